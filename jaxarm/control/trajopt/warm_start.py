"""Warm starts: damped-least-squares IK and minimum-jerk joint paths."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...dynamics.kinematics import tool_pose
from ...dynamics.newton_euler import inverse_dynamics
from ...model import checks
from ...model.arm import Arm
from ..resolved_rate import resolved_rate
from .problem import ReachProblem, _array


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
