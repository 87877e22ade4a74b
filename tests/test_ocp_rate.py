"""The input-rate (smoothness) term of trajopt (terms.input_rate): consecutive inputs coupled, which
DDP handles by carrying the previous input in its state. Checked against the exact minimizer of a
linear-quadratic problem (normal equations over all inputs at once), the first-order optimality of
the nonlinear two-link reach (the gradient of the total cost through a rollout vanishes on the free
inputs), second-order DDP, and gradients of the solution against finite differences."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_differences
from test_ocp import DT, Q0, T, TORQUE_LIMITS, reach_ocp, two_link

import jaxarm
from jaxarm import trajopt
from jaxarm.trajopt import terms

from numpy.testing import assert_allclose as assert_close


@pytest.fixture(scope="module")
def solve():
    return jaxarm.jit(trajopt.ddp)


def test_linear_quadratic_problem_with_an_input_rate_is_solved_exactly(solve):
    arm = jaxarm.make_arm(["P"], mass=[2.0], gravity=(0.0, 0.0, 0.0))
    wq, wu, wr, wf, u_prev = 3.0, 0.2, 0.05, 40.0, 1.5
    costs = (terms.joint_position(0.0, wq, when="path") + terms.effort(wu) + terms.input_rate(wr, previous=[u_prev])
             + terms.joint_position(0.0, wf) + terms.joint_velocity(wf))
    problem = trajopt.ocp(arm, [0.5], T, DT, qd0=[0.3], costs=costs)
    res = solve(problem, jnp.zeros((T, 1)))
    assert bool(res.converged), res.reason()
    assert int(res.iterations) <= 2
    # the exact minimizer: x_k = Phi_k x0 + sum_j Gamma_kj u_j, the cost a quadratic in u (T,)
    lin = jaxarm.linearize_trajectory(arm, res.q[:-1], res.qd[:-1], res.u, DT)
    A, B = np.asarray(lin.A[0]), np.asarray(lin.B[0])[:, 0]
    x0 = np.array([0.5, 0.3])
    Phi = [np.linalg.matrix_power(A, k) for k in range(T + 1)]
    Gam = np.zeros((T + 1, 2, T))
    for k in range(1, T + 1):
        for j in range(k):
            Gam[k, :, j] = Phi[k - 1 - j] @ B
    rows, rhs = [], []  # least squares: sqrt(w) (row . u - target)

    def add(w, row, target):
        rows.append(np.sqrt(w) * row)
        rhs.append(np.sqrt(w) * target)

    for k in range(T):
        add(wq * DT, Gam[k, 0], -(Phi[k] @ x0)[0])
        add(wu * DT, np.eye(T)[k], 0.0)
        d = np.eye(T)[k] - (np.eye(T)[k - 1] if k else 0.0)
        add(wr / DT, d, u_prev if k == 0 else 0.0)
    for i in range(2):
        add(wf, Gam[T, i], -(Phi[T] @ x0)[i])
    u = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0]
    assert_close(np.asarray(res.u)[:, 0], u, atol=1e-9, rtol=1e-8)
    J = np.sum((np.array(rows) @ u - np.array(rhs)) ** 2)
    assert float(res.cost) == pytest.approx(J, rel=1e-10)
    assert float(trajopt.total_cost(problem, res.x, res.u)) == pytest.approx(J, rel=1e-10)


@pytest.fixture(scope="module")
def rate_reach(solve):
    arm = two_link()
    base, goal = reach_ocp(arm)
    smooth = trajopt.ocp(arm, Q0, T, DT, costs=list(base.costs) + [terms.input_rate(1e-2 / TORQUE_LIMITS**2)],
                         params={"goal": goal})
    tight = jaxarm.jit(functools.partial(trajopt.ddp, tol=1e-12))
    return arm, base, smooth, tight(base), tight(smooth)


def test_the_input_rate_smooths_the_optimal_inputs_at_a_stationary_point(rate_reach):
    arm, base, smooth, free, res = rate_reach
    assert bool(res.converged) and bool(free.converged), res.reason()
    rough = lambda u: float(jnp.sum(jnp.diff(u, axis=0) ** 2))  # noqa: E731
    assert rough(res.u) < 0.5 * rough(free.u), (rough(res.u), rough(free.u))
    # first-order optimality: the gradient of the total cost through a rollout vanishes on the free inputs
    def J(u):
        traj = jaxarm.rollout(arm, Q0, jnp.zeros(2), u, DT, saturate=False)
        return trajopt.total_cost(smooth, jnp.concatenate([traj.q, traj.qd], axis=1), u)

    g = np.asarray(jax.grad(J)(res.u))
    free_inputs = np.abs(np.asarray(res.u)) < TORQUE_LIMITS - 1e-9
    assert free_inputs.sum() > 0.6 * g.size
    # (1e-2 at the solution without the rate term; 5e-4 at the default tol = 1e-6)
    assert np.max(np.abs(g[free_inputs])) < 1e-6, np.max(np.abs(g[free_inputs]))
    assert float(J(res.u)) == pytest.approx(float(res.cost), rel=1e-12)


def test_second_order_ddp_with_an_input_rate_finds_the_same_optimum(rate_reach):
    arm, base, smooth, free, res = rate_reach
    second = jaxarm.jit(functools.partial(trajopt.ddp, second_order=True, tol=1e-12))(smooth)
    assert bool(second.converged), second.reason()
    assert float(second.cost) == pytest.approx(float(res.cost), rel=1e-10)
    assert_close(second.u, res.u, atol=1e-5 * TORQUE_LIMITS.max())


def test_input_rate_terms_are_checked():
    arm = two_link()
    with pytest.raises(ValueError, match="more than one input_rate term"):
        trajopt.ocp(arm, Q0, T, DT, costs=terms.input_rate(1.0) + terms.input_rate(2.0))
    with pytest.raises(ValueError, match=r"previous: expected a number or shape \(2,\)"):
        trajopt.ocp(arm, Q0, T, DT, costs=terms.input_rate(1.0, previous=[1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="non-negative weights"):
        terms.input_rate(-1.0)


def test_gradients_of_a_solution_with_an_input_rate_match_finite_differences(rate_reach):
    """Implicit gradients (the rate's Hessian in the reduced system, its data in the right-hand
    side) with respect to the rate's weight and previous input (params entries), the goal, dt and
    the torque bound, against central differences of tightly converged solves."""
    arm, base, _, _, _ = rate_reach
    goal = base.params["goal"]
    problem = trajopt.ocp(arm, Q0, T, DT, costs=list(base.costs) + [terms.input_rate("w_rate", previous="u_prev")],
                          params={"goal": goal, "w_rate": jnp.asarray(1e-2 / TORQUE_LIMITS**2), "u_prev": jnp.array([3.0, 1.0])})
    weights = jnp.arange(T * 2, dtype=float).reshape(T, 2) / T

    def loss(p):
        r = trajopt.ddp(p, tol=1e-13, max_iterations=300)
        return jnp.sum(weights * r.u) + 10.0 * jnp.sum(r.x[-5:, :2] ** 2) + r.cost, r

    value = jaxarm.jit(loss)
    _, res = value(problem)
    assert bool(res.converged), res.reason()
    clamped = np.asarray((res.u == problem.lower) | (res.u == problem.upper))
    assert clamped.any() and not clamped.all()
    grad = jaxarm.jit(jax.grad(lambda p: loss(p)[0]))(problem)


    def with_param(name):
        return lambda p, v: p.replace(params={**p.params, name: jnp.asarray(v)})

    cases = [
        ("w_rate", lambda p: p.params["w_rate"], with_param("w_rate"), grad.params["w_rate"], 1e-7),
        ("u_prev", lambda p: p.params["u_prev"], with_param("u_prev"), grad.params["u_prev"], 1e-5),
        ("goal", lambda p: p.params["goal"][:2], lambda p, v: with_param("goal")(p, jnp.concatenate([v, p.params["goal"][2:]])),
         grad.params["goal"][:2], 1e-5),
        ("dt", lambda p: p.dt, lambda p, v: p.replace(dt=jnp.asarray(v)), grad.dt, 1e-6),
        ("upper", lambda p: p.upper, lambda p, v: p.replace(upper=jnp.asarray(v)), grad.upper, 1e-5),
    ]
    for name, get, put, g, h in cases:
        fd = central_differences(value, problem, get, put, h)
        g = np.asarray(g)
        assert np.max(np.abs(g - fd)) <= 1e-4 * max(np.max(np.abs(fd)), 1.0), (name, g, fd)
    assert np.max(np.abs(np.asarray(grad.params["u_prev"]))) > 0.01  # the first input is tied to it
