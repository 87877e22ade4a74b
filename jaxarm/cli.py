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
``_enable_compilation_cache``): the first run of a kind of simulation pays the compile time,
later ones start in seconds.

Exit codes: 0 success; 2 bad usage or input (unknown arm, malformed schedule, non-positive time
step, ...); 1 the simulation failed (diverged) or an output could not be written. Every error is
one line on stderr, ``jaxarm: error: ...``, and leaves no output file behind: outputs are written
to temporary files in their target directories and renamed only once all of them are complete.
Set JAXARM_DEBUG=1 to get the Python traceback instead.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import math
import os
import re
import sys
import tempfile
import warnings

import numpy as np

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
PD_BANDWIDTH = 10.0  # rad/s: default PD gains make every joint critically damped at this frequency
MAX_RESULT_BYTES = 4 * 1024**3  # refuse runs whose results alone would need more memory than this


class CommandError(Exception):
    """A user-facing failure: one line for stderr and the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------------------------
# Parsing helpers


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises CommandError (one line) instead of printing usage."""

    def error(self, message):
        raise CommandError(f"{message} (see '{self.prog} --help')")


_NEGATIVE = re.compile(r"-(\d|\.\d)[\d.eE+\-,\s]*|-(inf|nan)", re.IGNORECASE)


def _protect_negative_numbers(argv):
    """argparse takes '-0.5,0' (or '-1e-3') for an option; a leading space makes it a value.
    Number parsing strips the space again. No option of this program starts with '-<digit>'."""
    return [" " + a if _NEGATIVE.fullmatch(a) else a for a in argv]


def _finite_number(text: str, label: str) -> float:
    """One finite number from user text (an option value or a CSV cell), or a CommandError naming it."""
    text = text.strip()
    try:
        v = float(text)
    except ValueError:
        raise CommandError(f"{label}: {text!r} is not a number") from None
    if not math.isfinite(v):
        raise CommandError(f"{label}: expected a finite number, got {text}")
    return v


def _numbers(tokens, option: str) -> list[float]:
    text = " ".join(tokens) if isinstance(tokens, (list, tuple)) else str(tokens)
    values = [_finite_number(part, option) for part in re.split(r"[,\s]+", text.strip()) if part]
    if not values:
        raise CommandError(f"{option}: expected numbers, got nothing")
    return values


def _joint_vector(tokens, option: str, arm, default=None, allow_scalar: bool = False) -> np.ndarray:
    """One number per joint (or one number for all joints when allow_scalar)."""
    if tokens is None:
        return np.full(arm.n, default, dtype=np.float64)
    values = _numbers(tokens, option)
    if allow_scalar and len(values) == 1:
        return np.full(arm.n, values[0])
    if len(values) != arm.n:
        scalar = "1 or " if allow_scalar else ""
        raise CommandError(f"{option}: expected {scalar}{arm.n} values (one per joint of {arm.name}), got {len(values)}")
    return np.asarray(values, dtype=np.float64)


def _positive(value, option: str, what: str) -> float:
    values = _numbers(value, option)
    if len(values) != 1:
        raise CommandError(f"{option}: expected one number, got {len(values)}")
    if not values[0] > 0:
        raise CommandError(f"{option}: expected {what} > 0, got {values[0]:g}")
    return values[0]


def _one_line(message) -> str:
    return re.sub(r"\s*\n\s*", " ", str(message)).strip()


# --------------------------------------------------------------------------------------------
# Arms


def _load_arm(spec: str, strict: bool = False):
    """load_arm without the consistency warnings (``info`` reports them, the others summarise)."""
    from .arm_files import ArmFileError, PhysicalConsistencyWarning, load_arm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhysicalConsistencyWarning)
        try:
            return load_arm(spec, strict=strict)
        except ArmFileError as exc:
            raise CommandError(_one_line(exc)) from None


def _inconsistent_links(arm) -> list[int]:
    """Joint numbers (1-based) of the physically inconsistent links; a massless link with zero
    inertia is an idealisation and is not reported (as in jaxarm.arm_files)."""
    from .consistency import consistency_report

    reports = consistency_report(arm)
    return [i + 1 for i in range(arm.n) if not (reports[f"joint {i + 1}"].ok or reports[f"joint {i + 1}"].massless)]


def _consistency_note(arm, spec: str) -> str | None:
    bad = _inconsistent_links(arm)
    if not bad:
        return None
    which = f"link {bad[0]} has" if len(bad) == 1 else f"links {', '.join(map(str, bad))} have"
    return f"{arm.name}: {which} physically inconsistent inertial parameters (see 'jaxarm info {spec}'; --strict refuses such arms)"


def _require_motor_model(arm, option: str) -> None:
    kt = np.asarray(arm.drives.torque_constant)
    r = np.asarray(arm.drives.resistance)
    bad = np.flatnonzero(~((kt > 0) & (r > 0)))
    if bad.size:
        joints = "" if bad.size == arm.n else " for joint" + ("s " if bad.size > 1 else " ") + ", ".join(str(i + 1) for i in bad)
        raise CommandError(
            f"{option}: arm {arm.name} has no motor model{joints} "
            "(torque_constant and resistance must be > 0 in [joint.motor]); give joint torques instead"
        )


# --------------------------------------------------------------------------------------------
# Tables


def _fmt(x, digits: int = 6) -> str:
    x = float(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0.0:
        return "0"
    return f"{x:.{digits}g}"


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*(e[-+]?\d+)?|inf|-)", re.IGNORECASE)


def _table(headers, rows, indent: str = "  ") -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(headers))]
    numeric = [all(_NUMBER.fullmatch(r[k]) for r in cells[1:]) for k in range(len(headers))]
    lines = []
    for r in cells:
        padded = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)]
        lines.append(indent + "  ".join(padded).rstrip())
    return "\n".join(lines)


_CONVENTION_TEXT = {
    "standard": "standard (distal) DH: T_i = Rz(theta_i + q_i) Tz(d_i) Tx(a_i) Rx(alpha_i)",
    "modified": "modified (proximal, Craig) DH: T_i = Rx(alpha_{i-1}) Tx(a_{i-1}) Rz(theta_i + q_i) Tz(d_i)",
    "placement": "placements (URDF-like): fixed xyz, rpy in the parent frame, then motion about axis",
}


