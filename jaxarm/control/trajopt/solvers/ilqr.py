"""iLQR on the discrete linearization of the integrator step (Li & Todorov 2004; Tassa, Erez & Todorov 2012)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ....dynamics import linalg
from ....model.arm import Arm
from ...linearize import discrete_dynamics, linearize_trajectory
from ..objective import (
    _augmented_lagrangian,
    _augmented_states,
    _constraints,
    _empty_log,
    _lagrangian,
    _record,
    _rel_change,
    _result,
    _simulate,
    _stage,
    _terminal,
    _zero_multipliers,
)
from ....core import tracers
from ..problem import ReachProblem, TrajoptResult, _eager_reach, _setup
from .shooting import _check_iterations


class _Backward(NamedTuple):
    k: jnp.ndarray  # (T, nu) feedforward
    K: jnp.ndarray  # (T, nu, ns) feedback on the iLQR state s = (x, u_prev)
    dV1: jnp.ndarray  # () sum k^T Q_u
    dV2: jnp.ndarray  # () sum k^T Q_uu k / 2
    ok: jnp.ndarray  # () every regularized Q_uu was positive definite


def _backward_pass(A, B, lx, lu, lxx, luu, lux, Vx, Vxx, reg):
    """Riccati-like backward recursion of iLQR with a Levenberg-Marquardt term reg I on Q_uu
    (Tassa, Erez & Todorov 2012, eqs 5-11; the value update uses the unregularized Q_uu, eq 11)."""

    def step(carry, d):
        Vx, Vxx, ok = carry
        A, B, lx, lu, lxx, luu, lux = d
        Qx = lx + A.T @ Vx
        Qu = lu + B.T @ Vx
        Qxx = lxx + A.T @ Vxx @ A
        Quu = luu + B.T @ Vxx @ B
        Qux = lux + B.T @ Vxx @ A
        Quu_reg = Quu + reg * jnp.eye(Quu.shape[0], dtype=Quu.dtype)
        # factored one column per trip of a loop, not by LAPACK: a library call keeps XLA:CPU from
        # compiling this loop over the knots as one kernel (as in trajopt.ddp's backward pass; the
        # Puma reach of the user guide, 84 iterations, jaxarm.jit: 428 against 590 ms at the median,
        # 330 against 440 ms fastest, both forms compiled in one process and timed in alternation)
        L = linalg.cholesky_factor_columns(Quu_reg)
        ok = ok & jnp.all(jnp.isfinite(L))
        kK = -linalg.cholesky_solve_factored(L, jnp.concatenate([Qu[:, None], Qux], axis=1))
        k, K = kK[:, 0], kK[:, 1:]
        Vx = Qx + K.T @ Quu @ k + K.T @ Qu + Qux.T @ k
        Vxx = Qxx + K.T @ Quu @ K + K.T @ Qux + Qux.T @ K
        Vxx = 0.5 * (Vxx + Vxx.T)
        return (Vx, Vxx, ok), (k, K, k @ Qu, 0.5 * k @ Quu @ k)

    (_, _, ok), (k, K, d1, d2) = jax.lax.scan(step, (Vx, Vxx, jnp.asarray(True)), (A, B, lx, lu, lxx, luu, lux), reverse=True)
    ok = ok & jnp.all(jnp.isfinite(k)) & jnp.all(jnp.isfinite(K))
    return _Backward(k, K, jnp.sum(d1), jnp.sum(d2), ok)


def ilqr(
    arm: Arm,
    problem: ReachProblem,
    u_init,
    *,
    torque_limits: str = "augmented_lagrangian",
    input: str = "torque",
    method="rk3",
    max_iterations: int = 100,
    tol: float = 1e-6,
    regularization: float = 0.0,
    reg_min: float = 1e-8,
    reg_max: float = 1e8,
    reg_factor: float = 10.0,
    line_search_steps: int = 12,
    armijo: float = 1e-4,
    tol_violation: float = 1e-4,
    al_iterations: int = 10,
    mu: float = 10.0,
    mu_growth: float = 10.0,
) -> TrajoptResult:
    """Iterative LQR (Li & Todorov 2004; Tassa, Erez & Todorov 2012) on the discrete dynamics of the
    integrator step: A_k, B_k from :func:`jaxarm.linearize_trajectory`, second-order cost terms from
    ``jax.hessian`` of each stage (and the terminal) cost.

    Each iteration: linearize and quadratize along the nominal; backward pass (``lax.scan``) with
    Q_uu + reg I; forward pass z_k = z_k* + alpha k_k + K_k (s_k - s_k*) (``lax.scan`` of the
    integrator step) with backtracking alpha = 1, 1/2, 1/4, ... (``line_search_steps`` tries) until
    the decrease is at least ``armijo`` times the predicted one. A failed backward pass (Q_uu not
    positive definite) or line search multiplies reg by reg_factor^m on the m-th failure in a row (from at
    least reg_min; above reg_max the solver stops); success divides it, down to reg_min (a start at 0 stays 0 until a failure). Converged when an
    accepted step changes the objective by less than ``tol`` relatively (or the predicted change is
    below it). ``history`` holds cost, relative change, alpha (0 = rejected) and reg per iteration.

    Input limits: "augmented_lagrangian" (default): u = u_max z is linear in the decision, the limit
    enters the stage cost through multipliers updated between iLQR runs (AL-iLQR, as in ALTRO), like
    the joint position/velocity limits, and the Riccati recursion stays exact. "squash" (u = u_max
    tanh z) is available but is a trap for a Newton method: where an input saturates, du/dz -> 0,
    Q_uu loses curvature, the step in z grows without bound and the input sticks at the limit with
    no gradient to bring it back (on the two-link test it stalls about 15 % above the optimum).
    Clamped or box-QP gains (Tassa, Mansard & Todorov 2014) need a small QP per step inside the scan
    and make the recursion inexact where a limit switches. The smoothness term couples
    consecutive inputs; iLQR handles it exactly by augmenting the state with the previous input,
    s = (q, qd, u_{k-1}) (3n,). Cost curvature in z is the Gauss-Newton sigma' l_uu sigma' (exact
    without squashing), which keeps Q_uu positive where tanh bends.
    Pure and traceable (``lax.while_loop`` throughout): ``jax.vmap`` it over problems or arms.
    Jit a function that closes over the arm, ``jaxarm.jit(lambda p, u: ilqr(arm, p, u))``, rather
    than passing the arm to the jit: a traced arm folds none of its numbers (Puma 560 reach,
    T = 50: first call 20 s with the arm a jit argument, 14 s closed over). For the fastest first
    call solve the same problem with :func:`jaxarm.trajopt.ddp` on
    ``trajopt.reach_ocp(arm, problem, T)`` (docs/guide/trajopt.md).
    """
    given = dict(locals())  # the call as made (an eager call is answered by a kept compiled solve)
    func = "ilqr"
    setup, u_init = _setup(arm, problem, u_init, func, torque_limits=torque_limits, input=input, method=method)
    _check_iterations(max_iterations, al_iterations, func)
    if not isinstance(line_search_steps, (int, np.integer)) or line_search_steps < 1:
        raise ValueError(f"{func}: line_search_steps: expected a positive whole number, got {line_search_steps!r}")
    for name, v in (("regularization", regularization), ("reg_min", reg_min), ("reg_max", reg_max)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{func}: {name}: expected a finite number >= 0, got {v!r}")
    if not reg_factor > 1:
        raise ValueError(f"{func}: reg_factor: expected a number > 1, got {reg_factor!r}")
    if tracers.eager():
        solved = _eager_reach(ilqr, given)
        if solved is not None:
            return solved
    n, T = setup.arm.n, setup.T
    p = setup.problem
    dtype = u_init.dtype

    def forward(x_bar, z_bar, bw, alpha):
        s_bar = _augmented_states(x_bar, setup.to_input(z_bar))

        def step(carry, d):
            x, u_prev = carry
            s_ref, z_ref, k, K = d
            z = z_ref + alpha * k + K @ (jnp.concatenate([x, u_prev]) - s_ref)
            u = setup.to_input(z)
            x_next = discrete_dynamics(setup.arm, x, u, p.dt, method=method, input=input, saturate=False)
            return (x_next, u), (x_next, z)

        x0 = x_bar[0]
        _, (xs, zs) = jax.lax.scan(step, (x0, jnp.zeros(n, dtype)), (s_bar, z_bar, bw.k, bw.K))
        return jnp.concatenate([x0[None], xs]), zs

    def derivatives(x, z, lam, mu):
        # gradient and Hessian of each stage in (s, u), then to z by the chain rule u = sigma(z):
        # l_z = sigma' l_u, l_zz = sigma' l_uu sigma' (Gauss-Newton: the l_u sigma'' term, negative
        # where tanh bends, is dropped so Q_uu stays positive), l_zs = sigma' l_us
        u = setup.to_input(z)
        s = _augmented_states(x, u)
        lam_stage = jnp.concatenate([jnp.zeros_like(lam.state[:1]), lam.state[:-1]])

        def stage(su, k, ls, li):
            return _stage(setup, su[: 3 * n], su[3 * n:], k, ls, li, mu)

        su = jnp.concatenate([s, u], axis=1)
        ks = jnp.arange(T)
        g = jax.vmap(jax.grad(stage))(su, ks, lam_stage, lam.input)
        H = jax.vmap(jax.hessian(stage))(su, ks, lam_stage, lam.input)
        term = lambda xT: _terminal(setup, xT, lam.state[-1], mu)  # noqa: E731
        Vx = jnp.concatenate([jax.grad(term)(x[-1]), jnp.zeros(n, dtype)])
        Vxx = jnp.zeros((3 * n, 3 * n), dtype).at[: 2 * n, : 2 * n].set(jax.hessian(term)(x[-1]))
        ns = 3 * n
        d = setup.input_slope(z)  # (T, n)
        lu = d * g[:, ns:]
        luu = d[:, :, None] * H[:, ns:, ns:] * d[:, None, :]
        lus = d[:, :, None] * H[:, ns:, :ns]
        return g[:, :ns], lu, H[:, :ns, :ns], luu, lus, Vx, Vxx

    def linearization(x, z):
        # d x_{k+1}/d(x_k, u_k) of the integrator step; augmented s' = (x', u) with u = sigma(z)
        u = setup.to_input(z)
        lin = linearize_trajectory(setup.arm, x[:-1, :n], x[:-1, n:], u, p.dt, method=method, input=input, saturate=False)
        d = setup.input_slope(z)  # (T, n) diagonal du/dz
        A = jnp.zeros((T, 3 * n, 3 * n), dtype).at[:, : 2 * n, : 2 * n].set(lin.A)
        B = jnp.concatenate([lin.B * d[:, None, :], jax.vmap(jnp.diag)(d)], axis=1)
        return A, B

    def inner(z, lam, mu, it, log):
        objective = lambda x, z: _lagrangian(setup, x, z, lam, mu)  # noqa: E731
        x = _simulate(setup, z)
        J = objective(x, z)

        def cond(c):
            x, z, J, reg, fails, it, done, stop, log = c
            return (it < max_iterations) & ~done & ~stop

        def body(c):
            x, z, J, reg, fails, it, done, stop, log = c
            A, B = linearization(x, z)
            lx, lu, lxx, luu, lux, Vx, Vxx = derivatives(x, z, lam, mu)
            bw = _backward_pass(A, B, lx, lu, lxx, luu, lux, Vx, Vxx, reg)
            predicted_full = -(bw.dV1 + bw.dV2)
            small = bw.ok & (predicted_full <= tol * jnp.abs(J))

            def ls_cond(c):
                j, alpha, x_new, z_new, J_new, accepted = c
                return (j < line_search_steps) & ~accepted & bw.ok & ~small

            def ls_body(c):
                j, alpha, *_ = c
                x_new, z_new = forward(x, z, bw, alpha)
                J_new = objective(x_new, z_new)
                predicted = -(alpha * bw.dV1 + alpha**2 * bw.dV2)
                accepted = jnp.isfinite(J_new) & (J_new < J) & (J - J_new >= armijo * predicted)
                return j + 1, jnp.where(accepted, alpha, 0.5 * alpha), x_new, z_new, J_new, accepted

            one = jnp.asarray(1.0, dtype)
            _, alpha, x_new, z_new, J_new, accepted = jax.lax.while_loop(
                ls_cond, ls_body, tracers.batched_with((jnp.asarray(0), one, x, z, J, jnp.asarray(False)), c))
            rel = jnp.where(accepted, _rel_change(J, J_new), 0.0)
            log = _record(log, it, jnp.where(accepted, J_new, J), rel, jnp.where(accepted, alpha, 0.0), reg)
            x, z, J = (jnp.where(accepted, a, b) for a, b in ((x_new, x), (z_new, z), (J_new, J)))
            done = small | (accepted & (rel < tol))
            # consecutive failures raise reg ever faster: factor, factor^2, factor^3, ... (after Tassa 2012)
            raised = jnp.maximum(reg * reg_factor ** (fails + 1), reg_min)
            lowered = jnp.where(reg > 0, jnp.maximum(reg / reg_factor, reg_min), 0.0)
            ok = accepted | small
            reg = jnp.where(ok, lowered, raised)
            fails = jnp.where(ok, 0, fails + 1)
            stop = reg > reg_max
            return x, z, J, reg, fails, it + 1, done, stop, log

        init = (x, z, J, jnp.asarray(regularization, dtype), jnp.asarray(0), it, jnp.asarray(False), jnp.asarray(False), log)
        init = tracers.batched_with(init, (lam, mu))  # (under vmap: each loop batched once)
        x, z, J, reg, fails, it, done, stop, log = jax.lax.while_loop(cond, body, init)
        return z, it, done, log

    def constraint_values(z):
        g_state, g_input = _constraints(setup, _simulate(setup, z), z)
        return g_state, g_input, jnp.zeros((0, 2 * n), g_state.dtype)

    z0 = setup.from_input(u_init)
    z, it, conv, log = _augmented_lagrangian(
        inner, constraint_values, z0, _zero_multipliers(setup, 1, dtype), mu0=mu, mu_growth=mu_growth, mu_max=1e8,
        al_iterations=al_iterations, tol_violation=tol_violation, log=_empty_log(max_iterations, dtype),
        reads=(arm, problem, u_init))
    return _result(setup, z, jnp.zeros((0,), dtype), it, conv, tol_violation, log)
