"""An optimal-control problem for an arm: whatever costs and constraints the user writes.

    minimize    sum_{k<T} l(x_k, u_k, k) + l_T(x_T)
    subject to  x_{k+1} = F(x_k, u_k)         (one step of :func:`jaxarm.rollout`'s integrator)
                x_0 given,  lower <= u_k <= upper,
                g(x_k, u_k, k) <= 0,  h(x_k, u_k, k) = 0   (path and terminal constraints)

The costs and constraints are sums of :mod:`jaxarm.trajopt.terms` (tool position, orientation,
via points, effort, keep-out spheres, limits ... or your own functions), plus, as trajax takes
them, a plain ``running(x, u, k, params)`` and ``terminal(x, params)``. The problem is a pytree:
its arrays (start state, bounds, the terms' targets and weights, ``params``, the arm) are leaves,
the functions and the horizon are static, so one solver call can be ``jax.vmap``-ed over problems
and its solution differentiated with respect to them: ``jax.grad`` of any function of
:func:`jaxarm.trajopt.ddp`'s states and inputs (and of its cost) with respect to the problem --
``params``, start state, dt, bounds, the arm's physical parameters -- is computed by the implicit
function theorem at the optimum, not by differentiating the solver's iterations
(:mod:`jaxarm.control.trajopt.solvers.implicit`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ...model import checks
from ...model.arm import Arm
from ...simulate import integrators
from ..linearize import _check_input_kind, _joint_torque
from . import terms as _terms
from .problem import _input_limit, _without_input_limits
from ...core.xla import computed_once
from ...dynamics import linalg
from ...dynamics.forward import _forward_dynamics_factored
from ...dynamics.newton_euler import _inverse_dynamics


@dataclasses.dataclass(frozen=True, eq=False)
class OCP:
    """An optimal-control problem (build it with :func:`ocp`).

    arm: the arm whose dynamics are the constraint x_{k+1} = F(x_k, u_k) (its input limits are the
    default bounds; the dynamics themselves never clip); x0: (2n,) start state (q, qd); dt: ()
    step; lower, upper: (n,) input bounds (+-inf where free); params: your pytree (targets,
    weights, obstacles; read by terms that name its entries and passed to your functions);
    costs, constraints: tuples of :class:`jaxarm.trajopt.terms.Term`; T: horizon (steps);
    method: integrator ("rk3" ...); input: "torque" or "voltage".
    """

    arm: Arm
    x0: Any
    dt: Any
    lower: Any
    upper: Any
    params: Any
    costs: tuple
    constraints: tuple
    T: int
    method: Any = "rk3"
    input: str = "torque"

    @property
    def n(self) -> int:
        return self.arm.n

    def replace(self, **changes) -> "OCP":
        """A copy with some fields replaced (e.g. ``params``, ``x0``, ``dt``); checked again. A new
        ``dt`` rescales the path costs with the dynamics; via points stay at their knots (at times
        k dt of the new step)."""
        new = dataclasses.replace(self, **changes)
        _check_shapes(new, "OCP.replace")
        return new

    def step(self, x, u):
        """x_{k+1} (2n,) = F(x_k, u_k): one integrator step with u held (no clipping)."""
        return _step(solver_arm(self), x, u, self.dt, self.method, self.input)

    def __repr__(self) -> str:
        names = ", ".join(t.name for t in self.costs)
        cons = ", ".join(t.name for t in self.constraints)
        return f"OCP(arm={self.arm.name!r}, T={self.T}, costs=[{names}], constraints=[{cons}], input={self.input!r})"


jax.tree_util.register_dataclass(OCP, data_fields=["arm", "x0", "dt", "lower", "upper", "params", "costs", "constraints"],
                                 meta_fields=["T", "method", "input"])


def _step(arm, x, u, dt, method, input):
    """x_{k+1} (2n,): one step of the integrator ``method`` from x = (q, qd) with u held, no
    clipping of the input (the same step :func:`jaxarm.rollout` takes with ``saturate=False``)."""
    n = arm.n
    # the solvers differentiate this step by hand (_step_jacobians, the implicit gradients), and
    # its program is kept as it was measured: forward dynamics without its derivative rule, the
    # Runge-Kutta stage loop storing rather than recomputing (with them, the trajectory-
    # optimization tutorial took 205 s instead of 130 s in the docs test)
    step = _PLAIN_LOOPS[method] if isinstance(method, str) and method in _PLAIN_LOOPS else integrators.get_method(method)

    def accel(t, q, qd):
        return _forward_dynamics_factored(arm, q, qd, _joint_torque(arm, u, qd, input, False))[0]

    q, qd, _ = step(accel, 0.0, x[:n], x[n:], dt)
    return jnp.concatenate([q, qd])


_TABLEAUS = {"rk3": integrators.KUTTA3, "rk4": integrators.CLASSICAL_RK4}
_PLAIN_LOOPS = {name: integrators.explicit_rk(*tableau, recompute=False) for name, tableau in _TABLEAUS.items()}
_EULER = ("euler", "semi_implicit_euler")


def _accel_factored(arm, x, u, input):
    """qdd (n,) at x = (q, qd) under input u, and the Cholesky factor of M(q) it was solved with."""
    n = arm.n
    return _forward_dynamics_factored(arm, x[:n], x[n:], _joint_torque(arm, u, x[n:], input, False))


def _accel_factored_once(arm, xs, us, input):
    """:func:`_accel_factored` at every (x_k, u_k) (T, 2n), (T, n): accelerations (T, n) and
    Cholesky factors (T, n, n), stored once (:func:`jaxarm.core.xla.computed_once`) rather than
    fused again into each Jacobian entry that reads them."""
    return computed_once(jax.vmap(lambda x, u: _accel_factored(arm, x, u, input)), xs, us)


def _accel_jacobians(arm, xs, us, qdd, L, input):
    """d qdd / d(q, qd, u) (N, n, 3n) at the N points x = (q, qd) (N, 2n), u (N, n), given qdd
    (N, n) there and the Cholesky factors L (N, n, n) of M(q): from ID(q, qd, FD(q, qd, tau)) = tau
    (Carpentier & Mansard 2018, Sec. III-B), d qdd/dq = -M^-1 dID/dq,
    d qdd/dqd = M^-1 (dtau/dqd - dID/dqd), d qdd/du = M^-1 dtau/du, with dID/d(q, qd) at fixed
    qdd by forward mode through Newton-Euler along the 2n directions of (q, qd).

    The forward mode is split in two (``jax.linearize``): the primal pass and its residuals (the
    sines, rotations, velocities, ... the tangents are linear in) computed once per point and
    stored (:func:`jaxarm.core.xla.computed_once`), then the linear map applied to the 2n unit
    directions. With ``jax.jacfwd`` in one piece, XLA:CPU fused the whole primal recursion into
    each of the ~40 loop fusions of the Jacobian's entries (UR5 solver: 93k -> 56k lines of
    optimized HLO; Panda tutorial: 127k -> 81k). Reverse mode (n cotangents) was measured before:
    12 % faster solves under ``jaxarm.jit`` on the Panda but 2.8x slower under a plain
    ``jax.jit``, which is what users' own programs get."""
    n = arm.n
    linear = []

    def residuals(x, a):  # one point: the linearization's traced constants; its linear map kept aside
        _, lin = jax.linearize(lambda q, qd: _inverse_dynamics(arm, q, qd, a), x[:n], x[n:])
        closed = jax.make_jaxpr(lin)(x[:n], x[n:])
        traced = [i for i, c in enumerate(closed.consts) if isinstance(c, jax.core.Tracer)]
        linear.append((closed.jaxpr, list(closed.consts), traced))
        return [closed.consts[i] for i in traced]

    res = computed_once(jax.vmap(residuals), xs, qdd)
    jaxpr, consts, traced = linear[-1]

    def apply(r, t):  # the linear map at one point along one direction t (2n,)
        full = list(consts)
        for i, v in zip(traced, r):
            full[i] = v
        return jax.core.eval_jaxpr(jaxpr, full, t[:n], t[n:])[0]

    eye = jnp.eye(2 * n, dtype=xs.dtype)
    dID = jax.vmap(lambda r: jax.vmap(lambda t: apply(r, t), out_axes=1)(eye))(res)  # (N, n, 2n)

    def solve(x, u, L, d):
        dtau = jax.jacfwd(lambda qd, u: _joint_torque(arm, u, qd, input, False), argnums=(0, 1))(x[n:], u)
        return linalg.cholesky_solve_factored(L, jnp.concatenate([-d[:, :n], dtau[0] - d[:, n:], dtau[1]], axis=1))

    return jax.vmap(solve)(xs, us, L, dID)