def _unit(arm, i, revolute: str, prismatic: str) -> str:
    return revolute if arm.joint_types[i] == "revolute" else prismatic


def _info_text(arm, spec: str) -> str:
    n = arm.n
    types = "".join("R" if t == "revolute" else "P" for t in arm.joint_types)
    g = np.asarray(arm.gravity)
    out = [
        f"{arm.name}: {n} joints ({types}), {arm.convention} convention",
        f"gravity [m/s^2]: ({', '.join(_fmt(v) for v in g)})",
        "",
    ]
    kin = arm.kinematics
    out.append(f"Kinematics -- {_CONVENTION_TEXT[arm.convention]}")
    if arm.convention == "placement":
        headers = ["joint", "type", "x [m]", "y [m]", "z [m]", "roll [rad]", "pitch [rad]", "yaw [rad]", "axis"]
        rows = [
            [i + 1, arm.joint_types[i], *(_fmt(v) for v in kin.xyz[i]), *(_fmt(v) for v in kin.rpy[i]),
             "(" + ", ".join(_fmt(v, 4) for v in kin.axis[i]) + ")"]
            for i in range(n)
        ]
    else:
        if arm.convention == "modified":
            headers = ["joint", "type", "a_{i-1} [m]", "alpha_{i-1} [rad]", "d_i [m]", "theta_i [rad]"]
        else:
            headers = ["joint", "type", "a_i [m]", "alpha_i [rad]", "d_i [m]", "theta_i [rad]"]
        rows = [
            [i + 1, arm.joint_types[i], _fmt(kin.a[i]), _fmt(kin.alpha[i]), _fmt(kin.d[i]), _fmt(kin.theta[i])]
            for i in range(n)
        ]
    out.append(_table(headers, rows))
    if any(t == "prismatic" for t in arm.joint_types):
        out.append("  (for a prismatic joint q adds to d; for a revolute one to theta)")
    out.append("")

    links = arm.links
    out.append("Inertial parameters (link frame; inertia tensor about the COM in kg m^2)")
    headers = ["link", "mass [kg]", "com x [m]", "com y [m]", "com z [m]", "Ixx", "Iyy", "Izz", "Ixy", "Ixz", "Iyz"]
    rows = []
    for i in range(n):
        I = np.asarray(links.inertia[i])
        rows.append([i + 1, _fmt(links.mass[i]), *(_fmt(c) for c in links.com[i]),
                     _fmt(I[0, 0]), _fmt(I[1, 1]), _fmt(I[2, 2]), _fmt(I[0, 1]), _fmt(I[0, 2]), _fmt(I[1, 2])])
    out.append(_table(headers, rows))
    pm = float(np.asarray(arm.payload.mass))
    if pm > 0 or np.any(np.asarray(arm.payload.inertia)):
        pc, pI = np.asarray(arm.payload.com), np.asarray(arm.payload.inertia)
        out.append(f"  payload: mass {_fmt(pm)} kg, com ({', '.join(_fmt(c) for c in pc)}) m in the tool frame, "
                   f"inertia diag ({', '.join(_fmt(pI[k, k]) for k in range(3))}) kg m^2")
    out.append("")

    dr = arm.drives
    out.append("Drives (motor side; joint torque = G x motor torque; Kt = 0: no electrical model)")
    headers = ["joint", "gear G", "rotor Jm [kg m^2]", "viscous B [N m s/rad]", "Coulomb Tc+ [N m]", "Tc- [N m]",
               "Kt [N m/A]", "R [ohm]", "V limit [V]"]
    rows = []
    for i in range(n):
        kt, r = float(dr.torque_constant[i]), float(dr.resistance[i])
        rows.append([i + 1, _fmt(dr.gear_ratio[i]), _fmt(dr.rotor_inertia[i]), _fmt(dr.viscous_friction[i]),
                     _fmt(dr.coulomb_friction[i][0]), _fmt(dr.coulomb_friction[i][1]),
                     _fmt(kt) if kt > 0 else "-", _fmt(r) if r > 0 else "-", _fmt(dr.voltage_limit[i])])
    out.append(_table(headers, rows))
    extra = []
    for field, label in (("static_friction", "static (Stribeck) Ts [N m]"), ("stribeck_velocity", "Stribeck velocity"),
                         ("coulomb_velocity_scale", "Coulomb tanh scale")):
        values = np.asarray(getattr(dr, field))
        if np.any(values):
            extra.append(f"  {label}: " + ", ".join(_fmt(v) for v in values))
    sig = np.asarray(dr.sigmoid_friction)
    if np.any(sig):
        extra.append("  sigmoid friction (phi1, phi2, phi3), joint side: "
                     + "; ".join("(" + ", ".join(_fmt(v) for v in row) + ")" for row in sig))
    out.extend(extra)
    out.append("")

    lim = arm.limits
    out.append("Limits (joint side; inf = none)")
    headers = ["joint", "q min", "q max", "qd max", "tau max", "units"]
    rows = [[i + 1, _fmt(lim.position[i][0]), _fmt(lim.position[i][1]), _fmt(lim.velocity[i]), _fmt(lim.torque[i]),
             _unit(arm, i, "rad, rad/s, N m", "m, m/s, N")] for i in range(n)]
    out.append(_table(headers, rows))
    out.append("")

    for label, T in (("base (frame 0 in the world)", arm.base), ("tool (in the last link frame)", arm.tool)):
        T = np.asarray(T)
        if not np.array_equal(T, np.eye(4)):
            out.append(f"{label}: translation ({', '.join(_fmt(v) for v in T[:3, 3])}) m, rotation rows "
                       + "; ".join("(" + ", ".join(_fmt(v, 4) for v in row) + ")" for row in T[:3, :3]))
    if not np.array_equal(np.asarray(arm.base), np.eye(4)) or not np.array_equal(np.asarray(arm.tool), np.eye(4)):
        out.append("")

    from .consistency import consistency_report

    out.append("Physical consistency (Wensing, Kim & Slotine 2017: pseudo-inertia >= 0)")
    for label, report in consistency_report(arm).items():
        name = label.replace("joint", "link")
        if report.ok:
            out.append(f"  {name}: OK")
        elif report.massless:
            out.append(f"  {name}: OK (massless: no mass, no inertia)")
        else:
            out.append(f"  {name}: INCONSISTENT")
            out.extend(f"    - {p}" for p in report.problems)
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# info / inverse / forward


