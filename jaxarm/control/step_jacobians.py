"""Jacobians of one integrator step, A_k = dF/dx and B_k = dF/du at many points at once, built
from the dynamics' structure instead of automatic differentiation through the whole step: the
Runge-Kutta stages by the chain rule, the accelerations' Jacobians from inverse dynamics
(Carpentier & Mansard 2018, Sec. III-B), the forward dynamics and Newton-Euler's residuals stored
once (:func:`jaxarm.core.xla.computed_once`). One implementation, used by
:func:`jaxarm.linearize_trajectory` (and so TV-LQR design and the iLQR of ``reach_problem``) and by the
trajectory-optimization solvers (:mod:`jaxarm.control.trajopt`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..core.xla import computed_once, linearization
from ..dynamics import linalg, motors
from ..dynamics.forward import _forward_dynamics_factored
from ..dynamics.newton_euler import _inverse_dynamics
from ..simulate import integrators


def _joint_torque(arm, u, qd, input, saturate):
    """Joint torque from the input, exactly as :func:`jaxarm.rollout` applies it."""
    if input == "torque" and saturate:
        lim = jnp.asarray(arm.limits.torque, u.dtype)
        return jnp.clip(u, -lim, lim)
    return motors._input_torque(arm, u, qd, input)  # voltage: Swartz eq 12, clipped at voltage_limit


def _step(arm, x, u, dt, method, input):
    """x_{k+1} (2n,): one step of the integrator ``method`` from x = (q, qd) with u held, no
    clipping of the input (the same step :func:`jaxarm.rollout` takes with ``saturate=False``)."""
    n = arm.n
    return jnp.concatenate(_step_pair(arm, x[:n], x[n:], u, dt, method, input))


def _step_pair(arm, q, qd, u, dt, method, input):
    """:func:`_step` from (q, qd) to (q_{k+1}, qd_{k+1}), kept apart (see :func:`_step_accel`)."""
    return _step_accel(arm, q, qd, u, dt, method, input)[:2]


def _step_accel(arm, q, qd, u, dt, method, input, stages=False):
    """:func:`_step` from (q, qd) to (q_{k+1}, qd_{k+1}), kept apart, and the acceleration at
    (q, qd, u) (the first stage's; an Euler step's only one), or with ``stages`` and a
    Runge-Kutta method by name every stage's (s, n). A time loop should carry
    the two apart: with x = (q, qd) in one vector, XLA:CPU fuses the whole forward dynamics into
    the fusion whose root is their concatenation, and under ``jax.vmap`` that fusion is a loop
    over the batch and the state's entries that computes the dynamics again for every entry and
    is not vectorized (the UR5's semi-implicit Euler step, batches of 8 and 64: 15.9 and 65 us a
    step against 1.1 and 5.1 us with q and qd carried apart)."""
    # the solvers differentiate this step by hand (_step_jacobians, the implicit gradients), and
    # its program is kept as it was measured: forward dynamics without its derivative rule, the
    # Runge-Kutta stage loop storing rather than recomputing (with them, the trajectory-
    # optimization tutorial took 205 s instead of 130 s in the docs test)
    loops = _STAGE_LOOPS if stages else _PLAIN_LOOPS
    step = loops[method] if isinstance(method, str) and method in loops else integrators.get_method(method)

    def fd(q, qd, u):
        return _forward_dynamics_factored(arm, q, qd, _joint_torque(arm, u, qd, input, False))[0]

    def accel(t, q, qd):
        # an Euler step reads the acceleration twice (qd+ and q+): stored once, not fused into
        # both (the solvers' line search; UR5 solver 29.4k -> 28.1k lines of optimized HLO,
        # compile 3.4-3.6 -> 3.1-3.3 s, the same warm solve)
        return computed_once(fd, q, qd, u) if method in _EULER else fd(q, qd, u)

    return step(accel, 0.0, q, qd, dt)


_TABLEAUS = {"rk3": integrators.KUTTA3, "rk4": integrators.CLASSICAL_RK4}
_PLAIN_LOOPS = {name: integrators.explicit_rk(*tableau, recompute=False) for name, tableau in _TABLEAUS.items()}
_STAGE_LOOPS = {name: integrators.explicit_rk(*tableau, recompute=False, stages=True) for name, tableau in _TABLEAUS.items()}
_EULER = ("euler", "semi_implicit_euler")


def _accel_factored(arm, x, u, input, fe=None, saturate=False):
    """qdd (n,) at x = (q, qd) under input u (tool wrench fe (6,) or None; the input clipped as
    :func:`jaxarm.rollout` clips it when ``saturate``), and the Cholesky factor of M(q) it was
    solved with."""
    n = arm.n
    return _forward_dynamics_factored(arm, x[:n], x[n:], _joint_torque(arm, u, x[n:], input, saturate), fe)


def _rows(fe):
    """vmap's in_axes for an optional per-point wrench (N, 6)."""
    return None if fe is None else 0


