"""Receding-horizon control: the Puma 560's tool tracks a moving target while it holds a payload
20 % heavier than the model it plans on.

    python experiments/trajopt_mpc.py [--plot trajopt_mpc.png] [--seconds 4] [--horizon 50]

Planning model: the bundled Puma 560 with a 2 kg payload (Coulomb friction smoothed to
tanh(qd / 0.2 rad/s)). Simulated arm: the same with 2.4 kg. Target: a point circling at 0.5 Hz on a
15 cm circle in front of the arm. Every control step (dt = 20 ms) :func:`jaxarm.trajopt.mpc_step`
replans over the horizon (50 knots = 1 s, RK3) from the measured state, warm-started from the
previous plan moved one step on, with one DDP iteration (``--iterations``; the real-time iteration
scheme of Diehl, Bock & Schloeder 2005: the warm start is nearly optimal, and 3 iterations track
no better here); the first input is applied to
the simulated arm for one step (``jaxarm.rollout``). The cost along the horizon:
sum_k dt (1e4 |p_tool(q_k) - target(t_k)|^2 + sum_i (u_ki / u_max,i)^2 + 0.1 |qd_k|^2), the
targets of the window being a ``params`` entry (new values every step, same shapes: no recompile).

One JSON line: the time of the solver's step (median and 95th percentile, after the first), the
whole control loop's time per step (new targets by ``problem.replace``, the solve, one step of the
simulated arm), the tracking error (RMS and max, after the first second), and the same for the
first plan replayed open loop, which does not know of the heavier payload nor replan.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import trajopt  # noqa: E402
from jaxarm.trajopt import terms  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trajopt_puma import puma  # noqa: E402  (payload mass, Coulomb smoothing scale)

DT = 0.02
Q0 = np.array([0.0, 0.785, -3.14, 0.0, 0.785, 0.0])


def target(t, center):
    w = 2 * np.pi * 0.5
    t = np.asarray(t)[..., None]
    return center + 0.15 * np.concatenate([np.cos(w * t) - 1.0, np.sin(w * t), np.zeros_like(t)], axis=-1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--horizon", type=int, default=50)
    ap.add_argument("--iterations", type=int, default=1, help="DDP iterations per control step")
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    if not args.seconds > 1.0:
        ap.error(f"--seconds: expected more than 1 s (the tracking error is measured after the first second), got {args.seconds:g}")
    model, true_arm = puma(2.0, 0.2), puma(2.4, 0.2)
    H = args.horizon
    lim = np.asarray(model.limits.torque)
    center = np.asarray(jaxarm.tool_pose(model, Q0)[:3, 3])

    def tracking(arm, x, u, k, p):
        return jnp.sqrt(1e4) * (jaxarm.tool_pose(arm, x[: arm.n])[:3, 3] - p["targets"][k])

    costs = (terms.residual(tracking, when="path", uses_input=False, name="tracking")
             + terms.effort(1.0 / lim**2) + terms.joint_velocity(0.1, when="path"))
    window = lambda t0: jnp.asarray(target(t0 + DT * np.arange(H + 1), center))  # noqa: E731
    problem = trajopt.ocp(model, Q0, H, DT, costs=costs, params={"targets": window(0.0)})

    t0 = time.perf_counter()
    # the model arm closed over (a constant of the compiled programs, its numbers folded); the
    # targets, the measured state and the previous plan are the arguments
    first = jax.block_until_ready(jaxarm.jit(lambda targets: trajopt.ddp(problem.replace(params={"targets": targets})))(window(0.0)))
    first_plan_s = time.perf_counter() - t0
    step = jaxarm.jit(lambda targets, x, plan: trajopt.mpc_step(problem.replace(params={"targets": targets}), x, plan,
                                                                max_iterations=args.iterations))
    simulate = jaxarm.jit(lambda x, u: jaxarm.rollout(true_arm, x[:6], x[6:], u[None], DT, saturate=True))

    steps = int(round(args.seconds / DT))
    x, plan = jnp.asarray(problem.x0), first
    xs, times, loop_times, converged = [np.asarray(x)], [], [], 0
    compile_s = None
    for k in range(steps):
        t_loop = time.perf_counter()
        targets = window(k * DT)
        t0 = time.perf_counter()
        plan = jax.block_until_ready(step(targets, x, plan))
        elapsed = time.perf_counter() - t0
        if k == 0:
            compile_s = elapsed
        else:
            times.append(elapsed)
        converged += int(plan.converged)
        traj = simulate(x, plan.u[0])
        x = jnp.concatenate([traj.q[-1], traj.qd[-1]])
        xs.append(np.asarray(x))
        if k:
            loop_times.append(time.perf_counter() - t_loop)
    xs = np.asarray(xs)
    t = DT * np.arange(steps + 1)
    tool = np.asarray(jax.vmap(lambda q: jaxarm.tool_pose(true_arm, q)[:3, 3])(xs[:, :6]))
    err = np.linalg.norm(tool - target(t, center), axis=1)
    late = t >= 1.0
    # the first plan (1 s) replayed open loop and held, on the heavier arm
    u_open = np.concatenate([np.asarray(first.u), np.repeat(np.asarray(first.u[-1:]), max(0, steps - H), axis=0)])[:steps]
    open_traj = jaxarm.rollout(true_arm, Q0, np.zeros(6), u_open, DT)
    tool_open = np.asarray(jax.vmap(lambda q: jaxarm.tool_pose(true_arm, q)[:3, 3])(open_traj.q))
    err_open = np.linalg.norm(tool_open - target(t, center), axis=1)
    print(json.dumps(dict(
        case="mpc_moving_target", arm="puma560", plan_payload_kg=2.0, true_payload_kg=2.4, horizon_knots=H, dt=DT,
        iterations_per_step=args.iterations, control_steps=steps, converged_steps=converged,
        step_ms_median=round(1e3 * float(np.median(times)), 2), step_ms_p95=round(1e3 * float(np.percentile(times, 95)), 2),
        loop_ms_median=round(1e3 * float(np.median(loop_times)), 2), loop_ms_p95=round(1e3 * float(np.percentile(loop_times, 95)), 2),
        first_step_s=round(compile_s, 2), first_plan_s=round(first_plan_s, 2),
        tracking_rms_mm=round(1e3 * float(np.sqrt(np.mean(err[late] ** 2))), 2), tracking_max_mm=round(1e3 * float(err[late].max()), 2),
        open_loop_rms_mm=round(1e3 * float(np.sqrt(np.mean(err_open[late] ** 2))), 1),
        device=str(jax.devices()[0]))), flush=True)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
        goal = target(t, center)
        a.plot(goal[:, 0], goal[:, 1], "k--", label="target")
        a.plot(tool[:, 0], tool[:, 1], label="MPC (plans on 2 kg, carries 2.4 kg)")
        a.plot(tool_open[:, 0], tool_open[:, 1], ":", label="first plan, open loop")
        a.set_aspect("equal")
        a.set_xlabel("x (m)")
        a.set_ylabel("y (m)")
        a.legend(fontsize=8)
        a.set_title("Puma 560 tool path, seen from above")
        b.semilogy(t, 1e3 * err, label="MPC")
        b.semilogy(t, 1e3 * err_open, ":", label="open loop")
        b.set_xlabel("t (s)")
        b.set_ylabel("tool error (mm)")
        b.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
