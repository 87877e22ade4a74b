"""Puma 560 point-to-point reach by trajectory optimization: DDP, iLQR, shooting and multiple
shooting on one problem, then TV-LQR tracking under a payload-mass error, and the cost of a
rollout gradient.

    python experiments/trajopt_puma.py [--plot trajopt_puma.png] [--quick] [--multiple-shooting]

The problem. The Puma 560 (arms/puma560.toml, its torque limits 97.6, 186.4, 89.4, 24.2, 20.1,
21.3 N m) holds a 2 kg payload (a 5 cm sphere, 5 cm out along the tool z axis). It starts at rest
at q0 = (0, 45, -180, 0, 45, 0) deg (Corke's nominal pose "qn") and must bring its tool 0.5 m
away, to p0 + (0, 0.3, 0.4) m, in 1.0 s, ending at rest, minimizing the effort
sum_k sum_i (u_ki / u_max,i)^2 dt. Reaching and stopping are terminal costs (1e4 / m^2 on the
position error, 1e2 / (rad/s)^2 on the final joint speed); torque limits by squashing
(u = u_max tanh z) in shooting, by augmented Lagrangian in iLQR (its default, see jaxarm.trajopt.ilqr);
joint position limits by augmented Lagrangian.

Warm start (``--warm-start``, default ``min_jerk``): a damped-least-squares IK solution of the
target from q0 (``trajopt.position_ik``), the minimum-jerk joint path to it in 1 s and the torques
of that path by inverse dynamics (``trajopt.reach_warm_start``); its rollout is printed first
(``warm_start`` line). ``hold`` holds the start pose (gravity torques), the old start.

Discretization. RK3 (Kutta, the rollout's default) at dt = 10 ms, the input held over each step
(a 100 Hz zero-order hold): T = 100 steps, 600 decision variables. The slowest-to-integrate terms
are the drives: reflected rotor inertia against viscous friction and the Coulomb friction, which is
smoothed to tanh(qd / 0.2 rad/s) (``--coulomb-scale``, ``coulomb_velocity_scale``; the exact sign
makes the cost non-differentiable at rest, exactly where a rest-to-rest motion starts and ends).
A sharper 0.05 rad/s was the old default: then the wrist joints, which barely move, sit in the
steep part of the tanh, iLQR's linear model of the step holds only for tiny changes, its line
search settles at steps of 1/16 and it takes 57-88 iterations at dt = 20 ms (see docs/guide/trajopt.md);
at 0.2 rad/s it converges in about 35. Their rates are below ~150 1/s, so h * rate <= 1.5,
inside RK3's stability interval (2.51) with margin. The check is
printed: ``resim_position_error`` re-simulates the optimized input at dt = 1 ms (same 10 ms hold)
and reports how far the final tool position moves.

Tracking. The optimized torques are replayed open loop and with TV-LQR (jaxarm.tvlqr on the RK3
linearization about the optimized trajectory, ``jaxarm.lqr.tvlqr_tracking``; Q = diag(1e4 for q, 1e2 for qd), R = diag(1/u_max^2),
Qf = 10 Q) on a "true" arm whose payload is 10 % heavier (2.2 kg) than the model's (2.0 kg).

Gradient cost. ``grad_over_forward``: the time of the gradient of a scalar cost through a
1000-step RK3 rollout of the Puma (dt = 1 ms) with respect to all 6000 torque inputs, divided by
the time of one forward rollout, both jitted with jaxarm's XLA options (as the benchmark), compile
excluded, median of repeats, measured in the same process: ``value`` with the discrete adjoint
(``rollout(..., adjoint=True)``, jaxarm.adjoint), ``autodiff_value`` with plain reverse mode.
Timings on a shared machine are noisy: compare the ratios, not the seconds. Shooting's gradients
are plain reverse mode (``--adjoint``: the discrete adjoint).

Solvers (``--solvers``, default ``ddp,ilqr,shooting``): ``ddp`` solves the same problem written
as an OCP (``trajopt.reach_ocp``; torque limits as a box in the backward pass), ``ilqr``,
``shooting`` and ``multiple_shooting`` the ``ReachProblem`` itself. Each is compiled as a user
should call it: a ``jax.jit`` of a function that closes over the arm (and, for ``ddp``, the OCP),
so that the arm's numbers are constants of the program; ``compile_seconds`` is trace, lowering
and XLA's compile of that function.

Prints one JSON line per solver run (solver, iterations, seconds, cost, max_violation, converged,
plus position_error m, terminal_speed rad/s, max_torque_fraction, compile_seconds,
resim_position_error m), one per tracking run and one ``grad_over_forward`` metric line.
``--verbose`` prints each iLQR iteration (cost, relative change, alpha, regularization) to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import trajopt  # noqa: E402
from jaxarm.arm_files import write_atomic  # noqa: E402

PAYLOAD_KG = 2.0
PAYLOAD_COM = (0.0, 0.0, 0.05)
PAYLOAD_RADIUS = 0.05


def puma(payload_mass, coulomb_scale):
    arm = jaxarm.load_arm("puma560")
    drives = dataclasses.replace(arm.drives, coulomb_velocity_scale=np.full(arm.n, coulomb_scale))
    inertia = 0.4 * payload_mass * PAYLOAD_RADIUS**2 * np.ones(3)  # solid sphere
    return arm.replace(drives=drives).with_payload(payload_mass, PAYLOAD_COM, inertia)


def timed(fn, *args, repeats=1, options=None):
    """(result, compile seconds, median run seconds) of a jitted call."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile(compiler_options=options or None)
    t_compile = time.perf_counter() - t0
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return out, t_compile, statistics.median(times)