def _stages(arm, xs, us, dt, method, input):
    """The Runge-Kutta stages of the step ``method`` (a name in _TABLEAUS) at every (x_k, u_k) (T, 2n),
    (T, n): the tableau A (s, s) and weights b (s,) as NumPy arrays, the stage points X_i (s, T, 2n),
    their accelerations (s, T, n) and the Cholesky factors of M there (s, T, n, n), and the
    Jacobians of the state derivative f = (qd, qdd) at the stage points with respect to (x, u)
    (s, T, 2n, 3n). The stages run in a loop (``lax.scan``: the forward dynamics is compiled once,
    not once per stage); the accelerations' Jacobians come from inverse dynamics
    (:func:`_accel_jacobians`)."""
    n = arm.n
    T = xs.shape[0]
    _, A, b = (np.asarray(v, float) for v in _TABLEAUS[method])  # the stage times do not matter: u is held
    stages = len(b)
    dtype = xs.dtype
    A_dt = dt * jnp.asarray(A, dtype)

    def stage(carry, i):  # stage i, batched over the T knots: X_i from the K_j found so far (j < i)
        P, acc, L = carry  # (s, T, 2n) stage points, (s, T, n) their accelerations (zeros until found), factors
        K = jnp.concatenate([P[:, :, n:], acc], axis=2)  # K_j = f(X_j) = (qd_j, qdd_j)
        X = xs + jnp.einsum("j,jtk->tk", A_dt[i], K)
        a, Li = jax.vmap(lambda x, u: _accel_factored(arm, x, u, input))(X, us)
        return (P.at[i].set(X), acc.at[i].set(a), L.at[i].set(Li)), None

    init = (jnp.zeros((stages, T, 2 * n), dtype), jnp.zeros((stages, T, n), dtype), jnp.zeros((stages, T, n, n), dtype))
    (P, acc, L), _ = jax.lax.scan(stage, init, jnp.arange(stages))
    U = jnp.broadcast_to(us, (stages, T, n)).reshape(stages * T, n)
    Ja = _accel_jacobians(arm, P.reshape(stages * T, 2 * n), U, acc.reshape(stages * T, n), L.reshape(stages * T, n, n),
                          input).reshape(stages, T, n, 3 * n)
    top = jnp.concatenate([jnp.zeros((n, n)), jnp.eye(n), jnp.zeros((n, n))], axis=1).astype(dtype)
    J = jnp.concatenate([jnp.broadcast_to(top, (stages, T, n, 3 * n)), Ja], axis=2)
    return A, b, P, acc, L, J


