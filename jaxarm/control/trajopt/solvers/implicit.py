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

1. step Jacobians A_k, B_k and costates p_k = grad_x (l_k + lambda_k . c_k) + A_k^T p_{k+1}
   (backward);
2. the Hessians Q_k of l_k + lambda_k . c_k + p_{k+1} . F (the dynamics' second derivatives
   included: the costs' and constraints' by forward over reverse mode, from the same program as
   the gradients of step 1; p . d^2F by central differences of the analytic step Jacobians the
   solver uses, evaluated in one batch with the A_k, B_k of step 1);
3. the adjoint system, which is the optimality condition of a linear-quadratic problem in
   dz_k = (dx_k, du_k): minimize sum_k dz_k^T Q_k dz_k / 2 - x_bar_k . dx_k - u_bar_k . du_k
   subject to dx_{k+1} = A_k dx_k + B_k du_k, dx_0 = 0, the active constraints (equalities,
   inequalities with a positive multiplier) linearized, (dc_k/dz_k) dz_k = 0, and du = 0 for the
   inputs held at a bound. It is solved by a Riccati recursion, knot after knot (the backward pass of
   iLQR on this quadratic model, Tassa, Erez & Todorov 2012, eqs 5-11; the previous input in the
   state where an input-rate term couples knots), the
   active constraints by Uzawa's iteration on their multipliers omega with the augmented Hessian
   Q_k + rho C_k^T C_k (Fortin & Glowinski 1983), whose Riccati factorization is made once: O(T n^3)
   operations and O(T n^2) memory, where the same system reduced to the T n inputs and factored
   densely takes O(T^3 n^3) and O(T^2 n^2);
4. the second-order costates dp_k = (Q_k dz_k)_x + A_k^T dp_{k+1} + (dc_k/dx)^T omega_k - x_bar_k
   (backward), and the bounds' multipliers from the adjoint system's gradient in the held inputs;
   then one vector-Jacobian product of the expression above, its directional derivative
   dz_k . grad_z L_k taken by a central difference along dz_k, and the dynamics' dependence on the
   data by the adjoint of the integrator's stages with one reverse pass through Newton-Euler
   (:func:`_dynamics_data_vjp`).

Only the leaves of the problem that are being differentiated are: ``jax.grad`` with respect to
``params`` alone never differentiates the dynamics with respect to the arm, nor builds the
dynamics' dependence on the data at all (:func:`_dynamics_perturbed`).

The two central differences (relative step eps^(1/3)) gave the same gradients as exact second
derivatives by automatic differentiation to 1e-9 relative on the two-link reach of the tests
(float64); they replace differentiating the integrator step twice by automatic differentiation, whose
compile took minutes for a 6-joint arm (a first derivative of one RK3 step of the Puma 560 alone
compiles in 17 s; a reverse pass through it with respect to the whole problem, 114 s).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ....dynamics import linalg
from ....dynamics.newton_euler import _inverse_dynamics
from ...step_jacobians import (_EULER, _TABLEAUS, _accel_factored, _fd_step, _joint_torque, _stages, _step,
                               _step_second_derivatives)
from ..ocp import OCP, solver_arm
from .knots import _constraint_layout, _constraints, _knot_cost, _rate_cost, _rate_parts, _rate_term

UZAWA_ITERATIONS = 60
# Uzawa's penalty, relative to the adjoint system's scale (:func:`_penalty`). Large enough that the
# augmented Hessian is positive definite and 60 iterations converge (the UR5 obstacle reach of
# experiments/trajopt_ur5_obstacle.py: constraint residual 2e-17, whether 1e2 or 1); not larger:
# the Riccati recursion carries rho C^T C in its value Hessians, and cancels it, knot after knot.
# With 1e4 the adjoint solution of that reach, whose reduced Hessian has a condition number of
# 2e10, moved by 1e-3 relative between two XLA:CPU pipelines (the gradient by 3 %); with 1e2 it
# is within 1.4e-5 of a dense least-squares solution of the KKT system under both.
PENALTY = 1e2


