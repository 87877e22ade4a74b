"""Optimal-control problems written as terms, solved by box-FDDP (jaxarm.trajopt.ddp).

    python experiments/trajopt_ddp.py [--plot trajopt_ddp.png] [--cases puma_reach,puma_sweep,panda_obstacle,panda_via,batch,payloads,puma_gradient]
                                      [--plain-jit]

Cases (one JSON line each, plus one per solver where two are compared):

- ``puma_reach``: the Puma 560 reach of experiments/trajopt_puma.py (2 kg payload, Coulomb friction
  smoothed to tanh(qd / 0.2 rad/s), 0.5 m in 1 s from rest to rest, RK3, dt = 10 ms, T = 100,
  effort sum (u / u_max)^2 dt + 1e4 |p - p*|^2 + 1e2 |qd_T|^2, torque and joint limits), stated
  as terms and solved by ``ddp`` (torque limits as a box inside the backward pass) and by the
  older ``ilqr`` (torque limits by augmented Lagrangian) from the same minimum-jerk warm start.
- ``panda_obstacle``: the Panda (bundled, no friction) reaches 0.5 m in 1 s (dt = 20 ms, T = 50)
  around a 10 cm sphere centred half-way along the straight line from start to goal, which the
  unconstrained solution's tool path crosses;
  keep-out constraints on the tool point and on the wrist (link 5's origin), 2 cm margin. The
  Panda cases carry a posture and joint-speed regularization along the path (see regularization()).
- ``panda_via``: pick-and-place with the Panda: through two via points (lift at 0.3 s, carry
  at 0.7 s) to the place pose at 1.0 s, the gripper axis kept pointing down along the whole path
  (``terms.tool_axis``), ending at rest.
- ``puma_sweep``: minimum-time-like: the same Puma reach with T = 100 knots over durations 0.3-1.5 s,
  all in one ``jax.vmap`` over the problem's dt: effort, final error and peak torque against
  duration (short reaches saturate the torque box and miss the goal).
- ``puma_gradient``: gradients of the solution of ``puma_reach`` (its effort with respect to the
  goal and the links' masses) by the implicit function theorem, checked against central
  differences; the gradient's first call and warm time against the solve's.
- ``batch``: the Panda reach to 16 different goals in one ``jax.vmap``-ed call against 16 calls
  of the same compiled solver one after the other.
- ``payloads``: the same reach for 16 payloads from 0 to 3 kg: ``trajopt.solve_many`` with the
  arms batched, one ``jax.vmap`` over the stacked arms, and 16 calls of one compiled solver.

Timings: ``first_call_s`` is trace + compile + solve of a fresh function (what a user waits for
the first time), ``solve_s`` the median of 3 further calls; compiled with ``jaxarm.jit`` (jaxarm's
XLA:CPU options). ``--plain-jit`` adds the same Puma solve under a plain ``jax.jit`` (within
about 15 % of it since the solver takes the dynamics' Jacobians from inverse dynamics).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
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

PANDA_Q0 = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


def emit(**row):
    print(json.dumps(row), flush=True)


def timed(fn, *args, repeats=3):
    """(result, first-call seconds, median seconds of further calls)."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return out, first, statistics.median(times)


def tool_path(arm, q):
    return np.asarray(jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(q))


def summary(res):
    return dict(iterations=int(res.iterations), cost=float(res.cost), converged=bool(res.converged),
                max_violation=float(res.max_violation), max_gap=float(res.max_gap), status=res.reason().split(" after")[0])


# --------------------------------------------------------------------------- cases


