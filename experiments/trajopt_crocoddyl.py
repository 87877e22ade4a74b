"""jaxarm's trajopt.ddp against Crocoddyl's SolverBoxFDDP on the same reach, in the same run.

    python experiments/trajopt_crocoddyl.py [--setup] [--arms ur5,panda] [--batches 1,8,64] [--quick]

The arms are example-robot-data's URDFs (the UR5; the Panda up to its hand, the fingers locked at
zero: Pinocchio's reduced model and jaxarm's URDF reader both lump them into the last link), read by
both libraries: jaxarm by ``jaxarm.load_arm(urdf, base_link=..., tip_link=...)``, Crocoddyl by
Pinocchio. The problem (experiments/crocoddyl_reach.py states it in Crocoddyl's terms): from rest
at q0, reach a point offset from the start in 1 s, T = 100 knots of dt = 10 ms, semi-implicit Euler
(Crocoddyl's IntegratedActionModelEuler: v+ = v + a dt, q+ = q + v+ dt), cost

    dt sum_k (sum_i u_ki^2 / u_max,i^2 + 1 |q_k - q0|^2 + 0.1 |qd_k|^2)  +  1e4 |p_tool(q_T) - goal|^2  +  1e2 |qd_T|^2,

the posture and joint-speed terms along the path being the state regularization Crocoddyl's
examples carry (without them the tool position leaves directions free, e.g. the UR5's last joint,
and both solvers crawl along a flat valley and stop at different points of it),

inputs boxed by the URDF's effort limits, no joint limits, no joint damping (Pinocchio's ABA has none), both solvers starting from x0 at every
knot and the gravity torques (Crocoddyl's quasi-static default).

Crocoddyl runs in its own virtual environment (crocoddyl 3.1.0 needs pin 3.8; crocoddyl 3.2 with
pin 4.1 crashes in solve): ``--setup`` creates ``.venv-crocoddyl`` beside this repository's
``pyproject.toml`` with ``crocoddyl==3.1.0 pin==3.8.0 libpinocchio==3.8.0 cmeel-urdfdom<5
cmeel-tinyxml2<11 example-robot-data``; without it, the Crocoddyl columns are skipped (one JSON
line says so) and the URDFs are not available either, so the script stops there.

Before any timing, per arm, three checks (JSON line ``check``):
- dynamics: Crocoddyl's optimal inputs rolled out by jaxarm reproduce Crocoddyl's states;
- costs: jaxarm's ``trajopt.total_cost`` of Crocoddyl's trajectory equals Crocoddyl's cost;
- optimum: both solvers' optimal costs agree to 1e-6 relative (or the line says by how much not).

Then (JSON line per figure): iterations, warm solve time (median of 3), jaxarm's first call
(trace + compile + solve, ``jaxarm.jit`` and plain ``jax.jit``), and batches of goals: one
``jax.vmap``-ed call for B goals against B sequential Crocoddyl solves (solves per second), and
the same goals through ``trajopt.solve_many`` (``--pool slots,round_iterations``, default 4,10:
a pool of 4 slots, finished problems replaced after every 10 iterations; ``--workers 1,default``
compares one pool with solve_many's default of one pool per core). ``--parts``: where
jaxarm's first call goes (lines ``first_call_parts``: a fresh jit of the same solve traced,
lowered to StableHLO and compiled by XLA apart, then run; and the lines of its optimized HLO;
under ``jaxarm.jit``'s compiler options and under a plain ``jax.jit``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import trajopt  # noqa: E402
from jaxarm.trajopt import terms  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trajopt_ddp import emit, timed  # noqa: E402  the same timing as the other trajopt experiments

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-crocoddyl"
PACKAGES = ["crocoddyl==3.1.0", "pin==3.8.0", "libpinocchio==3.8.0", "cmeel-urdfdom<5", "cmeel-tinyxml2<11", "example-robot-data"]
T, DT, W_GOAL, W_VEL, W_POSTURE, W_SPEED = 100, 0.01, 1e4, 1e2, 1.0, 0.1
ARMS = {
    # urdf (under example-robot-data's robots/), base link, tip link, q0, joints Crocoddyl locks, reach offset (m)
    "ur5": ("ur_description/urdf/ur5_robot.urdf", "base_link", "tool0", [0.0, -1.0, 1.5, -0.5, 1.57, 0.0], [],
            [0.0, 0.35, 0.3]),
    "panda": ("panda_description/urdf/panda.urdf", "panda_link0", "panda_hand",
              [0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785], ["panda_finger_joint1", "panda_finger_joint2"],
              [0.0, 0.35, 0.3]),
}


def setup():
    import venv

    if not (VENV / "bin" / "python").exists():
        venv.create(VENV, with_pip=True)
    subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", *PACKAGES], check=True)


def robots_folder(python: Path):
    """example-robot-data's robots/ folder inside the Crocoddyl environment, or None."""
    for candidate in python.parent.parent.glob("lib/python*/site-packages/cmeel.prefix/share/example-robot-data/robots"):
        return candidate
    return None