def _accel_once(arm, xs, us, input, fe=None, saturate=False):
    """The accelerations (T, n) at every (x_k, u_k) (T, 2n), (T, n), stored once
    (:func:`jaxarm.core.xla.computed_once`) rather than fused again into each Jacobian entry that
    reads them."""
    return computed_once(jax.vmap(lambda x, u, f: _accel_factored(arm, x, u, input, f, saturate)[0], in_axes=(0, 0, _rows(fe))),
                         xs, us, fe)


def _accel_jacobians(arm, xs, us, qdd, input, fe=None, saturate=False):
    """d qdd / d(q, qd, u) (N, n, 3n) at the N points x = (q, qd) (N, 2n), u (N, n), given qdd
    (N, n) there, and the lower Cholesky factors L (N, n, n) of M(q) at those points: from
    ID(q, qd, FD(q, qd, tau)) = tau (Carpentier & Mansard 2018, Sec. III-B), d qdd/dq = -M^-1 dID/dq,
    d qdd/dqd = M^-1 (dtau/dqd - dID/dqd), d qdd/du = M^-1 dtau/du, with dID/d(q, qd, qdd) at fixed
    qdd by forward mode through Newton-Euler along the 3n directions of (q, qd, qdd): the last n
    columns are M(q) itself (dID/dqdd; rotor inertia included), factored by the platform's library.

    M comes from these tangents rather than from the forward dynamics' own factorization because
    XLA:CPU has no multi-output fusions: a forward dynamics that returns its factor as well as
    qdd compiles into one fusion per output that re-derives what they share (the Panda at 100
    knots: 13.3k lines of optimized HLO against 3.2k for qdd alone).

    The forward mode is split in two (:func:`jaxarm.core.xla.linearization`): the primal pass
    and its residuals (the sines, rotations, velocities, ... the tangents are linear in) computed
    once per point and stored (:func:`jaxarm.core.xla.computed_once`), then the linear map applied to the 3n unit
    directions. With ``jax.jacfwd`` in one piece, XLA:CPU fused the whole primal recursion into
    each of the ~40 loop fusions of the Jacobian's entries (UR5 solver: 93k -> 56k lines of
    optimized HLO; Panda tutorial: 127k -> 81k). Reverse mode (n cotangents) was measured before:
    12 % faster solves under ``jaxarm.jit`` on the Panda but 2.8x slower under a plain
    ``jax.jit``, which is what users' own programs get."""
    n = arm.n
    linear = []

    def residuals(x, a, f):  # one point: the linearization's traced values; its linear map kept aside
        _, values, apply = linearization(lambda q, qd, qdd: _inverse_dynamics(arm, q, qd, qdd, f), x[:n], x[n:], a)
        linear.append(apply)
        return values

    res = computed_once(jax.vmap(residuals, in_axes=(0, 0, _rows(fe))), xs, qdd, fe)

    def apply(r, t):  # the linear map at one point along one direction t (3n,)
        return linear[-1](r, t[:n], t[n: 2 * n], t[2 * n:])

    eye = jnp.eye(3 * n, dtype=xs.dtype)
    # dID/d(q, qd, qdd) (N, n, 3n), one torque's row per trip of a loop: each trip evaluates the
    # tangent recursion of all n torques along the 3n directions and keeps row i (a sum against a
    # one-hot mask, which XLA cannot fold: i is the loop's counter). The recursion is then compiled
    # once, and each trip is one loop fusion over (N, 3n), vectorized along the directions.
    # Unrolled -- the stack of the n rows computed in one fusion -- XLA:CPU evaluated the whole
    # recursion again for every entry of the stack, one entry at a time: the UR5's step Jacobians
    # took 0.46 ms at 100 points and 6.3 ms at 1600 (0.17 and 1.8 ms with this loop); the n rows
    # stored from fusions of their own ran as fast but compiled the recursion n times (the UR5
    # solver's first call 5.9 -> 10.5 s). An arm whose Newton-Euler is linear in (q, qd) (one
    # prismatic joint) has no residuals: hence the vmap's explicit axis size
    def row(i):
        dID = jax.vmap(lambda r: jax.vmap(lambda t: apply(r, t), out_axes=1)(eye), axis_size=xs.shape[0])(res)
        return jnp.sum(dID * (jnp.arange(n) == i).astype(dID.dtype)[:, None], axis=1)

    dID = jnp.moveaxis(jax.lax.map(row, jnp.arange(n)), 0, 1)
    # M = dID/dqdd, symmetric to rounding (the lower triangle is read); by the library for one
    # problem's knots, unrolled for a batch of problems (linalg.cholesky_factor_by_batch: jaxlib's
    # kernel splits a large batch over the thread pool and can deadlock solves run at once)
    L = linalg.cholesky_factor_by_batch(dID[:, :, 2 * n:])

    def solve(x, u, L, d):
        dtau = jax.jacfwd(lambda qd, u: _joint_torque(arm, u, qd, input, saturate), argnums=(0, 1))(x[n:], u)
        return linalg.cholesky_solve_factored(L, jnp.concatenate([-d[:, :n], dtau[0] - d[:, n: 2 * n], dtau[1]], axis=1))

    return jax.vmap(solve)(xs, us, L, dID), L