def _step_jacobians(arm, xs, us, dt, method, input):
    """x_{k+1} (T, 2n), A_k = dF/dx (T, 2n, 2n) and B_k = dF/du (T, 2n, n) of the integrator step
    at every (x_k, u_k) (T, 2n), (T, n).

    For the Runge-Kutta methods by name the Jacobian is built from the Jacobians of the state
    derivative f(x, u) = (qd, qdd) at the stage points, by the chain rule through the stages
    (Hairer, Norsett & Wanner, II.1 eq. 1.8: X_i = x + dt sum_j a_ij K_j, K_i = f(X_i, u),
    x+ = x + dt sum_i b_i K_i, so dK_i = J_i (dX_i, du)). The stages run in a loop
    (``lax.scan``: the forward dynamics is compiled once, not once per stage). The accelerations'
    Jacobians come from inverse dynamics, not from differentiating forward dynamics: from
    ID(q, qd, FD(q, qd, tau)) = tau (Carpentier & Mansard 2018, Sec. III-B),

        d qdd / dq = -M^-1 dID/dq,   d qdd / dqd = M^-1 (dtau/dqd - dID/dqd),   d qdd / du = M^-1 dtau/du,

    with dID/d(q, qd) at the stage's acceleration by one forward-mode pass through Newton-Euler
    (no mass matrix or Cholesky factor in the differentiated program) and M^-1 applied with the
    Cholesky factor the stage's forward dynamics already computed. The same numbers as
    ``jax.jacfwd`` of the step up to rounding; the DDP program on the Puma 560 is about half the
    size. The Euler methods by name take the same accelerations' Jacobians at the knot; any other
    method: ``jax.jacfwd`` of the step."""
    n = arm.n
    T = xs.shape[0]
    if isinstance(method, str) and method in _EULER:
        # one evaluation per knot: a = qdd(x, u); semi-implicit: qd+ = qd + a dt, q+ = q + qd+ dt;
        # explicit (Craig 6.117): qd+ = qd + a dt, q+ = q + qd dt + a dt^2 / 2
        a, L = _accel_factored_once(arm, xs, us, input)
        Ja = _accel_jacobians(arm, xs, us, a, L, input)  # (T, n, 3n)
        q, qd = xs[:, :n], xs[:, n:]
        c = dt * dt if method == "semi_implicit_euler" else 0.5 * dt * dt
        qd_next = qd + dt * a
        q_next = q + dt * qd_next if method == "semi_implicit_euler" else q + dt * qd + c * a
        eye = jnp.eye(n, dtype=xs.dtype)
        top = jnp.concatenate([jnp.broadcast_to(eye, (T, n, n)), jnp.broadcast_to(dt * eye, (T, n, n)),
                               jnp.zeros((T, n, n), xs.dtype)], axis=2) + c * Ja
        bottom = jnp.concatenate([jnp.zeros((T, n, n), xs.dtype), jnp.broadcast_to(eye, (T, n, n)),
                                  jnp.zeros((T, n, n), xs.dtype)], axis=2) + dt * Ja
        J = jnp.concatenate([top, bottom], axis=1)  # (T, 2n, 3n)
        return jnp.concatenate([q_next, qd_next], axis=1), J[:, :, : 2 * n], J[:, :, 2 * n:]
    if not (isinstance(method, str) and method in _TABLEAUS):
        def one(x, u):
            def f(xu):
                y = _step(arm, xu[: 2 * n], xu[2 * n:], dt, method, input)
                return y, y
            J, y = jax.jacfwd(f, has_aux=True)(jnp.concatenate([x, u]))
            return y, J[:, : 2 * n], J[:, 2 * n:]
        return jax.vmap(one)(xs, us)
    A, b, P, acc, L, J = _stages(arm, xs, us, dt, method, input)
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
                dXx = dXx + (dt * A[i, j]) * dKx[j]
                dXu = dXu + (dt * A[i, j]) * dKu[j]
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


