"""Transformations of a rollout applied outside any jit, as a new user first writes them.

    python experiments/eager_rollout_transforms.py [--arms panda,puma560] [--steps 1000]

``jax.grad`` of a cost of the final state with respect to the torque schedule and to the start
position, ``jax.jacfwd`` of the final state with respect to the start position, ``jax.hessian``
of the cost with respect to the start position (over ``--hessian-steps`` steps), ``jax.vmap``
over 8 schedules and ``jax.vmap`` of ``jax.grad``: for each, the first call's seconds, a second
call's with new values of the same shapes, and the programs JAX compiled for that second call
(float64, RK3, dt = 1 ms, known arm). One JSON line per arm and transformation. To compare with
an earlier version, run the same command with ``PYTHONPATH`` pointing at a checkout of it.
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

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="panda,puma560")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--hessian-steps", type=int, default=100)
    args = ap.parse_args(argv)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(lambda name, s, **kw: compiles.append(s) if name == COMPILE_EVENT else None)
    for name in args.arms.split(","):
        arm = jaxarm.load_arm(name)
        n, T = arm.n, args.steps
        rng = np.random.default_rng(0)
        q = jnp.asarray(np.mean(np.asarray(arm.limits.position), axis=1))
        qd = jnp.zeros(n)
        g = np.asarray(jaxarm.gravity_torques(arm, q))

        def cost(u, q0):
            return jnp.sum(jaxarm.rollout(arm, q0, qd, u, 1e-3).q[-1] ** 2)

        def final(q0, u):
            return jaxarm.rollout(arm, q0, qd, u, 1e-3).q[-1]

        H = args.hessian_steps
        cases = {
            "grad_wrt_torques": lambda u, q0: jax.grad(cost)(u, q0),
            "grad_wrt_start": lambda u, q0: jax.grad(cost, argnums=1)(u, q0),
            "jacfwd_wrt_start": lambda u, q0: jax.jacfwd(final)(q0, u),
            "hessian_wrt_start": lambda u, q0: jax.hessian(lambda q0: cost(u[:H], q0))(q0),
            "vmap_8_schedules": lambda u, q0: jax.vmap(final, (None, 0))(q0, jnp.stack([u * (1 + 0.01 * k) for k in range(8)])),
            "vmap_8_of_grad": lambda u, q0: jax.vmap(jax.grad(cost), (0, None))(jnp.stack([u * (1 + 0.01 * k) for k in range(8)]), q0),
        }
        for case, fn in cases.items():
            values = [(jnp.asarray(np.tile(g, (T, 1)) + 0.1 * rng.normal(size=(T, n))), q + 0.01 * k) for k in range(2)]
            start = time.perf_counter()
            jax.block_until_ready(fn(*values[0]))
            first = time.perf_counter() - start
            before = len(compiles)
            start = time.perf_counter()
            jax.block_until_ready(fn(*values[1]))
            second = time.perf_counter() - start
            print(json.dumps(dict(arm=name, transformation=case, steps=H if case.startswith("hessian") else T,
                                  first_call_s=round(first, 3), second_call_s=round(second, 4),
                                  second_call_compiles=len(compiles) - before)), flush=True)


if __name__ == "__main__":
    main()