def _cmd_info(args) -> int:
    arm = _load_arm(args.arm, strict=False)
    print(_info_text(arm, args.arm))
    return EXIT_OK


def _state_vectors(args, arm):
    q = _joint_vector(args.q, "--q", arm)
    qd = _joint_vector(args.qd, "--qd", arm, default=0.0)
    return q, qd


def _print_joint_table(arm, columns):
    """columns: list of (name, values (n,), unit for revolute joints, unit for prismatic joints)."""
    kinds = set(arm.joint_types)

    def unit(ur, up):
        return ur if kinds == {"revolute"} else up if kinds == {"prismatic"} else f"{ur} | {up}"

    headers = ["joint", "type"] + [f"{name} [{unit(ur, up)}]" for name, _, ur, up in columns]
    rows = [[i + 1, arm.joint_types[i], *(f"{float(v[i]):.12g}" for _, v, _, _ in columns)] for i in range(arm.n)]
    print(_table(headers, rows, indent=""))


def _cmd_inverse(args) -> int:
    from . import _xla, dynamics

    arm = _load_arm(args.arm, strict=args.strict)
    q, qd = _state_vectors(args, arm)
    qdd = _joint_vector(args.qdd, "--qdd", arm, default=0.0)
    # One compiled call is much faster than op-by-op dispatch (each op would compile on first use).
    tau = np.asarray(_xla.jit(dynamics.inverse_dynamics)(arm, q, qd, qdd))
    print(f"{arm.name}: inverse dynamics (rigid body + reflected rotor inertia + drive friction)")
    _print_joint_table(arm, [("q", q, "rad", "m"), ("qd", qd, "rad/s", "m/s"), ("qdd", qdd, "rad/s^2", "m/s^2"),
                             ("tau", tau, "N m", "N")])
    args._note = _consistency_note(arm, args.arm)
    return EXIT_OK


def _cmd_forward(args) -> int:
    from . import _xla, dynamics, motors

    arm = _load_arm(args.arm, strict=args.strict)
    q, qd = _state_vectors(args, arm)
    columns = [("q", q, "rad", "m"), ("qd", qd, "rad/s", "m/s")]
    if args.voltage is not None:
        _require_motor_model(arm, "--voltage")
        V = _joint_vector(args.voltage, "--voltage", arm)

        def through_motors(arm, q, qd, V):
            tau = motors.motor_torque(arm, V, qd)
            return motors.saturate_voltage(arm, V), tau, dynamics.forward_dynamics(arm, q, qd, tau)

        V_applied, tau, qdd = (np.asarray(x) for x in _xla.jit(through_motors)(arm, q, qd, V))
        columns.append(("V", V_applied, "V", "V"))
    else:
        tau = _joint_vector(args.tau, "--tau", arm)
        qdd = np.asarray(_xla.jit(dynamics.forward_dynamics)(arm, q, qd, tau))
    columns += [("tau", tau, "N m", "N"), ("qdd", qdd, "rad/s^2", "m/s^2")]
    print(f"{arm.name}: forward dynamics" + (" (voltage through the motor model, saturated)" if args.voltage is not None else ""))
    _print_joint_table(arm, columns)
    args._note = _consistency_note(arm, args.arm)
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# simulate


def read_schedule(path, kind: str, n: int, arm_name: str = "arm"):
    """Read a schedule CSV: header ``t,V1,..,Vn`` (kind "voltage") or ``t,tau1,..,taun`` (kind
    "torque"), then one row per change of input. Blank lines and lines starting with # are
    skipped. Returns (times (K,), values (K, n)); raises CommandError naming line and column."""
    option = f"--{kind}-schedule"
    prefix = "V" if kind == "voltage" else "tau"
    expected = ["t"] + [f"{prefix}{j}" for j in range(1, n + 1)]
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise CommandError(f"{option}: {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{option}: {path}: cannot read: {_one_line(exc)}") from None
    lines = [(k + 1, row) for k, row in enumerate(csv.reader(io.StringIO(text)))
             if row and any(c.strip() for c in row) and not row[0].lstrip().startswith("#")]
    where = f"{option}: {path}"
    if not lines:
        raise CommandError(f"{where}: empty; expected a header {','.join(expected)} and rows of numbers")
    line, header = lines[0]
    header = [h.strip() for h in header]
    if len(header) != n + 1:
        raise CommandError(
            f"{where}: line {line}: {len(header)} columns, expected {n + 1} (t and one per joint of the "
            f"{n}-joint arm {arm_name}): {','.join(expected)}"
        )
    if [h.lower() for h in header] != [e.lower() for e in expected]:
        raise CommandError(f"{where}: line {line}: header {','.join(header)}; expected {','.join(expected)}")
    if len(lines) < 2:
        raise CommandError(f"{where}: no data rows after the header")
    times, values = [], []
    for line, row in lines[1:]:
        if len(row) != n + 1:
            raise CommandError(f"{where}: line {line}: {len(row)} columns, expected {n + 1} ({','.join(expected)})")
        numbers = [_finite_number(cell, f"{where}: line {line}: {col}") for col, cell in zip(expected, row)]
        if times and not numbers[0] > times[-1]:
            raise CommandError(
                f"{where}: line {line}: t = {numbers[0]:g} s does not increase (previous row t = {times[-1]:g} s); "
                "times must be strictly increasing"
            )
        times.append(numbers[0])
        values.append(numbers[1:])
    if times[0] > 0:
        raise CommandError(
            f"{where}: the first row is at t = {times[0]:g} s, so there is no input before it; "
            "the first row must have t <= 0"
        )
    return np.asarray(times), np.asarray(values, dtype=np.float64)


def hold_schedule(times, values, steps: int, dt: float) -> np.ndarray:
    """Zero-order hold: the (steps, n) input of each step k (time k dt) is the row with the
    latest t <= k dt; row k applies from t_k until t_{k+1}, the last one to the end."""
    step_times = np.arange(steps) * dt
    index = np.searchsorted(times, step_times + 1e-9 * dt, side="right") - 1  # tolerate k*dt rounding
    return values[index]


