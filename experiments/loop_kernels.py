"""Whole loops as single kernels: 1000-step RK3 rollouts and their gradients compiled with XLA's
small-while-loop pass at its default threshold (1 kB: no loop of a rollout qualifies) and at
``jaxarm.core.xla.LOOP_KERNEL_BYTES`` (what ``jaxarm.jit`` compiles with), in one process.

For each arm and batch: the rollout's final joint angles and the gradient of a rollout cost (the
sum of their squares) with respect to the torques, each compiled both ways (``jax.jit(...)
.lower(...).compile(compiler_options=jaxarm.compiler_options())``, inside
``jaxarm.core.xla.loop_kernels(threshold)`` or not), compared (a line gives the largest
difference where the results are not equal to the last bit), and timed alternately. One JSON line per arm, batch, program and variant: best and median of ``--repeats``
calls, the compile time, and how many while loops were compiled as single kernels (calls tagged
``xla_cpu_small_call`` in the compiled HLO).

    python experiments/loop_kernels.py
    python experiments/loop_kernels.py --arms panda --batches 16 --thresholds 0,33554432,1000000000000
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
from jaxarm.core import xla  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import benchmark as bench  # noqa: E402

STEPS, DT = 1000, 1e-3


def compiled(fn, args, threshold):
    """fn compiled afresh (a new function object, so that no compiled program is reused), inside
    ``loop_kernels(threshold)`` unless threshold is None (XLA's default). Returns the executable,
    its compile time and the number of loops compiled as single kernels."""
    t0 = time.perf_counter()
    lowered = jax.jit(lambda *a: fn(*a)).lower(*args)
    if threshold is None:
        exe = lowered.compile(compiler_options=jaxarm.compiler_options())
    else:
        with xla.loop_kernels(threshold):
            exe = lowered.compile(compiler_options=jaxarm.compiler_options())
    return exe, time.perf_counter() - t0, exe.as_text().count('xla_cpu_small_call="true"')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="puma560,panda")
    ap.add_argument("--batches", default="1,16,64,256,4096", help="rollout batches (gradients up to 256)")
    ap.add_argument("--thresholds", default=f"default,{xla.LOOP_KERNEL_BYTES}",
                    help="comma-separated byte thresholds; 'default' for XLA's own (1 kB)")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args(argv)
    print(json.dumps({"machine": bench.machine(), "loop_kernels": xla.loop_kernels_status()}), flush=True)
    thresholds = [None if t == "default" else int(t) for t in args.thresholds.split(",")]
    for name in args.arms.split(","):
        arm = bench.benchmark_arm(name)
        for B in (int(b) for b in args.batches.split(",")):
            rng = np.random.default_rng(0)
            q0, qd0, tau = (jnp.asarray(x) for x in bench.rollout_inputs(arm, rng, B, STEPS))
            final = jax.vmap(lambda q0, qd0, u: jaxarm.rollout(arm, q0, qd0, u, DT, method="rk3", on_divergence="flag").q[-1])

            def cost(u, q0, qd0):
                return jnp.sum(final(q0, qd0, u) ** 2)

            programs = {"rollout": (lambda u, q0, qd0: final(q0, qd0, u))}
            if B <= 256:
                programs["gradient"] = jax.grad(cost)
            runs = {}
            for kind, fn in programs.items():
                for t in thresholds:
                    exe, seconds, kernels = compiled(fn, (tau, q0, qd0), t)
                    runs[kind, t] = [exe, seconds, kernels, []]
                reference = None
                for t in thresholds:
                    out = np.asarray(runs[kind, t][0](tau, q0, qd0))
                    if reference is None:
                        reference = out
                    elif not np.array_equal(out, reference):
                        print(json.dumps({"arm": name, "batch": B, "quantity": kind, "threshold": t, "note": "results differ",
                                          "max_abs_diff": float(np.max(np.abs(out - reference)))}), flush=True)
            for _ in range(args.repeats):  # alternately, so that the machine's slow episodes hit every variant
                for entry in runs.values():
                    t0 = time.perf_counter()
                    jax.block_until_ready(entry[0](tau, q0, qd0))
                    entry[3].append(time.perf_counter() - t0)
            for (kind, t), (_, seconds, kernels, times) in runs.items():
                print(json.dumps({"arm": name, "batch": B, "steps": STEPS, "quantity": kind,
                                  "threshold": "default" if t is None else t, "loop_kernels": kernels,
                                  "best_ms": round(1e3 * min(times), 3), "median_ms": round(1e3 * float(np.median(times)), 3),
                                  "compile_s": round(seconds, 2)}), flush=True)


if __name__ == "__main__":
    main()
