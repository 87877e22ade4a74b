"""The arm as data vs the arm compiled in: what folding a constant arm's structure buys.

jaxarm's dynamics kernels see an arm's values while tracing when the arm is closed over by the jit
(``jax.jit(lambda q, ...: f(arm, q, ...))``): its parameters enter as ``jaxarm.dynamics.algebra.Known``
scalars and the structural zeros and ones (DH twists of 0 and 90 degrees, centres of mass on an
axis, principal inertias, gravity along one axis) fold away at trace time. Passed as an argument
(``jax.jit(f)(arm, q, ...)``, as ``jax.grad`` with respect to the arm does), the same code runs
with tracers and nothing folds. Both programs are built from the library as it is, so the two
"variants" are timed in one process, in alternating rounds (median of the rounds):

* ``traced``: the arm is an argument of the jit (what every call compiled before the change);
* ``constant``: the arm is closed over (compiled in; also ``rollout_batch``'s default).

Per arm and dtype it prints one JSON line per measurement: the number of traced operations of
one forward dynamics (``eqns``), lower + compile seconds, and throughput of batched forward
dynamics (states/s) and of 1000-step RK3 rollouts (steps/s), each compiled with
``jaxarm.compiler_options()``.

    python experiments/constant_arm_before_after.py [--arms puma560,panda] [--dtypes float64]
        [--batch 65536] [--rollout-batch 4096] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.dynamics.forward import _forward_dynamics  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from benchmark import benchmark_arm, rollout_inputs  # noqa: E402


def emit(**row):
    print(json.dumps(row), flush=True)


def compiled_variants(arm, fn_of_arm, *args):
    """{"traced": compiled f(arm, *args), "constant": compiled f(*args) with the arm closed over},
    and their compile seconds."""
    options = jaxarm.compiler_options() or None
    out, seconds = {}, {}
    for variant in ("traced", "constant"):
        t0 = time.perf_counter()
        if variant == "traced":
            c = jax.jit(fn_of_arm).lower(arm, *args).compile(compiler_options=options)
            call = lambda c=c: c(arm, *args)  # noqa: E731
        else:
            c = jax.jit(lambda *xs: fn_of_arm(arm, *xs)).lower(*args).compile(compiler_options=options)
            call = lambda c=c: c(*args)  # noqa: E731
        seconds[variant] = time.perf_counter() - t0
        out[variant] = call
    return out, seconds


def alternate(calls, rounds):
    """Median wall time of each call over `rounds` alternating rounds (best of a few per round)."""
    times = {k: [] for k in calls}
    for call in calls.values():
        jax.block_until_ready(call())  # warm-up
    for _ in range(rounds):
        for k, call in calls.items():
            best = np.inf
            for _ in range(3):
                t = time.perf_counter()
                jax.block_until_ready(call())
                best = min(best, time.perf_counter() - t)
            times[k].append(best)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", default="puma560,panda")
    p.add_argument("--dtypes", default="float64")
    p.add_argument("--batch", type=int, default=65536, help="forward-dynamics batch")
    p.add_argument("--rollout-batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    emit(machine={"jax": jax.__version__, "jaxarm": jaxarm.__version__, "cpu_devices": jax.device_count()})
    for name in a.arms.split(","):
        base = benchmark_arm(name)
        for dname in a.dtypes.split(","):
            dtype = jnp.dtype(dname)
            arm = base.astype(dtype)
            rng = np.random.default_rng(0)
            n = arm.n
            x = jnp.asarray(rng.uniform(-1.0, 1.0, (3, n)), dtype)
            fn = _forward_dynamics
            traced = len(jax.make_jaxpr(fn)(arm, *x).jaxpr.eqns)
            constant = len(jax.make_jaxpr(lambda q, qd, t: fn(arm, q, qd, t))(*x).jaxpr.eqns)
            emit(arm=name, dtype=dname, quantity="forward_dynamics_eqns", traced=traced, constant=constant, ratio=traced / constant)

            X = tuple(jnp.asarray(rng.uniform(-1.0, 1.0, (a.batch, n)), dtype) for _ in range(3))
            fd = jax.vmap(lambda arm_, q, qd, t: jaxarm.forward_dynamics(arm_, q, qd, t), in_axes=(None, 0, 0, 0))
            calls, comp = compiled_variants(arm, fd, *X)
            np.testing.assert_allclose(calls["traced"](), calls["constant"](), rtol=1e-3 if dname == "float32" else 1e-9, atol=1e-3 if dname == "float32" else 1e-9)
            t = alternate(calls, a.rounds)
            for v in calls:
                emit(arm=name, dtype=dname, quantity="forward_dynamics", variant=v, batch=a.batch, value=a.batch / t[v], unit="states/s", compile_s=comp[v])
            emit(arm=name, dtype=dname, quantity="forward_dynamics", batch=a.batch, speedup=t["traced"] / t["constant"])
            del X, calls

            q0, qd0, tau = (jnp.asarray(v, dtype) for v in rollout_inputs(base, rng, a.rollout_batch, a.steps))

            def final(arm_, q0, qd0, u):
                traj = jaxarm.rollout(arm_, q0, qd0, u, 1e-3, method="rk3", on_divergence="flag")
                return traj.q[-1], traj.qd[-1]

            ro = jax.vmap(final, in_axes=(None, 0, 0, 0))
            calls, comp = compiled_variants(arm, ro, q0, qd0, tau)
            diff = np.abs(np.asarray(calls["traced"]()[0], float) - np.asarray(calls["constant"]()[0], float))
            # float64: every final angle agrees; float32: 1000 steps amplify the rounding in a few
            # chaotic rollouts, so the 99.9th percentile is checked (the bulk agrees to ~1e-5)
            worst = np.max(diff) if dname == "float64" else np.quantile(diff, 0.999)
            assert worst < (1e-7 if dname == "float64" else 1e-2), (name, dname, worst)
            emit(arm=name, dtype=dname, quantity="rollout_rk3_check", max_abs_diff=float(np.max(diff)), median_abs_diff=float(np.median(diff)))
            t = alternate(calls, a.rounds)
            B, T = a.rollout_batch, a.steps
            for v in calls:
                emit(arm=name, dtype=dname, quantity="rollout_rk3", variant=v, batch=B, steps=T, value=B * T / t[v], unit="steps/s", compile_s=comp[v])
            emit(arm=name, dtype=dname, quantity="rollout_rk3", batch=B, speedup=t["traced"] / t["constant"], compile_ratio=comp["traced"] / comp["constant"])
            del calls


if __name__ == "__main__":
    main()
