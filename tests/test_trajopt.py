"""Trajectory optimization: gradients against finite differences, iLQR against the closed-form
solution of a linear-quadratic problem, shooting (augmented Lagrangian and squashed) against iLQR
on a two-link reach with active torque limits, and a batched solve against per-problem solves.
(multiple_shooting has no test here: its compile alone cost more than this file's time budget.)

Kept cheap for CI: one problem shape (two links, T = 20 steps), each solver configuration compiled
once per module (``_jitted``) and shared through a module-scoped fixture; the batched test reuses the
single-problem shooting solver for its per-problem reference solves.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm import trajopt

from helpers import assert_close

TORQUE_LIMITS = np.array([20.0, 8.0])  # joint 1's limit is active in the reach below (unlimited it needs ~23 N m)
T, DT = 20, 0.05


@functools.lru_cache(maxsize=None)
def _jitted(name, **options):
    solver = {"shooting": trajopt.shooting, "multiple_shooting": trajopt.multiple_shooting, "ilqr": trajopt.ilqr}[name]
    return jax.jit(functools.partial(solver, **options))


def two_link(payload=0.0):
    arm = jaxarm.load_arm("two_link_planar")  # Craig 6.7, gravity along -y, in the x-y plane
    limits = dataclasses.replace(arm.limits, torque=TORQUE_LIMITS, velocity=np.array([10.0, 10.0]),
                                 position=np.array([[-np.pi, np.pi], [-np.pi, np.pi]]))
    arm = arm.replace(limits=limits)
    return arm.with_payload(payload) if payload else arm


def reach(arm, offset=(0.3, 0.3, 0.0), position=300.0, velocity=3.0, **weights):
    """Reach in T * DT = 1 s; both torque limits end up active. Moderate terminal weights keep the
    problem well enough conditioned for L-BFGS to finish in a few hundred iterations."""
    q0 = jnp.array([-1.2, 0.8])
    target = jaxarm.tool_pose(arm, q0)[:3, 3] + jnp.asarray(offset)
    return trajopt.reach_problem(arm, q0, target, DT, position=position, velocity=velocity, **weights)


def hold_start(arm, problem):
    return jnp.tile(jaxarm.gravity_torques(arm, problem.q0), (T, 1))


SHOOTING_AL = dict(torque_limits="augmented_lagrangian")
SHOOTING_SQUASH = dict(torque_limits="squash", max_iterations=2000)


@pytest.fixture(scope="module")
def solutions():
    arm = two_link()
    problem = reach(arm)
    u0 = hold_start(arm, problem)
    return arm, problem, {
        "ilqr": _jitted("ilqr")(arm, problem, u0),
        "shooting": _jitted("shooting", **SHOOTING_AL)(arm, problem, u0),
        "shooting_squash": _jitted("shooting", **SHOOTING_SQUASH)(arm, problem, u0),
    }


# --------------------------------------------------------------------------- gradients


def test_cost_gradient_matches_finite_differences():
    """d J / d u through an RK3 rollout (every cost term switched on) vs central differences."""
    arm = two_link()
    problem = reach(arm, orientation=3.0, velocity=5.0, smoothness=1e-3, path_position=2.0)
    steps = 8
    u = hold_start(arm, problem)[:steps] + jnp.asarray(np.random.default_rng(0).normal(0, 2.0, (steps, 2)))

    def cost(u):
        traj = jaxarm.rollout(arm, problem.q0, problem.qd0, u, DT, saturate=False, on_divergence="flag")
        return trajopt.trajectory_cost(arm, problem, traj.q, traj.qd, u)

    value_and_grad = jax.jit(jax.value_and_grad(cost))  # one compile, reused for the differences
    f = lambda u: value_and_grad(u)[0]  # noqa: E731
    _, g = value_and_grad(u)
    rng = np.random.default_rng(1)
    h = 1e-5
    for _ in range(4):
        d = jnp.asarray(rng.normal(size=u.shape))
        fd = (f(u + h * d) - f(u - h * d)) / (2 * h)
        exact = jnp.sum(g * d)
        assert abs(float(fd - exact)) <= 1e-6 * max(1.0, abs(float(exact))), (float(fd), float(exact))


# --------------------------------------------------------------------------- iLQR on an LQ problem


def cartesian_arm(m1=3.0, m2=1.5):
    """Two perpendicular prismatic joints (standard DH, alpha1 = 90 deg): M = diag(m1 + m2, m2),
    constant; gravity -z loads joint 1 only; the tool position is affine in q."""
    return jaxarm.make_arm(
        "PP", convention="standard", a=[0.3, 0.0], alpha=[np.pi / 2, 0.0], d=[0.1, 0.2], theta=[0.0, 0.0],
        mass=[m1, m2], com=np.zeros((2, 3)), inertia=np.stack([0.01 * np.eye(3)] * 2),
    )


def closed_form_lq(problem, p0, J, m_total, m2, g, steps):
    """Minimize the (quadratic) reach cost of a double integrator qdd = M^-1 (u - G) by one linear
    solve over the stacked inputs U (2T,). RK3 is exact for a constant acceleration over a step:
    q+ = q + dt qd + dt^2/2 a, qd+ = qd + dt a."""
    dt = float(problem.dt)
    Minv = np.diag([1.0 / m_total, 1.0 / m2])
    G = np.array([m_total * g, 0.0])
    N = 2 * steps
    # x_k = c_k + S_k U, x = (q, qd)
    c, S = np.concatenate([np.asarray(problem.q0), np.asarray(problem.qd0)]), np.zeros((4, N))
    cs, Ss = [c], [S]
    for k in range(steps):
        Ak = np.block([[np.eye(2), dt * np.eye(2)], [np.zeros((2, 2)), np.eye(2)]])
        Bk = np.vstack([0.5 * dt * dt * Minv, dt * Minv])
        E = np.zeros((2, N))
        E[:, 2 * k:2 * k + 2] = np.eye(2)
        c, S = Ak @ c - Bk @ G, Ak @ S + Bk @ E
        cs.append(c)
        Ss.append(S)
    target = np.asarray(problem.target)
    # J(U) = sum of squared residuals r = a + C U, weighted
    rows, offs = [], []

    def add(weight, C, a):
        rows.append(np.sqrt(weight) * C)
        offs.append(np.sqrt(weight) * a)

    w = np.asarray(problem.effort)
    for k in range(steps):
        E = np.zeros((2, N))
        E[:, 2 * k:2 * k + 2] = np.eye(2)
        add(dt, np.sqrt(w)[:, None] * E, np.zeros(2))
        add(float(problem.path_position) * dt, J @ Ss[k][:2], p0 + J @ cs[k][:2] - target)
        if k > 0:
            D = np.zeros((2, N))
            D[:, 2 * k:2 * k + 2], D[:, 2 * k - 2:2 * k] = np.eye(2), -np.eye(2)
            add(float(problem.smoothness) / dt, D, np.zeros(2))
    add(float(problem.position), J @ Ss[-1][:2], p0 + J @ cs[-1][:2] - target)
    add(float(problem.velocity), Ss[-1][2:], cs[-1][2:])
    C, a = np.vstack(rows), np.concatenate(offs)
    U, *_ = np.linalg.lstsq(C, -a, rcond=None)
    return U.reshape(steps, 2), float(np.sum((a + C @ U) ** 2))


def test_ilqr_solves_a_linear_quadratic_problem_in_one_iteration():
    m1, m2, g = 3.0, 1.5, 9.81
    arm = cartesian_arm(m1, m2)
    assert_close(jaxarm.mass_matrix(arm, jnp.array([0.3, -0.2])), np.diag([m1 + m2, m2]), 1e-12, "constant M")
    assert_close(jaxarm.gravity_torques(arm, jnp.zeros(2)), [(m1 + m2) * g, 0.0], 1e-12, "gravity load")
    p0 = np.asarray(jaxarm.tool_pose(arm, jnp.zeros(2))[:3, 3])
    J = np.array([[0.0, 0.0], [0.0, -1.0], [1.0, 0.0]])  # joint 1 along z0, joint 2 along z1 = -y0
    q = jnp.array([0.4, -0.7])
    assert_close(jaxarm.tool_pose(arm, q)[:3, 3], p0 + J @ np.asarray(q), 1e-12, "affine tool position")
    steps = 12
    problem = trajopt.reach_problem(arm, jnp.array([0.1, 0.0]), p0 + np.array([0.0, -0.2, 0.3]), 0.05,
                                    position=50.0, velocity=3.0, smoothness=1e-3, path_position=0.5)
    u0 = jnp.zeros((steps, 2))
    res = _jitted("ilqr", regularization=0.0)(arm, problem, u0)
    U, J_star = closed_form_lq(problem, p0, J, m1 + m2, m2, g, steps)
    assert float(res.history.alpha[0]) == 1.0  # the full Newton step is taken...
    assert_close(res.history.cost[0], J_star, 1e-9, "cost after one iteration")  # ...and is optimal
    assert_close(res.u, U, 1e-7, "optimal inputs")
    assert_close(res.cost, J_star, 1e-9, "final cost")
    assert bool(res.converged) and int(res.iterations) <= 2


# --------------------------------------------------------------------------- reach: solvers agree


def test_ilqr_converges_and_reports_each_iteration(solutions):
    arm, problem, sol = solutions
    res = sol["ilqr"]
    k = int(res.iterations)
    assert bool(res.converged) and k < 50
    h = res.history
    accepted = np.asarray(h.alpha[:k]) > 0
    assert accepted.any() and np.all(np.asarray(h.rel_change[:k])[accepted] > 0)  # accepted steps decrease the objective
    assert abs(float(h.rel_change[k - 1])) < 1e-6  # the stopping rule
    assert np.all(np.isnan(np.asarray(h.cost[k:])))
    assert np.all(np.isfinite(np.asarray(h.regularization[:k])))


def test_ilqr_and_shooting_reach_the_same_optimum(solutions):
    """Same constraint handling (augmented Lagrangian on the torque limits) -> same optimum."""
    arm, problem, sol = solutions
    a, b = sol["ilqr"], sol["shooting"]
    assert bool(a.converged) and bool(b.converged)
    # stated tolerance: both satisfy the limits to tol_violation = 1e-4 of the limit, so costs agree
    # to about that relatively; torques within 2 % of their scale
    assert abs(float(a.cost) - float(b.cost)) <= 1e-4 * float(a.cost), (float(a.cost), float(b.cost))
    assert_close(a.u / TORQUE_LIMITS, b.u / TORQUE_LIMITS, 2e-2, "optimal torques / limit")
    tool = [jaxarm.tool_pose(arm, res.q[-1])[:3, 3] for res in (a, b)]
    assert float(jnp.linalg.norm(tool[0] - problem.target)) < 5e-3  # soft terminal cost (weight 300 / m^2)
    assert float(jnp.linalg.norm(tool[0] - tool[1])) < 1e-4


def test_squashed_shooting_stops_on_the_plateau_rule(solutions):
    """u = u_max tanh z never reaches an active limit (z -> inf), so the gradient never vanishes;
    the windowed relative-cost rule (default tol 1e-7 over 10 iterations) must stop it, close to the
    augmented-Lagrangian optimum and strictly inside the limits."""
    arm, problem, sol = solutions
    res, best = sol["shooting_squash"], float(sol["ilqr"].cost)
    k = int(res.iterations)
    assert bool(res.converged) and k < SHOOTING_SQUASH["max_iterations"]
    c = np.asarray(res.history.cost)
    assert c[k - 1 - 10] - c[k - 1] <= 1e-7 * abs(c[k - 1 - 10])  # the rule that stopped it
    assert c[k - 1 - 20] - c[k - 1] > 1e-7 * abs(c[k - 1 - 20])  # ...and not long before
    assert 0.0 <= float(res.cost) - best <= 1e-3 * best, (float(res.cost), best)


def test_limits_respected(solutions):
    """Squashing keeps the torques strictly inside the limits; the augmented Lagrangian (iLQR and
    shooting) reaches them to within tol_violation (1e-4 of the limit)."""
    arm, problem, sol = solutions
    for name, res in sol.items():
        frac = np.abs(np.asarray(res.u)) / TORQUE_LIMITS
        slack = 0.0 if name == "shooting_squash" else 1e-4
        assert frac.max() <= 1.0 + slack, name
        assert frac[:, 0].max() > 0.95, f"{name}: the torque limit should be active in this test"
        assert 0.0 <= float(res.max_violation) <= slack, name
        assert np.all(np.abs(np.asarray(res.qd)) <= 10.0)


# --------------------------------------------------------------------------- batched


def test_batched_solve_equals_per_problem_solves(solutions):
    """One vmap over arms (different payloads, via stack_arms) and goals; the per-problem reference
    solves reuse the fixture's compiled solver."""
    arms = [two_link(payload) for payload in (0.0, 0.4)]
    problems = [reach(a, offset) for a, offset in zip(arms, [(0.3, 0.3, 0.0), (0.2, 0.35, 0.0)])]
    u0 = hold_start(arms[0], problems[0])
    stacked_arm = jaxarm.stack_arms(arms)
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *problems)
    solve = functools.partial(trajopt.shooting, **SHOOTING_AL)
    batch = jax.jit(jax.vmap(solve, in_axes=(0, 0, None)))(stacked_arm, stacked, u0)
    costs = []
    for i, (arm, problem) in enumerate(zip(arms, problems)):
        one = _jitted("shooting", **SHOOTING_AL)(arm, problem, u0)
        assert bool(batch.converged[i]) and bool(one.converged)
        # batched reductions round differently, so the two runs stop at different iterations: they
        # agree to the stopping tolerance, not bitwise
        assert_close(batch.cost[i], one.cost, 1e-4, f"problem {i} cost")  # AL: limits met to tol_violation 1e-4
        assert_close(batch.u[i] / TORQUE_LIMITS, one.u / TORQUE_LIMITS, 1e-2, f"problem {i} inputs / limit")
        costs.append(float(one.cost))
    assert abs(costs[0] - costs[1]) > 1e-3 * costs[0]  # the two problems really differ


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_reported_before_tracing():
    arm = two_link()
    problem = reach(arm)
    u0 = hold_start(arm, problem)
    with pytest.raises(ValueError, match="u_init: expected an input schedule of shape"):
        trajopt.shooting(arm, problem, u0[:, :1])
    with pytest.raises(ValueError, match="torque_limits"):
        trajopt.ilqr(arm, problem, u0, torque_limits="clip")
    with pytest.raises(ValueError, match="segments"):
        trajopt.multiple_shooting(arm, problem, u0, segments=7)
    with pytest.raises(TypeError, match="problem"):
        trajopt.ilqr(arm, {"q0": problem.q0}, u0)
    with pytest.raises(ValueError, match="target"):
        trajopt.reach_problem(arm, problem.q0, [0.0, 1.0], DT)
    with pytest.raises(ValueError, match="u_init: expected finite"):
        trajopt.ilqr(arm, problem, u0.at[3, 1].set(jnp.nan))