def puma_reach_problem():
    """The Puma reach of experiments/trajopt_puma.py as terms: (arm, q0, goal, torque limits, OCP)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trajopt_puma import puma

    arm = puma(2.0, 0.2)
    q0 = jnp.array([0.0, 0.785, -3.14, 0.0, 0.785, 0.0])
    goal = jaxarm.tool_pose(arm, q0)[:3, 3] + jnp.array([0.0, 0.3, 0.4])
    lim = np.asarray(arm.limits.torque)
    costs = terms.effort(1.0 / lim**2) + terms.tool_position("goal", 1e4) + terms.joint_velocity(1e2)
    return arm, q0, goal, lim, trajopt.ocp(arm, q0, 100, 0.01, costs=costs, params={"goal": goal})


def puma_reach(args, out):
    arm, q0, goal, lim, problem = puma_reach_problem()
    reach = trajopt.reach_problem(arm, q0, goal, 0.01, position=1e4, velocity=1e2)
    u0 = trajopt.reach_warm_start(arm, reach, 100)
    res, first, solve = timed(jaxarm.jit(lambda u: trajopt.ddp(problem, u)), u0)
    emit(case="puma_reach", solver="ddp", first_call_s=round(first, 2), solve_s=round(solve, 3),
         position_error_m=float(np.linalg.norm(tool_path(arm, res.q[-1:])[0] - np.asarray(goal))),
         max_torque_fraction=float(np.max(np.abs(res.u) / lim)), **summary(res))
    ref, first, solve = timed(jaxarm.jit(lambda u: trajopt.ilqr(arm, reach, u)), u0)
    emit(case="puma_reach", solver="ilqr", first_call_s=round(first, 2), solve_s=round(solve, 3),
         iterations=int(ref.iterations), cost=float(ref.cost), converged=bool(ref.converged),
         max_violation=float(ref.max_violation))
    if args.plain_jit:
        res, first, solve = timed(jax.jit(lambda u: trajopt.ddp(problem, u)), u0, repeats=1)
        emit(case="puma_reach", solver="ddp", jit="plain jax.jit", first_call_s=round(first, 2), solve_s=round(solve, 3),
             **summary(res))
    out["puma_reach"] = (arm, res, goal)


def puma_sweep(args, out):
    """Effort against duration: the Puma reach of ``puma_reach`` with T = 100 knots and the duration
    swept, all durations in one ``jax.vmap`` over the problem's dt (the path costs rescale with it)."""
    arm, q0, goal, lim, problem = puma_reach_problem()
    durations = np.linspace(0.3, 1.5, 13)
    solve = jaxarm.jit(jax.vmap(lambda dt: trajopt.ddp(problem.replace(dt=dt))))
    res, first, warm = timed(solve, jnp.asarray(durations / 100), repeats=1)
    effort = np.sum((np.asarray(res.u) / lim) ** 2, axis=(1, 2)) * durations / 100
    error = [float(np.linalg.norm(tool_path(arm, res.q[i, -1:])[0] - np.asarray(goal))) for i in range(len(durations))]
    peak = np.max(np.abs(np.asarray(res.u)) / lim, axis=(1, 2))
    emit(case="puma_sweep", solver="ddp", durations_s=durations.round(3).tolist(), effort=effort.round(5).tolist(),
         position_error_m=[float(f"{e:.3g}") for e in error], peak_torque_fraction=peak.round(3).tolist(),
         iterations=np.asarray(res.iterations).tolist(), converged=int(np.sum(np.asarray(res.converged))),
         first_call_s=round(first, 2), solve_s=round(warm, 3))
    out["puma_sweep"] = (durations, effort, np.asarray(error), peak)


def panda():
    arm = jaxarm.load_arm("panda")
    lim = np.asarray(arm.limits.torque)
    return arm, lim


def regularization():
    """Posture and joint-speed regularization along the path (as Crocoddyl's examples carry state
    regularization): the Panda's redundant joints otherwise leave the problem ill-conditioned --
    the same reach took 200+ iterations of 1/32-1/256 steps without them, 138 with a tenth of
    these weights and 25 with them."""
    return terms.joint_position(PANDA_Q0, 1.0, when="path") + terms.joint_velocity(0.1, when="path")


def panda_obstacle(args, out):
    arm, lim = panda()
    T, dt = 50, 0.02
    p0 = tool_path(arm, PANDA_Q0[None])[0]
    goal = p0 + np.array([0.0, 0.5, 0.0])
    costs = terms.effort(1.0 / lim**2) + terms.tool_position("goal", 1e4) + terms.joint_velocity(1e2) + regularization()
    free_problem = trajopt.ocp(arm, PANDA_Q0, T, dt, costs=costs, params={"goal": goal})
    free, first_free, solve_free = timed(jaxarm.jit(lambda: trajopt.ddp(free_problem)))
    path = tool_path(arm, free.q)
    center = p0 + np.array([0.0, 0.25, 0.0])  # half-way along the straight line, across the free path
    radius, margin = 0.10, 0.02
    keep_out = (terms.keep_out_sphere(center, radius, margin=margin)
                + terms.keep_out_sphere(center, radius, link=5, margin=margin))
    problem = trajopt.ocp(arm, PANDA_Q0, T, dt, costs=costs, params={"goal": goal}, constraints=keep_out)
    # warm start from the unconstrained solution: its inputs and states (as Crocoddyl takes xs, us)
    res, first, solve = timed(jaxarm.jit(lambda u, x: trajopt.ddp(problem, u, x)), free.u, free.x)
    path_c = tool_path(arm, res.q)
    emit(case="panda_obstacle", solver="ddp", first_call_s=round(first, 2), solve_s=round(solve, 3),
         unconstrained_min_clearance_m=float(np.min(np.linalg.norm(path - center, axis=1)) - radius),
         min_clearance_m=float(np.min(np.linalg.norm(path_c - center, axis=1)) - radius),
         unconstrained_cost=float(free.cost), unconstrained_first_call_s=round(first_free, 2),
         position_error_m=float(np.linalg.norm(path_c[-1] - goal)), **summary(res))
    out["panda_obstacle"] = (arm, free, res, center, radius, goal)