def _step_second_derivatives(arm, xs, us, dt, method, input):
    """d[A_k B_k] / dz_k (T, 3n, 2n, 3n) at every knot z_k = (x_k, u_k): entry [k, j] is the
    derivative of the step Jacobian [A_k B_k] (2n, 3n) along z_j, by central differences of the
    analytic step Jacobians (:func:`_step_jacobians`) with the relative step :func:`_fd_step`.
    Contracted with a costate p (2n,),
    ``einsum("jim,i->jm", D_k, p)`` is the Hessian of p . F(z) at z_k (3n, 3n), the dynamics'
    second-order term of DDP and of the implicit gradients. Differentiating the integrator step
    twice by automatic differentiation gives the same numbers but compiles for minutes for a
    6-joint arm; this reuses the compiled step Jacobians, batched over the 2 * 3n shifted points
    of every knot."""
    n = arm.n
    T = xs.shape[0]
    dtype = xs.dtype
    z = jnp.concatenate([xs, us], axis=1)
    h = _fd_step(dtype) * jnp.maximum(1.0, jnp.abs(z))  # (T, 3n)
    eye = jnp.eye(3 * n, dtype=dtype)
    shifted = z[None, :, None, :] + jnp.stack([1.0, -1.0]).astype(dtype)[:, None, None, None] * (h[:, :, None] * eye)[None]
    flat = shifted.reshape(-1, 3 * n)  # (2 T 3n, 3n)
    _, Ap, Bp = _step_jacobians(arm, flat[:, : 2 * n], flat[:, 2 * n:], dt, method, input)
    J = jnp.concatenate([Ap, Bp], axis=2).reshape(2, T, 3 * n, 2 * n, 3 * n)
    return (J[0] - J[1]) / (2.0 * h[:, :, None, None])


