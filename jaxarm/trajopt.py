"""Trajectory optimization: direct single and multiple shooting through differentiable rollouts,
and iLQR on the discrete linearization of the integrator step.

A problem (:class:`ReachProblem`) is data -- start state, tool target, time step, cost weights --
so one solver call can be ``jax.vmap``-ed over many goals or many arms (:func:`jaxarm.stack_arms`).
All three solvers minimize the same objective over an input schedule u (T, n) (torque, or motor
voltage with ``input="voltage"``):

    J = sum_k [ sum_i w_i u_ki^2 + w_path |p(q_k) - p*|^2 ] dt              (effort, path)
        + s sum_k |u_k - u_{k-1}|^2 / dt                                    (smoothness)
        + w_p |p(q_T) - p*|^2 + w_R (3 - tr(R*^T R(q_T))) + w_v |qd_T|^2    (tool pose, rest)

subject to the arm's limits: |u| <= u_max (``arm.limits.torque`` or ``arm.drives.voltage_limit``),
q within ``arm.limits.position`` and |qd| <= ``arm.limits.velocity`` at every step (infinite limits
are inactive). Inequality and defect constraints are handled by the augmented Lagrangian
(Nocedal & Wright 2006, section 17.4, eqs 17.36 and 17.65, multiplier update 17.39); the input
limit by either the same augmented Lagrangian or by squashing, u = u_max tanh(z).

Warm start: :func:`reach_warm_start` gives torques that follow a minimum-jerk joint path
(:func:`minimum_jerk`) to a damped-least-squares IK solution of the target (:func:`position_ik`).

The decision variable is the dimensionless z (T, n): u = u_max tanh(z) ("squash") or u = u_max z
("augmented_lagrangian"), with u_max replaced by 1 where a joint has no limit, so all joints are
equally scaled for the optimizers and the iLQR regularization is in the same units everywhere.
The solvers simulate an internal copy of the arm with its input limits removed: the solver itself
keeps u inside them (exactly for squash, to ``tol_violation`` for the augmented Lagrangian), so the
dynamics never hide a violation behind a clip with zero gradient.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import checks, integrators
from .arm import Arm
from .dynamics import inverse_dynamics
from .kinematics import tool_pose
from .linearize import _check_input_kind, discrete_dynamics, linearize_trajectory
from .resolved_rate import resolved_rate
from .simulate import rollout

TORQUE_LIMIT_MODES = ("squash", "augmented_lagrangian")


class ReachProblem(NamedTuple):
    """A point-to-point problem for one arm (a pytree of arrays: vmap over a stack of them).

    q0, qd0: (n,) initial state; target: (3,) tool position goal (world frame);
    target_rotation: (3, 3) tool orientation goal (used when ``orientation > 0``);
    dt: () time step; effort: (n,) weights w_i of sum_k w_i u_ki^2 dt;
    position, orientation, velocity: () weights of the terminal tool position error |p - p*|^2 (1/m^2),
    orientation error 3 - tr(R*^T R) (= |R - R*|_F^2 / 2) and joint speed |qd_T|^2 ((rad/s)^-2);
    smoothness: () weight of sum |u_k - u_{k-1}|^2 / dt; path_position: () weight of the running
    position error sum |p(q_k) - p*|^2 dt. The horizon T is the length of the input schedule.
    """

    q0: jnp.ndarray
    qd0: jnp.ndarray
    target: jnp.ndarray
    target_rotation: jnp.ndarray
    dt: jnp.ndarray
    effort: jnp.ndarray
    position: jnp.ndarray
    orientation: jnp.ndarray
    velocity: jnp.ndarray
    smoothness: jnp.ndarray
    path_position: jnp.ndarray


class IterationLog(NamedTuple):
    """Per-iteration record, each (max_iterations,), NaN after the last iteration.

    cost: objective (cost + augmented-Lagrangian terms) after the iteration; rel_change: its
    relative decrease; alpha: accepted line-search step (iLQR; 0 = rejected, NaN for shooting);
    regularization: the Levenberg-Marquardt term mu used in the backward pass (iLQR; NaN for shooting).
    """

    cost: jnp.ndarray
    rel_change: jnp.ndarray
    alpha: jnp.ndarray
    regularization: jnp.ndarray


class TrajoptResult(NamedTuple):
    """A solver's answer.

    u: (T, n) optimized input schedule (torque or voltage; pass it back as a warm start);
    q, qd: (T+1, n) the trajectory of a single rollout of u from the initial state;
    cost: () the objective J of that trajectory (no constraint terms);
    max_violation: () largest constraint violation: input and velocity limits as fractions of the
    limit, joint positions in rad or m, multiple-shooting defects in state units;
    iterations: () inner iterations used (all augmented-Lagrangian rounds together);
    converged: () bool, the relative cost change fell below ``tol`` and max_violation below
    ``tol_violation``; history: :class:`IterationLog`.
    """

    u: jnp.ndarray
    q: jnp.ndarray
    qd: jnp.ndarray
    cost: jnp.ndarray
    max_violation: jnp.ndarray
    iterations: jnp.ndarray
    converged: jnp.ndarray
    history: IterationLog


class _Multipliers(NamedTuple):
    state: jnp.ndarray  # (T, 4n) for x_1..x_T: q - upper, lower - q, qd/v - 1, -qd/v - 1
    input: jnp.ndarray  # (T, 2n): u/u_max - 1, -u/u_max - 1
    defect: jnp.ndarray  # (S-1, 2n) multiple-shooting defects (S = 1: (0, 2n))


@dataclasses.dataclass(frozen=True)
class _Setup:
    """Static solver options and the arm-dependent scaling shared by every stage."""

    arm: Arm  # input limits removed (the solver enforces them)
    problem: ReachProblem
    scale: jnp.ndarray  # (n,) u_max where finite, else 1
    limited: jnp.ndarray  # (n,) bool, finite input limit
    squash: bool
    input: str
    method: object
    T: int
    checkpoint: bool = False
    adjoint: bool = False

    def to_input(self, z):
        """u (..., n) from the dimensionless decision z (..., n)."""
        bounded = jnp.where(self.limited, jnp.tanh(z), z) if self.squash else z
        return self.scale * bounded

    def input_slope(self, z):
        """du/dz (..., n) (the map is elementwise)."""
        if self.squash:
            return self.scale * jnp.where(self.limited, 1.0 - jnp.tanh(z) ** 2, 1.0)
        return jnp.broadcast_to(self.scale, z.shape)

    def from_input(self, u):
        """The decision z that gives u (inputs at or beyond a squashed limit map just inside it)."""
        r = u / self.scale
        if self.squash:
            r = jnp.where(self.limited, jnp.arctanh(jnp.clip(r, -1 + 1e-6, 1 - 1e-6)), r)
        return r


# --------------------------------------------------------------------------- problem


def reach_problem(
    arm: Arm,
    q0,
    target,
    dt,
    *,
    qd0=None,
    target_rotation=None,
    effort=None,
    position=1e4,
    orientation=0.0,
    velocity=10.0,
    smoothness=0.0,
    path_position=0.0,
    input: str = "torque",
) -> ReachProblem:
    """A :class:`ReachProblem`: move the tool from rest at q0 (n,) to ``target`` (3,) (world frame).

    effort: (n,) or scalar weights; default 1 / u_max^2 per joint (u_max the torque limit, or the
    voltage limit with ``input="voltage"``; 1 where unlimited), so the effort term is the time
    integral of the squared fraction of the available input.
    """
    func = "reach_problem"
    checks.check_arm(arm, func)
    _check_input_kind(arm, input, func)
    n = arm.n
    q0 = checks.joint_vector(q0, arm, "q0", func)
    qd0 = jnp.zeros_like(q0) if qd0 is None else checks.joint_vector(qd0, arm, "qd0", func)
    target = _array(target, (3,), "target", func)
    R = jnp.eye(3) if target_rotation is None else _array(target_rotation, (3, 3), "target_rotation", func)
    if not float(dt) > 0:
        raise ValueError(f"{func}: dt: expected a positive time step, got {dt!r}")
    if effort is None:
        lim = np.asarray(_input_limit(arm, input), dtype=float)
        effort = np.where(np.isfinite(lim), 1.0 / np.where(np.isfinite(lim), lim, 1.0) ** 2, 1.0)
    effort = jnp.broadcast_to(_array(effort, None, "effort", func), (n,)) if np.ndim(effort) == 0 else _array(effort, (n,), "effort", func)
    weights = {}
    for name, w in (("position", position), ("orientation", orientation), ("velocity", velocity),
                    ("smoothness", smoothness), ("path_position", path_position)):
        weights[name] = _array(w, (), name, func)
        if not float(weights[name]) >= 0:
            raise ValueError(f"{func}: {name}: expected a non-negative weight, got {w!r}")
    if not bool(jnp.all(effort >= 0)):
        raise ValueError(f"{func}: effort: expected non-negative weights, got {np.asarray(effort).tolist()}")
    return ReachProblem(q0=q0, qd0=qd0, target=target, target_rotation=R, dt=jnp.asarray(float(dt)), effort=effort, **weights)


def _array(x, shape, name, func):
    a = jnp.asarray(x, dtype=jnp.result_type(float))
    if shape is not None and a.shape != shape:
        raise ValueError(f"{func}: {name}: expected shape {shape}, got {a.shape}")
    if not isinstance(a, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(a)))):
        raise ValueError(f"{func}: {name}: expected finite values, got {np.asarray(a).tolist()}")
    return a


def _input_limit(arm, input):
    return arm.drives.voltage_limit if input == "voltage" else arm.limits.torque


def _without_input_limits(arm: Arm, input: str) -> Arm:
    if input == "voltage":
        return arm.replace(drives=dataclasses.replace(arm.drives, voltage_limit=jnp.full_like(jnp.asarray(arm.drives.voltage_limit, float), jnp.inf)))
    return arm.replace(limits=dataclasses.replace(arm.limits, torque=jnp.full_like(jnp.asarray(arm.limits.torque, float), jnp.inf)))


def _setup(arm, problem, u_init, func, *, torque_limits, input, method, checkpoint=False, adjoint=False):
    checks.check_arm(arm, func)
    _check_input_kind(arm, input, func)
    if not isinstance(problem, ReachProblem):
        raise TypeError(f"{func}: problem: expected a jaxarm.trajopt.ReachProblem (see reach_problem), got {type(problem).__name__}")
    n = arm.n
    for name in ("q0", "qd0", "effort"):
        if jnp.shape(getattr(problem, name)) != (n,):
            raise ValueError(f"{func}: problem.{name}: expected shape ({n},) for this {n}-joint arm, got {jnp.shape(getattr(problem, name))}")
    if torque_limits not in TORQUE_LIMIT_MODES:
        raise ValueError(f"{func}: torque_limits: expected one of {TORQUE_LIMIT_MODES}, got {torque_limits!r}")
    integrators.get_method(method)
    u_init = jnp.asarray(u_init)
    if u_init.ndim != 2 or u_init.shape[1] != n or u_init.shape[0] < 1:
        raise ValueError(f"{func}: u_init: expected an input schedule of shape (T, {n}) with T >= 1 (the warm start), got {u_init.shape}")
    if not isinstance(u_init, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(u_init)))):
        raise ValueError(f"{func}: u_init: expected finite values, got NaN or inf")
    lim = jnp.asarray(_input_limit(arm, input), dtype=u_init.dtype if jnp.issubdtype(u_init.dtype, jnp.floating) else float)
    limited = jnp.isfinite(lim)
    scale = jnp.where(limited, lim, 1.0)
    setup = _Setup(
        arm=_without_input_limits(arm, input), problem=problem, scale=scale, limited=limited,
        squash=torque_limits == "squash", input=input, method=method, T=int(u_init.shape[0]),
        checkpoint=bool(checkpoint), adjoint=bool(adjoint),
    )
    return setup, u_init.astype(jnp.result_type(u_init.dtype, float))


# --------------------------------------------------------------------------- warm start


def position_ik(arm: Arm, q_init, target, *, iterations: int = 50, damping: float = 1e-2):
    """Joint positions q (n,) that put the tool at ``target`` (3,), by damped least squares from
    q_init (n,): q <- q + J_p^T (J_p J_p^T + damping^2 I)^-1 (p* - p(q)) (Wampler 1986; the
    ``"damped"`` :func:`jaxarm.resolved_rate` on the position rows), ``iterations`` times (fixed, so
    it traces), then clipped to the joint position limits. Near q_init among the solutions of a
    redundant arm. Check the residual |p(q) - p*| yourself: an unreachable target ends at the
    closest point damped least squares finds."""
    func = "position_ik"
    checks.check_arm(arm, func)
    q_init = checks.joint_vector(q_init, arm, "q_init", func)
    target = _array(target, (3,), "target", func)
    if not isinstance(iterations, (int, np.integer)) or iterations < 1:
        raise ValueError(f"{func}: iterations: expected a positive whole number, got {iterations!r}")
    if not float(damping) > 0:
        raise ValueError(f"{func}: damping: expected lambda > 0 (m), got {damping!r}")

    def body(_, q):
        dp = target - tool_pose(arm, q)[:3, 3]
        return q + resolved_rate(arm, q, dp, rows="position", method="damped", damping=damping).qd

    q = jax.lax.fori_loop(0, int(iterations), body, q_init)
    lim = jnp.asarray(arm.limits.position)
    return jnp.clip(q, lim[:, 0], lim[:, 1])


def minimum_jerk(q0, q1, duration, t):
    """Rest-to-rest minimum-jerk joint path (Flash & Hogan 1985) from q0 to q1 (n,) in ``duration``
    seconds at times t (m,): q, qd, qdd, each (m, n), with s = t / duration clipped to [0, 1],
    q = q0 + (q1 - q0)(10 s^3 - 15 s^4 + 6 s^5)."""
    if not isinstance(duration, jax.core.Tracer) and not float(duration) > 0:
        raise ValueError(f"minimum_jerk: duration: expected a positive time (s), got {duration!r}")
    if jnp.ndim(t) != 1 or jnp.shape(q0) != jnp.shape(q1) or jnp.ndim(q0) != 1:
        raise ValueError(f"minimum_jerk: expected q0, q1 of the same shape (n,) and t (m,), got {jnp.shape(q0)}, {jnp.shape(q1)}, {jnp.shape(t)}")
    s = jnp.clip(jnp.asarray(t) / duration, 0.0, 1.0)[:, None]
    dq = jnp.asarray(q1) - jnp.asarray(q0)
    q = q0 + dq * (10 * s**3 - 15 * s**4 + 6 * s**5)
    qd = dq * (30 * s**2 - 60 * s**3 + 30 * s**4) / duration
    qdd = dq * (60 * s - 180 * s**2 + 120 * s**3) / duration**2
    return q, qd, qdd


def reach_warm_start(arm: Arm, problem: ReachProblem, T: int, *, q_goal=None, ik_iterations: int = 50, ik_damping: float = 1e-2):
    """A torque warm start u (T, n) for a reach: the minimum-jerk joint path (:func:`minimum_jerk`)
    from problem.q0 to q_goal (n,) (default :func:`position_ik` of problem.target from q0) in
    T * problem.dt, with the torque of each held step from :func:`jaxarm.inverse_dynamics` at the
    middle of the step (the RK3 rollout then follows the path to O(dt^2) over the horizon), clipped to the
    torque limits. Torque input only (a voltage schedule would need the motor model inverted).
    Assumes the problem starts at rest (the path does)."""
    func = "reach_warm_start"
    checks.check_arm(arm, func)
    if not isinstance(problem, ReachProblem):
        raise TypeError(f"{func}: problem: expected a jaxarm.trajopt.ReachProblem (see reach_problem), got {type(problem).__name__}")
    if not isinstance(T, (int, np.integer)) or T < 1:
        raise ValueError(f"{func}: T: expected a positive whole number of steps, got {T!r}")
    if q_goal is None:
        q_goal = position_ik(arm, problem.q0, problem.target, iterations=ik_iterations, damping=ik_damping)
    q_goal = checks.joint_vector(q_goal, arm, "q_goal", func)
    dt = problem.dt
    q, qd, qdd = minimum_jerk(problem.q0, q_goal, T * dt, (jnp.arange(T) + 0.5) * dt)
    u = jax.vmap(lambda q, qd, qdd: inverse_dynamics(arm, q, qd, qdd))(q, qd, qdd)
    lim = jnp.asarray(arm.limits.torque)
    return jnp.clip(u, -lim, lim)


# --------------------------------------------------------------------------- cost and constraints


def _pose_errors(arm, problem, q):
    pose = tool_pose(arm, q)
    dp = pose[:3, 3] - problem.target
    rot = 3.0 - jnp.sum(problem.target_rotation * pose[:3, :3])  # 3 - tr(R*^T R) = |R - R*|_F^2 / 2
    return dp, rot


def _stage_cost(arm, problem, x, u):
    """Running cost of one step (effort and path position), already multiplied by dt."""
    n = arm.n
    c = jnp.sum(problem.effort * u**2)
    dp, _ = _pose_errors(arm, problem, x[:n])
    return (c + problem.path_position * jnp.sum(dp**2)) * problem.dt


def _terminal_cost(arm, problem, x):
    n = arm.n
    dp, rot = _pose_errors(arm, problem, x[:n])
    return problem.position * jnp.sum(dp**2) + problem.orientation * rot + problem.velocity * jnp.sum(x[n:] ** 2)


def _smoothness_term(problem, u, u_prev):
    return problem.smoothness * jnp.sum((u - u_prev) ** 2) / problem.dt


def trajectory_cost(arm: Arm, problem: ReachProblem, q, qd, u):
    """The objective J (see the module docstring) of a trajectory q, qd (T+1, n) under u (T, n)."""
    checks.check_arm(arm, "trajectory_cost")
    x = jnp.concatenate([q, qd], axis=1)
    stage = jax.vmap(lambda x, u: _stage_cost(arm, problem, x, u))(x[:-1], u)
    return jnp.sum(stage) + jnp.sum(jax.vmap(lambda a, b: _smoothness_term(problem, a, b))(u[1:], u[:-1])) + _terminal_cost(arm, problem, x[-1])


def _masked(g, limit):
    """g where the limit is finite, else -1 (an inactive constraint)."""
    return jnp.where(jnp.isfinite(limit), g, -1.0)


def _state_constraints(arm, x):
    """Joint position and velocity limits at one state x (2n,) as g (4n,) <= 0."""
    n = arm.n
    q, qd = x[:n], x[n:]
    lo, hi = jnp.asarray(arm.limits.position)[:, 0], jnp.asarray(arm.limits.position)[:, 1]
    v = jnp.asarray(arm.limits.velocity)
    fin = lambda a: jnp.where(jnp.isfinite(a), a, 0.0)  # noqa: E731
    return jnp.concatenate([
        _masked(q - fin(hi), hi), _masked(fin(lo) - q, lo),
        _masked(qd / jnp.where(jnp.isfinite(v), v, 1.0) - 1.0, v), _masked(-qd / jnp.where(jnp.isfinite(v), v, 1.0) - 1.0, v),
    ])


def _input_constraints(setup, u):
    """Input limits as g (2n,) <= 0, in fractions of the limit (inactive when squashing)."""
    r = u / setup.scale
    if setup.squash:
        return -jnp.ones(2 * r.shape[-1], r.dtype)
    return jnp.concatenate([jnp.where(setup.limited, r - 1.0, -1.0), jnp.where(setup.limited, -r - 1.0, -1.0)])


def _al_inequality(g, lam, mu):
    # Nocedal & Wright eq 17.65 (slacks eliminated): (max(0, lam + mu g)^2 - lam^2) / (2 mu)
    return jnp.sum(jnp.maximum(0.0, lam + mu * g) ** 2 - lam**2) / (2.0 * mu)


def _al_equality(h, lam, mu):
    # Nocedal & Wright eq 17.36: lam^T h + mu/2 |h|^2
    return jnp.sum(lam * h) + 0.5 * mu * jnp.sum(h**2)


def _stage(setup, s, u, k, lam_state, lam_input, mu):
    """Stage k of the objective with its constraint terms, on the iLQR state s = (x, u_{k-1}) (3n,)
    and the input u (n,)."""
    n = setup.arm.n
    x, u_prev = s[: 2 * n], s[2 * n:]
    p = setup.problem
    c = _stage_cost(setup.arm, p, x, u) + jnp.where(k > 0, _smoothness_term(p, u, u_prev), 0.0)
    c = c + jnp.where(k > 0, _al_inequality(_state_constraints(setup.arm, x), lam_state, mu), 0.0)  # x_0 is given
    return c + _al_inequality(_input_constraints(setup, u), lam_input, mu)


def _terminal(setup, x, lam_state, mu):
    return _terminal_cost(setup.arm, setup.problem, x) + _al_inequality(_state_constraints(setup.arm, x), lam_state, mu)


def _lagrangian(setup, x, z, lam: _Multipliers, mu):
    """Objective + augmented-Lagrangian terms of the trajectory x (T+1, 2n) under decisions z (T, n)."""
    u = setup.to_input(z)
    s = _augmented_states(x, u)
    lam_stage = jnp.concatenate([jnp.zeros_like(lam.state[:1]), lam.state[:-1]])
    k = jnp.arange(setup.T)
    stages = jax.vmap(lambda s, u, k, ls, li: _stage(setup, s, u, k, ls, li, mu))(s, u, k, lam_stage, lam.input)
    return jnp.sum(stages) + _terminal(setup, x[-1], lam.state[-1], mu)


def _augmented_states(x, u):
    """s_k = (x_k, u_{k-1}) (T, 3n) for k = 0..T-1 (u_{-1} = 0, unused: no smoothness term at k = 0)."""
    return jnp.concatenate([x[:-1], jnp.concatenate([jnp.zeros_like(u[:1]), u[:-1]])], axis=1)


def _constraints(setup, x, z):
    """(state g (T, 4n), input g (T, 2n)) for x_1..x_T and u_0..u_{T-1}."""
    g_state = jax.vmap(lambda x: _state_constraints(setup.arm, x))(x[1:])
    g_input = jax.vmap(lambda u: _input_constraints(setup, u))(setup.to_input(z))
    return g_state, g_input


def _violation(g_state, g_input, defects):
    v = jnp.maximum(jnp.max(g_state, initial=0.0), jnp.max(g_input, initial=0.0))
    return jnp.maximum(v, jnp.max(jnp.abs(defects), initial=0.0))


def _simulate(setup, z, x0=None):
    """Single rollout of the decisions z (T, n): states (T+1, 2n)."""
    p = setup.problem
    n = setup.arm.n
    q0, qd0 = (p.q0, p.qd0) if x0 is None else (x0[:n], x0[n:])
    traj = rollout(setup.arm, q0, qd0, setup.to_input(z), p.dt, method=setup.method, input=setup.input,
                   saturate=False, on_divergence="flag", checkpoint=setup.checkpoint,
                   adjoint=setup.adjoint)
    return jnp.concatenate([traj.q, traj.qd], axis=1)


def _result(setup, z, defects, iterations, inner_converged, tol_violation, log):
    x = _simulate(setup, z)
    n = setup.arm.n
    u = setup.to_input(z)
    g_state, g_input = _constraints(setup, x, z)
    viol = _violation(g_state, g_input, defects)
    cost = trajectory_cost(setup.arm, setup.problem, x[:, :n], x[:, n:], u)
    return TrajoptResult(u=u, q=x[:, :n], qd=x[:, n:], cost=cost, max_violation=viol, iterations=iterations,
                         converged=inner_converged & (viol <= tol_violation), history=log)


def _empty_log(max_iterations, dtype):
    nan = jnp.full((max_iterations,), jnp.nan, dtype)
    return IterationLog(nan, nan, nan, nan)


def _record(log, it, cost, rel, alpha=jnp.nan, reg=jnp.nan):
    return IterationLog(log.cost.at[it].set(cost), log.rel_change.at[it].set(rel),
                        log.alpha.at[it].set(alpha), log.regularization.at[it].set(reg))


def _rel_change(old, new):
    return (old - new) / jnp.maximum(jnp.abs(old), 1e-300)


# --------------------------------------------------------------------------- augmented Lagrangian


def _augmented_lagrangian(inner, constraint_values, params, lam0, *, mu0, mu_growth, mu_max, al_iterations, tol_violation, log):
    """Outer loop: solve the inner problem at fixed (lam, mu), then lam <- max(0, lam + mu g) for
    inequalities, lam <- lam + mu h for equalities (Nocedal & Wright eq 17.39), mu <- growth mu
    while the violation is above tolerance.

    inner(params, lam, mu, it, log) -> (params, it, converged, log);
    constraint_values(params) -> (g_state, g_input, h_defect)."""

    def cond(c):
        params, lam, mu, outer, it, conv, viol, log = c
        return (outer == 0) | ((outer < al_iterations) & (viol > tol_violation))

    def body(c):
        params, lam, mu, outer, it, conv, viol_prev, log = c
        params, it, conv, log = inner(params, lam, mu, it, log)
        g_state, g_input, h = constraint_values(params)
        viol = _violation(g_state, g_input, h)
        lam = _Multipliers(jnp.maximum(0.0, lam.state + mu * g_state), jnp.maximum(0.0, lam.input + mu * g_input), lam.defect + mu * h)
        # raise the penalty only when the violation did not drop fourfold (Conn, Gould & Toint 1991)
        mu = jnp.where((viol > tol_violation) & (viol > 0.25 * viol_prev), jnp.minimum(mu * mu_growth, mu_max), mu)
        return params, lam, mu, outer + 1, it, conv, viol, log

    dtype = lam0.state.dtype
    init = (params, lam0, jnp.asarray(mu0, dtype), jnp.asarray(0), jnp.asarray(0), jnp.asarray(False), jnp.asarray(jnp.inf, dtype), log)
    params, lam, mu, outer, it, conv, viol, log = jax.lax.while_loop(cond, body, init)
    return params, it, conv, log


def _zero_multipliers(setup, segments, dtype):
    n, T = setup.arm.n, setup.T
    return _Multipliers(jnp.zeros((T, 4 * n), dtype), jnp.zeros((T, 2 * n), dtype), jnp.zeros((segments - 1, 2 * n), dtype))


# --------------------------------------------------------------------------- shooting


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
        f = lambda p: fun(p, lam, mu)  # noqa: E731
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
    tol: float = 1e-7,
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
    checkpoint: rematerialize rollout steps in the backward pass (less memory).
    adjoint: gradients by the discrete adjoint (``jaxarm.rollout(..., adjoint=True)``): the same
        gradient, cheaper per iteration for one problem on a CPU when compiled with
        :func:`jaxarm.jit` (README, "Trajectory optimization"); under a plain ``jax.jit`` on a CPU
        it is slower than plain reverse mode (see :func:`jaxarm.rollout`).
    Pure and traceable: ``jax.vmap(lambda p: shooting(arm, p, u0))(problems)`` solves a batch.
    """
    setup, u_init = _setup(arm, problem, u_init, "shooting", torque_limits=torque_limits, input=input, method=method, checkpoint=checkpoint, adjoint=adjoint)
    _check_iterations(max_iterations, al_iterations, "shooting", window=window)
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
        al_iterations=al_iterations, tol_violation=tol_violation, log=log)
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
    tol: float = 1e-7,
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
    setup, u_init = _setup(arm, problem, u_init, "multiple_shooting", torque_limits=torque_limits, input=input, method=method, checkpoint=checkpoint, adjoint=adjoint)
    _check_iterations(max_iterations, al_iterations, "multiple_shooting", window=window)
    if not isinstance(segments, (int, np.integer)) or segments < 1 or setup.T % segments:
        raise ValueError(f"multiple_shooting: segments: expected a positive whole number dividing the horizon T = {setup.T}, got {segments!r}")
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
        al_iterations=al_iterations, tol_violation=tol_violation, log=log)
    _, defects = trajectory((z, starts))
    return _result(setup, z, defects, it, conv, tol_violation, log)