def panda_via(args, out):
    arm, lim = panda()
    T, dt = 50, 0.02
    p0 = tool_path(arm, PANDA_Q0[None])[0]
    lift, carry, place = p0 + np.array([0.0, 0.0, 0.15]), p0 + np.array([0.0, 0.35, 0.15]), p0 + np.array([0.0, 0.45, 0.0])
    down = np.array([0.0, 0.0, -1.0])
    costs = (terms.effort(1.0 / lim**2) + terms.tool_position(lift, 1e4, when=(0.3,)) + terms.tool_position(carry, 1e4, when=(0.7,))
             + terms.tool_position(place, 1e4) + terms.tool_axis((0.0, 0.0, 1.0), down, 10.0, when="path")
             + terms.joint_velocity(1e2) + regularization())
    problem = trajopt.ocp(arm, PANDA_Q0, T, dt, costs=costs)
    res, first, solve = timed(jaxarm.jit(lambda: trajopt.ddp(problem)))
    path = tool_path(arm, res.q)
    R = np.asarray(jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 2])(res.q))
    tilt = np.degrees(np.arccos(np.clip(R @ down, -1, 1)))
    emit(case="panda_via", solver="ddp", first_call_s=round(first, 2), solve_s=round(solve, 3),
         via_errors_m=[float(np.linalg.norm(path[15] - lift)), float(np.linalg.norm(path[35] - carry)),
                       float(np.linalg.norm(path[T] - place))],
         max_tilt_deg=float(tilt.max()), start_tilt_deg=float(tilt[0]), **summary(res))
    out["panda_via"] = (arm, res, (lift, carry, place))


def batch(args, out):
    arm, lim = panda()
    T, dt = 50, 0.02
    p0 = tool_path(arm, PANDA_Q0[None])[0]
    rng = np.random.default_rng(0)
    goals = p0 + np.column_stack([rng.uniform(-0.2, 0.2, 16), rng.uniform(0.2, 0.5, 16), rng.uniform(-0.2, 0.2, 16)])
    costs = terms.effort(1.0 / lim**2) + terms.tool_position("goal", 1e4) + terms.joint_velocity(1e2) + regularization()
    problem = trajopt.ocp(arm, PANDA_Q0, T, dt, costs=costs, params={"goal": goals[0]})
    batched = jaxarm.jit(jax.vmap(lambda g: trajopt.ddp(problem.replace(params={"goal": g}))))
    one = jaxarm.jit(lambda g: trajopt.ddp(problem.replace(params={"goal": g})))
    res, first_b, solve_b = timed(batched, jnp.asarray(goals))
    jax.block_until_ready(one(jnp.asarray(goals[0])))
    t0 = time.perf_counter()
    singles = [jax.block_until_ready(one(jnp.asarray(g))) for g in goals]
    seq = time.perf_counter() - t0
    emit(case="batch", solver="ddp", goals=16, batched_s=round(solve_b, 3), sequential_s=round(seq, 3),
         speedup=round(seq / solve_b, 2), first_call_s=round(first_b, 2), converged=int(np.sum(np.asarray(res.converged))),
         iterations_max=int(np.max(np.asarray(res.iterations))), iterations_sequential_max=max(int(s.iterations) for s in singles),
         max_cost_difference=float(np.max(np.abs(np.asarray(res.cost) - np.array([float(s.cost) for s in singles])))))