def _stages(arm, xs, us, dt, method, input, fe=None, saturate=False, given=None):
    """The Runge-Kutta stages of the step ``method`` (a name in _TABLEAUS) at every (x_k, u_k) (T, 2n),
    (T, n): the tableau A (s, s) and weights b (s,) as NumPy arrays, the stage points X_i (s, T, 2n),
    their accelerations (s, T, n), the Cholesky factors of M there (s, T, n, n), and the
    Jacobians of the state derivative f = (qd, qdd) at the stage points with respect to (x, u)
    (s, T, 2n, 3n). The stages run in a loop (``lax.scan``: the forward dynamics is compiled once,
    not once per stage); the accelerations' Jacobians come from inverse dynamics
    (:func:`_accel_jacobians`). ``given`` (T, s, n): the stage accelerations, found already (by a
    rollout of the same steps): the stage points are then sums of them, and no forward dynamics
    is evaluated."""
    n = arm.n
    T = xs.shape[0]
    _, A, b = (np.asarray(v, float) for v in _TABLEAUS[method])  # the stage times do not matter: u is held
    stages = len(b)
    dtype = xs.dtype
    A_dt = dt * jnp.asarray(A, dtype)
    given = None if given is None else jnp.moveaxis(given, 1, 0)  # (s, T, n)

    def stage(carry, i):  # stage i, batched over the T knots: X_i from the K_j found so far (j < i)
        P, acc = carry  # (s, T, 2n) stage points, (s, T, n) their accelerations (zeros until found)
        K = jnp.concatenate([P[:, :, n:], acc], axis=2)  # K_j = f(X_j) = (qd_j, qdd_j)
        X = xs + jnp.einsum("j,jtk->tk", A_dt[i], K)
        if given is None:
            a = jax.vmap(lambda x, u, f: _accel_factored(arm, x, u, input, f, saturate)[0], in_axes=(0, 0, _rows(fe)))(X, us, fe)
        else:
            a = given[i]
        return (P.at[i].set(X), acc.at[i].set(a)), None

    init = (jnp.zeros((stages, T, 2 * n), dtype), jnp.zeros((stages, T, n), dtype))
    (P, acc), _ = jax.lax.scan(stage, init, jnp.arange(stages))
    U = jnp.broadcast_to(us, (stages, T, n)).reshape(stages * T, n)
    F = None if fe is None else jnp.broadcast_to(fe, (stages,) + fe.shape).reshape(stages * T, fe.shape[-1])
    Ja, L = _accel_jacobians(arm, P.reshape(stages * T, 2 * n), U, acc.reshape(stages * T, n), input, F, saturate)
    Ja, L = Ja.reshape(stages, T, n, 3 * n), L.reshape(stages, T, n, n)
    top = jnp.concatenate([jnp.zeros((n, n), dtype), jnp.eye(n, dtype=dtype), jnp.zeros((n, n), dtype)], axis=1)
    J = jnp.concatenate([jnp.broadcast_to(top, (stages, T, n, 3 * n)), Ja], axis=2)
    return A, b, P, acc, L, J


