"""Direct single and multiple shooting through differentiable rollouts, minimized with optax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ....model.arm import Arm
from ..objective import (
    _al_equality,
    _augmented_lagrangian,
    _constraints,
    _empty_log,
    _lagrangian,
    _record,
    _rel_change,
    _result,
    _simulate,
    _zero_multipliers,
)
from ....core import tracers
from ....simulate.rollouts import warn_deprecated_adjoint
from ..problem import ReachProblem, TrajoptResult, _eager_reach, _setup


def _optax_minimize(fun, optimizer, max_iterations, tol, gtol, window):
    """Inner solver for shooting: optax iterations at fixed (lam, mu) until converged, or
    max_iterations in total (over all augmented-Lagrangian rounds).

    Converged when either
    - the objective decreased by less than ``tol`` relatively over the last ``window`` iterations,
      (f_{k-window} - f_k) <= tol |f_{k-window}| (a plateau; a single-step test is fooled by the
      zoom line search's occasional tiny steps, and squashed inputs at an active limit approach
      the optimum only asymptotically, tanh z -> 1 as z -> inf, so the gradient never vanishes), or
    - the largest gradient entry fell below ``gtol`` times its value at the start of this inner
      solve (scale-free, unlike an absolute threshold).
    A non-finite objective, or no decrease at all over a window (a line search that only returns
    zero steps), stops the loop unconverged."""
    opt = optax.with_extra_args_support(optimizer)

    def inner(params, lam, mu, it, log):
        # in the decision's precision: optax's zoom line search steps by a float64 step length where
        # float64 is enabled, which would lift a float32 problem's trial points (and every rollout of
        # the line search) to float64
        dtypes = jax.tree_util.tree_map(lambda p: p.dtype, params)
        f = lambda p: fun(jax.tree_util.tree_map(lambda x, d: x.astype(d), p, dtypes), lam, mu)  # noqa: E731
        state = opt.init(params)
        reuse = optax.tree_utils.tree_get(state, "value", None) is not None  # L-BFGS keeps value and grad
        value_and_grad = optax.value_and_grad_from_state(f) if reuse else jax.value_and_grad(f)
        dtype = log.cost.dtype

        def cond(c):
            params, state, history, g0, j, it, done, failed, log = c
            return (it < max_iterations) & ~done & ~failed

        def body(c):
            params, state, history, g0, j, it, done, failed, log = c
            value, grad = value_and_grad(params, state=state) if reuse else value_and_grad(params)
            gmax = jnp.max(jnp.stack([jnp.max(jnp.abs(g)) for g in jax.tree_util.tree_leaves(grad)]))
            g0 = jnp.where(j == 0, gmax, g0)
            oldest = history[j % window]  # f from `window` iterations ago (inf until then)
            decrease = oldest - value
            plateau = jnp.isfinite(oldest) & (decrease > 0) & (decrease <= tol * jnp.abs(oldest))
            done = plateau | (gmax <= gtol * g0)
            failed = ~jnp.isfinite(value) | (jnp.isfinite(oldest) & (decrease <= 0))  # stalled: no decrease in a window
            history = history.at[j % window].set(value)
            updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=f)
            stop = done | failed
            params = jax.tree_util.tree_map(lambda p, q: jnp.where(stop, p, q), params, optax.apply_updates(params, updates))
            previous = history[(j - 1) % window]
            log = _record(log, it, value, jnp.where(j > 0, _rel_change(previous, value), jnp.nan))
            return params, state, history, g0, j + 1, it + 1, done, failed, log

        init = (params, state, jnp.full((window,), jnp.inf, dtype), jnp.asarray(jnp.inf, dtype), jnp.asarray(0), it,
                jnp.asarray(False), jnp.asarray(False), log)
        init = tracers.batched_with(init, (lam, mu))  # (under vmap: each loop batched once)
        params, state, _, _, _, it, done, _, log = jax.lax.while_loop(cond, body, init)
        return params, it, done, log

    return inner


def shooting(
    arm: Arm,
    problem: ReachProblem,
    u_init,
    *,
    torque_limits: str = "squash",
    input: str = "torque",
    method="rk3",
    optimizer: optax.GradientTransformation | None = None,
    max_iterations: int = 1000,
    tol: float | None = None,
    gtol: float = 1e-6,
    window: int = 10,
    tol_violation: float = 1e-4,
    al_iterations: int = 10,
    mu: float = 10.0,
    mu_growth: float = 10.0,
    checkpoint: bool = False,
    adjoint: bool = False,
) -> TrajoptResult:
    """Direct single shooting: minimize J over the whole input schedule through one differentiable
    rollout (:func:`jaxarm.rollout`, RK3 by default) with an optax optimizer.

    arm: the arm (vmap over :func:`jaxarm.stack_arms` for many); problem: :class:`ReachProblem`;
    u_init: (T, n) warm start (e.g. gravity torques at q0, or a previous result's u).
    torque_limits: "squash" (u = u_max tanh z: always feasible, unconstrained) or
    "augmented_lagrangian" (u free, |u| <= u_max by multipliers). Joint position/velocity limits
    always go through the augmented Lagrangian (al_iterations rounds, penalty mu growing by mu_growth).
    optimizer: any optax transformation (default ``optax.lbfgs()``, zoom line search).
    Stopping rule (each augmented-Lagrangian round): converged when the objective decreased by less
    than ``tol`` relatively over the last ``window`` iterations, or when the largest gradient entry
    (w.r.t. the dimensionless z) fell below ``gtol`` times its value at the start of the round; a
    non-finite objective or no decrease at all over a window stops unconverged. (An absolute gradient test never triggers with a
    squashed, active limit: tanh z approaches it only as z -> inf.) max_iterations: over all rounds.
    tol: by default 1e-7, or 10 machine epsilons of the arm's precision where that is larger
    (float32: 1.2e-6; a float32 objective cannot show a relative decrease of 1e-7, and the plateau
    test then rarely passed).
    checkpoint: rematerialize rollout steps in the backward pass (less memory).
    adjoint: deprecated (a ``FutureWarning``), to be removed: gradients by the discrete adjoint
        (``jaxarm.rollout(..., adjoint=True)``): the same gradient, slower, compiled longer and
        stored larger than plain reverse mode's (see :func:`jaxarm.rollout`). Here: the
        Puma 560 reach (T = 50, arm closed over, :func:`jaxarm.jit`) took 0.57 ms per iteration and
        a 31 s first call with it, against 0.43 ms and 15 s without; under a plain ``jax.jit``
        on a CPU it is slower still (see :func:`jaxarm.rollout`).
    Pure and traceable: ``jax.vmap(lambda p: shooting(arm, p, u0))(problems)`` solves a batch.
    Jit a function that closes over the arm, ``jaxarm.jit(lambda p, u: shooting(arm, p, u))``,
    rather than passing the arm to the jit: L-BFGS's line search holds several copies of the
    rollout's gradient, and with a traced arm none of them folds the arm's numbers (Puma 560 reach,
    T = 50, with adjoint gradients: first call 110 s with the arm a jit argument, 31 s closed
    over; 15 s closed over with plain reverse mode).
    """
    given = dict(locals())  # the call as made (an eager call is answered by a kept compiled solve)
    if adjoint:
        warn_deprecated_adjoint("trajopt.shooting")
    setup, u_init = _setup(arm, problem, u_init, "shooting", torque_limits=torque_limits, input=input, method=method, checkpoint=checkpoint, adjoint=adjoint)
    _check_iterations(max_iterations, al_iterations, "shooting", window=window)
    tol = default_tol(u_init.dtype) if tol is None else tol
    if tracers.eager():
        solved = _eager_reach(shooting, given)
        if solved is not None:
            return solved
    optimizer = _default_optimizer() if optimizer is None else optimizer

    def objective(z, lam, mu):
        return _lagrangian(setup, _simulate(setup, z), z, lam, mu)

    def constraint_values(z):
        g_state, g_input = _constraints(setup, _simulate(setup, z), z)
        return g_state, g_input, jnp.zeros((0, 2 * setup.arm.n), g_state.dtype)

    z0 = setup.from_input(u_init)
    log = _empty_log(max_iterations, z0.dtype)
    z, it, conv, log = _augmented_lagrangian(
        _optax_minimize(objective, optimizer, max_iterations, tol, gtol, window), constraint_values, z0,
        _zero_multipliers(setup, 1, z0.dtype), mu0=mu, mu_growth=mu_growth, mu_max=1e8,
        al_iterations=al_iterations, tol_violation=tol_violation, log=log, reads=(arm, problem, u_init))
    return _result(setup, z, jnp.zeros((0,), z.dtype), it, conv, tol_violation, log)


def multiple_shooting(
    arm: Arm,
    problem: ReachProblem,
    u_init,
    *,
    segments: int = 10,
    torque_limits: str = "squash",
    input: str = "torque",
    method="rk3",
    optimizer: optax.GradientTransformation | None = None,
    max_iterations: int = 2000,
    tol: float | None = None,
    gtol: float = 1e-6,
    window: int = 10,
    tol_violation: float = 1e-4,
    al_iterations: int = 10,
    mu: float = 100.0,
    mu_growth: float = 10.0,
    checkpoint: bool = False,
    adjoint: bool = False,
) -> TrajoptResult:
    """Direct multiple shooting: the horizon T is split into ``segments`` equal pieces (T must be a
    multiple), each rolled out (vmapped :func:`jaxarm.rollout`) from its own initial state, which is
    a decision variable; continuity x_end(segment j) = x_start(segment j+1) is an equality
    constraint (defect) handled by the augmented Lagrangian together with the limits.

    Same cost, options (``adjoint`` included) and result as :func:`shooting`; the segment starts are initialized from a
    rollout of u_init (zero defects), and the result's trajectory is a single rollout of the
    optimized u (its max_violation includes the remaining defects).
    """
    given = dict(locals())  # the call as made (an eager call is answered by a kept compiled solve)
    if adjoint:
        warn_deprecated_adjoint("trajopt.multiple_shooting")
    setup, u_init = _setup(arm, problem, u_init, "multiple_shooting", torque_limits=torque_limits, input=input, method=method, checkpoint=checkpoint, adjoint=adjoint)
    _check_iterations(max_iterations, al_iterations, "multiple_shooting", window=window)
    tol = default_tol(u_init.dtype) if tol is None else tol
    if not isinstance(segments, (int, np.integer)) or segments < 1 or setup.T % segments:
        raise ValueError(f"multiple_shooting: segments: expected a positive whole number dividing the horizon T = {setup.T}, got {segments!r}")
    if tracers.eager():
        solved = _eager_reach(multiple_shooting, given)
        if solved is not None:
            return solved
    optimizer = _default_optimizer() if optimizer is None else optimizer
    n, S, L = setup.arm.n, int(segments), setup.T // int(segments)
    p = setup.problem

    def trajectory(params):
        z, starts = params
        x0 = jnp.concatenate([p.q0, p.qd0])
        x_start = jnp.concatenate([x0[None], starts])  # (S, 2n)
        segs = jax.vmap(lambda xs, zs: _simulate(setup, zs, xs))(x_start, z.reshape(S, L, n))  # (S, L+1, 2n)
        defects = segs[:-1, -1] - starts  # (S-1, 2n)
        x = jnp.concatenate([segs[:, :-1].reshape(setup.T, 2 * n), segs[-1, -1:]])
        return x, defects

    def objective(params, lam, mu):
        x, defects = trajectory(params)
        return _lagrangian(setup, x, params[0], lam, mu) + _al_equality(defects, lam.defect, mu)

    def constraint_values(params):
        x, defects = trajectory(params)
        return (*_constraints(setup, x, params[0]), defects)

    z0 = setup.from_input(u_init)
    x_init = _simulate(setup, z0)
    params0 = (z0, x_init[L:setup.T:L][: S - 1])
    log = _empty_log(max_iterations, z0.dtype)
    (z, starts), it, conv, log = _augmented_lagrangian(
        _optax_minimize(objective, optimizer, max_iterations, tol, gtol, window), constraint_values, params0,
        _zero_multipliers(setup, S, z0.dtype), mu0=mu, mu_growth=mu_growth, mu_max=1e8,
        al_iterations=al_iterations, tol_violation=tol_violation, log=log, reads=(arm, problem, u_init))
    _, defects = trajectory((z, starts))
    return _result(setup, z, defects, it, conv, tol_violation, log)


def default_tol(dtype) -> float:
    """The plateau tolerance :func:`shooting` and :func:`multiple_shooting` use by default in
    ``dtype``: 1e-7, or 10 machine epsilons where that is larger (float32: 1.2e-6)."""
    return max(1e-7, 10.0 * float(jnp.finfo(dtype).eps))


def _default_optimizer():
    # L-BFGS (Nocedal & Wright alg. 7.4) with optax's zoom line search (strong Wolfe conditions). A
    # plain backtracking (Armijo) search compiles in about half the time but stalled on these
    # problems (zero steps after a few iterations), so it is not the default.
    return optax.lbfgs()


def _check_iterations(max_iterations, al_iterations, func, window=1):
    for name, v in (("max_iterations", max_iterations), ("al_iterations", al_iterations), ("window", window)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{func}: {name}: expected a positive whole number, got {v!r}")