def ocp(
    arm: Arm,
    q0,
    T: int,
    dt,
    *,
    qd0=None,
    costs=None,
    constraints=None,
    running: Callable | None = None,
    terminal: Callable | None = None,
    path_inequality: Callable | None = None,
    path_equality: Callable | None = None,
    terminal_inequality: Callable | None = None,
    terminal_equality: Callable | None = None,
    params=None,
    lower=None,
    upper=None,
    joint_limits: bool = True,
    method="rk3",
    input: str = "torque",
) -> OCP:
    """An :class:`OCP`: move the arm from (q0, qd0) over T steps of dt.

    costs, constraints: terms from :mod:`jaxarm.trajopt.terms`, added up or in a list.
    running(x, u, k, params) -> (), terminal(x, params) -> (): plain JAX cost functions (summed
    over k = 0..T-1 as they are, no dt); path_inequality(x, u, k, params) -> (m,) <= 0 and
    path_equality (= 0) at k = 0..T-1; terminal_inequality(x, params), terminal_equality at x_T.
    (Terms get the arm as their first argument; use :func:`terms.custom` when a function needs it,
    e.g. to differentiate with respect to the arm.)
    lower, upper: input bounds, scalar or (n,); default -+ the arm's torque limit (voltage limit
    with ``input="voltage"``), infinite where it has none. joint_limits: add the arm's joint
    position and velocity limits as constraints (:func:`terms.joint_limits`).

    Every function is traced once here, on abstract values (nothing compiles), so a cost that
    returns the wrong shape, a params entry that is missing or a bound below its partner is
    reported now, by name.
    """
    func = "ocp"
    checks.check_arm(arm, func)
    _check_input_kind(arm, input, func)
    integrators.get_method(method)
    if not isinstance(T, (int, np.integer)) or isinstance(T, bool) or T < 1:
        raise ValueError(f"{func}: T: expected a whole number of steps >= 1, got {T!r}")
    T = int(T)
    try:
        dt_f = float(dt)
    except (TypeError, ValueError):
        raise ValueError(f"{func}: dt: expected a positive time step in seconds, got {dt!r}") from None
    if not (np.isfinite(dt_f) and dt_f > 0):
        raise ValueError(f"{func}: dt: expected a positive time step in seconds, got {dt!r}")
    n = arm.n
    q0 = checks.joint_vector(q0, arm, "q0", func)
    qd0 = jnp.zeros_like(q0) if qd0 is None else checks.joint_vector(qd0, arm, "qd0", func)
    _finite(q0, "q0", func)
    _finite(qd0, "qd0", func)
    x0 = jnp.concatenate([q0, qd0]).astype(jnp.result_type(float))
    lim = jnp.asarray(_input_limit(arm, input), dtype=x0.dtype)
    lower = -lim if lower is None else _bound(lower, n, "lower", func, x0.dtype)
    upper = lim if upper is None else _bound(upper, n, "upper", func, x0.dtype)
    if not isinstance(lower, jax.core.Tracer) and not isinstance(upper, jax.core.Tracer):
        bad = np.flatnonzero(~(np.asarray(lower) <= np.asarray(upper)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{func}: lower, upper: the input bounds are infeasible at joint {i + 1}: "
                             f"lower {float(lower[i])} > upper {float(upper[i])}")
    params = {} if params is None else params

    cost_terms = list(_terms.as_terms(costs, "costs"))
    con_terms = list(_terms.as_terms(constraints, "constraints"))
    for t in cost_terms:
        if t.kind not in ("residual", "scalar", "rate"):
            raise ValueError(f"{func}: costs: term {t.name!r} is a constraint ({t.kind}); pass it in constraints=")
    if sum(t.kind == "rate" for t in cost_terms) > 1:
        raise ValueError(f"{func}: costs: more than one input_rate term; give one (its weight may be per joint)")
    for t in con_terms:
        if t.kind not in ("inequality", "equality"):
            raise ValueError(f"{func}: constraints: term {t.name!r} is a cost; pass it in costs=")
    for name, fn in (("running", running), ("terminal", terminal), ("path_inequality", path_inequality),
                     ("path_equality", path_equality), ("terminal_inequality", terminal_inequality),
                     ("terminal_equality", terminal_equality)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{func}: {name}: expected a function, got {type(fn).__name__}")
    user_running = None
    if running is not None:
        user_running = _terms._make("running", "scalar", lambda a, x, u, k, d, p, f=running: f(x, u, k, p), "path", True)
    if terminal is not None:
        cost_terms.append(_terms._make("terminal", "scalar", lambda a, x, u, k, d, p, f=terminal: f(x, p), "end", False))
    for name, fn, kind, when, uses in (
        ("path_inequality", path_inequality, "inequality", "path", True),
        ("path_equality", path_equality, "equality", "path", True),
        ("terminal_inequality", terminal_inequality, "inequality", "end", False),
        ("terminal_equality", terminal_equality, "equality", "end", False),
    ):
        if fn is None:
            continue
        if uses:
            wrapped = lambda a, x, u, k, d, p, f=fn: jnp.atleast_1d(f(x, u, k, p))  # noqa: E731
        else:
            wrapped = lambda a, x, u, k, d, p, f=fn: jnp.atleast_1d(f(x, p))  # noqa: E731
        con_terms.append(_terms._make(name, kind, wrapped, when, uses))
    if joint_limits:
        con_terms.insert(0, _terms.joint_limits())

    def scheduled(t, s=None):
        integrated = s is None and t.when == "path" and t.kind in ("residual", "scalar")
        s = _terms.schedule(t, T, dt_f, func) if s is None else s
        return dataclasses.replace(t, schedule=jnp.asarray(s, dtype=x0.dtype), integrated=integrated)

    cost_terms = [scheduled(t) for t in cost_terms]
    if user_running is not None:  # summed as written, no dt
        s = np.zeros(T + 1)
        s[:T] = 1.0
        cost_terms.append(scheduled(user_running, s))
    if not cost_terms:
        raise ValueError(f"{func}: costs: the problem has no cost; give terms (e.g. trajopt.terms.effort()) or running=/terminal=")
    problem = OCP(arm=arm, x0=x0, dt=jnp.asarray(dt_f, x0.dtype), lower=lower, upper=upper, params=params,
                  costs=tuple(cost_terms), constraints=tuple(scheduled(t) for t in con_terms), T=T, method=method,
                  input=input)
    _check_shapes(problem, func)
    return problem


def _finite(a, name, func, show_values=True):
    """Refuse NaN or inf in a concrete array (a traced one is not checked); name the values when
    they are few (``show_values``), not for whole trajectories."""
    if not isinstance(a, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(a)))):
        got = np.asarray(a).tolist() if show_values else "NaN or inf"
        raise ValueError(f"{func}: {name}: expected finite values, got {got}")


