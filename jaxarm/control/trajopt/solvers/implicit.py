"""Gradients of an optimal trajectory by the implicit function theorem at the optimum.

A solution of :func:`jaxarm.trajopt.ddp` satisfies the first-order optimality (KKT) conditions of
the problem in the states z_k = (x_k, u_k) with the dynamics as constraints: with the Lagrangian

    L = sum_k l_k(z_k) + lambda_k . c_k(z_k) + p_{k+1} . (F(x_k, u_k) - x_{k+1}) + p_0 . (x0 - x_0),

grad_z L = 0, the dynamics hold, the active constraints c_a (equalities, inequalities with a
positive multiplier) are zero and the inputs held at a bound of the box stay there. Differentiating
these conditions with respect to the problem's data theta (every array of the
:class:`jaxarm.trajopt.OCP`: params, start state, dt, bounds, the terms' targets and weights, the
arm's physical parameters) gives the sensitivity of the solution; reverse mode needs one solve with
the same symmetric KKT matrix (the adjoint system), whatever theta is (Gould et al. 2016, "On
differentiating parameterized argmin and argmax problems with application to bi-level
optimization"; Amos & Kolter 2017, "OptNet"; for optimal control, Amos et al. 2018,
"Differentiable MPC for end-to-end planning and control"):

    theta_bar = -d/dtheta [ sum_k dz_k . grad_z L_k + dp_{k+1} . F(z_k) + omega_k . c_k(z_k) + dp_0 . x0 ]
                + omega_box . d bounds / dtheta,

with (dz, dp, omega, omega_box) the adjoint solution for the cotangents (x_bar, u_bar) of the
solution. Everything is built from one knot at a time (vmapped, never a rollout differentiated
twice, which keeps the compile short):

1. costates p_k = grad_x (l_k + lambda_k . c_k) + A_k^T p_{k+1} (backward), step Jacobians A_k, B_k;
2. the Hessians Q_k of l_k + lambda_k . c_k + p_{k+1} . F (the dynamics' second derivatives
   included) and the states' sensitivities S_k = dx_k / du (forward: S_{k+1} = A_k S_k + B_k E_k);
3. the reduced system in the inputs, H = sum_k Phi_k^T Q_k Phi_k with Phi_k = (S_k, E_k), the
   active constraints' Jacobian G = (dc_k/dz_k) Phi_k, the right-hand side u_bar + sum_k S_k^T x_bar_k,
   solved by Uzawa's iteration on the augmented matrix H + rho G^T G (Fortin & Glowinski 1983;
   positive definite at a strict local minimum, factored once) with the clamped inputs held;
4. dz_k = Phi_k v and the second-order costates dp_k = (Q_k dz_k)_x + A_k^T dp_{k+1} +
   (dc_k/dx)^T omega_k - x_bar_k (backward); then one vector-Jacobian product of the expression above.

The reduced system is dense in the T n inputs: fine for the horizons trajectory optimization uses
(hundreds to a few thousand inputs).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ....dynamics import linalg
from ..ocp import OCP, _step, _step_jacobians, solver_arm
from .knots import _constraint_layout, _constraints, _knot_cost

UZAWA_ITERATIONS = 60


def _knot_terms(problem, arm, z, k, lam_k):
    """l_k + lambda_k . c_k at knot k (constraints only where they apply)."""
    val = _knot_cost(problem, arm, z, k)
    if lam_k.shape[0]:
        c, applies = _constraints(problem, arm, z, k)
        val = val + jnp.sum(jnp.where(applies, lam_k * c, 0.0))
    return val


def solution_vjp(problem: OCP, xs, us, lam, x_bar, u_bar):
    """The cotangent of ``problem`` (an OCP of the same structure) given the cotangents x_bar
    (T+1, 2n) and u_bar (T, n) of the solution (xs, us) with constraint multipliers lam (T+1, m)."""
    T, n = problem.T, problem.n
    nx, N = 2 * n, T * n
    dtype = us.dtype
    _, eq_np = _constraint_layout(problem)
    eq = jnp.asarray(eq_np)
    m = lam.shape[1]
    ks = jnp.arange(T + 1)
    u_pad = jnp.concatenate([us, jnp.zeros((1, n), dtype)])
    z = jnp.concatenate([xs, u_pad], axis=1)  # (T+1, 3n)
    arm = solver_arm(problem)

    def step(p, z):
        arm = solver_arm(p)
        return _step(arm, z[:nx], z[nx:], p.dt, p.method, p.input)

    # 1. step Jacobians and costates
    _, A, B = _step_jacobians(arm, xs[:-1], us, problem.dt, problem.method, problem.input)
    g = jax.vmap(jax.grad(lambda z, k, lam_k: _knot_terms(problem, arm, z, k, lam_k)))(z, ks, lam)

    def costate(p_next, d):
        g_k, A_k = d
        p_k = g_k[:nx] + A_k.T @ p_next
        return p_k, p_k

    pT = g[T, :nx]
    _, p_head = jax.lax.scan(costate, pT, (g[:T], A), reverse=True)
    p = jnp.concatenate([p_head, pT[None]])  # p_0 .. p_T
    p_next = jnp.concatenate([p[1:], jnp.zeros((1, nx), dtype)])  # p_{k+1}, zero at k = T

    def knot_lagrangian(prob, z, k, lam_k, p_k1):
        return _knot_terms(prob, solver_arm(prob), z, k, lam_k) + p_k1 @ step(prob, z)

    # 2. Hessians of the knots' Lagrangians and the states' sensitivities to the inputs
    Q = jax.vmap(jax.hessian(lambda z, k, lam_k, p_k1: knot_lagrangian(problem, z, k, lam_k, p_k1)))(z, ks, lam, p_next)
    Q = 0.5 * (Q + jnp.swapaxes(Q, 1, 2))

    def sensitivity(S, d):
        A_k, B_k, k = d
        S_next = jnp.einsum("ab,bjc->ajc", A_k, S).at[:, k, :].add(B_k)
        return S_next, S_next

    S0 = jnp.zeros((nx, T, n), dtype)
    _, S_tail = jax.lax.scan(sensitivity, S0, (A, B, jnp.arange(T)))
    S = jnp.concatenate([S0[None], S_tail]).reshape(T + 1, nx, N)
    E = jnp.concatenate([jnp.eye(N, dtype=dtype).reshape(T, n, N), jnp.zeros((1, n, N), dtype)])
    Phi = jnp.concatenate([S, E], axis=1)  # (T+1, 3n, N)

    # 3. the reduced adjoint system
    H = jnp.einsum("kai,kab,kbj->ij", Phi, Q, Phi)
    H = 0.5 * (H + H.T)
    b = u_bar.reshape(N) + jnp.einsum("kai,ka->i", S, x_bar)
    lower = jnp.broadcast_to(problem.lower, (T, n))
    upper = jnp.broadcast_to(problem.upper, (T, n))
    at_lower, at_upper = us <= lower, us >= upper
    clamped = (at_lower | at_upper).reshape(N)
    free = ~clamped
    if m:
        c, applies = jax.vmap(lambda z, k: _constraints(problem, arm, z, k))(z, ks)
        active = applies & (eq[None, :] | (lam > 0))  # (T+1, m)
        C = jax.vmap(jax.jacfwd(lambda z, k: _constraints(problem, arm, z, k)[0]))(z, ks)  # (T+1, m, 3n)
        C = jnp.where(active[:, :, None], C, 0.0)
        G = jnp.einsum("kma,kai->kmi", C, Phi).reshape((T + 1) * m, N)
    else:
        active = jnp.zeros((T + 1, 0), bool)
        C = jnp.zeros((T + 1, 0, 3 * n), dtype)
        G = jnp.zeros((0, N), dtype)
    Gf = jnp.where(free[None, :], G, 0.0)
    Hf = jnp.where(free[:, None] & free[None, :], H, 0.0) + jnp.diag(jnp.where(free, 0.0, 1.0).astype(dtype))
    bf = jnp.where(free, b, 0.0)
    scale_h = jnp.max(jnp.abs(jnp.diag(Hf)))
    scale_g = jnp.maximum(jnp.max(jnp.sum(Gf**2, axis=1), initial=0.0), jnp.finfo(dtype).tiny)
    rho = jnp.where(jnp.any(active), 1e4 * scale_h / scale_g, 0.0)
    L = linalg.cholesky_factor(Hf + rho * Gf.T @ Gf)

    def uzawa(_, w):
        v = linalg.cholesky_solve_factored(L, bf - Gf.T @ w)
        return w + rho * (Gf @ v)

    w = jax.lax.fori_loop(0, UZAWA_ITERATIONS, uzawa, jnp.zeros(G.shape[0], dtype))
    v = linalg.cholesky_solve_factored(L, bf - Gf.T @ w)
    omega_box = jnp.where(clamped, b - H @ v - G.T @ w, 0.0).reshape(T, n)
    omega = w.reshape(T + 1, m)

    # 4. the states' and costates' directions
    dz = jnp.einsum("kai,i->ka", Phi, v)
    Qdz = jnp.einsum("kab,kb->ka", Q, dz)
    Cw = jnp.einsum("kma,km->ka", C, omega)
    rhs = Qdz[:, :nx] + Cw[:, :nx] - x_bar

    def second_costate(dp_next, d):
        r_k, A_k = d
        dp_k = r_k + A_k.T @ dp_next
        return dp_k, dp_k

    dpT = rhs[T]
    _, dp_head = jax.lax.scan(second_costate, dpT, (rhs[:T], A), reverse=True)
    dp = jnp.concatenate([dp_head, dpT[None]])
    dp_next = jnp.concatenate([dp[1:], jnp.zeros((1, nx), dtype)])

    def residual_product(prob):
        def knot(z, k, lam_k, p_k1, dz_k, dp_k1, om_k):
            _, tangent = jax.jvp(lambda z: knot_lagrangian(prob, z, k, lam_k, p_k1), (z,), (dz_k,))
            out = tangent + dp_k1 @ step(prob, z)
            if m:
                out = out + jnp.sum(om_k * _constraints(prob, solver_arm(prob), z, k)[0])
            return out

        per_knot = jax.vmap(knot)(z, ks, lam, p_next, dz, dp_next, omega)
        return jnp.sum(per_knot) + dp[0] @ prob.x0

    out, pull = jax.vjp(residual_product, problem)
    (p_bar,) = pull(-jnp.ones_like(out))
    lower_bar = jnp.sum(jnp.where(at_lower, omega_box, 0.0), axis=0)
    upper_bar = jnp.sum(jnp.where(at_upper & ~at_lower, omega_box, 0.0), axis=0)
    return dataclasses.replace(p_bar, lower=p_bar.lower + lower_bar, upper=p_bar.upper + upper_bar)