def _knot_terms(problem, arm, z, k, lam_k):
    """l_k + lambda_k . c_k at knot k (constraints only where they apply)."""
    val = _knot_cost(problem, arm, z, k)
    if lam_k.shape[0]:
        c, applies = _constraints(problem, arm, z, k)
        val = val + jnp.sum(jnp.where(applies, lam_k * c, 0.0))
    return val


def solution_vjp(problem: OCP, xs, us, lam, x_bar, u_bar, perturbed=None):
    """The cotangent of ``problem`` (an OCP of the same structure) given the cotangents x_bar
    (T+1, 2n) and u_bar (T, n) of the solution (xs, us) with constraint multipliers lam (T+1, m).
    perturbed: one bool per leaf of the problem (``jax.tree_util.tree_leaves`` order), False for
    leaves nobody differentiates (their cotangent is returned as zeros without being computed:
    differentiating the dynamics with respect to the arm's parameters is what compiles longest)."""
    T, n = problem.T, problem.n
    nx = 2 * n
    dtype = us.dtype
    _, eq_np = _constraint_layout(problem)
    eq = jnp.asarray(eq_np)
    m = lam.shape[1]
    ks = jnp.arange(T + 1)
    u_pad = jnp.concatenate([us, jnp.zeros((1, n), dtype)])
    z = jnp.concatenate([xs, u_pad], axis=1)  # (T+1, 3n)
    arm = solver_arm(problem)

    # 1. step Jacobians (with their central differences of step 2, in one batch: one copy of the
    # step Jacobians in the program) and costates
    A, B, D = _step_second_derivatives(arm, xs[:-1], us, problem.dt, problem.method, problem.input, with_first=True)
    # the knots' gradients and Hessians (step 2) from one forward-over-reverse program
    knot_grad = jax.grad(lambda z, k, lam_k: _knot_terms(problem, arm, z, k, lam_k))
    Q, g = jax.vmap(jax.jacfwd(lambda z, k, lam_k: (knot_grad(z, k, lam_k),) * 2, has_aux=True))(z, ks, lam)

    def costate(p_next, d):
        g_k, A_k = d
        p_k = g_k[:nx] + A_k.T @ p_next
        return p_k, p_k

    pT = g[T, :nx]
    _, p_head = jax.lax.scan(costate, pT, (g[:T], A), reverse=True)
    p = jnp.concatenate([p_head, pT[None]])  # p_0 .. p_T
    p_next = jnp.concatenate([p[1:], jnp.zeros((1, nx), dtype)])  # p_{k+1}, zero at k = T

    # 2. Hessians of the knots' Lagrangians: the costs' and constraints' (above, forward over reverse
    # mode, as jax.hessian, with the gradients of step 1 from the same program), the dynamics'
    # p_{k+1} . d^2F by central differences of the step Jacobians (the same analytic Jacobians the
    # solver uses; differentiating the integrator step twice by autodiff compiles for minutes for a
    # 6-joint arm)
    Q_dyn = jnp.einsum("kjim,ki->kjm", D, p_next[:T])  # row j: d(grad (p.F)) / dz_j
    Q = Q.at[:T].add(Q_dyn)
    Q = 0.5 * (Q + jnp.swapaxes(Q, 1, 2))

    # 3. the adjoint system, as the linear-quadratic problem in dz_k = (dx_k, du_k) it is the
    # optimality condition of (:func:`_adjoint_solve`): the inputs on a bound held, the active
    # constraints linearized, the input-rate term's curvature c_rate
    lower = jnp.broadcast_to(problem.lower, (T, n))
    upper = jnp.broadcast_to(problem.upper, (T, n))
    at_lower, at_upper = us <= lower, us >= upper
    clamped = at_lower | at_upper  # (T, n)
    free = (~clamped).astype(dtype)
    rate = _rate_term(problem) is not None
    c_rate = 2.0 * _rate_parts(problem, us)[0] if rate else jnp.zeros((T, n), dtype)  # (T, n)
    if m:
        _, applies = jax.vmap(lambda z, k: _constraints(problem, arm, z, k))(z, ks)
        active = applies & (eq[None, :] | (lam > 0))  # (T+1, m)
        C = jax.vmap(jax.jacfwd(lambda z, k: _constraints(problem, arm, z, k)[0]))(z, ks)  # (T+1, m, 3n)
        C = jnp.where(active[:, :, None], C, 0.0)
        C = C.at[T, :, nx:].set(0.0)  # (knot T has no input)
    else:
        active = jnp.zeros((T + 1, 0), bool)
        C = jnp.zeros((T + 1, 0, 3 * n), dtype)
    dz, omega = _adjoint_solve(Q, A, B, C, free, c_rate, active, x_bar, u_bar)
    jax.debug.callback(_warn_unless_finite, jnp.all(jnp.isfinite(dz)))

    # 4. the states' and costates' directions, and the bounds' multipliers
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
    # a bound's multiplier: minus the adjoint system's gradient in that input (b - H v - G^T w)
    grad_u = Qdz[:T, nx:] + Cw[:T, nx:] - u_bar + jnp.einsum("kab,ka->kb", B, dp[1:])
    if rate:
        grad_u = grad_u + jax.jvp(jax.grad(lambda u: _rate_cost(problem, u)), (us,), (dz[:T, nx:],))[1]
    omega_box = jnp.where(clamped, -grad_u, 0.0)

    # 5. the expression whose gradient with respect to the problem's data is -theta_bar:
    # sum_k dz_k . grad_z L_k + dp_{k+1} . F(z_k) + omega_k . c_k + dp_0 . x0, with the directional
    # derivative dz_k . grad_z L_k by a central difference along dz_k. The dynamics' part
    # (p_{k+1} . F at z_k +- eps dz_k, dp_{k+1} . F at z_k) is differentiated by the adjoint of the
    # integrator's stages (:func:`_dynamics_data_vjp`), the costs and constraints by autodiff.
    size = jnp.max(jnp.abs(dz), axis=1)
    scale = _fd_step(dtype) * jnp.maximum(1.0, jnp.max(jnp.abs(z), axis=1))
    eps = jnp.where(size > 0, scale / jnp.where(size > 0, size, 1.0), scale)  # (T+1,); dz_k = 0: any step
    zs = jnp.stack([z + eps[:, None] * dz, z - eps[:, None] * dz])  # (2, T+1, 3n)
    leaves, treedef = jax.tree_util.tree_flatten(problem)
    if perturbed is None:
        perturbed = [jnp.issubdtype(jnp.result_type(a), jnp.inexact) for a in leaves]
    if _dynamics_perturbed(problem, perturbed):
        points = jnp.concatenate([zs[0, :T], zs[1, :T], z[:T]])
        weights = jnp.concatenate([p_next[:T] / (2.0 * eps[:T, None]), -p_next[:T] / (2.0 * eps[:T, None]), dp_next[:T]])
        dynamics_part = _dynamics_data_vjp(problem, points, weights)
    else:  # the step does not depend on what is differentiated (params, targets, x0, bounds only)
        def dynamics_part(prob):
            return jnp.zeros((), dtype)

    def residual_product(prob):
        def knot(z_pm, z, k, lam_k, e, om_k):
            terms = jax.vmap(lambda z: _knot_terms(prob, solver_arm(prob), z, k, lam_k))(z_pm)
            out = (terms[0] - terms[1]) / (2.0 * e)
            if m:
                out = out + jnp.sum(om_k * _constraints(prob, solver_arm(prob), z, k)[0])
            return out

        per_knot = jax.vmap(knot, in_axes=(1, 0, 0, 0, 0, 0))(zs, z, ks, lam, eps, omega)
        out = jnp.sum(per_knot) + dp[0] @ prob.x0 + dynamics_part(prob)
        if rate:  # du . grad_u R, exactly (R is a quadratic of the inputs)
            out = out + jnp.vdot(dz[:T, nx:], jax.grad(lambda u: _rate_cost(prob, u))(us))
        return out

    chosen = [i for i, f in enumerate(perturbed) if f]

    def of_chosen(values):
        full = list(leaves)
        for i, v in zip(chosen, values):
            full[i] = v
        return residual_product(jax.tree_util.tree_unflatten(treedef, full))

    out, pull = jax.vjp(of_chosen, [leaves[i] for i in chosen])
    (pulled,) = pull(-jnp.ones_like(out))
    bars = [_zero_cotangent(a) for a in leaves]
    for i, v in zip(chosen, pulled):
        bars[i] = v
    p_bar = jax.tree_util.tree_unflatten(treedef, bars)
    lower_bar = jnp.sum(jnp.where(at_lower, omega_box, 0.0), axis=0)
    upper_bar = jnp.sum(jnp.where(at_upper & ~at_lower, omega_box, 0.0), axis=0)
    return dataclasses.replace(p_bar, lower=p_bar.lower + lower_bar, upper=p_bar.upper + upper_bar)


