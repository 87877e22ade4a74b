"""The implicit gradient of a ddp solution against the horizon: its adjoint alone, first call and warm.

    python experiments/implicit_gradient_horizons.py [--horizons 100,400,1000]

The two-link planar arm reaches 0.42 m in 1 s (RK3, T knots, dt = 1/T) around a 10 cm sphere that
the free path would cross (the obstacle is active), with the torque box; the solve is converged
tightly, then the vector-Jacobian product of the solution with respect to the sphere's centre
(``jaxarm.control.trajopt.solvers.implicit.solution_vjp``, the backward pass of ``jax.grad`` through
``trajopt.ddp``) of sum (u / u_max)^2 / 2 is compiled and timed on its own (``jaxarm.jit``; best of 5 warm calls). One JSON
line per horizon: the adjoint system is solved knot after knot, so its warm time should grow
linearly in T. To compare with another version of jaxarm, run the same script with that version
first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import trajopt  # noqa: E402
from jaxarm.control.trajopt.solvers import implicit  # noqa: E402
from jaxarm.trajopt import terms  # noqa: E402

LIMITS = np.array([20.0, 8.0])
Q0 = np.array([-1.2, 0.8])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--horizons", default="100,400,1000", help="comma-separated knot counts T")
    args = ap.parse_args(argv)
    arm = jaxarm.load_arm("two_link_planar")
    arm = arm.replace(limits=dataclasses.replace(arm.limits, torque=LIMITS, velocity=np.array([10.0, 10.0]),
                                                 position=np.array([[-np.pi, np.pi]] * 2)))
    q0 = jnp.asarray(Q0)
    goal = jaxarm.tool_pose(arm, q0)[:3, 3] + jnp.array([0.3, 0.3, 0.0])
    costs = terms.effort(1.0 / LIMITS**2) + terms.tool_position("goal", 300.0) + terms.joint_velocity(3.0)
    print(json.dumps(dict(device=str(jax.devices()[0]), jax=jax.__version__, jaxarm=jaxarm.__file__)), flush=True)
    for T in (int(t) for t in args.horizons.split(",")):
        dt = 1.0 / T
        free = jaxarm.jit(lambda p: trajopt.ddp(p, tol=1e-10, max_iterations=300))(
            trajopt.ocp(arm, q0, T, dt, costs=costs, params={"goal": goal}))
        tool = jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(free.q)
        centre = tool[T // 2] + jnp.array([0.02, -0.01, 0.0])
        problem = trajopt.ocp(arm, q0, T, dt, costs=costs, constraints=terms.keep_out_sphere("centre", 0.1),
                              params={"goal": goal, "centre": centre})
        res = jaxarm.jit(lambda p, u, x: trajopt.ddp(p, u, x, tol=1e-10, tol_violation=1e-9, max_iterations=400,
                                                     al_iterations=30))(problem, free.u, free.x)
        # the leaves differentiated: the centre alone, as jax.grad with respect to it marks them
        perturbed = [a is problem.params["centre"] for a in jax.tree_util.tree_leaves(problem)]
        vjp = jaxarm.jit(lambda p, x, u, lam, u_bar: implicit.solution_vjp(
            p, x, u, lam, jnp.zeros_like(x), u_bar, perturbed).params["centre"])
        call = (problem, res.x, res.u, res.multipliers, res.u / LIMITS**2)
        t0 = time.perf_counter()
        grad = jax.block_until_ready(vjp(*call))
        first = time.perf_counter() - t0
        warm = []
        for _ in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(vjp(*call))
            warm.append(time.perf_counter() - t0)
        print(json.dumps(dict(T=T, converged=bool(res.converged), iterations=int(res.iterations),
                              active_knots=int(np.sum(np.asarray(res.multipliers) > 0)),
                              first_call_s=round(first, 2), warm_s=round(min(warm), 5),
                              gradient=np.asarray(grad).round(6).tolist())), flush=True)


if __name__ == "__main__":
    main()