def report(solver, res, arm, problem, seconds, t_compile, dt_fine_error):
    tool = np.asarray(jaxarm.tool_pose(arm, res.q[-1])[:3, 3])
    line = {
        "solver": solver,
        "iterations": int(res.iterations),
        "seconds": round(seconds, 4),
        "cost": float(res.cost),
        "max_violation": float(res.max_violation),
        "converged": bool(res.converged),
        "position_error": float(np.linalg.norm(tool - np.asarray(problem.target))),
        "terminal_speed": float(np.linalg.norm(np.asarray(res.qd[-1]))),
        "max_torque_fraction": float(np.max(np.abs(np.asarray(res.u)) / np.asarray(arm.limits.torque))),
        "compile_seconds": round(t_compile, 2),
        "resim_position_error": dt_fine_error,
    }
    print(json.dumps(line), flush=True)


def rollout_summary(arm, problem, u):
    """Cost, final tool-position error and joint speed of a rollout of u (the warm start)."""
    traj = jaxarm.rollout(arm, problem.q0, problem.qd0, u, float(problem.dt))
    tool = np.asarray(jaxarm.tool_pose(arm, traj.q[-1])[:3, 3])
    return {"cost": float(trajopt.trajectory_cost(arm, problem, traj.q, traj.qd, u)),
            "position_error": float(np.linalg.norm(tool - np.asarray(problem.target))),
            "terminal_speed": float(np.linalg.norm(np.asarray(traj.qd[-1])))}


def resim_error(arm, problem, u, hold):
    """Final tool-position change when u (held for dt) is re-simulated with steps dt / hold."""
    dt = float(problem.dt)
    coarse = jaxarm.rollout(arm, problem.q0, problem.qd0, u, dt)
    fine = jaxarm.rollout(arm, problem.q0, problem.qd0, jnp.repeat(u, hold, axis=0), dt / hold)
    p = lambda q: np.asarray(jaxarm.tool_pose(arm, q)[:3, 3])  # noqa: E731
    return float(np.linalg.norm(p(coarse.q[-1]) - p(fine.q[-1])))


def track(nominal_arm, true_arm, problem, res, args):
    """Open-loop replay and TV-LQR tracking of the optimized trajectory on the heavier arm."""
    n, dt = nominal_arm.n, float(problem.dt)
    u = res.u
    lines = []
    open_loop = jaxarm.rollout(true_arm, problem.q0, problem.qd0, u, dt)
    lines.append(("open_loop", open_loop))
    from jaxarm.lqr import tvlqr_tracking

    Q = jnp.diag(jnp.concatenate([jnp.full(n, 1e4), jnp.full(n, 1e2)]))
    R = jnp.diag(1.0 / jnp.asarray(nominal_arm.limits.torque) ** 2)
    policy, _ = tvlqr_tracking(nominal_arm, res.q, res.qd, u, dt, Q, R, 10.0 * Q)
    closed = jaxarm.rollout(true_arm, problem.q0, problem.qd0, policy, dt, steps=u.shape[0])  # clips at the torque limits
    lines.append(("tvlqr", closed))
    for name, traj in lines:
        dq = np.abs(np.asarray(traj.q) - np.asarray(res.q))
        p_true = np.asarray(jax.vmap(lambda q: jaxarm.tool_pose(true_arm, q)[:3, 3])(traj.q))
        p_nom = np.asarray(jax.vmap(lambda q: jaxarm.tool_pose(nominal_arm, q)[:3, 3])(res.q))
        tool_err = np.linalg.norm(p_true - p_nom, axis=1)
        print(json.dumps({
            "tracking": name,
            "payload_nominal_kg": PAYLOAD_KG,
            "payload_true_kg": 1.1 * PAYLOAD_KG,
            "max_joint_error_rad": float(dq.max()),
            "rms_tool_error_m": float(np.sqrt(np.mean(tool_err**2))),
            "final_tool_error_m": float(tool_err[-1]),
            "max_torque_fraction": float(np.max(np.abs(np.asarray(traj.tau)) / np.asarray(true_arm.limits.torque))),
        }), flush=True)
    return lines


