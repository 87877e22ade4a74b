"""The objective: stage and terminal costs, constraints, and the augmented Lagrangian (Nocedal & Wright 2006, section 17.4)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...core import tracers
from ...dynamics.kinematics import tool_pose
from ...model import checks
from ...model.arm import Arm
from ...simulate.rollouts import rollout
from .problem import IterationLog, ReachProblem, TrajoptResult, _Multipliers
from .solvers.knots import _al_parts


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
    """Augmented-Lagrangian term of g <= 0 (Nocedal & Wright eq 17.65), summed."""
    return jnp.sum(_al_parts(g, True, False, lam, mu)[0])


def _al_equality(h, lam, mu):
    """Augmented-Lagrangian term of h = 0 (Nocedal & Wright eq 17.36), summed."""
    return jnp.sum(_al_parts(h, True, True, lam, mu)[0])


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


def _augmented_lagrangian(inner, constraint_values, params, lam0, *, mu0, mu_growth, mu_max, al_iterations, tol_violation, log,
                          reads=()):
    """Outer loop: solve the inner problem at fixed (lam, mu), then lam <- max(0, lam + mu g) for
    inequalities, lam <- lam + mu h for equalities (Nocedal & Wright eq 17.39), mu <- growth mu
    while the violation is above tolerance.

    inner(params, lam, mu, it, log) -> (params, it, converged, log);
    constraint_values(params) -> (g_state, g_input, h_defect); reads: what ``inner`` reads (the arm, the
    problem), so that under ``jax.vmap`` each loop is batched once (:func:`jaxarm.core.tracers.batched_with`)."""

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
    params, lam, mu, outer, it, conv, viol, log = jax.lax.while_loop(cond, body, tracers.batched_with(init, reads))
    return params, it, conv, log


def _zero_multipliers(setup, segments, dtype):
    n, T = setup.arm.n, setup.T
    return _Multipliers(jnp.zeros((T, 4 * n), dtype), jnp.zeros((T, 2 * n), dtype), jnp.zeros((segments - 1, 2 * n), dtype))
