"""How the shape of a rollout's time loop sets its speed, on whatever device JAX runs on.

    python experiments/time_loop_shapes.py [--arms puma560 panda] [--batches 1 1024] [--steps 1000]
        [--variants default loop written written+unroll4] [--dtype float64] [--mjx] [--mjx-batches 1024]

One process; one JSON line per (arm, batch, variant): steps/s of ``jax.jit(jax.vmap(rollout))``
(median of --reps timed calls after a warm-up), the compile time, and the largest difference of the
final joint positions from the first variant (the variants compute the same thing). Variants:

- ``default``: ``method="rk3"``, what the library picks for the platform
  (:func:`jaxarm.integrators.explicit_rk` with ``loop=None``: a loop over the stages on a CPU,
  the stages one after the other elsewhere);
- ``loop``: Kutta's three stages in a loop (``explicit_rk(*KUTTA3, loop=True)``), so the dynamics
  is compiled once;
- ``written``: :func:`jaxarm.integrators.rk3`, the three stages written out one after the other;
- ``+unrollK``: ``rollout(..., unroll=K)``, K steps per iteration of the time loop.

On a GPU every loop iteration launches the loop body's kernels and reads the loop's predicate
back to the host, so a rollout of small arms at small batches is bound by the number of loop
iterations and kernels per step, not by arithmetic; on a CPU the loop costs next to nothing and
the variants differ by how XLA fuses the step. ``--mjx`` adds MuJoCo MJX (``jax.vmap(mjx.step)``
in a ``lax.scan``, RK4, ``--mjx-steps`` steps) at the same batches, in the same process and
``--dtype`` (float32 runs with JAX's 64-bit mode off, so MJX's model is float32 throughout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--arms", nargs="+", default=["puma560"])
p.add_argument("--batches", type=int, nargs="+", default=[1, 1024])
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--variants", nargs="+", default=["default", "loop", "written", "written+unroll4"])
p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
p.add_argument("--reps", type=int, default=5)
p.add_argument("--mjx", action="store_true", help="MuJoCo MJX at the same batches (skipped with a line if absent)")
p.add_argument("--mjx-steps", type=int, default=100)
p.add_argument("--mjx-batches", type=int, nargs="+", help="MJX's batches (default: --batches)")
a = p.parse_args()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", a.dtype == "float64")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import integrators  # noqa: E402

DT = 1e-3
DTYPE = jnp.float64 if a.dtype == "float64" else jnp.float32


def emit(**row):
    print(json.dumps(row), flush=True)


def rollout_kwargs(variant):
    kw = {"method": "rk3"}
    for tok in variant.split("+"):
        if tok == "written":
            kw["method"] = integrators.rk3
        elif tok == "loop":
            kw["method"] = integrators.explicit_rk(*integrators.KUTTA3, loop=True)
        elif tok.startswith("unroll"):
            kw["unroll"] = int(tok[len("unroll"):])
        elif tok != "default":
            raise SystemExit(f"unknown variant part {tok!r} in {variant!r}")
    return kw


def inputs(arm, B, T, seed=0):
    rng = np.random.default_rng(seed)
    q0 = rng.uniform(-0.5, 0.5, (B, arm.n))
    qd0 = rng.uniform(-0.5, 0.5, (B, arm.n))
    g = np.asarray(jax.jit(jax.vmap(lambda q: jaxarm.gravity_torques(arm, q)))(jnp.asarray(q0, DTYPE)))
    u = g[:, None, :] + rng.uniform(-1.0, 1.0, (B, T, arm.n))
    return tuple(jnp.asarray(x, DTYPE) for x in (q0, qd0, u))


def median_time(f, args, reps):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def compile_timed(fn, args):
    t = time.perf_counter()
    c = jax.jit(fn).lower(*args).compile()
    return c, time.perf_counter() - t


def jaxarm_rows(name):
    arm = jaxarm.load_arm(name)
    if DTYPE == jnp.float32:
        arm = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, arm)
    for B in a.batches:
        args = inputs(arm, B, a.steps)
        first = None
        for v in a.variants:
            kw = rollout_kwargs(v)
            fn = jax.vmap(lambda q0, qd0, u, kw=kw: jaxarm.rollout(arm, q0, qd0, u, DT, on_divergence="flag", **kw).q[-1])
            c, cs = compile_timed(fn, args)
            t = median_time(c, args, a.reps)
            out = np.asarray(c(*args))
            first = out if first is None else first
            emit(arm=name, implementation=f"jaxarm {jaxarm.__version__}", variant=v, dtype=a.dtype, batch=B, steps=a.steps,
                 steps_per_s=B * a.steps / t, us_per_step=1e6 * t / a.steps, compile_s=round(cs, 2),
                 max_diff_vs_first=float(np.max(np.abs(out - first))), device=str(jax.devices()[0].device_kind))


def mjx_rows(name):
    try:
        from mujoco import mjx
        from importlib import metadata
        version = metadata.version("mujoco-mjx")
    except Exception as e:  # absent or broken install
        emit(arm=name, implementation="mjx", skipped=f"{type(e).__name__}: {e}".splitlines()[0])
        return
    from benchmark import mjx_rollout, mujoco_model

    jax.config.update("jax_enable_x64", a.dtype == "float64")  # (importing the benchmark module turns it on)
    arm = jaxarm.load_arm(name)
    one, model_and_data = mjx_rollout(mjx, mujoco_model(arm, DT))
    leaves = [x.dtype for x in jax.tree_util.tree_leaves(model_and_data) if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    T = a.mjx_steps

    for B in a.mjx_batches or a.batches:
        args = inputs(arm, B, T)
        c, cs = compile_timed(jax.vmap(one), args)
        t = median_time(c, args, a.reps)
        out = c(*args)
        emit(arm=name, implementation=f"mjx {version}", variant="jax.vmap(mjx.step) in lax.scan, RK4", dtype=a.dtype,
             model_float_dtypes=sorted({str(d) for d in leaves}), output_dtype=str(out.dtype), batch=B, steps=T,
             steps_per_s=B * T / t, us_per_step=1e6 * t / T, compile_s=round(cs, 2), device=str(jax.devices()[0].device_kind))


for name in a.arms:
    jaxarm_rows(name)
    if a.mjx:
        mjx_rows(name)