def _bound(b, n, name, func, dtype):
    a = jnp.asarray(b, dtype=dtype)
    if a.ndim == 0:
        a = jnp.broadcast_to(a, (n,))
    if a.shape != (n,):
        raise ValueError(f"{func}: {name}: expected a number or shape ({n},) (one per joint), got {a.shape}")
    if not isinstance(a, jax.core.Tracer) and bool(np.any(np.isnan(np.asarray(a)))):
        raise ValueError(f"{func}: {name}: expected numbers (+-inf for no bound), got NaN")
    return a


_CHECKED: dict = {}  # the abstract signatures of problems _check_shapes has passed


def _abstract_signature(problem: OCP):
    """(tree structure, leaves' shapes and dtypes) of a problem, or None where that is not
    hashable: two problems with the same signature pass or fail :func:`_check_shapes` alike."""
    leaves, treedef = jax.tree_util.tree_flatten(problem)
    try:
        key = (treedef, tuple((jnp.shape(leaf), jnp.result_type(leaf)) for leaf in leaves))
        hash(key)
    except TypeError:
        return None
    return key


def _check_shapes(problem: OCP, func: str) -> None:
    """Trace every term once on abstract values: shapes and params lookups, before any compile.
    Done once per abstract signature: ``problem.replace(params=...)`` with new values of the same
    shapes, every control step of an MPC loop, traces nothing again (it took 35 ms a call on the
    tracking problem of ``experiments/trajopt_mpc.py``, longer than the control step itself)."""
    key = _abstract_signature(problem)
    if key is not None and key in _CHECKED:
        return
    _check_terms(problem, func)
    if key is not None:
        if len(_CHECKED) >= 256:
            _CHECKED.clear()
        _CHECKED[key] = True