def _step_jacobians(arm, xs, us, dt, method, input, fe=None, saturate=False, qdd=None):
    """x_{k+1} (T, 2n), A_k = dF/dx (T, 2n, 2n) and B_k = dF/du (T, 2n, n) of the integrator step
    at every (x_k, u_k) (T, 2n), (T, n). ``qdd``: the accelerations when the caller has them
    already (the solvers' line search rollout finds them), so that this program holds no forward
    dynamics of its own: for the Euler methods at the knots (T, n), for the Runge-Kutta methods by
    name at every stage (T, s, n), as :func:`_step_accel` returns them with ``stages``.

    For the Runge-Kutta methods by name the Jacobian is built from the Jacobians of the state
    derivative f(x, u) = (qd, qdd) at the stage points, by the chain rule through the stages
    (Hairer, Norsett & Wanner, II.1 eq. 1.8: X_i = x + dt sum_j a_ij K_j, K_i = f(X_i, u),
    x+ = x + dt sum_i b_i K_i, so dK_i = J_i (dX_i, du)). The stages run in a loop
    (``lax.scan``: the forward dynamics is compiled once, not once per stage). The accelerations'
    Jacobians come from inverse dynamics, not from differentiating forward dynamics: from
    ID(q, qd, FD(q, qd, tau)) = tau (Carpentier & Mansard 2018, Sec. III-B),

        d qdd / dq = -M^-1 dID/dq,   d qdd / dqd = M^-1 (dtau/dqd - dID/dqd),   d qdd / du = M^-1 dtau/du,

    with dID/d(q, qd, qdd) at the stage's acceleration by one forward-mode pass through Newton-Euler
    (no mass matrix or Cholesky factor in the differentiated program; the qdd columns are M
    itself) and M^-1 applied with M's Cholesky factor from the platform's library. The same numbers as
    ``jax.jacfwd`` of the step up to rounding; the DDP program on the Puma 560 is about half the
    size. The Euler methods by name take the same accelerations' Jacobians at the knot; any other
    method: ``jax.jacfwd`` of the step."""
    n = arm.n
    T = xs.shape[0]
    if isinstance(method, str) and method in _EULER:
        # one evaluation per knot: a = qdd(x, u); semi-implicit: qd+ = qd + a dt, q+ = q + qd+ dt;
        # explicit (Craig 6.117): qd+ = qd + a dt, q+ = q + qd dt + a dt^2 / 2
        a = _accel_once(arm, xs, us, input, fe, saturate) if qdd is None else qdd
        Ja, _ = _accel_jacobians(arm, xs, us, a, input, fe, saturate)  # (T, n, 3n)
        q, qd = xs[:, :n], xs[:, n:]
        c = dt * dt if method == "semi_implicit_euler" else 0.5 * dt * dt
        # the step itself by the integrator's own formulas (a rollout's states to the last bit)
        q_next, qd_next, _ = integrators.get_method(method)(lambda t, q, qd: a, 0.0, q, qd, dt)
        eye = jnp.eye(n, dtype=xs.dtype)
        top = jnp.concatenate([jnp.broadcast_to(eye, (T, n, n)), jnp.broadcast_to(dt * eye, (T, n, n)),
                               jnp.zeros((T, n, n), xs.dtype)], axis=2) + c * Ja
        bottom = jnp.concatenate([jnp.zeros((T, n, n), xs.dtype), jnp.broadcast_to(eye, (T, n, n)),
                                  jnp.zeros((T, n, n), xs.dtype)], axis=2) + dt * Ja
        J = jnp.concatenate([top, bottom], axis=1)  # (T, 2n, 3n)
        return jnp.concatenate([q_next, qd_next], axis=1), J[:, :, : 2 * n], J[:, :, 2 * n:]
    if not (isinstance(method, str) and method in _TABLEAUS):
        if fe is not None or saturate:
            raise ValueError("_step_jacobians: a wrench or saturation needs a method by name")
        def one(x, u):
            def f(xu):
                y = _step(arm, xu[: 2 * n], xu[2 * n:], dt, method, input)
                return y, y
            J, y = jax.jacfwd(f, has_aux=True)(jnp.concatenate([x, u]))
            return y, J[:, : 2 * n], J[:, 2 * n:]
        return jax.vmap(one)(xs, us)
    A, b, P, acc, L, J = _stages(arm, xs, us, dt, method, input, fe, saturate, given=qdd)
    stages = len(b)
    dtype = xs.dtype
    K = jnp.concatenate([P[:, :, n:], acc], axis=2)
    y = xs + dt * jnp.einsum("j,jtk->tk", jnp.asarray(b, dtype), K)
    eye = jnp.eye(2 * n, dtype=dtype)
    dKx, dKu = [], []
    for i in range(stages):
        dXx = eye
        dXu = jnp.zeros((2 * n, n), dtype)
        for j in range(i):
            if A[i, j] != 0.0:
                dXx = dXx + (dt * float(A[i, j])) * dKx[j]
                dXu = dXu + (dt * float(A[i, j])) * dKu[j]
        Jx, Ju = J[i, :, :, : 2 * n], J[i, :, :, 2 * n:]
        dKx.append(jnp.einsum("tij,tjk->tik", Jx, jnp.broadcast_to(dXx, (T, 2 * n, 2 * n))))
        dKu.append(jnp.einsum("tij,tjk->tik", Jx, jnp.broadcast_to(dXu, (T, 2 * n, n))) + Ju)
    Ak = eye + dt * sum(float(b[i]) * dKx[i] for i in range(stages))
    Bk = dt * sum(float(b[i]) * dKu[i] for i in range(stages))
    return y, Ak, Bk


