"""Resolved-rate control (jaxarm.resolved_rate): the four solutions' defining properties,
singularity diagnostics near the Puma's wrist singularity, and straight-line tool motion."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
import scipy.linalg

import jaxarm
from jaxarm.resolved_rate import resolved_rate, resolved_rate_motion
from tests.helpers import assert_close, random_arm

PUMA = jaxarm.load_arm("puma560")
Q_GENERIC = np.array([0.3, 0.6, -0.9, 0.4, 0.8, -0.2])
TWIST = np.array([0.1, -0.05, 0.08, 0.2, -0.1, 0.3])


@pytest.mark.parametrize("frame", ["base", "tool"])
def test_exact_solution_reproduces_the_commanded_twist(frame):
    sol = resolved_rate(PUMA, Q_GENERIC, TWIST, frame=frame, method="exact")
    J = np.asarray(jaxarm.jacobian(PUMA, Q_GENERIC, frame=frame))
    assert_close(J @ np.asarray(sol.qd), TWIST, 1e-12, f"J qd ({frame})")
    assert_close(sol.twist, TWIST, 1e-12, "reported twist")
    assert not bool(sol.singular)
    assert float(sol.manipulability) == pytest.approx(np.sqrt(np.linalg.det(J @ J.T)), rel=1e-10)
    assert float(sol.condition) == pytest.approx(np.linalg.cond(J), rel=1e-10)
    # the pseudo-inverse and minimum-norm solutions coincide with it for a square regular J
    for method in ("pseudo_inverse", "minimum_norm", "least_squares"):
        assert_close(resolved_rate(PUMA, Q_GENERIC, TWIST, frame=frame, method=method).qd, sol.qd, 1e-9, method)


def test_least_squares_solves_the_normal_equations_of_a_tall_jacobian():
    arm = random_arm(0, "RRR", "placement", name="rr3")  # 6 rows, 3 joints: over-determined
    q = np.array([0.4, -0.8, 1.1])
    sol = resolved_rate(arm, q, TWIST, method="least_squares")
    J = np.asarray(jaxarm.jacobian(arm, q))
    r = J @ np.asarray(sol.qd) - TWIST
    assert np.abs(J.T @ r).max() < 1e-12 * np.abs(J).max() * np.abs(TWIST).max() * 10  # J^T (J qd - v) = 0
    assert np.linalg.norm(r) > 1e-3  # a generic twist is not reachable: a genuine residual
    assert_close(sol.qd, np.linalg.lstsq(J, TWIST, rcond=None)[0], 1e-10, "vs numpy lstsq")
    assert float(sol.manipulability) == pytest.approx(np.sqrt(np.linalg.det(J.T @ J)), rel=1e-10)
    with pytest.raises(ValueError, match="least_squares' needs at least"):
        resolved_rate(PUMA, Q_GENERIC, TWIST, rows="position", method="least_squares")


def test_minimum_norm_solution_for_position_only_commands():
    """Position rows only: 3 equations, 6 joints. qd = J^T (J J^T)^-1 v solves J qd = v exactly and
    has no component in the null space of J (every other solution is qd + z, |qd + z| > |qd|)."""
    sol = resolved_rate(PUMA, Q_GENERIC, TWIST, rows="position", method="minimum_norm")
    J = np.asarray(jaxarm.jacobian(PUMA, Q_GENERIC))[:3]
    qd = np.asarray(sol.qd)
    assert_close(J @ qd, TWIST[:3], 1e-12, "J qd = v")
    Z = scipy.linalg.null_space(J)
    assert Z.shape == (6, 3)
    assert np.abs(Z.T @ qd).max() < 1e-12 * np.linalg.norm(qd)
    z = Z @ np.array([0.3, -0.2, 0.1])
    assert np.linalg.norm(qd + z) > np.linalg.norm(qd)
    assert_close(qd, np.linalg.pinv(J) @ TWIST[:3], 1e-10, "vs numpy pinv")
    # a (3,) twist for the commanded rows means the same
    assert_close(resolved_rate(PUMA, Q_GENERIC, TWIST[:3], rows=(0, 1, 2), method="minimum_norm").qd, qd, 0, "(3,) twist")


def test_damped_least_squares_stays_bounded_at_the_wrist_singularity():
    """At q5 = 0 the Puma's joint 4 and 6 axes align: J loses rank. The exact solution blows up
    (and the diagnostics flag it); damped least squares obeys |qd| <= |v| / (2 lambda)
    (each singular value s maps to s / (s^2 + lambda^2) <= 1 / (2 lambda))."""
    q = Q_GENERIC.copy()
    q[4] = 1e-7
    lam = 0.05
    exact = resolved_rate(PUMA, q, TWIST, method="exact")
    damped = resolved_rate(PUMA, q, TWIST, method="damped", damping=lam)
    assert bool(exact.singular) and bool(damped.singular)
    assert float(exact.condition) > 1e5 and float(exact.manipulability) < 1e-6
    assert np.linalg.norm(exact.qd) > 1e4 * np.linalg.norm(TWIST)
    assert np.linalg.norm(damped.qd) <= np.linalg.norm(TWIST) / (2 * lam)
    # away from the singularity damping -> 0 recovers the exact solution
    small = resolved_rate(PUMA, Q_GENERIC, TWIST, method="damped", damping=1e-7)
    assert_close(small.qd, resolved_rate(PUMA, Q_GENERIC, TWIST).qd, 1e-9, "lambda -> 0")


def test_constant_tool_velocity_moves_the_tool_along_a_straight_line():
    """A constant tool-frame linear velocity with zero angular velocity keeps the tool's orientation,
    so the world velocity is constant: p(t) = p0 + R0 v t. The integration error shrinks with dt,
    at first order for held rates (Euler) and third order for RK3."""
    v = np.array([-0.05, 0.03, -0.04])  # keeps the condition number below 20 over the path
    twist = np.concatenate([v, np.zeros(3)])
    q0 = Q_GENERIC
    T0 = np.asarray(jaxarm.tool_pose(PUMA, q0))
    duration, block = 1.0, 10

    @functools.partial(jax.jit, static_argnames="integrator")
    def run(q, dt, t0, integrator):  # one compiled block of 10 steps, chained: dt varies, shapes do not
        return resolved_rate_motion(PUMA, q, lambda t, q: twist, dt, steps=block, integrator=integrator, t0=t0)

    errs = {"euler": [], "rk3": []}
    for integrator in errs:
        for blocks in (2, 4, 8):
            dt = duration / (blocks * block)
            q = q0
            for b in range(blocks):
                m = run(q, dt, b * block * dt, integrator)
                assert not np.any(np.asarray(m.singular))
                q = m.q[-1]
            T1 = np.asarray(jaxarm.tool_pose(PUMA, q))
            errs[integrator].append(np.linalg.norm(T1[:3, 3] - (T0[:3, 3] + T0[:3, :3] @ v * duration)))
            assert_close(T1[:3, :3], T0[:3, :3], 10 * errs[integrator][-1] + 1e-12, "orientation kept")
    e1, e3 = np.array(errs["euler"]), np.array(errs["rk3"])
    assert np.all(np.log2(e1[:-1] / e1[1:]) > 0.9), e1
    assert np.all(np.log2(e3[:-1] / e3[1:]) > 2.7), e3
    assert e3[-1] < 1e-6
    # a (T, 6) schedule in the tool frame gives the same motion as the constant function
    m_sched = resolved_rate_motion(PUMA, q0, np.tile(twist, (block, 1)), 0.01)
    assert_close(m_sched.q, run(q0, 0.01, 0.0, "euler").q, 1e-12, "schedule vs function")


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="'exact' needs a square"):
        resolved_rate(PUMA, Q_GENERIC, TWIST, rows="position")
    with pytest.raises(ValueError, match="twist: expected shape"):
        resolved_rate(PUMA, Q_GENERIC, TWIST[:4])
    with pytest.raises(ValueError, match="rows: expected"):
        resolved_rate(PUMA, Q_GENERIC, TWIST, rows=(0, 0, 7))
    with pytest.raises(ValueError, match="damping"):
        resolved_rate(PUMA, Q_GENERIC, TWIST, method="damped", damping=0.0)
    with pytest.raises(ValueError, match="method: expected"):
        resolved_rate(PUMA, Q_GENERIC, TWIST, method="svd")
    with pytest.raises(ValueError, match="integrator: expected"):
        resolved_rate_motion(PUMA, Q_GENERIC, np.tile(TWIST, (3, 1)), 0.01, integrator="midpoint")
    with pytest.raises(ValueError, match="steps: required"):
        resolved_rate_motion(PUMA, Q_GENERIC, lambda t, q: TWIST, 0.01)