def _adjoint_solve(Q, A, B, C, free, c_rate, active, x_bar, u_bar):
    """The adjoint system's solution dz (T+1, 3n) and the active constraints' multipliers omega
    (T+1, m) (step 3 of the module's description): Q (T+1, 3n, 3n), A (T, 2n, 2n), B (T, 2n, n),
    C (T+1, m, 3n) the active constraints' Jacobians (zero rows elsewhere, no input columns at
    knot T), free (T, n) 1.0 or 0.0, c_rate (T, n) the input-rate term's curvature, active
    (T+1, m), and the cotangents x_bar (T+1, 2n), u_bar (T, n)."""
    T, n = free.shape
    m = C.shape[1]
    dtype = Q.dtype
    rho = _penalty(Q, A, B, C, free, c_rate, active) if m else jnp.zeros((), dtype)
    lq = _lq_factor(Q + rho * jnp.einsum("kma,kmb->kab", C, C), A, B, free, c_rate)
    q_bar = -jnp.concatenate([x_bar, jnp.concatenate([u_bar, jnp.zeros((1, n), dtype)])], axis=1)  # (T+1, 3n)

    def solve(w):
        return _lq_solve(lq, q_bar + jnp.einsum("kma,km->ka", C, w.reshape(T + 1, m)))

    if m:
        def uzawa(_, w):
            return w + rho * jnp.einsum("kma,ka->km", C, solve(w)).reshape(-1)

        w = jax.lax.fori_loop(0, UZAWA_ITERATIONS, uzawa, jnp.zeros((T + 1) * m, dtype))
    else:
        w = jnp.zeros(0, dtype)
    return solve(w), w.reshape(T + 1, m)