def _fd_step(dtype):
    """Relative step of the central differences: the cube root of the machine epsilon (truncation
    and rounding errors balanced, about 1e-10 relative in float64)."""
    return float(jnp.finfo(dtype).eps) ** (1.0 / 3.0)


def _step_second_derivatives(arm, xs, us, dt, method, input, with_first=False):
    """d[A_k B_k] / dz_k (T, 3n, 2n, 3n) at every knot z_k = (x_k, u_k): entry [k, j] is the
    derivative of the step Jacobian [A_k B_k] (2n, 3n) along z_j, by central differences of the
    analytic step Jacobians (:func:`_step_jacobians`) with the relative step :func:`_fd_step`.
    Contracted with a costate p (2n,),
    ``einsum("jim,i->jm", D_k, p)`` is the Hessian of p . F(z) at z_k (3n, 3n), the dynamics'
    second-order term of DDP and of the implicit gradients. Differentiating the integrator step
    twice by automatic differentiation gives the same numbers but compiles for minutes for a
    6-joint arm; this reuses the compiled step Jacobians, batched over the 2 * 3n shifted points
    of every knot.

    ``with_first``: (A, B, D), the step Jacobians A_k (T, 2n, 2n) and B_k (T, 2n, n) at the knots
    themselves evaluated in the same batch as the shifted points, so that a program needing both
    compiles the step Jacobians once (each copy of them is the largest part of such a program)."""
    n = arm.n
    T = xs.shape[0]
    dtype = xs.dtype
    z = jnp.concatenate([xs, us], axis=1)
    h = _fd_step(dtype) * jnp.maximum(1.0, jnp.abs(z))  # (T, 3n)
    eye = jnp.eye(3 * n, dtype=dtype)
    shifted = z[None, :, None, :] + jnp.stack([1.0, -1.0]).astype(dtype)[:, None, None, None] * (h[:, :, None] * eye)[None]
    flat = shifted.reshape(-1, 3 * n)  # (2 T 3n, 3n)
    if with_first:
        flat = jnp.concatenate([flat, z])
    _, Ap, Bp = _step_jacobians(arm, flat[:, : 2 * n], flat[:, 2 * n:], dt, method, input)
    J = jnp.concatenate([Ap, Bp], axis=2)
    D = J[: 2 * T * 3 * n].reshape(2, T, 3 * n, 2 * n, 3 * n)
    D = (D[0] - D[1]) / (2.0 * h[:, :, None, None])
    if with_first:
        return Ap[2 * T * 3 * n:], Bp[2 * T * 3 * n:], D
    return D
