"""Compile time of the Jacobian with respect to the whole arm under a plain ``jax.jit``.

``jax.jit(jax.jacfwd(jaxarm.inverse_dynamics))(arm, q, qd, qdd)`` differentiates along every
parameter of the arm at once (a vmap over their basis) and cuts the result into one block per arm
leaf. Without a fence XLA fuses the whole component-wise expression into each block and computes
it once per leaf; jaxarm's functions end it with an exact product by the identity when they see
that transformation (``jaxarm.dynamics.eager._fenced``). This script compiles both forms in one
process (``unfenced`` calls the undecorated function, ``fn.__wrapped__``, whose output is not
ended so; forward dynamics keeps the products inside it, on the accelerations its Newton-Euler
tangent is taken at and on that tangent before its solve), checks that they agree, and prints one
JSON line per arm, function and form: compile time, optimized program size and time per call.

    python experiments/arm_jacobian_compile.py                      # two-link and Puma 560
    python experiments/arm_jacobian_compile.py --arms panda --forms fenced
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxarm  # noqa: E402

FUNCTIONS = {
    "inverse_dynamics": lambda f, a, q, qd, qdd: f(a, q, qd, qdd),
    "mass_matrix": lambda f, a, q, qd, qdd: f(a, q),
    "forward_dynamics": lambda f, a, q, qd, qdd: f(a, q, qd, qdd),
}


def measure(arm_name, function, form, repeats=20):
    arm = jaxarm.load_arm(arm_name)
    n = arm.n
    rng = np.random.default_rng(0)
    q, qd, qdd = (jnp.asarray(rng.uniform(-1, 1, n)) for _ in range(3))
    public = getattr(jaxarm, function)
    fn = public if form == "fenced" else public.__wrapped__
    call = FUNCTIONS[function]
    jac = jax.jit(jax.jacfwd(lambda a: call(fn, a, q, qd, qdd)))
    start = time.perf_counter()
    compiled = jac.lower(arm).compile()
    seconds = time.perf_counter() - start
    out = jax.block_until_ready(compiled(arm))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(arm))
        times.append(time.perf_counter() - t)
    reference = jax.jacfwd(lambda a: call(public.__wrapped__, a, q, qd, qdd))(arm)  # op by op
    error = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(reference)))
    return {"arm": arm_name, "function": function, "form": form, "parameters": int(sum(np.size(x) for x in jax.tree_util.tree_leaves(arm))),
            "compile_s": round(seconds, 2), "optimized_hlo_mb": round(len(compiled.as_text()) / 1e6, 2),
            "call_us": round(1e6 * min(times), 1), "max_abs_difference_op_by_op": error, "device": jax.devices()[0].device_kind}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="two_link_planar,puma560")
    parser.add_argument("--functions", default="inverse_dynamics,mass_matrix,forward_dynamics")
    parser.add_argument("--forms", default="fenced,unfenced")
    args = parser.parse_args()
    for arm_name in args.arms.split(","):
        for function in args.functions.split(","):
            for form in args.forms.split(","):
                print(json.dumps(measure(arm_name, function, form)), flush=True)


if __name__ == "__main__":
    main()