class _LQ(NamedTuple):
    """The adjoint system's Riccati factorization (:func:`_lq_factor`), knots k = 0..T-1, on the
    state s_k = (dx_k, du_{k-1}) (3n,): its step s_{k+1} = A_k s_k + B_k du_k, the lower Cholesky
    factor L_k of the inputs' Hessian (the bound inputs' rows and columns replaced by the
    identity), the feedback du_k = K_k s_k + k_k (K_k zero in the bound inputs' rows), and the
    free inputs (1.0, or 0.0 for an input on its bound)."""

    A: jnp.ndarray  # (T, 3n, 3n)
    B: jnp.ndarray  # (T, 3n, n)
    L: jnp.ndarray  # (T, n, n)
    K: jnp.ndarray  # (T, n, 3n)
    free: jnp.ndarray  # (T, n)


def _lq_factor(Q, A, B, free, c_rate) -> _LQ:
    """The backward Riccati recursion of the linear-quadratic problem min sum_k dz_k^T Q_k dz_k / 2
    + sum_k c_k . (du_k - du_{k-1})^2 / 2 subject to dx_{k+1} = A_k dx_k + B_k du_k, dx_0 = 0,
    du_{-1} = 0, and du_ki = 0 where ``free`` is 0 (Q (T+1, 3n, 3n) in dz_k = (dx_k, du_k); the
    input block of Q_T is not read; c_rate (T, n)). The inputs' Hessian H_uu of every knot is
    positive definite exactly when the problem's Hessian in the free inputs is (the recursion is
    a block LDL^T factorization of that Hessian, eliminating the inputs from the last knot
    back); a NaN factor where it is not."""
    T, n = free.shape
    nx, ns = 2 * n, 3 * n
    dtype = Q.dtype
    eye = jnp.eye(n, dtype=dtype)
    As = jnp.zeros((T, ns, ns), dtype).at[:, :nx, :nx].set(A)
    Bs = jnp.concatenate([B, jnp.broadcast_to(eye, (T, n, n))], axis=1)
    rate = c_rate[:, :, None] * eye  # (T, n, n)
    Qss = jnp.zeros((T, ns, ns), dtype).at[:, :nx, :nx].set(Q[:T, :nx, :nx]).at[:, nx:, nx:].set(rate)
    Qus = jnp.concatenate([Q[:T, nx:, :nx], -rate], axis=2)  # (T, n, 3n)
    Quu = Q[:T, nx:, nx:] + rate

    def step(P, d):
        A_k, B_k, Qss_k, Qus_k, Quu_k, f = d
        PA = P @ A_k
        Hss = Qss_k + A_k.T @ PA
        Hus = f[:, None] * (Qus_k + B_k.T @ PA)
        Huu = f[:, None] * (Quu_k + B_k.T @ P @ B_k) * f[None, :] + jnp.diag(1.0 - f)
        L = jnp.linalg.cholesky(0.5 * (Huu + Huu.T))
        K = -linalg.cholesky_solve_factored(L, Hus)
        P = Hss + Hus.T @ K
        return 0.5 * (P + P.T), (L, K)

    P_T = jnp.zeros((ns, ns), dtype).at[:nx, :nx].set(Q[T, :nx, :nx])
    _, (L, K) = jax.lax.scan(step, P_T, (As, Bs, Qss, Qus, Quu, free), reverse=True)
    return _LQ(As, Bs, L, K, free)