def payloads(args, out):
    """The Panda reach of ``batch`` (first goal) for 16 payloads from 0 to 3 kg at the hand (one
    robot family carrying different loads, a domain randomization): ``trajopt.solve_many`` with
    the arms batched (``jaxarm.stack_arms``; only the payload's mass differs, so the rest of the arm
    stays a constant of the program), one ``jax.vmap`` over the stacked arms (every leaf of the
    arm traced), and 16 calls of one compiled solver with the payload's mass as argument."""
    arm, lim = panda()
    T, dt = 50, 0.02
    p0 = tool_path(arm, PANDA_Q0[None])[0]
    goal = p0 + np.array([0.1, 0.35, 0.0])
    masses = np.linspace(0.0, 3.0, 16)
    arms = [arm.with_payload(m) for m in masses]
    stacked = jaxarm.stack_arms(arms)
    costs = terms.effort(1.0 / lim**2) + terms.tool_position("goal", 1e4) + terms.joint_velocity(1e2) + regularization()
    problem = trajopt.ocp(arm, PANDA_Q0, T, dt, costs=costs, params={"goal": jnp.asarray(goal)})
    stats = []
    pooled, first_p, solve_p = timed(lambda: trajopt.solve_many(problem, arm=stacked, report=stats.append))
    vmapped, first_v, solve_v = timed(jaxarm.jit(jax.vmap(lambda a: trajopt.ddp(problem.replace(arm=a)))), stacked)
    one = jaxarm.jit(lambda m: trajopt.ddp(problem.replace(arm=arm.replace(payload=dataclasses.replace(arm.payload, mass=m)))))
    jax.block_until_ready(one(jnp.asarray(masses[0])))
    t0 = time.perf_counter()
    singles = [jax.block_until_ready(one(jnp.asarray(m))) for m in masses]
    seq = time.perf_counter() - t0
    costs_seq = np.array([float(r.cost) for r in singles])
    emit(case="payloads", solver="ddp", arms=16, solve_many_s=round(solve_p, 3), solve_many_first_call_s=round(first_p, 2),
         vmap_s=round(solve_v, 3), vmap_first_call_s=round(first_v, 2), sequential_s=round(seq, 3),
         converged=[int(np.sum(np.asarray(r.converged))) for r in (pooled, vmapped)],
         arm_leaves_varying=stats[-1]["arm_leaves_varying"],
         max_relative_cost_difference=float(np.max(np.abs(np.asarray(pooled.cost) - costs_seq) / costs_seq)),
         effort_first_last=[float(costs_seq[0]), float(costs_seq[-1])])


def puma_gradient(args, out):
    """Gradients of the solution: the Puma reach's optimal effort with respect to the goal (params)
    and to the links' masses (the arm), by the implicit function theorem at the optimum (the
    solver's iterations are not differentiated), checked against central differences of converged
    solves for one entry of each. The Puma's asymmetric Coulomb levels are replaced by their mean
    (see below)."""
    arm, q0, goal, lim, problem = puma_reach_problem()
    # the Puma's Coulomb levels differ with the direction (0.395 / 0.435 N m on joint 1): smoothed by
    # tanh, the friction's slope jumps at qd = 0, where a reach from rest starts, so the problem has
    # no Hessian at its solution. Here both levels are their mean (a smooth model).
    tc = np.asarray(arm.drives.coulomb_friction)
    mean = 0.5 * (tc[:, 0] - tc[:, 1])
    arm = arm.replace(drives=dataclasses.replace(arm.drives, coulomb_friction=np.column_stack([mean, -mean])))
    problem = problem.replace(arm=arm)
    tight = dict(tol=1e-10, max_iterations=300)

    def effort(goal, masses):
        p = problem.replace(params={"goal": goal}, arm=arm.replace(links=dataclasses.replace(arm.links, mass=masses)))
        r = trajopt.ddp(p, **tight)
        return jnp.sum((r.u / lim) ** 2) * p.dt, r

    masses = jnp.asarray(arm.links.mass)
    goal = jnp.asarray(goal)
    value = jaxarm.jit(effort)
    (_, res), first_solve, solve = timed(value, goal, masses)
    grad = jaxarm.jit(jax.grad(lambda g, m: effort(g, m)[0], argnums=(0, 1)))
    (g_goal, g_mass), first, warm = timed(grad, goal, masses, repeats=2)

    def central(f, base, i, h):
        e = np.zeros(np.size(base))
        e[i] = h
        return (float(f(base + e)) - float(f(base - e))) / (2 * h)

    goal_fd = central(lambda v: value(jnp.asarray(v), masses)[0], np.asarray(goal), 2, 1e-5)
    mass_fd = central(lambda v: value(goal, jnp.asarray(v))[0], np.asarray(masses), 2, 1e-5)
    emit(case="puma_gradient", solver="ddp", converged=bool(res.converged), iterations=int(res.iterations),
         effort=float(value(goal, masses)[0]), d_effort_d_goal=np.asarray(g_goal).round(6).tolist(),
         d_effort_d_mass=np.asarray(g_mass).round(6).tolist(),
         check_goal_z=[float(np.asarray(g_goal)[2]), goal_fd], check_mass_3=[float(np.asarray(g_mass)[2]), mass_fd],
         gradient_first_call_s=round(first, 2), gradient_s=round(warm, 3), solve_s=round(solve, 3),
         solve_first_call_s=round(first_solve, 2))