def _default_optimizer():
    # L-BFGS (Nocedal & Wright alg. 7.4) with optax's zoom line search (strong Wolfe conditions). A
    # plain backtracking (Armijo) search compiles in about half the time but stalled on these
    # problems (zero steps after a few iterations), so it is not the default.
    return optax.lbfgs()


def _check_iterations(max_iterations, al_iterations, func, window=1):
    for name, v in (("max_iterations", max_iterations), ("al_iterations", al_iterations), ("window", window)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{func}: {name}: expected a positive whole number, got {v!r}")


# --------------------------------------------------------------------------- iLQR


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
        chol = jax.scipy.linalg.cho_factor(Quu_reg, lower=True)
        ok = ok & jnp.all(jnp.isfinite(chol[0]))
        k = -jax.scipy.linalg.cho_solve(chol, Qu)
        K = -jax.scipy.linalg.cho_solve(chol, Qux)
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
    """
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
                ls_cond, ls_body, (jnp.asarray(0), one, x, z, J, jnp.asarray(False)))
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
        x, z, J, reg, fails, it, done, stop, log = jax.lax.while_loop(cond, body, init)
        return z, it, done, log

    def constraint_values(z):
        g_state, g_input = _constraints(setup, _simulate(setup, z), z)
        return g_state, g_input, jnp.zeros((0, 2 * n), g_state.dtype)

    z0 = setup.from_input(u_init)
    z, it, conv, log = _augmented_lagrangian(
        inner, constraint_values, z0, _zero_multipliers(setup, 1, dtype), mu0=mu, mu_growth=mu_growth, mu_max=1e8,
        al_iterations=al_iterations, tol_violation=tol_violation, log=_empty_log(max_iterations, dtype))
    return _result(setup, z, jnp.zeros((0,), dtype), it, conv, tol_violation, log)