def _lq_solve(lq: _LQ, q):
    """dz (T+1, 3n) minimizing the factored problem plus sum_k q_k . dz_k (q (T+1, 3n); the input
    part of q_T is not read): the linear terms' backward pass, then the feedback's forward pass
    from dx_0 = 0."""
    T, n = lq.free.shape
    nx = 2 * n
    dtype = q.dtype
    qs = jnp.concatenate([q[:T, :nx], jnp.zeros((T, n), dtype)], axis=1)

    def back(p, d):
        A_k, B_k, L_k, K_k, f, qs_k, qu_k = d
        hu = f * (qu_k + B_k.T @ p)
        return qs_k + A_k.T @ p + K_k.T @ hu, -linalg.cholesky_solve_factored(L_k, hu)

    p_T = jnp.concatenate([q[T, :nx], jnp.zeros(n, dtype)])
    _, kff = jax.lax.scan(back, p_T, (lq.A, lq.B, lq.L, lq.K, lq.free, qs, q[:T, nx:]), reverse=True)

    def forward(s, d):
        A_k, B_k, K_k, k_k = d
        du = K_k @ s + k_k
        return A_k @ s + B_k @ du, (s[:nx], du)

    s_T, (dx, du) = jax.lax.scan(forward, jnp.zeros(3 * n, dtype), (lq.A, lq.B, lq.K, kff))
    return jnp.concatenate([jnp.concatenate([dx, s_T[None, :nx]]), jnp.concatenate([du, jnp.zeros((1, n), dtype)])], axis=1)


