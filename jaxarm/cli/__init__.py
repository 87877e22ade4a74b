"""The ``jaxarm`` command: Swartz's ``sim`` program on top of the library.

    jaxarm info ARM                                     DH table, inertias, drives, limits, consistency
    jaxarm inverse ARM --q .. [--qd ..] [--qdd ..]      joint torques (Newton-Euler + drive terms)
    jaxarm forward ARM --q .. [--qd ..] (--tau .. | --voltage ..)   joint accelerations
    jaxarm simulate ARM [input] --duration T --dt DT --out run.npz [--csv ..] [--plot ..]
    jaxarm plot run.npz [--out run.png]
    jaxarm identify LOG --arm ARM --out identified.toml [--report r.json] [--plot fit.png] ...

ARM is a bundled arm name (``puma560``; see :func:`jaxarm.arm_files.bundled_arms`) or a path to
an arm file. Vectors are comma- or space-separated numbers, one per joint (``--q 0,0.8,-0.8,0,0.5,0``
or ``--q 0 0.8 -0.8 0 0.5 0``). Everything runs in float64.

``simulate`` without an input option applies zero joint torque: the arm moves under gravity
(and drive friction) alone. ``--controller pd`` is PD plus gravity compensation from the arm's own
model; its default gains are kp = (10 rad/s)^2 M_ii(q0), kd = 2 (10 rad/s) M_ii(q0), i.e. about
critically damped at 10 rad/s per joint. Long runs are simulated in up to 20 chunks of one
compiled length (the state carried over) so a progress bar can be drawn on a terminal's stderr.

Run as a program, the command keeps compiled XLA code in a persistent cache (see
:func:`jaxarm.enable_compilation_cache`): the first run of a kind of simulation pays the compile time,
later ones start in seconds.

Exit codes: 0 success; 2 bad usage or input (unknown arm, malformed schedule, non-positive time
step, ...); 1 the simulation failed (diverged) or an output could not be written. Every error is
one line on stderr, ``jaxarm: error: ...``, and leaves no output file behind: outputs are written
to temporary files in their target directories and renamed only once all of them are complete.
Set JAXARM_DEBUG=1 to get the Python traceback instead.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    PD_BANDWIDTH,
    CommandError,
    _one_line,
    _Parser,
    _protect_negative_numbers,
)
from .export import _cmd_export
from .forward import _cmd_forward
from .identify import IDENTIFY_METHODS, _cmd_identify
from .estimate import OBSERVER_GAIN, _cmd_estimate
from .info import _cmd_info
from .payload import _cmd_identify_payload
from .inverse import _cmd_inverse
from .plot import _cmd_plot
from .simulate import _cmd_simulate
from .view import _cmd_arms, _cmd_view


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..simulate.integrators import METHODS

    parser = _Parser(prog="jaxarm", description="Differentiable robot-arm dynamics in JAX: inspect arms, "
                     "compute inverse/forward dynamics, simulate.",
                     epilog="ARM is a bundled arm name (e.g. puma560) or a path to an arm .toml file.")
    parser.add_argument("--version", action="version", version=f"jaxarm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def log_reading(p):
        """--columns, --joint-names, --angles for commands that read logs like identify does."""
        p.add_argument("--columns", metavar="MAP", help="the log's column names (see jaxarm identify --help)")
        p.add_argument("--joint-names", metavar="NAMES", help="joint names to read the log by (see jaxarm identify --help)")
        p.add_argument("--angles", choices=["radians", "degrees"], default="radians", help="unit of the revolute joints' q, dq")

    def arm_command(name, help_text, **kw):
        p = sub.add_parser(name, help=help_text, description=help_text, **kw)
        p.add_argument("arm", metavar="ARM", help="bundled arm name (puma560, ...) or path to an arm .toml file")
        return p

    def strict(p):
        p.add_argument("--strict", action="store_true", help="refuse an arm with physically inconsistent links")

    p = arm_command("info", "print an arm's DH table, inertias, drives, limits and physical-consistency report")
    p.set_defaults(func=_cmd_info)

    vec = dict(nargs="+", metavar="X")
    p = arm_command("inverse", "joint torques that produce qdd at (q, qd)")
    p.add_argument("--q", required=True, help="joint positions (rad or m), comma- or space-separated", **vec)
    p.add_argument("--qd", help="joint velocities (default zeros)", **vec)
    p.add_argument("--qdd", help="joint accelerations (default zeros)", **vec)
    strict(p)
    p.set_defaults(func=_cmd_inverse)

    p = arm_command("forward", "joint accelerations from joint torques or motor voltages at (q, qd)")
    p.add_argument("--q", required=True, help="joint positions (rad or m)", **vec)
    p.add_argument("--qd", help="joint velocities (default zeros)", **vec)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tau", help="joint torques (N m or N)", **vec)
    g.add_argument("--voltage", help="motor voltages (V), through the motor model (needs Kt and R)", **vec)
    strict(p)
    p.set_defaults(func=_cmd_forward)

    p = arm_command(
        "simulate", "simulate the arm and save the trajectory",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "input (at most one; default: zero joint torque, i.e. the arm falls under gravity):\n"
            "  --torque-schedule FILE   CSV with header t,tau1,..,taun\n"
            "  --voltage-schedule FILE  CSV with header t,V1,..,Vn (arm needs motor constants)\n"
            "  --controller pd --target q1,..,qn [--kp ..] [--kd ..]\n"
            "A schedule row applies from its time t_k until the next row's (zero-order hold); the last\n"
            "row holds to the end; the first row must have t <= 0. PD gains default to a critically\n"
            f"damped {PD_BANDWIDTH:g} rad/s per joint: kp = {PD_BANDWIDTH**2:g} M_ii(q0), kd = {2 * PD_BANDWIDTH:g} M_ii(q0);\n"
            "gravity is compensated with the arm's own model unless --no-gravity-compensation.\n"
            "Vectors (--q0, --target, --kp, ...) are comma- or space-separated numbers.\n"
            "The run has floor(duration / dt) steps (never past --duration). The joints' position\n"
            "limits act as rigid, plastic end stops (jaxarm.rollout's stops) and each stop reached is\n"
            "reported; --no-stops lets joints pass them (reported as a warning).\n"
            "Results (.npz): t (T+1,), q, qd ([B,] T+1, n),\n"
            "qdd, tau, u ([B,] T, n), arm, dt, method, q0, qd0, position_limits, torque_limits\n"
            "(and target, kp, kd for pd). --plot draws targets dashed and limits dotted."
        ),
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--torque-schedule", metavar="FILE", help="joint torques over time (CSV t,tau1..taun)")
    g.add_argument("--voltage-schedule", metavar="FILE", help="motor voltages over time (CSV t,V1..Vn)")
    g.add_argument("--controller", choices=["pd"], help="feedback controller")
    p.add_argument("--target", help="PD target joint positions", **vec)
    p.add_argument("--kp", help="PD position gains: one value or one per joint", **vec)
    p.add_argument("--kd", help="PD velocity gains: one value or one per joint", **vec)
    p.add_argument("--no-gravity-compensation", action="store_true", help="plain PD, no g(q) feed-forward")
    p.add_argument("--duration", required=True, metavar="T", help="simulated time (s)")
    p.add_argument("--dt", required=True, metavar="DT", help="time step (s)")
    p.add_argument("--method", default="rk3", choices=sorted(METHODS), help="integrator (default rk3)")
    p.add_argument("--q0", help="initial joint positions (default zeros)", **vec)
    p.add_argument("--qd0", help="initial joint velocities (default zeros)", **vec)
    p.add_argument("--batch", type=int, metavar="N", help="run N rollouts (vmapped, sharded over devices)")
    p.add_argument("--perturb", metavar="SIGMA", help="std. dev. of Gaussian noise on the batch's initial q (rad)")
    p.add_argument("--seed", type=int, metavar="S", help="random seed for --perturb (default 0)")
    p.add_argument("--bound", default="1e6", metavar="B", help="|q| or |qd| beyond this counts as divergence (default 1e6)")
    p.add_argument("--no-stops", action="store_true", help="let joints pass their position limits (default: the limits are end stops)")
    p.add_argument("--out", required=True, metavar="FILE.npz", help="results file")
    p.add_argument("--csv", metavar="FILE.csv", help="also write t, q, qd, tau as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="also plot q, qd, tau against time (needs matplotlib)")
    p.add_argument("--animate", metavar="FILE.gif|FILE.mp4|FILE.html", help="also draw the arm moving: an animated GIF or an MP4 "
                   "(needs matplotlib, and imageio-ffmpeg for MP4; with --batch, the first rollout) or an interactive 3-D page that opens offline (with --batch, up to 16 rollouts)")
    strict(p)
    p.add_argument("--force", action="store_true", help="replace output files that already exist (default: refuse)")
    p.set_defaults(func=_cmd_simulate)

    p = arm_command("export", "write the arm as URDF and/or MuJoCo MJCF (for viewers and other simulators)")
    p.add_argument("--urdf", metavar="FILE.urdf", help="URDF output (rotor inertia has no URDF field and is dropped)")
    p.add_argument("--mjcf", metavar="FILE.xml", help="MuJoCo MJCF output")
    p.add_argument("--timestep", default="0.001", metavar="DT", help="MJCF option timestep (default 0.001)")
    strict(p)
    p.add_argument("--force", action="store_true", help="replace output files that already exist (default: refuse)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "identify", help="fit an arm's inertial, drive and friction parameters to a torque log",
        description="fit an arm's inertial, drive and friction parameters to a logged experiment (t, q*, "
        "dq*, tau* columns; CSV or NPZ) and write the identified arm file",
        epilog="--method consistent (default): every link physically consistent by construction (log-Cholesky "
        "pseudo-inertia, optax L-BFGS), regularized towards ARM's values; --method linear: least squares on the "
        "base parameters (drives kept physical, links may be inconsistent). The log must excite every base parameter: "
        "a rank-deficient or too short log is refused. The filter cutoff and the Coulomb friction shape are chosen "
        "from the log by blocked cross-validation unless --cutoff is given; every choice is printed and reported.",
    )
    p.add_argument("log", metavar="LOG", nargs="+", help="log file(s) (.csv or .npz) with t, q1..qn, optional dq1..dqn, "
                   "tau1..taun; several experiments of one arm are identified together, each preprocessed on its own")
    p.add_argument("--arm", required=True, metavar="ARM", help="the arm to identify (bundled name or .toml): kinematics, and the prior / start")
    p.add_argument("--out", required=True, metavar="FILE.toml", help="identified arm file")
    p.add_argument("--report", metavar="FILE.json", help="JSON report: RMSE per joint, condition number, standard deviations, consistency")
    p.add_argument("--plot", metavar="FILE.png", help="measured vs predicted torques (held-out part if any)")
    p.add_argument("--html", metavar="FILE.html", help="the report as one self-contained page to read: verdict, decisions, "
                   "measured vs predicted torques, residual histograms and spectra, parameters, consistency")
    p.add_argument("--urdf", metavar="FILE.urdf", help="the identified arm also as URDF (inertials, damping, friction), "
                   "read back and checked against the identified torques on the log")
    p.add_argument("--mjcf", metavar="FILE.xml", help="the identified arm also as MuJoCo MJCF (inertials, armature, damping, "
                   "frictionloss), checked by MuJoCo's inverse dynamics when mujoco is installed")
    p.add_argument("--method", choices=IDENTIFY_METHODS, default="consistent", help="default consistent")
    p.add_argument("--fit-until", metavar="T", help="fit on t < T, report held-out RMSE on t >= T (default: hold out the last "
                   "quarter for the report's validation errors, then refit the arm on the whole log)")
    p.add_argument("--fit-from", metavar="T", help="fit on t >= T, report held-out RMSE on t < T (the first part held out)")
    p.add_argument("--friction", choices=["viscous-coulomb", "sigmoid"], default=None,
                   help="friction model to fit (consistent method; default viscous-coulomb, with the Coulomb shape chosen "
                   "from the data unless --cutoff is given)")
    p.add_argument("--columns", metavar="MAP", help="the log's column names, e.g. 't=%%time*1e-9,q{j}=field.position{j0},"
                   "dq{j}=field.velocity{j0},tau{j}=field.effort{j0}' for a ROS joint_states export ({j}: joint from 1, {j0}: from 0)")
    p.add_argument("--joint-names", metavar="NAMES", help="the arm's joint names, comma-separated or read from a URDF file, to "
                   "read a log by joint name: a ROS joint_states export (field.name*, field.position*, ...) or columns named "
                   "<joint>, <joint>_velocity, <joint>_effort (default: the names in --arm when it is a .urdf)")
    p.add_argument("--angles", choices=["radians", "degrees"], default="radians",
                   help="unit of the revolute joints' q, dq columns (default radians; a log that looks like degrees is refused)")
    p.add_argument("--rate", metavar="HZ", help="resample to this uniform rate (default: the log's median rate)")
    p.add_argument("--cutoff", metavar="HZ", help="zero-phase Butterworth low-pass of q, dq, tau before differentiating, or 'none' "
                   "(default: chosen from the log by blocked cross-validation, with the Coulomb friction shape)")
    p.add_argument("--steps", metavar="N", help="most L-BFGS iterations of the consistent fit (default 2000; it stops when converged)")
    p.add_argument("--regularization", metavar="W", help="weight of the pull towards ARM's values (default: chosen among "
                   "1e-4 .. 1e-1 by 3-fold blocked cross-validation in time on the fitted part)")
    p.add_argument("--refine", action="store_true", help="then refine the model so that simulations driven by the logged "
                   "torques follow the logged motion (output error, as DIDIM/CLOE; about 1-2 minutes for a 7-joint arm), and keep "
                   "it only if it lowers the held-out simulation error without raising the held-out torque error")
    p.add_argument("--force", action="store_true", help="replace output files that already exist (default: refuse)")
    p.set_defaults(func=_cmd_identify)

    p = sub.add_parser("identify-payload", help="identify a payload held by the tool from a log with it attached",
                       description="fit the mass, centre of mass and inertia of a payload held by ARM's tool to a torque log "
                       "(optionally the difference with a log of the same motion without it); write ARM holding the payload")
    p.add_argument("log", metavar="LOG", help="log (.csv or .npz) with t, q*, dq*, tau* of a motion with the payload")
    p.add_argument("--arm", required=True, metavar="ARM", help="the (identified) arm: bundled name, .toml or .urdf")
    p.add_argument("--out", required=True, metavar="FILE.toml", help="the arm file holding the identified payload")
    p.add_argument("--baseline", metavar="LOG0", help="a log of the same motion without the payload: the difference of "
                   "the two logs is fitted, which cancels the arm model's own errors")
    p.add_argument("--report", metavar="FILE.json", help="JSON report: parameters, standard deviations, consistency")
    p.add_argument("--cutoff", metavar="HZ", help="low-pass cutoff or 'none' (default: chosen from the log)")
    log_reading(p)
    p.add_argument("--force", action="store_true", help="replace output files that already exist (default: refuse)")
    p.set_defaults(func=_cmd_identify_payload)

    p = sub.add_parser("estimate", help="filtered states and external joint torques from a log",
                       description="run an extended Kalman filter (q, qd and external joint torques) and the generalized-momentum "
                       "observer on a log of positions and applied joint torques; write them, with contact detection, to an .npz")
    p.add_argument("log", metavar="LOG", help="log (.csv or .npz) with t, q*, tau* (dq* optional)")
    p.add_argument("--arm", required=True, metavar="ARM", help="the (identified) arm: bundled name, .toml or .urdf")
    p.add_argument("--out", required=True, metavar="FILE.npz", help="t, q, qd, std, external_kalman, external_observer, contact, "
                   "contact_link, threshold, nis, torque_std, applied_torque (and drive_error, payload_mass where estimated)")
    p.add_argument("--plot", metavar="FILE.png", help="measured minus filtered positions and the external torque estimates")
    p.add_argument("--position-std", metavar="RAD", help="encoder noise (default 1e-4 rad)")
    p.add_argument("--velocity-std", metavar="RAD/S", help="also filter the logged velocities, with this noise")
    p.add_argument("--torque-std", metavar="NM", help="torque uncertainty (default: the arm model's torque error on the log)")
    p.add_argument("--external-std", metavar="NM", help="random-walk intensity of the external torques (default 5 N m / sqrt(s))")
    p.add_argument("--gain", metavar="K", help=f"momentum observer gain (default {OBSERVER_GAIN:g} 1/s)")
    p.add_argument("--contact-free-until", metavar="T", help="the log is contact-free before T: contact thresholds from it")
    p.add_argument("--input", choices=("torque", "current", "voltage"),
                   help="what drives the arm: the torque columns tau* (default), motor currents I* or motor voltages V*")
    p.add_argument("--torque-sensor-std", metavar="NM", help="with --input current or voltage: read tau* as link-side joint "
                   "torque sensors with this noise, and estimate the drives' torque errors (drive_error)")
    p.add_argument("--current-std", metavar="A", help="with --input voltage: read I* as motor-current sensors with this noise")
    p.add_argument("--payload-mass", metavar="KG", help="estimate a payload's mass online (a point mass at the tool frame), "
                   "starting from KG: payload_mass, payload_mass_std; a slowly varying external torque looks like a load, so give a small "
                   "--external-std too (e.g. 0.1)")
    log_reading(p)
    p.add_argument("--force", action="store_true", help="replace output files that already exist (default: refuse)")
    p.set_defaults(func=_cmd_estimate)

    p = arm_command("view", "draw the arm at a configuration or along saved runs: an interactive page "
                    "(.html, opens offline), a picture (.png) or an animation (.gif, .mp4)")
    p.add_argument("--q", help="joint positions to draw (default zeros, or the runs' motion)", **vec)
    p.add_argument("--traj", nargs="+", metavar="RESULTS.npz", help="runs to play (jaxarm simulate --out, or any .npz with t and q)")
    p.add_argument("--target", help="points to mark, x,y,z in metres (several: x1,y1,z1,x2,...)", **vec)
    p.add_argument("--title", help="title of the page or picture (default: the arm's name)")
    p.add_argument("--no-meshes", action="store_true", help="draw the arm as a stick figure only (default: a URDF's visual meshes "
                   "in the .html page: STL, OBJ or COLLADA, a visual that cannot be read falls back to the link's collision mesh; "
                   "elsewhere, and for arm files, the links as shaded cylinders from the kinematics)")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.html, FILE.png, FILE.gif or FILE.mp4")
    p.add_argument("--force", action="store_true", help="replace output files that already exist (default: refuse)")
    p.set_defaults(func=_cmd_view)

    p = sub.add_parser("arms", help="list the bundled arms", description="list the bundled arms, one line each")
    p.set_defaults(func=_cmd_arms)

    p = sub.add_parser("plot", help="plot a saved run", description="plot a saved run (jaxarm simulate --out)")
    p.add_argument("results", metavar="RESULTS.npz")
    p.add_argument("--out", metavar="FILE.png", help="image file (default: RESULTS with .png)")
    p.add_argument("--force", action="store_true", help="replace output files that already exist (default: refuse)")
    p.set_defaults(func=_cmd_plot)
    return parser


def main(argv=None) -> int:
    """Run the ``jaxarm`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    Called without argv (as the ``jaxarm`` program), it also enables the persistent compilation
    cache (:func:`jaxarm.enable_compilation_cache`); in-process calls with an explicit argv leave JAX's
    configuration alone apart from float64.
    """
    import jax

    jax.config.update("jax_enable_x64", True)
    if argv is None:
        from ..core.xla import enable_compilation_cache

        enable_compilation_cache()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(os.environ.get("JAXARM_DEBUG"))
    try:
        parser = build_parser()
        args = parser.parse_args(_protect_negative_numbers(argv))
        if getattr(args, "func", None) is None:
            raise CommandError("expected a command: info, inverse, forward, simulate, view, export, plot, identify, identify-payload, estimate or arms (see 'jaxarm --help')")
        code = args.func(args)
        note = getattr(args, "_note", None)
        if note:
            print(f"jaxarm: warning: {note}", file=sys.stderr)
        return code
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except CommandError as exc:
        if debug:
            raise
        print(f"jaxarm: error: {_one_line(exc)}", file=sys.stderr)
        return exc.code
    except ValueError as exc:  # a library check on user input that the CLI did not anticipate
        if debug:
            raise
        print(f"jaxarm: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("jaxarm: error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `jaxarm info puma560 | head`: stop quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