def equal_axes(ax, points):
    """Equal scales on the three axes (a sphere looks like one), around the points (m, 3)."""
    points = np.asarray(points)
    center = 0.5 * (points.max(axis=0) + points.min(axis=0))
    half = 0.5 * float(np.max(points.max(axis=0) - points.min(axis=0))) + 0.02
    ax.set_xlim(center[0] - half, center[0] + half)
    ax.set_ylim(center[1] - half, center[1] + half)
    ax.set_zlim(center[2] - half, center[2] + half)
    ax.set_box_aspect((1, 1, 1))
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_zlabel("z (m)")


def plot(path, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(18, 4.5))
    if "puma_sweep" in out:
        durations, effort, error, peak = out["puma_sweep"]
        ax = fig.add_subplot(1, 3, 3)
        ax.semilogy(durations, effort, "o-", label="effort  sum (u / u_max)^2 dt")
        ax.semilogy(durations, error, "s--", label="final tool error (m)")
        ax.set_xlabel("duration of the reach (s)")
        ax2 = ax.twinx()
        ax2.plot(durations, peak, "^:", color="k", label="peak |u| / u_max")
        ax2.set_ylabel("peak torque / limit")
        ax.set_title("Puma reach: effort against duration (one vmap over dt)")
        lines = ax.get_legend_handles_labels()
        more = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8)
    if "panda_obstacle" in out:
        arm, free, res, center, radius, goal = out["panda_obstacle"]
        ax = fig.add_subplot(1, 3, 1, projection="3d")
        for r, style, label in ((free, "--", "without the obstacle"), (res, "-", "keep-out constraint")):
            p = tool_path(arm, r.q)
            ax.plot(p[:, 0], p[:, 1], p[:, 2], style, label=label)
        u, v = np.mgrid[0:2 * np.pi:20j, 0:np.pi:10j]
        ax.plot_wireframe(center[0] + radius * np.cos(u) * np.sin(v), center[1] + radius * np.sin(u) * np.sin(v),
                          center[2] + radius * np.cos(v), color="grey", linewidth=0.4)
        ax.scatter(*goal, color="k", marker="x", label="goal")
        equal_axes(ax, np.concatenate([tool_path(arm, free.q), tool_path(arm, res.q), [center - radius, center + radius]]))
        ax.set_title("Panda reach around a sphere (tool path)")
        ax.legend(fontsize=8)
    if "panda_via" in out:
        arm, res, pts = out["panda_via"]
        ax = fig.add_subplot(1, 3, 2, projection="3d")
        p = tool_path(arm, res.q)
        ax.plot(p[:, 0], p[:, 1], p[:, 2], label="tool path")
        for pt, name in zip(pts, ("lift (0.3 s)", "carry (0.7 s)", "place (1.0 s)")):
            ax.scatter(*pt, marker="o", label=name)
        equal_axes(ax, np.concatenate([p, np.asarray(pts)]))
        ax.set_title("Panda pick-and-place, gripper kept pointing down")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


CASES = {"puma_reach": puma_reach, "puma_sweep": puma_sweep, "panda_obstacle": panda_obstacle, "panda_via": panda_via,
         "batch": batch, "payloads": payloads, "puma_gradient": puma_gradient}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--plot", default=None, help="PNG of the Panda cases' tool paths")
    ap.add_argument("--plain-jit", action="store_true", help="also time the Puma solve under a plain jax.jit")
    args = ap.parse_args(argv)
    out = {}
    emit(device=str(jax.devices()[0]), jax=jax.__version__, dtype="float64")
    for name in args.cases.split(","):
        if name not in CASES:
            ap.error(f"--cases: unknown case {name!r}; expected some of {', '.join(CASES)}")
        CASES[name](args, out)
    if args.plot:
        plot(args.plot, out)


if __name__ == "__main__":
    main()