def _penalty(Q, A, B, C, free, c_rate, active):
    """Uzawa's penalty rho = PENALTY max_j |H_jj| / max_r |G_r|^2 (H the adjoint system's Hessian in the
    free inputs, the identity in the bound ones; G_r the rows of the active constraints' Jacobian
    in the free inputs), by recursions rather than from H and G themselves: with W_k = Q_k,xx +
    A_k^T W_{k+1} A_k (W_T = Q_T,xx), H's diagonal at knot k is that of Q_k,uu + B_k^T W_{k+1} B_k
    plus the rate term's; with the free inputs' reachability Gramian Gamma_{k+1} = A_k Gamma_k
    A_k^T + B_k F_k B_k^T (Gamma_0 = 0), |G_r|^2 = C_r,x Gamma_k C_r,x^T + sum over the free
    inputs of C_r,u^2."""
    T, n = free.shape
    nx = 2 * n
    dtype = Q.dtype

    def back(W, d):
        Q_k, A_k = d
        return Q_k[:nx, :nx] + A_k.T @ W @ A_k, W

    _, W_next = jax.lax.scan(back, Q[T, :nx, :nx], (Q[:T], A), reverse=True)  # W_{k+1}, k = 0..T-1
    rate_diag = c_rate + jnp.concatenate([c_rate[1:], jnp.zeros((1, n), dtype)])
    diag = jnp.diagonal(Q[:T, nx:, nx:], axis1=1, axis2=2) + jnp.einsum("kai,kab,kbi->ki", B, W_next, B) + rate_diag
    scale_h = jnp.max(jnp.abs(jnp.where(free > 0, diag, 1.0)))

    def forward(G, d):
        A_k, B_k, f = d
        return A_k @ G @ A_k.T + (B_k * f[None, :]) @ B_k.T, G

    G_T, G_k = jax.lax.scan(forward, jnp.zeros((nx, nx), dtype), (A, B, free))
    gram = jnp.concatenate([G_k, G_T[None]])  # Gamma_0 .. Gamma_T
    free_all = jnp.concatenate([free, jnp.zeros((1, n), dtype)])
    rows = jnp.einsum("kma,kab,kmb->km", C[:, :, :nx], gram, C[:, :, :nx]) + jnp.einsum("kmi,ki->km", C[:, :, nx:] ** 2, free_all)
    scale_g = jnp.maximum(jnp.max(rows, initial=0.0), jnp.finfo(dtype).tiny)
    return jnp.where(jnp.any(active), PENALTY * scale_h / scale_g, 0.0)


def _dynamics_perturbed(problem: OCP, perturbed) -> bool:
    """Whether any leaf the integrator step reads (the arm's, dt) is among the ``perturbed`` leaves
    of the problem (``jax.tree_util.tree_leaves`` order)."""
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(problem)[0]]
    return any(f and getattr(path[0], "name", None) in ("arm", "dt") for path, f in zip(paths, perturbed))


