"""Memory and time of reverse-mode gradients through long rollouts, with and without jax.checkpoint.

    python experiments/checkpoint_memory.py              # Puma 560, 10^4 RK3 steps at 1 ms
    python experiments/checkpoint_memory.py --steps 2000
    python experiments/checkpoint_memory.py --quick      # 500 steps

For each setting prints one JSON line: XLA's temporary-buffer size for the compiled gradient
(``memory_analysis().temp_size_in_bytes``), the wall time of one gradient evaluation and of one
forward rollout (best of repeats, as in benchmark.py), and the gradient's agreement between the two
settings. The first line describes the machine (benchmark.py's ``machine()``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from benchmark import best_time, machine  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", default="puma560")
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--dt", type=float, default=1e-3)
    p.add_argument("--min-time", type=float, default=1.0, help="seconds spent timing each call")
    p.add_argument("--quick", action="store_true", help="500 steps, short timings")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.min_time = 500, 0.1
    print(json.dumps({"machine": machine()}), flush=True)
    arm = jaxarm.load_arm(args.arm)
    n, T = arm.n, args.steps
    rng = np.random.default_rng(0)
    q0 = jnp.asarray(rng.uniform(-0.3, 0.3, n))
    tau = jnp.asarray(rng.uniform(-2, 2, (T, n))) + jaxarm.gravity_torques(arm, q0)
    grads = {}
    for checkpoint in (False, True):

        def cost(u, checkpoint=checkpoint):
            traj = jaxarm.rollout(arm, q0, jnp.zeros(n), u, args.dt, checkpoint=checkpoint, on_divergence="flag")
            return jnp.sum(traj.q[-1] ** 2) + 1e-6 * jnp.sum(u**2)

        fwd = jax.jit(cost).lower(tau).compile()
        grad = jax.jit(jax.grad(cost)).lower(tau).compile()
        mem = grad.memory_analysis()
        t_fwd = best_time(lambda: jax.block_until_ready(fwd(tau)), args.min_time)
        t_grad = best_time(lambda: jax.block_until_ready(grad(tau)), args.min_time)
        g = grad(tau)
        grads[checkpoint] = np.asarray(g)
        print(
            json.dumps(
                {
                    "arm": args.arm,
                    "steps": T,
                    "checkpoint": checkpoint,
                    "grad_temp_bytes": int(mem.temp_size_in_bytes) if mem is not None else None,
                    "forward_seconds": t_fwd,
                    "grad_seconds": t_grad,
                    "grad_over_forward": t_grad / t_fwd,
                }
            ),
            flush=True,
        )
    diff = np.abs(grads[True] - grads[False]).max() / max(np.abs(grads[False]).max(), 1e-300)
    print(json.dumps({"metric": "checkpoint_grad_relative_difference", "value": float(diff)}), flush=True)


if __name__ == "__main__":
    main()
