"""Array-based (3-vectors and 3x3 matrices as arrays) vs component-wise inverse dynamics and mass
matrix, timed in one process in alternating rounds (median of the rounds), beside pin.rnea /
pin.crba in a Python loop.

The array versions are the test oracles of ``tests/oracles.py`` (``rnea``, ``composite_mass_matrix``),
the same equations written the plain way; this script measures what writing them component-wise
(:mod:`jaxarm.dynamics.algebra`) buys, on the same machine at the same time, so the ratios hold
even on a busy machine.

    python experiments/kernels_before_after.py [--batches 1,4096,65536] [--dtypes float64,float32]

Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import drives  # noqa: E402
from jaxarm.dynamics.newton_euler import _base_acceleration  # noqa: E402
from jaxarm.model.arm import body_model  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import oracles  # noqa: E402
from benchmark import pinocchio_model  # noqa: E402


def reference_inverse_dynamics(arm, q, qd, qdd):
    bodies = body_model(arm)
    a0 = _base_acceleration(arm, jnp.result_type(bodies.mass, q))
    tau = oracles.rnea(arm, bodies, q, qd, qdd, a0)[0]
    return tau + drives._reflected_inertia(arm) * qdd + drives._friction_torques(arm, qd)


def reference_mass_matrix(arm, q):
    bodies = body_model(arm)
    return oracles.composite_mass_matrix(arm, bodies, q) + jnp.diag(drives._reflected_inertia(arm))


def loop_rate(fn, count=2000, repeats=5):
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(count):
            fn(i)
        best = min(best, (time.perf_counter() - t) / count)
    return 1.0 / best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", default="puma560")
    parser.add_argument("--batches", default="1,4096,65536")
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    arm = jaxarm.load_arm(args.arm)
    n = arm.n
    rng = np.random.default_rng(0)
    try:
        import pinocchio as pin

        model = pinocchio_model(arm, pin)
        data = model.createData()
        Q, QD, QDD = (rng.uniform(-1, 1, (2000, n)) for _ in range(3))
        for name, fn in (
            ("pin.rnea", lambda i: pin.rnea(model, data, Q[i], QD[i], QDD[i])),
            ("pin.crba", lambda i: pin.crba(model, data, Q[i])),
        ):
            print(json.dumps({"implementation": f"{name} loop", "version": pin.__version__, "arm": args.arm,
                              "dtype": "float64", "states_per_second": loop_rate(fn)}), flush=True)
    except ImportError as err:
        print(json.dumps({"implementation": "pinocchio", "absent": str(err)}), flush=True)

    for dtype_name in args.dtypes.split(","):
        dtype = getattr(jnp, dtype_name)
        a = arm.astype(dtype)
        fns = {
            ("inverse_dynamics", "reference"): lambda q, qd, qdd: reference_inverse_dynamics(a, q, qd, qdd),
            ("inverse_dynamics", "kernel"): lambda q, qd, qdd: jaxarm.inverse_dynamics(a, q, qd, qdd),
            ("mass_matrix", "reference"): lambda q, qd, qdd: reference_mass_matrix(a, q),
            ("mass_matrix", "kernel"): lambda q, qd, qdd: jaxarm.mass_matrix(a, q),
        }
        for batch in (int(b) for b in args.batches.split(",")):
            states = [jnp.asarray(rng.uniform(-1, 1, (batch, n)), dtype) for _ in range(3)]
            compiled, compile_seconds = {}, {}
            for key, fn in fns.items():
                t = time.perf_counter()
                compiled[key] = jax.jit(jax.vmap(fn)).lower(*states).compile()
                compile_seconds[key] = time.perf_counter() - t
                jax.block_until_ready(compiled[key](*states))
            times = {key: [] for key in compiled}
            reps = max(1, 10_000 // batch) if batch < 4096 else 1
            for _ in range(args.rounds):  # alternate, so load changes hit every variant alike
                for key, c in compiled.items():
                    t = time.perf_counter()
                    for _ in range(reps):
                        jax.block_until_ready(c(*states))
                    times[key].append((time.perf_counter() - t) / reps)
            for (quantity, implementation), ts in times.items():
                print(json.dumps({
                    "arm": args.arm, "quantity": quantity, "implementation": implementation, "dtype": dtype_name,
                    "batch": batch, "states_per_second": batch / float(np.median(ts)),
                    "compile_seconds": compile_seconds[(quantity, implementation)],
                }), flush=True)


if __name__ == "__main__":
    main()
