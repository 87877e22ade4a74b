"""What a rollout's reverse pass stores per step: the derivatives of the step's piecewise
operations (torque clip, end stops, divergence guard) by jaxarm's rules or by jax's own.

``jaxarm.rollout`` differentiates the torque clip, the end stops and the divergence guard by rules
of its own (``jaxarm.dynamics.algebra.saturated``, ``jaxarm.simulate.rollouts._end_stops``, ``_selected``) that store one
array each per step (the end stops two) for the reverse pass. This script traces the gradient of
a batched 1000-step RK3 rollout cost with respect to the torques both ways in one process (jax's
rules by patching those three functions with their plain forms while tracing), counts the arrays
the compiled program writes per step (its dynamic-update-slice kernels), checks that the two
gradients are equal, and times the forward pass and both gradients alternately. One JSON line per
arm, batch and variant: best and median of ``--repeats`` calls.

    python experiments/reverse_mode_stores.py
    python experiments/reverse_mode_stores.py --arms puma560 --batches 16 --repeats 40
"""

from __future__ import annotations

import argparse
import json
import re
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.dynamics import algebra  # noqa: E402
from jaxarm.simulate import rollouts  # noqa: E402

STEPS, DT = 1000, 1e-3
JAX_RULES = (algebra.saturated_plain, rollouts._end_stops_plain, rollouts._selected_plain)


def programs(arm, B, rng):
    lim = np.asarray(arm.limits.position)
    q0 = jnp.asarray(rng.uniform(lim[:, 0], lim[:, 1], (B, arm.n)) * 0.5)
    qd0 = jnp.zeros((B, arm.n))
    gravity = np.asarray(jax.vmap(lambda q: jaxarm.gravity_torques(arm, q))(q0))
    tau = jnp.asarray(gravity[:, None, :] + rng.normal(0.0, 1.0, (B, STEPS, arm.n)))
    final = jax.vmap(lambda q0, qd0, u: jaxarm.rollout(arm, q0, qd0, u, DT, method="rk3", on_divergence="flag").q[-1])

    def cost(u, q0, qd0):
        return jnp.sum(final(q0, qd0, u) ** 2) + 1e-6 * jnp.sum(u**2)

    ours = (algebra.saturated, rollouts._end_stops, rollouts._selected)
    compiled = {}
    for variant, rules in (("jax_rules", JAX_RULES), ("jaxarm_rules", ours)):
        algebra.saturated, rollouts._end_stops, rollouts._selected = rules
        try:
            for name, fn in (("forward", cost), ("gradient", jax.grad(cost))):
                t0 = time.perf_counter()
                compiled[variant, name] = jax.jit(fn, compiler_options=jaxarm.compiler_options()).lower(tau, q0, qd0).compile()
                compiled[variant, name + "_compile_s"] = time.perf_counter() - t0
        finally:
            algebra.saturated, rollouts._end_stops, rollouts._selected = ours
    return compiled, (tau, q0, qd0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="puma560,panda")
    ap.add_argument("--batches", default="16,256")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    for name in args.arms.split(","):
        arm = jaxarm.load_arm(name)
        for B in (int(b) for b in args.batches.split(",")):
            compiled, inputs = programs(arm, B, rng)
            g = {v: np.asarray(compiled[v, "gradient"](*inputs)) for v in ("jax_rules", "jaxarm_rules")}
            if not np.array_equal(g["jax_rules"], g["jaxarm_rules"]):
                raise AssertionError(f"{name}: the gradients differ by {np.max(np.abs(g['jax_rules'] - g['jaxarm_rules'])):.3g}")
            times = {k: [] for k in compiled if isinstance(k[1], str) and not k[1].endswith("_s")}
            for _ in range(args.repeats):  # alternately, so that the machine's slow episodes hit both
                for k in times:
                    t0 = time.perf_counter()
                    jax.block_until_ready(compiled[k](*inputs))
                    times[k].append(time.perf_counter() - t0)
            for v in ("jax_rules", "jaxarm_rules"):
                hlo = compiled[v, "gradient"].as_text()
                fwd, grad = np.sort(times[v, "forward"]), np.sort(times[v, "gradient"])
                print(json.dumps(dict(
                    arm=name, batch=B, steps=STEPS, variant=v,
                    arrays_written_per_step=len(re.findall(r"dynamic-update-slice[\w.-]* = ", hlo)),
                    forward_best_s=round(fwd[0], 5), forward_median_s=round(float(np.median(fwd)), 5),
                    gradient_best_s=round(grad[0], 5), gradient_median_s=round(float(np.median(grad)), 5),
                    ratio_best=round(grad[0] / fwd[0], 2), ratio_median=round(float(np.median(grad) / np.median(fwd)), 2),
                    gradient_compile_s=round(compiled[v, "gradient_compile_s"], 2), gradients_equal=True)), flush=True)


if __name__ == "__main__":
    main()
