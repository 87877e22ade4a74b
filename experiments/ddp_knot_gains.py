"""The backward pass's knot QP with its gains solved together with the Newton step, against after it.

    python experiments/ddp_knot_gains.py [--arms panda puma560] [--batches 0 8] [--rounds 20]

Each knot of ``trajopt.ddp``'s backward pass solves a box QP for the input step and the feedback
gains K = -Q_uu,ff^-1 Q_ux,f (Tassa, Mansard & Todorov 2014). For one problem the gains' right-hand
sides are solved in the same substitution as the unconstrained Newton step (which is the answer at
most knots, where no bound is active); a batch (``jax.vmap``) solves them after the box QP, since
it evaluates both branches of the QP's conditional for every problem
(``jaxarm.control.trajopt.solvers.ddp._knot_qp``). This compares the two forms in one process on
the same problems: "joint" is the solver as it is, "after" the solver with the batch's form for one
problem as well (the form both used before). Both are compiled first (as :func:`jaxarm.jit` compiles:
its options and its loop kernels; before 2026-12-07 without the loop kernels), checked to take the same
iterations to the same cost, then timed in alternation (``--rounds`` calls of each), so that a busy
machine slows both alike. One JSON line per arm and batch (0: one problem, not in a ``vmap``).

The problem: the reach of ``experiments/trajopt_crocoddyl.py`` (its ``reach_ocp``: 100
semi-implicit Euler knots of 10 ms, tool 0.35 m sideways and 0.3 m up, effort, goal, posture and
speed terms, the torque limits as the box) on a bundled arm; a batch reaches goals scattered
around it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
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
from jaxarm.control.trajopt.solvers import ddp as ddp_module  # noqa: E402
from jaxarm.core.xla import loop_kernels  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trajopt_crocoddyl  # noqa: E402  the reach of the Crocoddyl comparison, on a bundled arm here

Q0 = {"panda": trajopt_crocoddyl.ARMS["panda"][3], "puma560": [0.0, 0.785, -3.14, 0.0, 0.785, 0.0]}  # Puma: Corke's "qn"


def reach(name, batch):
    arm = jaxarm.load_arm(name)
    q0 = Q0.get(name, np.mean(np.asarray(arm.limits.position), axis=1))
    problem, goals = trajopt_crocoddyl.reach_ocp(arm, q0, trajopt_crocoddyl.ARMS["panda"][5], max(batch, 1))
    return problem, jnp.asarray(goals if batch else goals[0])


def compiled_with(problem, arg, batch, name, value=None, plain=False):
    """The solve of ``problem`` for the goal(s) ``arg`` (a ``jax.vmap`` over goals if ``batch``)
    compiled with the solver module's ``name`` replaced by ``value`` (None: as it is), as
    :func:`jaxarm.jit` compiles (its options and loop kernels), or as a plain ``jax.jit`` does
    (``plain``). Returns the compiled program and the seconds its trace, lowering and compile took."""
    original = getattr(ddp_module, name)
    if value is not None:
        setattr(ddp_module, name, value)
    try:
        f = lambda g: trajopt.ddp(problem.replace(params={"goal": g}))  # noqa: E731  (a new function: traced anew)
        f = jax.vmap(f) if batch else f
        t0 = time.perf_counter()
        with contextlib.nullcontext() if plain else loop_kernels():
            c = jax.jit(f).lower(arg).compile(None if plain else dict(jaxarm.compiler_options()))
        return c, time.perf_counter() - t0
    finally:
        setattr(ddp_module, name, original)


def compiled(problem, arg, batch, form):
    """The solve compiled with the knot QP's gains in ``form`` ("joint": as it is; "after": the batch's form)."""
    after = functools.partial(ddp_module._box_qp, joint=False) if form == "after" else None
    return compiled_with(problem, arg, batch, "_knot_qp", after)


def check_same(label, results):
    """Raise unless every solve in ``results`` ({form: result}) took the first's iterations to its cost."""
    (first_form, first), *others = results.items()
    for form, r in others:
        if not (np.array_equal(np.asarray(first.iterations), np.asarray(r.iterations))
                and np.allclose(np.asarray(first.cost), np.asarray(r.cost), rtol=1e-9, atol=0.0)):
            raise AssertionError(f"{label}: {form} differs from {first_form}: iterations {r.iterations} / {first.iterations}, "
                                 f"cost {r.cost} / {first.cost}")


def in_alternation(programs, arg, rounds):
    """Wall times (s) of ``rounds`` calls of each compiled program on ``arg``, one call of each in
    turn, so that a busy machine slows every program alike: {name: [seconds, ...]}."""
    times = {name: [] for name in programs}
    for _ in range(rounds):
        for name, program in programs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(program(arg))
            times[name].append(time.perf_counter() - t0)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", nargs="+", default=["panda", "puma560"])
    ap.add_argument("--batches", type=int, nargs="+", default=[0, 8])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    for name in args.arms:
        for batch in args.batches:
            problem, arg = reach(name, batch)
            programs, results, compile_s = {}, {}, {}
            for form in ("joint", "after"):
                programs[form], compile_s[form] = compiled(problem, arg, batch, form)
                results[form] = jax.block_until_ready(programs[form](arg))
            check_same(f"{name} batch {batch}", results)
            a = results["joint"]
            times = in_alternation(programs, arg, args.rounds)
            row = dict(case="ddp_knot_gains", arm=name, batch=batch, iterations=np.asarray(a.iterations).tolist(),
                       rounds=args.rounds, device=str(jax.devices()[0]))
            for form, ts in times.items():
                ts = np.sort(ts)
                row[form] = dict(min_ms=round(1e3 * ts[0], 2), median_ms=round(1e3 * float(np.median(ts)), 2),
                                 compile_s=round(compile_s[form], 2))
            row["median_ratio_joint_over_after"] = round(row["joint"]["median_ms"] / row["after"]["median_ms"], 3)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