@functools.lru_cache(maxsize=None)
def _chunk_function(steps: int, method: str, input_kind: str, controller: str | None, gravity_comp: bool, batched: bool):
    """A jitted rollout of ``steps`` steps from (q0, qd0) at time t0, compiled once per structure.

    dt, the divergence bound and the controller gains are traced arguments, so repeated calls
    (every chunk of a run, and runs in the same process) reuse the compiled code. Default PD
    gains come from the mass matrix at q_ref, computed inside the compiled function.
    """
    import jax.numpy as jnp

    from . import _xla
    from .batch import rollout_batch
    from .controllers import pd_controller
    from .dynamics import mass_matrix
    from .simulate import rollout

    def run(arm, q0, qd0, u, t0, dt, bound, ctrl):
        gains = None
        if controller == "pd":
            kp_abs, kp_rel, kd_abs, kd_rel, target, q_ref = ctrl
            m = jnp.diag(mass_matrix(arm, q_ref))  # effective inertia of each joint at the start
            kp, kd = kp_abs + kp_rel * m, kd_abs + kd_rel * m
            inputs = pd_controller(kp, kd, target, gravity_compensation=arm if gravity_comp else None)
            gains = (kp, kd)
        else:
            inputs = u
        kwargs = dict(method=method, input=input_kind, t0=t0, bound=bound, steps=steps if controller else None)
        if batched:
            traj = rollout_batch(arm, q0, qd0, inputs, dt, inputs_batched=False, on_divergence="flag", **kwargs)
        else:
            traj = rollout(arm, q0, qd0, inputs, dt, on_divergence="flag", **kwargs)
        return traj, gains

    return _xla.jit(run)


class _Progress:
    """``[#####     ]  50%  t = 1.00 / 2.00 s`` on stderr, redrawn in place; only on a terminal."""

    def __init__(self, total_time: float, enabled: bool):
        self.total = total_time
        self.enabled = enabled
        self.drawn = False

    def update(self, fraction: float, note: str = "") -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(round(width * fraction))
        sys.stderr.write(f"\r[{'#' * filled}{' ' * (width - filled)}] {100 * fraction:3.0f}%  "
                         f"t = {fraction * self.total:.3g} / {self.total:.3g} s{note}\033[K")
        sys.stderr.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.drawn = False