def crocoddyl(python, spec):
    proc = subprocess.run([str(python), str(ROOT / "experiments" / "crocoddyl_reach.py")], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"crocoddyl_reach.py failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


def reach_ocp(arm, q0, offset, goals: int):
    """The reach as a ``trajopt.ocp`` (the cost of the module docstring, the torque limits as the
    input box, no joint limits) and ``goals`` goals (goals, 3): the first the start's tool position
    plus ``offset``, the others scattered around it (seeded)."""
    q0 = np.asarray(q0)
    lim = np.asarray(arm.limits.torque)
    p0 = np.asarray(jaxarm.tool_pose(arm, q0)[:3, 3])
    rng = np.random.default_rng(0)
    out = p0 + np.column_stack([rng.uniform(-0.15, 0.15, goals), rng.uniform(0.2, 0.4, goals), rng.uniform(0.1, 0.3, goals)])
    out[0] = p0 + np.asarray(offset)
    costs = (terms.effort(1.0 / lim**2) + terms.tool_position("goal", W_GOAL) + terms.joint_velocity(W_VEL)
             + terms.joint_position(q0, W_POSTURE, when="path") + terms.joint_velocity(W_SPEED, when="path"))
    problem = trajopt.ocp(arm, q0, T, DT, costs=costs, params={"goal": jnp.asarray(out[0])}, method="semi_implicit_euler",
                          joint_limits=False)
    return problem, out


def run_arm(name, robots, python, batches, repeats, pool=None, parts=False, workers=(None,)):
    rel, base, tip, q0, locked, offset = ARMS[name]
    urdf = robots / rel
    arm = jaxarm.load_arm(str(urdf), base_link=base, tip_link=tip)
    # the URDF's joint damping: jaxarm reads it as viscous friction, Crocoddyl's free forward
    # dynamics (Pinocchio's ABA) leaves it out; compare the same rigid-body model
    arm = arm.replace(drives=dataclasses.replace(arm.drives, viscous_friction=np.zeros(arm.n)))
    q0 = np.asarray(q0)
    lim = np.asarray(arm.limits.torque)
    problem, goals = reach_ocp(arm, q0, offset, max(batches))
    goal = goals[0]
    w_effort = 1.0 / lim**2

    spec = dict(urdf=str(urdf), tip_frame=tip, locked=locked, q0=q0.tolist(), goals=goals.tolist(), T=T, dt=DT,
                w_effort=w_effort.tolist(), w_goal=W_GOAL, w_vel=W_VEL, w_posture=W_POSTURE, w_speed=W_SPEED, u_lb=(-lim).tolist(), u_ub=lim.tolist(),
                max_iterations=200, repeats=repeats)
    croc = crocoddyl(python, spec)
    c0 = croc["solves"][0]
    xs_c, us_c = np.asarray(croc["trajectory"]["xs"]), np.asarray(croc["trajectory"]["us"])

    solve = jaxarm.jit(lambda g: trajopt.ddp(problem.replace(params={"goal": g})))
    res, first, warm = timed(solve, jnp.asarray(goal), repeats=repeats)
    plain, first_plain, warm_plain = timed(jax.jit(lambda g: trajopt.ddp(problem.replace(params={"goal": g}))),
                                           jnp.asarray(goal), repeats=1)

    # checks: the same dynamics, the same cost, the same optimum
    traj = jaxarm.rollout(arm, q0, np.zeros(arm.n), us_c, DT, method="semi_implicit_euler", saturate=False)
    x_roll = np.concatenate([np.asarray(traj.q), np.asarray(traj.qd)], axis=1)
    cost_of_croc = float(trajopt.total_cost(problem, jnp.asarray(xs_c), jnp.asarray(us_c)))
    rel_opt = abs(float(res.cost) - c0["cost"]) / abs(c0["cost"])
    emit(arm=name, quantity="check", dynamics_max_abs=float(np.max(np.abs(x_roll - xs_c))),
         cost_relative=abs(cost_of_croc - c0["cost"]) / abs(c0["cost"]), optimum_relative=rel_opt,
         optimum_agrees=bool(rel_opt <= 1e-6), jaxarm_cost=float(res.cost), crocoddyl_cost=c0["cost"],
         note="" if rel_opt <= 1e-6 else "the two solvers stop at different points of a flat valley: compare the costs")
    emit(arm=name, quantity="solve", implementation="jaxarm ddp (jaxarm.jit)", iterations=int(res.iterations),
         converged=bool(res.converged), solve_s=round(warm, 4), first_call_s=round(first, 2), cost=float(res.cost))
    emit(arm=name, quantity="solve", implementation="jaxarm ddp (plain jax.jit)", iterations=int(plain.iterations),
         converged=bool(plain.converged), solve_s=round(warm_plain, 4), first_call_s=round(first_plain, 2))
    emit(arm=name, quantity="solve", implementation=f"crocoddyl {croc['crocoddyl']} SolverBoxFDDP", iterations=c0["iterations"],
         converged=c0["converged"], solve_s=round(c0["solve_s"], 4), first_call_s=round(c0["solve_s"] + c0["build_s"], 4),
         cost=c0["cost"])

    if parts:  # where the first call goes: a fresh closure of the same solve, traced, lowered and compiled apart
        import time

        for which, options in (("jaxarm.compiler_options()", jaxarm.compiler_options()), ("plain jax.jit", {})):
            fresh = jax.jit(lambda g: trajopt.ddp(problem.replace(params={"goal": g})), compiler_options=options)
            t0 = time.perf_counter()
            traced = fresh.trace(jnp.asarray(goal))
            t1 = time.perf_counter()
            lowered = traced.lower()
            t2 = time.perf_counter()
            compiled = lowered.compile()
            t3 = time.perf_counter()
            jax.block_until_ready(compiled(jnp.asarray(goal)))
            t4 = time.perf_counter()
            emit(arm=name, quantity="first_call_parts", jit=which, trace_s=round(t1 - t0, 2), lower_s=round(t2 - t1, 2),
                 compile_s=round(t3 - t2, 2), solve_s=round(t4 - t3, 3), total_s=round(t4 - t0, 2),
                 optimized_hlo_lines=compiled.as_text().count("\n"))

    croc_seq = [r["solve_s"] for r in croc["solves"]]
    for b in batches:
        batched = jaxarm.jit(jax.vmap(lambda g: trajopt.ddp(problem.replace(params={"goal": g}))))
        out, first_b, warm_b = timed(batched, jnp.asarray(goals[:b]), repeats=max(1, repeats // 2))
        croc_s = float(np.sum(croc_seq[:b]))
        emit(arm=name, quantity="batch", goals=b, jaxarm_s=round(warm_b, 3), jaxarm_solves_per_s=round(b / warm_b, 2),
             jaxarm_first_call_s=round(first_b, 2), converged=int(np.sum(np.asarray(out.converged))),
             crocoddyl_sequential_s=round(croc_s, 3), crocoddyl_solves_per_s=round(b / croc_s, 2),
             ratio=round(croc_s / warm_b, 3),
             crocoddyl_converged=int(sum(r["converged"] for r in croc["solves"][:b])))
        if pool is None or b < 2:
            continue
        slots, rounds_of = min(b, pool[0]), pool[1]
        for w in workers:  # pools side by side (None: solve_many's default, one per core on a CPU)
            stats = []
            pooled, first_p, warm_p = timed(lambda g: trajopt.solve_many(problem, {"goal": g}, slots=slots, round_iterations=rounds_of,
                                                                         workers=w, report=stats.append),
                                            np.asarray(goals[:b]), repeats=max(1, repeats // 2))
            emit(arm=name, quantity="pool", goals=b, slots=slots, round_iterations=rounds_of, workers=stats[-1]["workers"],
                 jaxarm_s=round(warm_p, 3), jaxarm_solves_per_s=round(b / warm_p, 2), jaxarm_first_call_s=round(first_p, 2),
                 converged=int(np.sum(np.asarray(pooled.converged))), slot_rounds=stats[-1]["slot_rounds"], rounds=stats[-1]["rounds"],
                 ratio=round(croc_s / warm_p, 3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", action="store_true", help=f"create {VENV.name} with Crocoddyl first")
    ap.add_argument("--crocoddyl-python", default=str(VENV / "bin" / "python"))
    ap.add_argument("--arms", default="ur5,panda")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--quick", action="store_true", help="UR5 only, batches 1 and 8, one timing repeat")
    ap.add_argument("--pool", default="4,10", help="also trajopt.solve_many: slots,round_iterations ('none' to skip)")
    ap.add_argument("--workers", default="default",
                    help="solve_many's pools side by side, comma-separated ('default': one per core on a CPU), e.g. 1,default")
    ap.add_argument("--parts", action="store_true",
                    help="also where jaxarm's first call goes: trace, lower, XLA compile, solve, lines of optimized HLO")
    args = ap.parse_args(argv)
    if args.setup:
        setup()
    if args.quick:
        args.arms, args.batches = "ur5", "1,8"
    batches = sorted({int(b) for b in args.batches.split(",")})
    emit(machine=os.uname().machine, cpus=os.cpu_count(), jax=jax.__version__, jaxarm_device=str(jax.devices()[0]),
         load=os.getloadavg()[0])
    python = Path(args.crocoddyl_python)
    robots = robots_folder(python) if python.exists() else None
    if robots is None:
        emit(quantity="skipped", reason=f"no Crocoddyl environment at {python} (run with --setup): nothing to compare with, "
             "and example-robot-data's URDFs come with it")
        return 0
    for name in args.arms.split(","):
        if name not in ARMS:
            ap.error(f"--arms: unknown arm {name!r}; expected some of {', '.join(ARMS)}")
        pool = None if args.pool == "none" else tuple(int(v) for v in args.pool.split(","))
        workers = tuple(None if w == "default" else int(w) for w in args.workers.split(","))
        run_arm(name, robots, python, batches, 1 if args.quick else 3, pool, args.parts, workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