def grad_over_forward(repeats):
    """Time of d(cost)/d(6000 torques) through 1000 RK3 steps over the time of the forward rollout."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jaxarm.PhysicalConsistencyWarning)
        arm = jaxarm.load_arm("puma560")
    n, T, dt = arm.n, 1000, 1e-3
    rng = np.random.default_rng(0)
    q0 = jnp.asarray([0, np.pi / 4, -np.pi, 0, np.pi / 4, 0])
    tau = jnp.asarray(rng.uniform(-2, 2, (T, n))) + jaxarm.gravity_torques(arm, q0)
    options = jaxarm.compiler_options()
    out, grads = {}, {}
    for adjoint in (False, True):
        def cost(u, adjoint=adjoint):
            traj = jaxarm.rollout(arm, q0, jnp.zeros(n), u, dt, adjoint=adjoint, on_divergence="flag")
            return jnp.sum(traj.q[-1] ** 2) + 1e-6 * jnp.sum(u**2)

        _, _, t_fwd = timed(cost, tau, repeats=repeats, options=options)
        grads[adjoint], t_compile, t_grad = timed(jax.grad(cost), tau, repeats=repeats, options=options)
        out[adjoint] = (t_fwd, t_grad, t_compile)
    diff = float(jnp.max(jnp.abs(grads[True] - grads[False])) / jnp.max(jnp.abs(grads[False])))
    r0, r1 = (out[a][1] / out[a][0] for a in (False, True))
    print(json.dumps({
        "metric": "grad_over_forward", "value": round(r1, 3), "autodiff_value": round(r0, 3),
        "forward_seconds": out[True][0], "grad_seconds": out[True][1], "grad_seconds_autodiff": out[False][1],
        "grad_compile_seconds": out[True][2], "grad_compile_seconds_autodiff": out[False][2],
        "adjoint_vs_autodiff_relative_difference": diff, "steps": T, "inputs": T * n,
    }), flush=True)


def plot(path, arm, problem, runs, tracking):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for (name, res), style in zip(runs, ("-", "--", ":", "-.")):
        t = np.arange(res.q.shape[0]) * float(problem.dt)
        axes[0, 0].plot(t, np.asarray(res.q), style)
        tool = np.asarray(jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(res.q))
        for i, c in enumerate("xyz"):
            axes[0, 1].plot(t, tool[:, i], style, label=f"{name} {c}")
        axes[1, 0].plot(t[:-1], np.asarray(res.u) / np.asarray(arm.limits.torque), style)
    axes[0, 1].plot([t[-1]] * 3, np.asarray(problem.target), "k*", label="target")
    for name, traj in tracking:
        tool = np.asarray(jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(traj.q))
        axes[1, 1].plot(np.asarray(traj.t), tool, label=[f"{name} {c}" for c in "xyz"])
    axes[0, 0].set(title="joint angles (rad); line style = solver", xlabel="t (s)")
    axes[0, 1].set(title="tool position (m)", xlabel="t (s)")
    axes[0, 1].legend(fontsize=7)
    axes[1, 0].set(title="torque / limit", xlabel="t (s)")
    axes[1, 1].set(title="tool position under a 10 % heavier payload (m)", xlabel="t (s)")
    axes[1, 1].legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plot", help="write joint, tool and torque plots to this PNG")
    p.add_argument("--quick", action="store_true", help="smoke run: dt = 20 ms, fewer repeats")
    p.add_argument("--coulomb-scale", type=float, default=0.2,
                   help="Coulomb smoothing velocity (rad/s); 0.05 makes iLQR slow (see the docstring)")
    p.add_argument("--multiple-shooting", action="store_true", help="also solve by multiple shooting (10 segments)")
    p.add_argument("--solvers", default="ddp,ilqr,shooting", help="comma-separated: ddp, ilqr, shooting, multiple_shooting")
    p.add_argument("--warm-start", choices=("min_jerk", "hold"), default="min_jerk",
                   help="initial torques: minimum-jerk path to an IK solution by inverse dynamics (default), "
                        "or hold the start pose")
    p.add_argument("--adjoint", action="store_true", help="shooting gradients by the discrete adjoint (default: plain reverse mode)")
    p.add_argument("--skip-tracking", action="store_true", help="no TV-LQR tracking run")
    p.add_argument("--skip-benchmark", action="store_true", help="no grad_over_forward measurement")
    p.add_argument("--verbose", action="store_true", help="print every iLQR iteration to stderr")
    args = p.parse_args(argv)

    arm = puma(PAYLOAD_KG, args.coulomb_scale)
    true_arm = puma(1.1 * PAYLOAD_KG, args.coulomb_scale)
    dt = 0.02 if args.quick else 0.01
    T = int(round(1.0 / dt))
    q0 = jnp.asarray([0, np.pi / 4, -np.pi, 0, np.pi / 4, 0])
    target = jaxarm.tool_pose(arm, q0)[:3, 3] + jnp.asarray([0.0, 0.3, 0.4])  # 0.5 m away
    problem = trajopt.reach_problem(arm, q0, target, dt, position=1e4, velocity=1e2)
    if args.warm_start == "hold":
        u0 = jnp.tile(jaxarm.gravity_torques(arm, q0), (T, 1))  # hold the start pose
    else:  # minimum-jerk path to a damped-least-squares IK solution, torques by inverse dynamics
        u0 = trajopt.reach_warm_start(arm, problem, T)
    warm = rollout_summary(arm, problem, u0)
    print(json.dumps({"warm_start": args.warm_start, **warm}), flush=True)
    hold = int(round(dt / 1e-3))

    # every solver closes over the arm (a jit argument would be traced: nothing of the arm folds,
    # and the Puma's shooting took 110 s to compile instead of 14 s, iLQR 20 s instead of 14 s)
    # ddp starts from the warm start's rollout (feasible): from the start state at every knot (its
    # default) with these inputs it took 96 iterations to a local optimum 0.26 % higher (0.197319)
    reach = trajopt.reach_ocp(arm, problem, T)

    def ddp_from_rollout(pr, u):
        traj = jaxarm.rollout(arm, pr.q0, pr.qd0, u, pr.dt, on_divergence="flag")
        return trajopt.ddp(reach, u, jnp.concatenate([traj.q, traj.qd], axis=1), max_iterations=200)

    available = {
        "ddp": ddp_from_rollout,
        "ilqr": lambda pr, u: trajopt.ilqr(arm, pr, u, max_iterations=100),
        "shooting": lambda pr, u: trajopt.shooting(arm, pr, u, max_iterations=3000, adjoint=args.adjoint),
        "multiple_shooting": lambda pr, u: trajopt.multiple_shooting(arm, pr, u, segments=10, max_iterations=3000, adjoint=args.adjoint),
    }
    names = args.solvers.split(",") + (["multiple_shooting"] if args.multiple_shooting else [])
    unknown = [s for s in names if s not in available]
    if unknown:
        p.error(f"--solvers: unknown solver(s) {unknown}; choose from {sorted(available)}")
    solvers = [(s, available[s]) for s in names]
    runs = []
    for name, solve in solvers:
        res, t_compile, seconds = timed(solve, problem, u0, options=jaxarm.compiler_options())
        report(name, res, arm, problem, seconds, t_compile, resim_error(arm, problem, res.u, hold))
        runs.append((name, res))
        if name == "ilqr" and args.verbose:
            h = res.history
            for k in range(int(res.iterations)):
                print(json.dumps({"iteration": k, "cost": float(h.cost[k]), "rel_change": float(h.rel_change[k]),
                                  "alpha": float(h.alpha[k]), "regularization": float(h.regularization[k])}), file=sys.stderr)
    tracking = []
    if not args.skip_tracking:
        best = dict(runs).get("ddp", dict(runs).get("ilqr", runs[0][1]))
        tracking = track(arm, true_arm, problem, best, args)
    if not args.skip_benchmark:
        grad_over_forward(3 if args.quick else 7)
    if args.plot:
        plot(args.plot, arm, problem, runs, tracking)


if __name__ == "__main__":
    main()
