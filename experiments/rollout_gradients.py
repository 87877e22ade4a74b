"""Gradients through rollouts: plain reverse mode, checkpointed steps and the discrete adjoint.

    python experiments/rollout_gradients.py [--arms puma560] [--batches 1 256]
        [--kinds checkpoint adjoint autodiff] [--steps 1000]
    python experiments/rollout_gradients.py --wrt masses [--arms panda] [--methods euler rk3] [--steps 40]

The gradient of a batched rollout cost (squared final positions + 1e-6 |u|^2, RK3, dt = 1 ms,
float64) with respect to all torque inputs, relative to the cost itself, as the benchmark's
``rollout_grad`` rows measure it (``benchmarks/benchmark.py``), for three ways of differentiating
the rollout: plain reverse mode (``autodiff``), ``checkpoint=True`` and ``adjoint=True``. Each
gradient is checked against the first one computed before it is timed. One JSON line per arm,
batch and kind, with the compile time and the memory XLA reserves for the gradient program's
intermediates (``temp_MB``: ``memory_analysis().temp_size_in_bytes`` of the compiled program,
the working memory beyond its inputs and outputs).

``--wrt masses``: the gradient of one rollout's summed final joint positions with respect to the
links' masses (the arm traced, so nothing of it is folded into the program: identification by
simulation error, domain randomization), from the middle of the joints' ranges under gravity
compensation, dt = 1 ms, for each ``--methods`` entry and kind: its compile time and run time.

What makes reverse mode cheap (docs/how-it-works.md, "What makes reverse mode cheap"): forward
dynamics differentiated through inverse dynamics (``jaxarm.dynamics.forward._forward_dynamics``),
the Runge-Kutta stage loop evaluating the dynamics again in reverse mode instead of storing them
(``jaxarm.integrators.explicit_rk``), and the recursions reading a joint vector by one split, so
that reverse mode gathers its cotangents in one concatenate (``jaxarm.dynamics.algebra.entries``). To
compare with an earlier commit, run the same command with ``PYTHONPATH`` pointing at a checkout
of it (``git worktree add /tmp/before <commit>``), alternating the runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import benchmark as bench  # noqa: E402  (benchmark_arm, rollout_inputs, compile_timed, best_time)

KINDS = {"autodiff": {}, "checkpoint": {"checkpoint": True}, "adjoint": {"adjoint": True}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", nargs="+", default=["puma560"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    ap.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=["checkpoint", "adjoint", "autodiff"])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds of repeats per timing (best of them)")
    ap.add_argument("--wrt", choices=["torques", "masses"], default="torques")
    ap.add_argument("--methods", nargs="+", default=["euler", "rk3"], help="integrators of --wrt masses")
    args = ap.parse_args(argv)
    dt = 1e-3
    if args.wrt == "masses":
        return masses(args, dt)
    for name in args.arms:
        arm = bench.benchmark_arm(name)
        rng = np.random.default_rng(0)

        def cost_fn(**kw):
            def final(q0, qd0, u):
                return jaxarm.rollout(arm, q0, qd0, u, dt, method="rk3", on_divergence="flag", **kw).q[-1]

            return lambda u, q0, qd0: jnp.sum(jax.vmap(final)(q0, qd0, u) ** 2) + 1e-6 * jnp.sum(u**2)

        for B in args.batches:
            q0, qd0, tau = (jnp.asarray(x) for x in bench.rollout_inputs(arm, rng, B, args.steps))
            fwd, _ = bench.compile_timed(cost_fn(), tau, q0, qd0)
            t_fwd = bench.best_time(lambda: jax.block_until_ready(fwd(tau, q0, qd0)), args.min_time)
            reference = None
            for kind in args.kinds:
                grad, compile_s = bench.compile_timed(jax.grad(cost_fn(**KINDS[kind])), tau, q0, qd0)
                g = np.asarray(grad(tau, q0, qd0))
                reference = g if reference is None else reference
                rel = float(np.max(np.abs(g - reference)) / np.max(np.abs(reference)))
                if not rel < 1e-9:
                    raise AssertionError(f"{name} batch {B}: the {kind} gradient differs from the {args.kinds[0]} one by {rel:.3g} (relative)")
                t = bench.best_time(lambda: jax.block_until_ready(grad(tau, q0, qd0)), args.min_time)
                print(json.dumps(dict(case="rollout_grad", arm=name, batch=B, kind=kind, steps=args.steps,
                                      ratio=round(t / t_fwd, 2), grad_s=round(t, 4), forward_s=round(t_fwd, 4),
                                      compile_s=round(compile_s["value"], 1), temp_MB=temp_megabytes(grad), rel_diff=rel,
                                      device=str(jax.devices()[0]))),
                      flush=True)
    return 0


def temp_megabytes(compiled):
    """The working memory XLA reserves for a compiled program's intermediates, in MiB (None where
    the backend does not report it)."""
    analysis = compiled.memory_analysis()
    return None if analysis is None else round(analysis.temp_size_in_bytes / 2**20, 2)


def masses(args, dt):
    """The gradient of a rollout with respect to the links' masses (one rollout, the arm traced)."""
    import time

    for name in args.arms:
        arm = jaxarm.load_arm(name)
        q0 = jnp.asarray(np.mean(np.asarray(arm.limits.position), axis=1))
        u = jnp.tile(jnp.asarray(jaxarm.gravity_torques(arm, q0)), (args.steps, 1))
        mass = jnp.asarray(arm.links.mass)
        for method in args.methods:
            reference = None
            for kind in args.kinds:
                def cost(m, method=method, kind=kind):
                    a = arm.replace(links=arm.links.replace(mass=m))
                    traj = jaxarm.rollout(a, q0, jnp.zeros(arm.n), u, dt, method=method, on_divergence="flag", **KINDS[kind])
                    return jnp.sum(traj.q[-1])

                grad, compile_s = bench.compile_timed(jax.grad(cost), mass)
                g = np.asarray(grad(mass))
                reference = g if reference is None else reference
                rel = float(np.max(np.abs(g - reference)) / np.max(np.abs(reference)))
                if not rel < 1e-9:
                    raise AssertionError(f"{name} {method}: the {kind} mass gradient differs from the {args.kinds[0]} one by {rel:.3g}")
                jax.block_until_ready(grad(mass))
                t0 = time.perf_counter()
                for _ in range(20):
                    jax.block_until_ready(grad(mass))
                print(json.dumps(dict(case="mass_grad", arm=name, method=method, kind=kind, steps=args.steps,
                                      compile_s=round(compile_s["value"], 1), grad_ms=round((time.perf_counter() - t0) / 20 * 1e3, 2),
                                      rel_diff=rel, device=str(jax.devices()[0]))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
