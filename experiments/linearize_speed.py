"""Time ``jaxarm.linearize_trajectory`` (RK3 step Jacobians A_k, B_k) and ``jaxarm.linearize_continuous``
(A = df/dx, B = df/du of xdot = f(x, u)) at N points of a bundled arm.

    python experiments/linearize_speed.py [--arms puma560,panda] [--points 100,1000] [--repeats 20]
        [--functions linearize_trajectory,linearize_continuous]

One JSON line per arm and N: first call (trace + compile + run) and the median of the warm calls,
float64, compiled by ``jax.jit`` with ``jaxarm.compiler_options()`` (what ``jaxarm.jit`` uses),
at random states and inputs (seed 0).
"""

from __future__ import annotations

import argparse
import json
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="puma560,panda")
    ap.add_argument("--points", default="100,1000")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--functions", default="linearize_trajectory,linearize_continuous")
    args = ap.parse_args(argv)
    calls = {"linearize_trajectory": lambda arm, q, qd, u: jaxarm.linearize_trajectory(arm, q, qd, u, 0.01),
             "linearize_continuous": lambda arm, q, qd, u: jaxarm.linearize_continuous(arm, q, qd, u)}
    for which in args.functions.split(","):
        if which not in calls:
            ap.error(f"--functions: expected names among {sorted(calls)}, got {which!r}")
    for name in args.arms.split(","):
        arm = jaxarm.load_arm(name)
        rng = np.random.default_rng(0)
        for N in (int(p) for p in args.points.split(",")):
            q, qd, u = (jnp.asarray(rng.normal(size=(N, arm.n)) * s) for s in (0.5, 0.5, 1.0))
            for which in args.functions.split(","):
                call = calls[which]
                f = jax.jit(lambda q, qd, u: call(arm, q, qd, u), compiler_options=jaxarm.compiler_options())
                t = time.perf_counter()
                jax.block_until_ready(f(q, qd, u))
                first = time.perf_counter() - t
                times = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    jax.block_until_ready(f(q, qd, u))
                    times.append(time.perf_counter() - t)
                print(json.dumps(dict(arm=name, quantity=which, method="rk3" if which == "linearize_trajectory" else None,
                                      points=N, first_call_s=round(first, 3), warm_ms=round(1e3 * float(np.median(times)), 3))),
                      flush=True)

if __name__ == "__main__":
    main()
