"""Receding-horizon control (model predictive control) on :func:`jaxarm.trajopt.ddp`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ....core import tracers
from ....core.xla import eager_compiled, jit, split_settings
from ...step_jacobians import _step
from ..ocp import OCP, _kept_key, solver_arm
from .ddp import OCPResult, ddp


def shift(problem: OCP, plan: OCPResult):
    """The previous plan moved one step on: inputs u_1..u_{T-1} with the last one repeated, states
    x_1..x_T with one more step of the model appended, multipliers likewise. (u (T, n), x (T+1, 2n),
    multipliers (T+1, m)) to pass to :func:`jaxarm.trajopt.ddp` as the warm start."""
    u = jnp.concatenate([plan.u[1:], plan.u[-1:]])
    x_last = _step(solver_arm(problem), plan.x[-1], plan.u[-1], problem.dt, problem.method, problem.input)
    x = jnp.concatenate([plan.x[1:], x_last[None]])
    lam = jnp.concatenate([plan.multipliers[1:], plan.multipliers[-1:]])
    return u, x, lam


def mpc_step(problem: OCP, x, plan: OCPResult | None = None, *, max_iterations: int = 10, **options) -> OCPResult:
    """One step of receding-horizon control: re-plan from the measured state x (2n,) over the
    problem's horizon, warm-started from ``plan`` (the previous step's answer) moved one step on
    (:func:`shift`): its states, with the first replaced by x, start the solve infeasible by the
    model's error, which the feasibility-driven solver closes. Apply ``result.u[0]``; pass the
    result back as ``plan`` next time. ``max_iterations`` bounds the work per control step (the
    warm start usually needs a few; one, the real-time iteration scheme of Diehl, Bock & Schloeder
    2005, tracked as well as three in ``experiments/trajopt_mpc.py``, at 3.6 ms instead of 9.6 ms a
    step); ``options`` go to :func:`jaxarm.trajopt.ddp`. Targets that move are ``params`` entries:
    ``problem.replace(params=...)`` before the call (same shapes: no recompile, and the terms are
    not traced again). Pure and traceable: ``jax.jit`` it once and call it in a loop, or inside a
    ``lax.scan`` with the simulator (:func:`jaxarm.rollout`), planning on one arm and simulating
    another. Jit a function that closes over the problem and takes the targets, x and the plan as
    arguments (``jaxarm.jit(lambda targets, x, plan: mpc_step(problem.replace(params=...), x,
    plan))``): the model arm is then a constant of the program, whose numbers the dynamics fold
    (Puma, 50 knots: 1.5 ms a step against 2.2 ms with the problem an argument). Called eagerly,
    in a plain Python loop, it does this itself: the first step (and the first with a plan)
    compiles, the next ones reuse that program. Constraints:
    each step ends with a multiplier update (``update_at_limit=True``, the real-time iteration
    scheme's estimate), and the shifted multipliers warm-start the next step.
    """
    # each control step ends with a multiplier update, converged or not (few iterations a step:
    # otherwise a constraint's multipliers would move only at the steps that happen to converge)
    options.setdefault("update_at_limit", True)
    x = jnp.asarray(x, jnp.result_type(problem.x0))
    if x.shape != (2 * problem.n,):
        raise ValueError(f"mpc_step: x: expected the measured state (q, qd) of shape ({2 * problem.n},), got {x.shape}")
    if tracers.eager():  # called in a plain Python loop: one compiled step, kept (as ddp does)
        stepped = _compiled_step(problem, x, plan, max_iterations, options)
        if stepped is not None:
            return stepped
    problem = problem.replace(x0=x)
    if plan is None:
        return ddp(problem, max_iterations=max_iterations, **options)
    u, xs, lam = shift(problem, plan)
    xs = xs.at[0].set(x)
    return ddp(problem, u, xs, max_iterations=max_iterations, multipliers=lam, **options)


def _compiled_step(problem, x, plan, max_iterations, options):
    """:func:`mpc_step` called eagerly, answered by a compiled step kept for the next call
    (:func:`jaxarm.core.xla.eager_compiled`): the problem but its ``params`` (the model arm above
    all) and the settings are its constants; the targets (``params``), the measured state and the
    plan its arguments. A control loop in plain Python then compiles once, where every step run
    op by op traced and compiled the solver's loops again (seconds a step). None where a setting
    cannot key a kept program."""
    settings, arrays = split_settings(dict(options, max_iterations=max_iterations))
    problem_key, params, rebuild = _kept_key(problem)
    key = ("mpc_step", problem_key, jax.tree_util.tree_structure(plan), settings, tuple(sorted(arrays)))
    step = eager_compiled(key, lambda: jit(lambda params, x, plan, arrays: mpc_step(
        rebuild(params), x, plan, **dict(settings), **arrays)))
    return None if step is None else step(params, x, plan, arrays)
