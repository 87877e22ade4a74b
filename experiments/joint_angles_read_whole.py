"""Joint angles read whole, or by a plain split: RK3 rollouts and their gradients at small batches.

On a CPU, :func:`jaxarm.dynamics.kinematics.joint_frames` reads the joint angles with
``algebra.entries(q, whole=True)``: every angle also reads the first and the last one (plus zero
times their sum). Without it, a batched fusion that never reads the first angle (the Puma 560's
and the Panda's first joint turns about gravity, so that angle drops out of the dynamics) is
vectorized by LLVM with its last vector's worth of rows run as scalar code; at batch 16 in float32
that is half the batch.

Both variants of the same 1000-step RK3 rollout are traced in one process (the plain split by
patching ``algebra.entries`` while tracing) and timed alternately, so that the machine's slow and
fast episodes hit both. One JSON line per arm, dtype, batch, quantity and variant: steps per second
or seconds (best of ``--repeats`` calls), and the first call's time.

    python experiments/joint_angles_read_whole.py
    python experiments/joint_angles_read_whole.py --dtypes float64 --batches 1,16,256 --gradients
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.dynamics import algebra  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import benchmark as bench  # noqa: E402


@contextlib.contextmanager
def plain_split():
    """While tracing: joint angles read by a plain split (the variant before ``whole``)."""
    entries = algebra.entries
    algebra.entries = lambda x, whole=False: entries(x)
    try:
        yield
    finally:
        algebra.entries = entries


VARIANTS = {"read_whole": contextlib.nullcontext, "plain_split": plain_split}


def measure(name, dtype, batch, steps, repeats, gradients):
    arm = bench.benchmark_arm(name).astype(dtype)
    rng = np.random.default_rng(0)
    q0, qd0, tau = (jnp.asarray(x, dtype) for x in bench.rollout_inputs(arm, rng, batch, steps))

    def final(q0, qd0, u):
        return jaxarm.rollout(arm, q0, qd0, u, 1e-3, method="rk3", on_divergence="flag").q[-1]

    programs = {}
    for variant, context in VARIANTS.items():
        entries = {"rollout": (jaxarm.jit(jax.vmap(final)), (q0, qd0, tau))}
        if gradients:
            cost = jax.grad(lambda u, q0, qd0: jnp.sum(jax.vmap(final)(q0, qd0, u) ** 2))
            entries["gradient"] = (jaxarm.jit(cost), (tau, q0, qd0))
        for kind, (fn, args) in entries.items():
            with context():  # traced (and compiled) at the first call
                t = time.perf_counter()
                jax.block_until_ready(fn(*args))
                programs[(kind, variant)] = [fn, args, time.perf_counter() - t, np.inf]
    for _ in range(repeats):  # alternately
        for entry in programs.values():
            fn, args = entry[0], entry[1]
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            entry[3] = min(entry[3], time.perf_counter() - t)
    for (kind, variant), (_, _, first, best) in programs.items():
        row = dict(arm=name, dtype=jnp.dtype(dtype).name, batch=batch, steps=steps, quantity=kind, variant=variant,
                   first_call_s=round(first, 2), seconds=round(best, 6))
        if kind == "rollout":
            row["steps_per_s"] = float(f"{batch * steps / best:.3g}")
        print(json.dumps(row), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="puma560,panda")
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--batches", default="1,16,64,256,4096")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--gradients", action="store_true", help="also the gradient of a rollout cost, both variants")
    args = ap.parse_args(argv)
    print(json.dumps(dict(machine=bench.machine())), flush=True)
    for name in args.arms.split(","):
        for dtype in args.dtypes.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                measure(name, getattr(jnp, dtype), batch, args.steps, args.repeats, args.gradients)


if __name__ == "__main__":
    main()
