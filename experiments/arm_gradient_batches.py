"""The gradient of a batch of rollouts with respect to the arm they share, before and after.

Identification by gradient: a loss over a ``jax.vmap``-ed batch of 1000-step RK3 rollouts (the
sum of squared joint angles along the way), differentiated by ``jax.grad`` with respect to the
arm's standard inertial and drive parameters (``jaxarm.identify.linear_model``), the kinematics
known. Programs per arm and batch, compiled in one process and timed alternately:

- ``forward``: the loss itself (the arm traced the same way), as it runs now; ``forward_before``:
  with every friction model of the partly traced drives evaluated, as before;
- ``before``: the gradient as it ran before the three changes below;
- ``per_state_reads``: the inertial parameters read per state, one vector per body
  (``jaxarm.dynamics.algebra.per_state_entries``), instead of as unbatched scalars;
- ``friction_cotangent_apart``: and friction's share of the joint-velocity cotangent computed
  apart (``jaxarm.dynamics.newton_euler._FRICTION_COTANGENT_APART``);
- ``now``: and the friction models chosen per parameter field, so that the Stribeck and sigmoid
  models whose (known) parameters are zero are left out although the Coulomb and viscous
  coefficients are traced (``jaxarm.dynamics.drives._MODELS_BY_FIELD``): what ``jaxarm.rollout``
  gives now.

One JSON line per program: compile time, best of ``--repeats`` runs, the ratio to ``forward``, and
the largest relative difference of the gradient from ``before``'s. A batch of one reads the
parameters as before (there is nothing to sum over).

    python experiments/arm_gradient_batches.py
    python experiments/arm_gradient_batches.py --arms panda --batches 16,256 --steps 200
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
from jaxarm.dynamics import drives, forward, newton_euler  # noqa: E402
from jaxarm.identify.linear_model import arm_with_parameters, standard_parameters  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import benchmark as bench  # noqa: E402


# (label, differentiated, per-state reads, friction cotangent apart, friction models by field)
PROGRAMS = (("forward", False, True, True, True), ("forward_before", False, False, False, False),
            ("before", True, False, False, False), ("per_state_reads", True, True, False, False),
            ("friction_cotangent_apart", True, True, True, False), ("now", True, True, True, True))


def measure(name, batch, steps, repeats):
    arm = bench.benchmark_arm(name)
    q0, qd0, tau = (jnp.asarray(x) for x in bench.rollout_inputs(arm, np.random.default_rng(0), batch, steps))
    p0 = standard_parameters(arm)

    def loss(p):
        a = arm_with_parameters(arm, p)
        q = jax.vmap(lambda x, v, u: jaxarm.rollout(a, x, v, u, 1e-3, on_divergence="flag").q)(q0, qd0, tau)
        return jnp.sum(q ** 2)

    programs = {}
    for label, differentiated, per_state, apart, by_field in PROGRAMS:
        forward._PER_STATE, newton_euler._FRICTION_COTANGENT_APART, drives._MODELS_BY_FIELD = per_state, apart, by_field
        # a new function for each program: jax caches a trace by function, not by these switches
        fn = jax.grad(loss) if differentiated else (lambda p: loss(p))
        try:
            start = time.perf_counter()
            compiled = jax.jit(fn, compiler_options=jaxarm.compiler_options()).lower(p0).compile()
            first = time.perf_counter() - start
        finally:
            forward._PER_STATE = newton_euler._FRICTION_COTANGENT_APART = drives._MODELS_BY_FIELD = True
        programs[label] = dict(compiled=compiled, compile_s=first, best_s=float("inf"))
    values = {k: np.asarray(v["compiled"](p0)) for k, v in programs.items()}
    for _ in range(repeats):
        for v in programs.values():
            start = time.perf_counter()
            jax.block_until_ready(v["compiled"](p0))
            v["best_s"] = min(v["best_s"], time.perf_counter() - start)
    base, before = programs["forward"]["best_s"], values["before"]
    for label, v in programs.items():
        row = dict(arm=name, batch=batch, steps=steps, program=label, compile_s=round(v["compile_s"], 2),
                   ms=round(v["best_s"] * 1e3, 2), ratio_to_forward=round(v["best_s"] / base, 2))
        if values[label].shape == before.shape:
            row["gradient_rel_difference"] = float(np.max(np.abs(values[label] - before)) / np.max(np.abs(before)))
        print(json.dumps(row), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="puma560,panda")
    ap.add_argument("--batches", default="16,256")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    print(json.dumps(dict(machine=bench.machine())), flush=True)
    for name in args.arms.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            measure(name, batch, args.steps, args.repeats)


if __name__ == "__main__":
    main()