def _dynamics_data_vjp(problem: OCP, zs, ws):
    """A function g of a problem (of the same structure) whose gradient with respect to the problem's
    data is sum_i ws_i . dF/dtheta (z_i, theta), F the integrator step, at the points zs (B, 3n) =
    (x, u) with cotangents ws (B, 2n), the points held fixed.

    For the Runge-Kutta methods by name and the Euler methods the step is differentiated by hand:
    the adjoint of the stages X_i = x + dt sum_j a_ij K_j, K_i = f(X_i), F = x + dt sum_i b_i K_i
    with the stage Jacobians the solver uses gives each stage acceleration's cotangent qdd_bar_i;
    an acceleration depends on the data through ID(q, qd, qdd; theta) = tau(u, qd; theta), so
    qdd_bar . d qdd/dtheta = (M^-1 qdd_bar) . d(tau - ID)/dtheta at fixed (q, qd, qdd)
    (Carpentier & Mansard 2018): one reverse pass through Newton-Euler, never through the forward
    dynamics (a reverse pass through a Puma 560 RK3 step compiles for minutes). The step's
    dependence on dt is summed here as a number, c_dt = sum_i ws_i . dF/ddt, and g carries dt c_dt.
    Any other method: g is sum_i ws_i . F(z_i) differentiated by autodiff."""
    n = problem.n
    nx = 2 * n
    arm = solver_arm(problem)
    dt, method, input = problem.dt, problem.method, problem.input
    xs, us = zs[:, :nx], zs[:, nx:]
    dtype = zs.dtype
    if isinstance(method, str) and method in _TABLEAUS:
        A, b, P, acc, L, J = _stages(arm, xs, us, dt, method, input)
        stages = len(b)
        Jx = J[:, :, :, :nx]  # (s, B, 2n, 2n)
        K = jnp.concatenate([P[:, :, n:], acc], axis=2)
        K_bar, X_bar = [None] * stages, [None] * stages
        for i in reversed(range(stages)):
            k_bar = (dt * b[i]) * ws
            for j in range(i + 1, stages):
                if A[j, i] != 0.0:
                    k_bar = k_bar + (dt * A[j, i]) * X_bar[j]
            K_bar[i] = k_bar
            X_bar[i] = jnp.einsum("bij,bi->bj", Jx[i], k_bar)
        dK = []
        for i in range(stages):
            dX = jnp.zeros_like(xs)
            for j in range(i):
                if A[i, j] != 0.0:
                    dX = dX + A[i, j] * (K[j] + dt * dK[j])
            dK.append(jnp.einsum("bij,bj->bi", Jx[i], dX))
        c_dt = jnp.sum(ws * sum(b[i] * (K[i] + dt * dK[i]) for i in range(stages)))
        qdd_bar = jnp.stack([K_bar[i][:, n:] for i in range(stages)])
        X, a, Lf = P.reshape(-1, nx), acc.reshape(-1, n), L.reshape(-1, n, n)
        U = jnp.broadcast_to(us, (stages,) + us.shape).reshape(-1, n)
        qdd_bar = qdd_bar.reshape(-1, n)
    elif isinstance(method, str) and method in _EULER:
        a, Lf = jax.vmap(lambda x, u: _accel_factored(arm, x, u, input))(xs, us)
        wq, wqd = ws[:, :n], ws[:, n:]
        q_dot = xs[:, n:]
        if method == "semi_implicit_euler":  # q+ = q + dt (qd + dt a), qd+ = qd + dt a
            qdd_bar = dt * dt * wq + dt * wqd
            c_dt = jnp.sum(wq * (q_dot + 2.0 * dt * a) + wqd * a)
        else:  # q+ = q + dt qd + dt^2 a / 2, qd+ = qd + dt a
            qdd_bar = 0.5 * dt * dt * wq + dt * wqd
            c_dt = jnp.sum(wq * (q_dot + dt * a) + wqd * a)
        X, U = xs, us
    else:
        def g(prob):
            arm = solver_arm(prob)
            F = jax.vmap(lambda z: _step(arm, z[:nx], z[nx:], prob.dt, prob.method, prob.input))(zs)
            return jnp.sum(ws * F)
        return g
    lam = jax.vmap(linalg.cholesky_solve_factored)(Lf, qdd_bar)  # M^-1 qdd_bar at each point
    lam, X, U, a, c_dt = (jax.lax.stop_gradient(v) for v in (lam, X, U, a, c_dt))

    def g(prob):
        arm = solver_arm(prob)
        residual = jax.vmap(lambda x, u, a: _joint_torque(arm, u, x[n:], prob.input, False)
                            - _inverse_dynamics(arm, x[:n], x[n:], a))(X, U, a)
        return jnp.sum(lam * residual) + prob.dt * c_dt.astype(dtype)

    return g


def _warn_unless_finite(ok):
    if not np.all(ok):  # one flag, or one per problem under jax.vmap
        warnings.warn(
            "trajopt.ddp: the gradient of the solution is NaN: the Hessian of the problem in its inputs is not "
            "positive definite at the solution. Either the solve did not reach a strict local minimum closely "
            "enough (check result.converged; on nearly singular problems, such as a redundant arm with light "
            "regularization, pass a tighter tol, e.g. tol=1e-10), or the dynamics or costs are not twice "
            "differentiable there -- e.g. "
            "asymmetric Coulomb friction levels smoothed by tanh switch level at qd = 0, which a start from "
            "rest sits on (make the two levels equal, or use the sigmoid friction model)",
            RuntimeWarning, stacklevel=2)


def _zero_cotangent(a):
    a = jnp.asarray(a)
    if jnp.issubdtype(a.dtype, jnp.inexact):
        return jnp.zeros_like(a)
    return np.zeros(a.shape, dtype=jax.dtypes.float0)
