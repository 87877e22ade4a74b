"""The two forms of a Runge-Kutta step on this machine: its stages in a loop, or written out.

Both forms of the same 1000-step RK3 rollout (``jaxarm.integrators.explicit_rk(*KUTTA3,
loop=True)`` and ``loop=False``, the form a rollout that is not differentiated runs) are compiled
in one process and timed alternately, so that the machine's slow and fast episodes hit both. One
JSON line per arm, dtype, batch and form: steps per second (best of ``--repeats`` calls) and the
first call's time (trace, compile and run). ``--gradients`` adds the gradient of a rollout cost
(the sum of squared final joint angles) with respect to the torques, in both forms.

    python experiments/rk_stage_forms.py
    python experiments/rk_stage_forms.py --arms panda --dtypes float32 --batches 256,4096 --plain-jit
    python experiments/rk_stage_forms.py --arms puma560 --batches 1,16 --gradients
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
from jaxarm import integrators  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import benchmark as bench  # noqa: E402

FORMS = {"loop": True, "written_out": False}


def stage_forms():
    """The variants this script compares: {label: (method, context while tracing)}."""
    return {form: (integrators.explicit_rk(*integrators.KUTTA3, loop=loop), contextlib.nullcontext)
            for form, loop in FORMS.items()}


def measure(name, dtype, batch, steps, repeats, plain, gradients, variants, label="form", parts=False):
    """Compile each variant's rollout (and gradient) in this process, the variant's context open
    while it is traced, then time all of them alternately; one JSON line per program, the
    variant's name under ``label``. ``parts``: the first call's trace and lowering, and XLA's
    compile, timed apart (``jax.jit(...).trace(...).lower()``, then ``.compile()``)."""
    arm = bench.benchmark_arm(name).astype(dtype)
    rng = np.random.default_rng(0)
    q0, qd0, tau = (jnp.asarray(x, dtype) for x in bench.rollout_inputs(arm, rng, batch, steps))
    compile_with = jax.jit if plain else jaxarm.jit
    programs = {}
    for variant, (method, context) in variants.items():

        def final(q0, qd0, u, method=method):
            return jaxarm.rollout(arm, q0, qd0, u, 1e-3, method=method, on_divergence="flag").q[-1]

        entries = {"rollout": compile_with(jax.vmap(final))}
        if gradients:
            entries["gradient"] = compile_with(jax.grad(lambda u, q0, qd0, final=final: jnp.sum(jax.vmap(final)(q0, qd0, u) ** 2)))
        for kind, fn in entries.items():
            args = (q0, qd0, tau) if kind == "rollout" else (tau, q0, qd0)
            split = {}
            with context():  # traced and compiled at the first call
                t = time.perf_counter()
                if parts:
                    lowered = jax.jit(fn.__wrapped__ if hasattr(fn, "__wrapped__") else fn,
                                      **({} if plain else {"compiler_options": jaxarm.compiler_options()})).trace(*args).lower()
                    split["trace_lower_s"] = round(time.perf_counter() - t, 2)
                    fn = lowered.compile()
                    split["compile_s"] = round(time.perf_counter() - t - split["trace_lower_s"], 2)
                jax.block_until_ready(fn(*args))
            programs[(kind, variant)] = [fn, args, time.perf_counter() - t, np.inf, split]
    for _ in range(repeats):  # alternately
        for entry in programs.values():
            fn, args = entry[0], entry[1]
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            entry[3] = min(entry[3], time.perf_counter() - t)
    for (kind, variant), (_, _, first, best, split) in programs.items():
        row = dict(arm=name, dtype=jnp.dtype(dtype).name, batch=batch, steps=steps, quantity=kind, **{label: variant},
                   jit="plain" if plain else "jaxarm", first_call_s=round(first, 2), **split, seconds=round(best, 6))
        if kind == "rollout":
            row["steps_per_s"] = float(f"{batch * steps / best:.3g}")
        print(json.dumps(row), flush=True)


def main(argv=None, description=None, variants=stage_forms, label="form", batches="1,16,256,4096", repeats=5):
    """The command line of this script, and of the scripts that compare other variants with it."""
    ap = argparse.ArgumentParser(description=description or __doc__.split("\n")[0])
    ap.add_argument("--arms", default="puma560,panda")
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--batches", default=batches)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--plain-jit", action="store_true", help="compile with a plain jax.jit instead of jaxarm.jit")
    ap.add_argument("--gradients", action="store_true", help="also the gradient of a rollout cost, every variant")
    ap.add_argument("--parts", action="store_true", help="time the first call's trace and lowering apart from XLA's compile")
    args = ap.parse_args(argv)
    bench.PLAIN_JIT = args.plain_jit
    print(json.dumps(dict(machine=bench.machine())), flush=True)
    for name in args.arms.split(","):
        for dtype in args.dtypes.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                measure(name, getattr(jnp, dtype), batch, args.steps, args.repeats, args.plain_jit, args.gradients, variants(), label,
                        args.parts)


if __name__ == "__main__":
    main()
