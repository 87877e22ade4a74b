"""Throughput of batched dynamics: inverse dynamics, mass matrix, forward dynamics.

Prints one JSON line per measurement and a summary table at the end:

    python experiments/benchmark.py                 # Puma 560, batch 1 .. 65536, float64 + float32
    python experiments/benchmark.py --quick         # a smoke run (small batches, < 1 min)
    python experiments/benchmark.py --arm panda --dtype float64 --batches 1,1024,65536

Each measurement: the jitted, vmapped function is compiled once (compile time reported), run
once to warm up, then timed over repeats until at least --min-time seconds have passed; the best
of 3 such rounds is reported as states per second. If Pinocchio is installed, `pin.rnea`,
`pin.crba` and `pin.aba` called in a Python loop are measured in the same run for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402

FUNCTIONS = {
    "inverse_dynamics": lambda arm: jax.vmap(lambda q, qd, qdd: jaxarm.inverse_dynamics(arm, q, qd, qdd)),
    "mass_matrix": lambda arm: jax.vmap(lambda q, qd, qdd: jaxarm.mass_matrix(arm, q)),
    "forward_dynamics": lambda arm: jax.vmap(lambda q, qd, qdd: jaxarm.forward_dynamics(arm, q, qd, qdd)),
}


def _time(fn, args, min_time):
    best = np.inf
    for _ in range(3):
        reps, start = 0, time.perf_counter()
        while True:
            jax.block_until_ready(fn(*args))
            reps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        best = min(best, elapsed / reps)
    return best


def machine():
    return {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
    }


def bench_jaxarm(arm, name, dtype, batches, min_time, rng):
    rows = []
    arm_d = arm.astype(dtype)
    n = arm.n
    for fname, make in FUNCTIONS.items():
        fn = jax.jit(make(arm_d))
        for B in batches:
            args = tuple(jnp.asarray(rng.uniform(-1, 1, (B, n)), dtype) for _ in range(3))
            t0 = time.perf_counter()
            compiled = fn.lower(*args).compile()
            compile_s = time.perf_counter() - t0
            jax.block_until_ready(compiled(*args))
            per_call = _time(compiled, args, min_time)
            row = {
                "library": "jaxarm",
                "version": jaxarm.__version__,
                "arm": name,
                "function": fname,
                "dtype": jnp.dtype(dtype).name,
                "batch": B,
                "seconds_per_call": per_call,
                "states_per_second": B / per_call,
                "compile_seconds": compile_s,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def bench_pinocchio(arm, name, min_time, rng):
    try:
        import pinocchio as pin
    except ImportError:
        return []
    model = pinocchio_model(arm, pin)
    data = model.createData()
    n = arm.n
    N = 2000
    qs, qds, qdds = (rng.uniform(-1, 1, (N, n)) for _ in range(3))
    calls = {
        "inverse_dynamics": ("pin.rnea", lambda i: pin.rnea(model, data, qs[i], qds[i], qdds[i])),
        "mass_matrix": ("pin.crba", lambda i: pin.crba(model, data, qs[i])),
        "forward_dynamics": ("pin.aba", lambda i: pin.aba(model, data, qs[i], qds[i], qdds[i])),
    }
    rows = []
    for fname, (label, call) in calls.items():
        best = np.inf
        for _ in range(3):
            start = time.perf_counter()
            for i in range(N):
                call(i)
            best = min(best, (time.perf_counter() - start) / N)
        row = {
            "library": "pinocchio",
            "version": pin.__version__,
            "call": label + " in a Python loop",
            "arm": name,
            "function": fname,
            "dtype": "float64",
            "batch": 1,
            "seconds_per_call": best,
            "states_per_second": 1.0 / best,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def pinocchio_model(arm, pin):
    """The arm as a Pinocchio model, built from jaxarm's canonical body model (placements + z joints)."""
    bodies = jax.tree_util.tree_map(np.asarray, jaxarm.body_model(arm))
    model = pin.Model()
    parent = 0
    for i, rev in enumerate(arm.is_revolute):
        placement = pin.SE3(bodies.rotation[i], bodies.translation[i])
        joint = pin.JointModelRZ() if rev else pin.JointModelPZ()
        parent = model.addJoint(parent, joint, placement, f"joint{i + 1}")
        m = float(bodies.mass[i])
        c = bodies.first_moment[i] / m if m > 0 else np.zeros(3)
        I_c = bodies.inertia_origin[i] - m * (c @ c * np.eye(3) - np.outer(c, c))
        model.appendBodyToJoint(parent, pin.Inertia(m, c, I_c), pin.SE3.Identity())
    R0 = np.asarray(arm.base)[:3, :3]
    model.gravity.linear = R0.T @ np.asarray(arm.gravity)
    model.armature = np.asarray(jaxarm.reflected_inertia(arm))
    return model


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", default="puma560")
    p.add_argument("--dtype", default="both", choices=["float64", "float32", "both"])
    p.add_argument("--batches", default="1,16,256,4096,65536")
    p.add_argument("--min-time", type=float, default=0.2)
    p.add_argument("--quick", action="store_true", help="small batches and short timings (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.min_time = "1,256", 0.02
    batches = [int(b) for b in args.batches.split(",")]
    dtypes = [jnp.float64, jnp.float32] if args.dtype == "both" else [getattr(jnp, args.dtype)]
    print(json.dumps({"machine": machine()}), flush=True)
    arm = jaxarm.load_arm(args.arm)
    rng = np.random.default_rng(0)
    rows = []
    for dtype in dtypes:
        rows += bench_jaxarm(arm, args.arm, dtype, batches, args.min_time, rng)
    peers = bench_pinocchio(arm, args.arm, args.min_time, rng)
    rows += peers
    print(file=sys.stderr)
    print(f"{'function':18s} {'dtype':8s} {'batch':>7s} {'states/s':>12s} {'compile s':>9s}", file=sys.stderr)
    for r in rows:
        print(
            f"{r['function']:18s} {r['dtype']:8s} {r['batch']:7d} {r['states_per_second']:12.4g} "
            f"{r.get('compile_seconds', float('nan')):9.2f}  {r['library']}",
            file=sys.stderr,
        )
    return rows


if __name__ == "__main__":
    main()