def run_chunked(arm, q0, qd0, *, steps: int, dt: float, method: str = "rk3", inputs=None, input_kind: str = "torque",
             controller=None, bound: float = 1e6, chunks: int | None = None, progress: bool = False) -> dict:
    """Run the rollout in chunks (compiled once for the chunk length, carrying the state).

    q0, qd0: (n,) or (B, n) for a batch (then :func:`jaxarm.rollout_batch`). inputs: (steps, n)
    schedule, or None with controller = dict(kp_abs, kp_rel, kd_abs, kd_rel, target, q_ref,
    gravity_compensation). Returns numpy arrays t (steps+1,), q, qd ([B,] steps+1, n), qdd, tau,
    u ([B,] steps, n) and kp, kd for a controller. Raises jaxarm.DivergenceError.
    """
    from .simulate import Trajectory, check_divergence

    q0 = np.asarray(q0, dtype=np.float64)
    qd0 = np.asarray(qd0, dtype=np.float64)
    batched = q0.ndim == 2
    if chunks is None:
        chunks = max(1, min(20, steps // 100))
    length = -(-steps // chunks)
    chunks = -(-steps // length)
    if inputs is not None:
        inputs = np.asarray(inputs, dtype=np.float64)
        pad = chunks * length - steps
        if pad:
            inputs = np.concatenate([inputs, np.repeat(inputs[-1:], pad, axis=0)])  # trimmed afterwards
    ctrl = None
    if controller is not None:
        ctrl = tuple(np.asarray(controller[k], dtype=np.float64)
                     for k in ("kp_abs", "kp_rel", "kd_abs", "kd_rel", "target", "q_ref"))
    fn = _chunk_function(length, method, input_kind, "pd" if controller is not None else None,
                         bool(controller and controller.get("gravity_compensation", True)), batched)
    t = dt * np.arange(steps + 1)
    parts = {k: [] for k in ("q", "qd", "qdd", "tau", "u")}
    diverged = np.full(q0.shape[:-1], -1)
    q, qd = q0, qd0
    gains = None
    bar = _Progress(steps * dt, progress and chunks > 1)
    bar.update(0.0, "  (compiling)")
    try:
        for k in range(chunks):
            start = k * length
            u = None if inputs is None else inputs[start:start + length]
            traj, gains = fn(arm, q, qd, u, np.float64(start * dt), np.float64(dt), np.float64(bound), ctrl)
            keep = min(length, steps - start)
            out = {name: np.asarray(getattr(traj, name)) for name in parts}
            parts["q"].append(out["q"][..., 1:keep + 1, :])
            parts["qd"].append(out["qd"][..., 1:keep + 1, :])
            for name in ("qdd", "tau", "u"):
                parts[name].append(out[name][..., :keep, :])
            step = np.asarray(traj.diverged_step)
            newly = (diverged < 0) & (step >= 0) & (step < keep)
            diverged = np.where(newly, start + step, diverged)
            q, qd = out["q"][..., keep, :], out["qd"][..., keep, :]  # numpy carry: same signature every call
            bar.update((start + keep) / steps)
            if np.any(diverged >= 0):
                break
    finally:
        bar.close()
    if np.any(diverged >= 0):
        check_divergence(Trajectory(t=t, q=None, qd=None, qdd=None, tau=None, u=None, diverged_step=diverged))
    result = {
        "t": t,
        "q": np.concatenate([q0[..., None, :]] + parts["q"], axis=-2),
        "qd": np.concatenate([qd0[..., None, :]] + parts["qd"], axis=-2),
        **{name: np.concatenate(parts[name], axis=-2) for name in ("qdd", "tau", "u")},
    }
    if gains is not None:
        result["kp"], result["kd"] = (np.asarray(g) for g in gains)
    return result


class _Outputs:
    """Files written to temporaries beside their targets, renamed into place together."""

    def __init__(self):
        self.pending = []  # (temporary, final)

    @staticmethod
    def check(path: str, option: str) -> None:
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise CommandError(f"{option}: {path} is a directory")
        if not os.path.isdir(folder):
            raise CommandError(f"{option}: {path}: directory {folder} does not exist")
        if not os.access(folder, os.W_OK):
            raise CommandError(f"{option}: {path}: directory {folder} is not writable")

    def write(self, path: str, writer) -> None:
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
        self.pending.append((tmp, path))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # the permissions a plain open() would give
        with os.fdopen(fd, "wb") as f:
            writer(f)

    def commit(self) -> None:
        for tmp, path in self.pending:
            os.replace(tmp, path)
        self.pending = []

    def discard(self) -> None:
        for tmp, _ in self.pending:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self.pending = []


def _csv_text(result, n: int) -> str:
    """t, q1..qn, qd1..qdn, tau1..taun; tau is blank in the last row (no step starts there).
    A batch gets a leading ``batch`` column and all its elements, one after the other."""
    q, qd, tau, t = result["q"], result["qd"], result["tau"], result["t"]
    batched = q.ndim == 3
    if not batched:
        q, qd, tau = q[None], qd[None], tau[None]
    header = (["batch"] if batched else []) + ["t"] + [f"q{j}" for j in range(1, n + 1)] \
        + [f"qd{j}" for j in range(1, n + 1)] + [f"tau{j}" for j in range(1, n + 1)]
    buf = io.StringIO()
    buf.write(",".join(header) + "\n")
    rows = len(t)
    for b in range(q.shape[0]):
        tau_b = np.concatenate([tau[b], np.full((1, n), np.nan)])
        block = np.column_stack([t, q[b], qd[b], tau_b])
        if batched:
            block = np.column_stack([np.full(rows, b), block])
        lines = io.StringIO()
        np.savetxt(lines, block, fmt="%.10g", delimiter=",")
        buf.write(lines.getvalue().replace("nan", ""))
    return buf.getvalue()


def _cmd_simulate(args) -> int:
    from .integrators import METHODS
    from .plotting import require_matplotlib

    # Scalars first: they need no arm.
    dt = _positive(args.dt, "--dt", "a time step in seconds")
    duration = _positive(args.duration, "--duration", "a duration in seconds")
    bound = _positive(args.bound, "--bound", "a bound")
    if args.method not in METHODS:  # argparse choices already checks; kept for direct calls
        raise CommandError(f"--method: expected one of {', '.join(sorted(METHODS))}, got {args.method}")
    steps = int(math.ceil(duration / dt - 1e-9))
    if steps < 1:
        raise CommandError(f"--duration: {duration:g} s is shorter than one time step (--dt {dt:g} s)")
    if args.batch is not None and args.batch < 1:
        raise CommandError(f"--batch: expected a positive number of rollouts, got {args.batch}")
    if args.perturb is not None and args.batch is None:
        raise CommandError("--perturb: only with --batch N (it perturbs the initial positions of the N rollouts)")
    sigma = 0.0
    if args.perturb is not None:
        values = _numbers(args.perturb, "--perturb")
        if len(values) != 1 or values[0] < 0:
            raise CommandError(f"--perturb: expected one standard deviation >= 0 (rad), got {args.perturb.strip()}")
        sigma = values[0]
    if args.seed is not None and args.batch is None:
        raise CommandError("--seed: only with --batch N --perturb SIGMA")
    if args.controller is None:
        for option, value in (("--target", args.target), ("--kp", args.kp), ("--kd", args.kd)):
            if value is not None:
                raise CommandError(f"{option}: only with --controller pd")
        if args.no_gravity_compensation:
            raise CommandError("--no-gravity-compensation: only with --controller pd")
    elif args.target is None:
        raise CommandError("--target: required with --controller pd (one position per joint)")

    outputs = [(args.out, "--out")] + [(p, o) for p, o in ((args.csv, "--csv"), (args.plot, "--plot")) if p]
    seen = {}
    for path, option in outputs:
        _Outputs.check(path, option)
        key = os.path.abspath(path)
        if key in seen:
            raise CommandError(f"{option}: {path} is also the {seen[key]} file")
        seen[key] = option
    if args.plot:
        try:
            require_matplotlib()
        except ImportError as exc:
            raise CommandError(f"--plot: {exc}", EXIT_FAILURE) from None

    arm = _load_arm(args.arm, strict=args.strict)
    n = arm.n
    q0 = _joint_vector(args.q0, "--q0", arm, default=0.0)
    qd0 = _joint_vector(args.qd0, "--qd0", arm, default=0.0)
    batch = args.batch
    est = (batch or 1) * (steps + 1) * n * 8 * 6
    if est > MAX_RESULT_BYTES:
        raise CommandError(
            f"--duration/--dt: {steps} steps{f' x {batch} rollouts' if batch else ''} would need about "
            f"{est / 1024**3:.1f} GB for the results; use a larger --dt or a shorter --duration"
        )

    inputs, controller, input_kind = None, None, "torque"
    if args.torque_schedule is not None:
        times, values = read_schedule(args.torque_schedule, "torque", n, arm.name)
        inputs, source = hold_schedule(times, values, steps, dt), "torque schedule"
    elif args.voltage_schedule is not None:
        _require_motor_model(arm, "--voltage-schedule")
        times, values = read_schedule(args.voltage_schedule, "voltage", n, arm.name)
        inputs, source, input_kind = hold_schedule(times, values, steps, dt), "voltage schedule", "voltage"
    elif args.controller == "pd":
        target = _joint_vector(args.target, "--target", arm)
        kp = None if args.kp is None else _joint_vector(args.kp, "--kp", arm, allow_scalar=True)
        kd = None if args.kd is None else _joint_vector(args.kd, "--kd", arm, allow_scalar=True)
        for option, gain in (("--kp", kp), ("--kd", kd)):
            if gain is not None and np.any(gain < 0):
                raise CommandError(f"{option}: expected gains >= 0, got {', '.join(_fmt(g) for g in gain)}")
        zeros, bw = np.zeros(n), PD_BANDWIDTH
        controller = {
            "kp_abs": zeros if kp is None else kp, "kp_rel": np.full(n, bw**2) if kp is None else zeros,
            "kd_abs": zeros if kd is None else kd, "kd_rel": np.full(n, 2 * bw) if kd is None else zeros,
            "target": target, "q_ref": q0, "gravity_compensation": not args.no_gravity_compensation,
        }
        source = "PD" + ("" if args.no_gravity_compensation else " + gravity compensation")
    else:
        inputs, source = np.zeros((steps, n)), "zero torque"

    if batch is not None:
        rng = np.random.default_rng(0 if args.seed is None else args.seed)
        q0_run = q0 + sigma * rng.normal(size=(batch, n))
        qd0_run = np.broadcast_to(qd0, (batch, n)).copy()
    else:
        q0_run, qd0_run = q0, qd0

    from .simulate import DivergenceError

    try:
        result = run_chunked(arm, q0_run, qd0_run, steps=steps, dt=dt, method=args.method, inputs=inputs,
                             input_kind=input_kind, controller=controller, bound=bound, progress=sys.stderr.isatty())
    except DivergenceError as exc:
        msg = _one_line(exc).replace("reduce dt", "reduce --dt").replace("pass bound= to raise the limit", "raise --bound")
        raise CommandError(msg, EXIT_FAILURE) from None

    record = dict(result)
    record.update(
        arm=np.asarray(arm.name), dt=np.asarray(dt), method=np.asarray(args.method), input=np.asarray(input_kind),
        source=np.asarray(source), joint_types=np.asarray(arm.joint_types), q0=q0_run, qd0=qd0_run,
    )
    if controller is not None:
        record["target"] = controller["target"]

    files = _Outputs()
    try:
        files.write(args.out, lambda f: np.savez(f, **record))
        if args.csv:
            files.write(args.csv, lambda f: f.write(_csv_text(result, n).encode("utf-8")))
        if args.plot:
            from .plotting import plot_trajectory

            fmt = os.path.splitext(args.plot)[1].lstrip(".").lower() or "png"
            files.write(args.plot, lambda f: plot_trajectory(record, f, format=fmt))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write the results: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()

    # Summary on stdout.
    batch_text = f", {batch} rollouts (initial q perturbed by {sigma:g} rad)" if batch else ""
    print(f"{arm.name}: {steps} steps of {dt:g} s ({args.method}), {source}{batch_text}")
    qT = result["q"][..., -1, :]
    if batch:
        print(f"final q (element 0) = [{', '.join(_fmt(v) for v in qT[0])}]")
    else:
        print(f"final q = [{', '.join(_fmt(v) for v in qT)}]")
    if controller is not None:
        err = np.abs(qT - controller["target"]).reshape(-1, n).max(axis=0)
        j = int(np.argmax(err))
        print(f"PD gains kp = [{', '.join(_fmt(v, 4) for v in result['kp'])}], kd = [{', '.join(_fmt(v, 4) for v in result['kd'])}]")
        print(f"final max |q - target| = {err[j]:.3g} (joint {j + 1})")
    print("wrote " + ", ".join(p for p, _ in outputs))
    args._note = _consistency_note(arm, args.arm)
    return EXIT_OK


def _cmd_plot(args) -> int:
    from .plotting import load_results, plot_trajectory, require_matplotlib

    out = args.out or os.path.splitext(args.results)[0] + ".png"
    if os.path.abspath(out) == os.path.abspath(args.results):
        raise CommandError(f"--out: {out} would overwrite the results file")
    try:
        data = load_results(args.results)
    except ValueError as exc:
        raise CommandError(_one_line(exc)) from None
    _Outputs.check(out, "--out")
    try:
        require_matplotlib()
    except ImportError as exc:
        raise CommandError(str(exc), EXIT_FAILURE) from None
    files = _Outputs()
    fmt = os.path.splitext(out)[1].lstrip(".").lower() or "png"
    try:
        files.write(out, lambda f: plot_trajectory(data, f, format=fmt))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()
    print(f"wrote {out}")
    return EXIT_OK


def _cmd_export(args) -> int:
    from .mjcf import to_mjcf
    from .urdf import to_urdf

    if not (args.urdf or args.mjcf):
        raise CommandError("export: expected --urdf FILE and/or --mjcf FILE")
    targets = [(path, flag) for path, flag in ((args.urdf, "--urdf"), (args.mjcf, "--mjcf")) if path]
    for path, flag in targets:
        _Outputs.check(path, flag)
    arm = _load_arm(args.arm, strict=args.strict)
    texts = []
    for path, flag in targets:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                text = to_urdf(arm) if flag == "--urdf" else to_mjcf(arm, timestep=float(args.timestep))
        except ValueError as exc:
            raise CommandError(f"{flag}: {_one_line(exc)}") from None
        for w in caught:
            print(f"jaxarm: warning: {_one_line(w.message)}", file=sys.stderr)
        texts.append((path, text))
    files = _Outputs()
    try:
        for path, text in texts:
            files.write(path, lambda f, text=text: f.write(text.encode("utf-8")))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()
    for path, _ in texts:
        print(f"wrote {path}")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# identify


IDENTIFY_METHODS = ("consistent", "linear")


def _identify_plot(fmt, t, measured, predicted, label):
    """A writer (file -> None) drawing measured vs predicted torques per joint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = measured.shape[1]
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.6 * n + 0.8), sharex=True, squeeze=False)
    for j, ax in enumerate(axes[:, 0]):
        ax.plot(t, measured[:, j], color="0.55", lw=0.8, label="measured")
        ax.plot(t, predicted[:, j], color="C0", lw=0.9, label="identified model")
        ax.set_ylabel(f"tau{j + 1}")
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=2)
    axes[-1, 0].set_xlabel(f"t [s] ({label})")
    fig.tight_layout()

    def write(f):
        fig.savefig(f, format=fmt, dpi=110)
        plt.close(fig)

    return write


def _cmd_identify(args) -> int:
    """Fit an arm's parameters to a torque log; write the arm file (and report, plot) atomically."""
    import json

    from . import consistent_identification as ci
    from .arm_files import arm_to_toml
    from .consistency import consistency_report
    from .identification import IdentificationError, identify_linear, predict_torques, torque_rmse
    from .logs import LogError, load_log, preprocess_log

    outputs = [(args.out, "--out")] + [(p, o) for p, o in ((args.report, "--report"), (args.plot, "--plot")) if p]
    paths = [os.path.abspath(p) for p, _ in outputs]
    if len(set(paths)) != len(paths) or os.path.abspath(args.log) in paths:
        raise CommandError("--out, --report, --plot: expected distinct files, none of them the log")
    for path, option in outputs:
        _Outputs.check(path, option)
    if args.method == "linear" and args.friction == "sigmoid":
        raise CommandError("--friction sigmoid: the sigmoid model is not linear in its parameters; use --method consistent "
                           "(--method linear keeps the arm's own sigmoid friction as known)")
    steps = int(_positive(args.steps, "--steps", "a number of iterations")) if args.steps is not None else 500
    regularization = _numbers(args.regularization, "--regularization")[0]
    if regularization < 0:
        raise CommandError(f"--regularization: expected a weight >= 0, got {regularization:g}")
    rate = _positive(args.rate, "--rate", "a sample rate [Hz]") if args.rate is not None else None
    cutoff = _positive(args.cutoff, "--cutoff", "a cutoff frequency [Hz]") if args.cutoff is not None else None
    fit_until = _numbers(args.fit_until, "--fit-until")[0] if args.fit_until is not None else None
    if args.plot:
        from .plotting import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as exc:
            raise CommandError(str(exc), EXIT_FAILURE) from None

    arm = _load_arm(args.arm)
    try:
        raw = load_log(args.log, arm)
    except FileNotFoundError:
        raise CommandError(f"{args.log}: no such file") from None
    except (LogError, OSError) as exc:
        raise CommandError(_one_line(exc)) from None
    where = os.path.basename(args.log)
    if raw.tau is None:
        raise CommandError(f"{where}: no torque columns (tau1..tau{arm.n}): identification fits the parameters to measured joint torques")
    fit_raw, held_raw = (raw, None) if fit_until is None else raw.split(fit_until)
    if held_raw is not None and len(held_raw) == 0:
        raise CommandError(f"--fit-until: {fit_until:g} s is after the log's last sample (t = {raw.t[-1]:g} s): nothing is held out")
    preprocessing = dict(rate=rate, cutoff=cutoff, velocity="auto")
    try:
        if len(fit_raw) < 3:
            raise LogError(f"{where}: only {len(fit_raw)} samples before --fit-until {fit_until:g} s")
        fit_log = preprocess_log(fit_raw, **preprocessing)
        held = None if held_raw is None else preprocess_log(held_raw, **preprocessing, trim=0.0, filter_torque=False)
    except LogError as exc:
        raise CommandError(f"cannot identify from {where}: {_one_line(exc)}") from None

    # The linear (base-parameter) fit: identifiability check, condition number, standard deviations.
    try:
        linear = identify_linear(arm, fit_log)
    except IdentificationError as exc:
        raise CommandError(f"cannot identify {arm.name} from {where}: {_one_line(exc)}") from None
    if args.method == "linear":
        fitted, optimizer = linear.arm, None
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ci.PriorNudgedWarning)
            fit = ci.fit_consistent(arm, fit_log.q, fit_log.dq, fit_log.ddq, fit_log.tau, friction=args.friction,
                                    regularization=regularization, max_steps=steps)
        for w in caught:
            print(f"jaxarm: warning: {_one_line(w.message)}", file=sys.stderr)
        fitted = fit.arm
        optimizer = {"iterations": fit.iterations, "converged": fit.converged, "message": fit.message,
                     "regularization": regularization, "loss_history_first_last": [float(fit.loss_history[0]), float(fit.loss_history[-1])]}
    fitted = fitted.replace(name=f"{arm.name}-identified")

    rmse_fit = torque_rmse(fit_log.tau, predict_torques(fitted, fit_log.q, fit_log.dq, fit_log.ddq))
    rmse_held = None if held is None else torque_rmse(held.tau, predict_torques(fitted, held.q, held.dq, held.ddq))
    consistency = consistency_report(fitted)
    report = {
        "log": os.path.abspath(args.log),
        "arm": arm.name,
        "method": args.method,
        "friction": args.friction if args.method == "consistent" else "viscous-coulomb (linear)",
        "fit_until": fit_until,
        "preprocessing": {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in fit_log.info.items()},
        "samples": {"fit": len(fit_log), "heldout": 0 if held is None else len(held)},
        "rmse": {"fit": rmse_fit.tolist(), "heldout": None if rmse_held is None else rmse_held.tolist(),
                 "heldout_torque": "measured (not filtered)", "fit_torque": "filtered like q and dq" if cutoff else "as logged"},
        "linear": linear.report(),
        "condition_number": linear.condition_number,
        "optimizer": optimizer,
        "consistency": {label: {"ok": bool(r.ok), "problems": list(r.problems)} for label, r in consistency.items()},
        "consistent": all(r.ok or r.massless for r in consistency.values()),
    }
    comment = (f"{fitted.name}: identified by 'jaxarm identify' ({args.method}) from {where}"
               + (f" (t < {fit_until:g} s)" if fit_until is not None else ""))
    text = arm_to_toml(fitted, comment=comment)
    files = _Outputs()
    try:
        files.write(args.out, lambda f: f.write(text.encode("utf-8")))
        if args.report:
            files.write(args.report, lambda f: f.write((json.dumps(report, indent=2) + "\n").encode("utf-8")))
        if args.plot:
            shown = held if held is not None else fit_log
            fmt = os.path.splitext(args.plot)[1].lstrip(".").lower() or "png"
            files.write(args.plot, _identify_plot(fmt, shown.t, shown.tau,
                                                  predict_torques(fitted, shown.q, shown.dq, shown.ddq),
                                                  "held-out part" if held is not None else "fitted part"))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write the results: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()

    print(f"{arm.name}: identified from {where} ({args.method}; {len(fit_log)} samples"
          + (f", held out t >= {fit_until:g} s" if fit_until is not None else "") + ")")
    rows = [[j + 1, f"{rmse_fit[j]:.4g}", "-" if rmse_held is None else f"{rmse_held[j]:.4g}"] for j in range(arm.n)]
    print(_table(["joint", "RMSE fit", "RMSE held-out"], rows, indent=""))
    print(f"base regressor: rank {linear.rank}, condition number {linear.condition_number:.4g}")
    bad = [label for label, r in consistency.items() if not (r.ok or r.massless)]
    print("physically consistent: " + ("yes" if not bad else "NO (" + ", ".join(bad) + ")"))
    print("wrote " + ", ".join(p for p, _ in outputs))
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .integrators import METHODS

    parser = _Parser(prog="jaxarm", description="Differentiable robot-arm dynamics in JAX: inspect arms, "
                     "compute inverse/forward dynamics, simulate.",
                     epilog="ARM is a bundled arm name (e.g. puma560) or a path to an arm .toml file.")
    parser.add_argument("--version", action="version", version=f"jaxarm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

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
            "The run has ceil(duration / dt) steps. Results (.npz): t (T+1,), q, qd ([B,] T+1, n),\n"
            "qdd, tau, u ([B,] T, n), arm, dt, method, q0, qd0 (and target, kp, kd for pd)."
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
    p.add_argument("--out", required=True, metavar="FILE.npz", help="results file")
    p.add_argument("--csv", metavar="FILE.csv", help="also write t, q, qd, tau as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="also plot q, qd, tau against time (needs matplotlib)")
    strict(p)
    p.set_defaults(func=_cmd_simulate)

    p = arm_command("export", "write the arm as URDF and/or MuJoCo MJCF (for viewers and other simulators)")
    p.add_argument("--urdf", metavar="FILE.urdf", help="URDF output (rotor inertia has no URDF field and is dropped)")
    p.add_argument("--mjcf", metavar="FILE.xml", help="MuJoCo MJCF output")
    p.add_argument("--timestep", default="0.001", metavar="DT", help="MJCF option timestep (default 0.001)")
    strict(p)
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "identify", help="fit an arm's inertial, drive and friction parameters to a torque log",
        description="fit an arm's inertial, drive and friction parameters to a logged experiment (t, q*, "
        "dq*, tau* columns; CSV or NPZ) and write the identified arm file",
        epilog="--method consistent (default): every link physically consistent by construction (log-Cholesky "
        "pseudo-inertia, optax L-BFGS), regularized towards ARM's values; --method linear: least squares on the "
        "base parameters (may be inconsistent). The log must excite every base parameter: a rank-deficient or "
        "too short log is refused. Real logs need --cutoff (e.g. --rate 1000 --cutoff 10 for the Panda).",
    )
    p.add_argument("log", metavar="LOG", help="log file (.csv or .npz) with t, q1..qn, optional dq1..dqn, tau1..taun")
    p.add_argument("--arm", required=True, metavar="ARM", help="the arm to identify (bundled name or .toml): kinematics, and the prior / start")
    p.add_argument("--out", required=True, metavar="FILE.toml", help="identified arm file")
    p.add_argument("--report", metavar="FILE.json", help="JSON report: RMSE per joint, condition number, standard deviations, consistency")
    p.add_argument("--plot", metavar="FILE.png", help="measured vs predicted torques (held-out part if any)")
    p.add_argument("--method", choices=IDENTIFY_METHODS, default="consistent", help="default consistent")
    p.add_argument("--fit-until", metavar="T", help="fit on t < T, report held-out RMSE on t >= T (default: fit on all)")
    p.add_argument("--friction", choices=["viscous-coulomb", "sigmoid"], default="viscous-coulomb",
                   help="friction model to fit (consistent method; default viscous-coulomb)")
    p.add_argument("--rate", metavar="HZ", help="resample to this uniform rate (default: the log's median rate)")
    p.add_argument("--cutoff", metavar="HZ", help="zero-phase Butterworth low-pass of q, dq, tau before differentiating (default none)")
    p.add_argument("--steps", metavar="N", help="L-BFGS iterations of the consistent fit (default 500)")
    p.add_argument("--regularization", default="1e-3", metavar="W", help="weight of the pull towards ARM's values (default 1e-3)")
    p.set_defaults(func=_cmd_identify)

    p = sub.add_parser("plot", help="plot a saved run", description="plot a saved run (jaxarm simulate --out)")
    p.add_argument("results", metavar="RESULTS.npz")
    p.add_argument("--out", metavar="FILE.png", help="image file (default: RESULTS with .png)")
    p.set_defaults(func=_cmd_plot)
    return parser


def _enable_compilation_cache() -> None:
    """Keep compiled XLA programs in a persistent cache, so only the first run of a command pays
    the compile time. Location: $JAXARM_CACHE_DIR, else $XDG_CACHE_HOME/jaxarm/xla, else
    ~/.cache/jaxarm/xla; JAXARM_CACHE_DIR=off disables it. A cache already configured for JAX
    (JAX_COMPILATION_CACHE_DIR) is left alone."""
    import jax

    setting = os.environ.get("JAXARM_CACHE_DIR")
    if setting is not None and setting.strip().lower() in ("", "0", "off", "no", "false", "none"):
        return
    if jax.config.jax_compilation_cache_dir:
        return
    if setting is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        setting = os.path.join(base, "jaxarm", "xla")
    try:
        os.makedirs(setting, exist_ok=True)
    except OSError:
        return  # no writable cache: compile every time
    jax.config.update("jax_compilation_cache_dir", setting)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def main(argv=None) -> int:
    """Run the ``jaxarm`` command with ``argv`` (default ``sys.argv[1:]``); returns the exit code.

    Called without argv (as the ``jaxarm`` program), it also enables the persistent compilation
    cache (see _enable_compilation_cache); in-process calls with an explicit argv leave JAX's
    configuration alone apart from float64.
    """
    import jax

    jax.config.update("jax_enable_x64", True)
    if argv is None:
        _enable_compilation_cache()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(os.environ.get("JAXARM_DEBUG"))
    try:
        parser = build_parser()
        args = parser.parse_args(_protect_negative_numbers(argv))
        if getattr(args, "func", None) is None:
            raise CommandError("expected a command: info, inverse, forward, simulate, export, plot or identify (see 'jaxarm --help')")
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
