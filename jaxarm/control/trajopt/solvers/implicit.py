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
   included: the costs' and constraints' by ``jax.hessian``, p . d^2F by central differences of
   the analytic step Jacobians the solver uses) and the states' sensitivities S_k = dx_k / du
   (forward: S_{k+1} = A_k S_k + B_k E_k);
3. the reduced system in the inputs, H = sum_k Phi_k^T Q_k Phi_k with Phi_k = (S_k, E_k), the
   active constraints' Jacobian G = (dc_k/dz_k) Phi_k, the right-hand side u_bar + sum_k S_k^T x_bar_k,
   solved by Uzawa's iteration on the augmented matrix H + rho G^T G (Fortin & Glowinski 1983;
   positive definite at a strict local minimum, factored once) with the clamped inputs held;
4. dz_k = Phi_k v and the second-order costates dp_k = (Q_k dz_k)_x + A_k^T dp_{k+1} +
   (dc_k/dx)^T omega_k - x_bar_k (backward); then one vector-Jacobian product of the expression above,
   its directional derivative dz_k . grad_z L_k taken by a central difference along dz_k, and the
   dynamics' dependence on the data by the adjoint of the integrator's stages with one reverse
   pass through Newton-Euler (:func:`_dynamics_data_vjp`).

Only the leaves of the problem that are being differentiated are: ``jax.grad`` with respect to
``params`` alone never differentiates the dynamics with respect to the arm.

The two central differences (relative step eps^(1/3)) gave the same gradients as exact second
derivatives by automatic differentiation to 1e-9 relative on the two-link reach of the tests
(float64); they replace differentiating the integrator step twice by automatic differentiation, whose
compile took minutes for a 6-joint arm (a first derivative of one RK3 step of the Puma 560 alone
compiles in 17 s; a reverse pass through it with respect to the whole problem, 114 s).

The reduced system is dense in the T n inputs: fine for the horizons trajectory optimization uses
(hundreds to a few thousand inputs).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import jax.scipy.linalg  # noqa: F401  (jax.scipy.linalg.cho_factor)
import numpy as np

from ....dynamics import linalg
from ....dynamics.newton_euler import _inverse_dynamics
from ...step_jacobians import (_EULER, _TABLEAUS, _accel_factored, _fd_step, _joint_torque, _stages, _step, _step_jacobians,
                               _step_second_derivatives)
from ..ocp import OCP, solver_arm
from .knots import _constraint_layout, _constraints, _knot_cost, _rate_cost, _rate_term

UZAWA_ITERATIONS = 60


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
    nx, N = 2 * n, T * n
    dtype = us.dtype
    _, eq_np = _constraint_layout(problem)
    eq = jnp.asarray(eq_np)
    m = lam.shape[1]
    ks = jnp.arange(T + 1)
    u_pad = jnp.concatenate([us, jnp.zeros((1, n), dtype)])
    z = jnp.concatenate([xs, u_pad], axis=1)  # (T+1, 3n)
    arm = solver_arm(problem)

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

    # 2. Hessians of the knots' Lagrangians: the costs' and constraints' by jax.hessian, the dynamics'
    # p_{k+1} . d^2F by central differences of the step Jacobians (the same analytic Jacobians the
    # solver uses; differentiating the integrator step twice by autodiff compiles for minutes for a
    # 6-joint arm), then the states' sensitivities to the inputs
    Q = jax.vmap(jax.hessian(lambda z, k, lam_k: _knot_terms(problem, arm, z, k, lam_k)))(z, ks, lam)
    D = _step_second_derivatives(arm, xs[:-1], us, problem.dt, problem.method, problem.input)  # (T, 3n, 2n, 3n)
    Q_dyn = jnp.einsum("kjim,ki->kjm", D, p_next[:T])  # row j: d(grad (p.F)) / dz_j
    Q = Q.at[:T].add(Q_dyn)
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

    # 3. the reduced adjoint system (an input-rate term couples consecutive inputs: its Hessian,
    # block-tridiagonal in the inputs, enters here directly)
    H = jnp.einsum("kai,kab,kbj->ij", Phi, Q, Phi)
    rate = _rate_term(problem) is not None
    if rate:
        H = H + jax.hessian(lambda u: _rate_cost(problem, u.reshape(T, n)))(us.reshape(N))
    H = 0.5 * (H + H.T)
    b = u_bar.reshape(N) + jnp.einsum("kai,ka->i", S, x_bar)
    lower = jnp.broadcast_to(problem.lower, (T, n))
    upper = jnp.broadcast_to(problem.upper, (T, n))
    at_lower, at_upper = us <= lower, us >= upper
    clamped = (at_lower | at_upper).reshape(N)
    free = ~clamped
    if m:
        _, applies = jax.vmap(lambda z, k: _constraints(problem, arm, z, k))(z, ks)
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
    # LAPACK's Cholesky (jaxarm.dynamics.linalg unrolls its loops for the arm's n x n matrices)
    L = jax.scipy.linalg.cho_factor(Hf + rho * Gf.T @ Gf, lower=True)

    def uzawa(_, w):
        v = jax.scipy.linalg.cho_solve(L, bf - Gf.T @ w)
        return w + rho * (Gf @ v)

    w = jax.lax.fori_loop(0, UZAWA_ITERATIONS, uzawa, jnp.zeros(G.shape[0], dtype))
    v = jax.scipy.linalg.cho_solve(L, bf - Gf.T @ w)
    jax.debug.callback(_warn_unless_finite, jnp.all(jnp.isfinite(v)))
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

    # 5. the expression whose gradient with respect to the problem's data is -theta_bar:
    # sum_k dz_k . grad_z L_k + dp_{k+1} . F(z_k) + omega_k . c_k + dp_0 . x0, with the directional
    # derivative dz_k . grad_z L_k by a central difference along dz_k. The dynamics' part
    # (p_{k+1} . F at z_k +- eps dz_k, dp_{k+1} . F at z_k) is differentiated by the adjoint of the
    # integrator's stages (:func:`_dynamics_data_vjp`), the costs and constraints by autodiff.
    size = jnp.max(jnp.abs(dz), axis=1)
    scale = _fd_step(dtype) * jnp.maximum(1.0, jnp.max(jnp.abs(z), axis=1))
    eps = jnp.where(size > 0, scale / jnp.where(size > 0, size, 1.0), scale)  # (T+1,); dz_k = 0: any step
    zs = jnp.stack([z + eps[:, None] * dz, z - eps[:, None] * dz])  # (2, T+1, 3n)
    points = jnp.concatenate([zs[0, :T], zs[1, :T], z[:T]])
    weights = jnp.concatenate([p_next[:T] / (2.0 * eps[:T, None]), -p_next[:T] / (2.0 * eps[:T, None]), dp_next[:T]])
    dynamics_part = _dynamics_data_vjp(problem, points, weights)

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

    leaves, treedef = jax.tree_util.tree_flatten(problem)
    if perturbed is None:
        perturbed = [jnp.issubdtype(jnp.result_type(a), jnp.inexact) for a in leaves]
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