def _check_terms(problem: OCP, func: str) -> None:
    n = problem.n
    if jnp.shape(problem.x0) != (2 * n,):
        raise ValueError(f"{func}: x0: expected shape ({2 * n},) = (q, qd), got {jnp.shape(problem.x0)}")
    dtype = jnp.result_type(problem.x0)
    x = jax.ShapeDtypeStruct((2 * n,), dtype)
    u = jax.ShapeDtypeStruct((n,), dtype)
    k = jax.ShapeDtypeStruct((), jnp.int32)
    for group in (problem.costs, problem.constraints):
        for t in group:
            if jnp.shape(t.schedule) != (problem.T + 1,):
                raise ValueError(f"{func}: term {t.name!r}: its schedule has shape {jnp.shape(t.schedule)}, "
                                 f"expected ({problem.T + 1},) for T = {problem.T}; build the problem again with ocp() to change T")
            try:
                out = jax.eval_shape(lambda arm, x, u, k, d, p, t=t: t.fn(arm, x, u, k, t.values(p) if d is None else d, p),
                                     problem.arm, x, u, k, None, problem.params)
            except KeyError as e:
                raise KeyError(f"{func}: {e.args[0]}") from None
            except Exception as e:  # a user function that fails on abstract values: say which
                raise ValueError(f"{func}: term {t.name!r} fails when evaluated at a knot "
                                 f"(x ({2 * n},), u ({n},), k, params): {type(e).__name__}: {e}") from e
            shape = out.shape
            if t.kind == "scalar" and shape != ():
                raise ValueError(f"{func}: term {t.name!r}: a cost must return a scalar, got shape {shape}")
            if t.kind != "scalar" and len(shape) != 1:
                raise ValueError(f"{func}: term {t.name!r}: expected a vector (m,) of "
                                 f"{'residuals' if t.kind == 'residual' else 'constraint values'}, got shape {shape}")
            if not jnp.issubdtype(out.dtype, jnp.floating):
                raise ValueError(f"{func}: term {t.name!r}: expected floating-point values, got {out.dtype}")
            w = t.values(problem.params).get("weight")
            if w is not None and jnp.ndim(w) != 0:
                raise ValueError(f"{func}: term {t.name!r}: weight: expected a scalar, got shape {jnp.shape(w)}")
            if t.kind == "rate":
                for field in ("w", "previous"):
                    v = t.values(problem.params).get(field)
                    if v is not None and jnp.shape(v) not in ((), (n,)):
                        raise ValueError(f"{func}: term {t.name!r}: {field}: expected a number or shape ({n},) "
                                         f"(one per joint), got shape {jnp.shape(v)}")


def solver_arm(problem: OCP) -> Arm:
    """The arm the solver simulates: input limits removed (the bounds are the solver's job)."""
    return _without_input_limits(problem.arm, problem.input)


def reach_ocp(arm: Arm, problem, T: int, *, method="rk3", input: str = "torque") -> OCP:
    """The :class:`jaxarm.trajopt.ReachProblem` ``problem`` as an :class:`OCP` of T steps, written in
    terms (same objective as :func:`jaxarm.trajopt.trajectory_cost`): effort, terminal tool
    position, orientation and joint speed, running tool position; solve it with
    :func:`jaxarm.trajopt.ddp`. The input smoothness is the input-rate term
    (:func:`jaxarm.trajopt.terms.input_rate`, from the second input on)."""
    from .problem import ReachProblem

    func = "reach_ocp"
    if not isinstance(problem, ReachProblem):
        raise TypeError(f"{func}: problem: expected a jaxarm.trajopt.ReachProblem, got {type(problem).__name__}")
    costs = (_terms.effort(problem.effort) + _terms.tool_position(problem.target, problem.position)
             + _terms.tool_orientation(problem.target_rotation, problem.orientation)
             + _terms.joint_velocity(problem.velocity)
             + _terms.tool_position(problem.target, problem.path_position, when="path"))
    if isinstance(problem.smoothness, jax.core.Tracer) or float(problem.smoothness) != 0.0:
        costs = costs + _terms.input_rate(problem.smoothness)
    return ocp(arm, problem.q0, T, problem.dt, qd0=problem.qd0, costs=costs, method=method, input=input)
