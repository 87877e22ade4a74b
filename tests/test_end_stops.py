"""End stops at the joints' position limits in jaxarm.rollout (jaxarm.simulate.rollouts.end_stops).

The stop model is a rigid, perfectly plastic stop applied after each step: the joint is put back on
its limit and its velocity into the stop is removed. The checks: a pendulum falling onto its stop
rests there with zero velocity (and leaves it when pulled back); until the first contact the run is
the free run, bit for bit; no state ever leaves the limits; infinite limits change nothing; the
count of steps on a stop matches the trajectory; a start outside the limits is refused; the stops
work with a traced arm under jit and vmap.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from tests.helpers_sim import pendulum, sim_arm


def with_position_limits(arm, limits):
    return arm.replace(limits=dataclasses.replace(arm.limits, position=np.asarray(limits, dtype=float)))


def test_a_pendulum_falls_onto_its_stop_and_rests_there():
    # The pendulum's COM is level at q = 0 and gravity turns it towards +q (axis y, COM along x).
    arm = with_position_limits(pendulum(viscous=0.0), [[-1.0, 0.5]])
    dt, T = 1e-3, 1500
    free = jaxarm.rollout(arm, [0.0], [0.0], np.zeros((T, 1)), dt, stops=False)
    stopped = jaxarm.rollout(arm, [0.0], [0.0], np.zeros((T, 1)), dt)
    q_free, q = np.asarray(free.q[:, 0]), np.asarray(stopped.q[:, 0])
    first = int(np.argmax(q_free > 0.5))  # the free pendulum passes the limit at this knot
    assert 10 < first < T and q_free.max() > 1.0  # the free run goes well past the stop
    np.testing.assert_array_equal(q[:first], q_free[:first])  # untouched before the contact
    assert q.max() <= 0.5 and q[first] == 0.5
    # From the contact on it rests on the stop: gravity keeps pushing, the stop keeps the joint.
    np.testing.assert_array_equal(q[first:], 0.5)
    np.testing.assert_array_equal(np.asarray(stopped.qd[first:, 0]), 0.0)
    assert int(stopped.stop_steps[0]) == T - first + 1
    assert int(free.stop_steps[0]) == 0


def test_a_joint_leaves_its_stop_when_pulled_back():
    arm = with_position_limits(pendulum(viscous=0.0), [[-1.0, 0.5]])
    dt, T = 1e-3, 800
    # The torque that holds the pendulum at rest at q = 0.5 is negative: gravity pushes it into the stop.
    g = -float(jaxarm.inverse_dynamics(arm, jnp.array([0.5]), jnp.zeros(1), jnp.zeros(1))[0])
    assert g > 0.1
    # Rest on the stop for 300 steps, then a torque larger than gravity pulls it away.
    tau = np.where(np.arange(T)[:, None] < 300, 0.0, -2.0 * g)
    traj = jaxarm.rollout(arm, [0.5], [0.0], tau, dt)
    q, qd = np.asarray(traj.q[:, 0]), np.asarray(traj.qd[:, 0])
    np.testing.assert_array_equal(q[:301], 0.5)
    assert q[320] < 0.5 and qd[320] < 0  # off the stop, moving away
    assert q[-1] == -1.0 and qd[-1] == 0.0  # and then held by the lower stop
    np.testing.assert_array_equal(int(traj.stop_steps[0]), np.sum((q[1:] == 0.5) | (q[1:] == -1.0)))


def test_no_state_leaves_the_limits_and_the_count_matches_the_trajectory():
    arm = sim_arm(3)
    limits = [[-0.4, 0.5], [-np.inf, np.inf], [-0.3, 0.2]]
    arm = with_position_limits(arm, limits)
    rng = np.random.default_rng(2)
    T = 600
    tau = 3.0 * rng.normal(size=(T, 3))
    traj = jaxarm.rollout(arm, [0.0, 0.1, 0.0], [2.0, 0.0, -1.5], tau, 2e-3)
    free = jaxarm.rollout(arm, [0.0, 0.1, 0.0], [2.0, 0.0, -1.5], tau, 2e-3, stops=False)
    q, lo, hi = np.asarray(traj.q), np.asarray(limits)[:, 0], np.asarray(limits)[:, 1]
    assert np.all(q >= lo) and np.all(q <= hi)
    free_q = np.asarray(free.q)
    outside = (free_q < lo) | (free_q > hi)
    assert outside[:, 0].any() and outside[:, 2].any()  # the stops had work to do
    on_stop = (q[1:] == lo) | (q[1:] == hi)
    np.testing.assert_array_equal(np.asarray(traj.stop_steps), on_stop.sum(axis=0))
    assert traj.stop_steps[1] == 0 and traj.stop_steps[0] > 0 and traj.stop_steps[2] > 0
    assert np.all(np.isfinite(np.asarray(traj.qd)))


def test_infinite_limits_change_nothing():
    arm = sim_arm(1)
    assert not np.any(np.isfinite(np.asarray(arm.limits.position)))
    tau = np.random.default_rng(0).normal(size=(200, 3))
    a = jaxarm.rollout(arm, [0.1, 0.2, 0.3], [1.0, -1.0, 0.5], tau, 1e-2)
    b = jaxarm.rollout(arm, [0.1, 0.2, 0.3], [1.0, -1.0, 0.5], tau, 1e-2, stops=False)
    np.testing.assert_array_equal(np.asarray(a.q), np.asarray(b.q))
    np.testing.assert_array_equal(np.asarray(a.stop_steps), 0)


def test_a_traced_arm_under_jit_and_vmap_gets_the_same_stops():
    arm = with_position_limits(pendulum(viscous=0.0), [[-1.0, 0.5]])
    tau = np.zeros((700, 1))
    direct = jaxarm.rollout(arm, [0.0], [0.0], tau, 1e-3)
    jitted = jax.jit(lambda a: jaxarm.rollout(a, jnp.zeros(1), jnp.zeros(1), tau, 1e-3))(arm)
    np.testing.assert_allclose(np.asarray(jitted.q), np.asarray(direct.q), rtol=0, atol=1e-14)
    assert int(jitted.stop_steps[0]) == int(direct.stop_steps[0]) > 0
    # vmap over the upper limit: each element stops at its own limit.
    uppers = jnp.array([0.2, 0.5, 0.9])

    def run(upper):
        a = arm.replace(limits=dataclasses.replace(arm.limits, position=jnp.array([[-1.0, 1.0]]) * jnp.array([1.0, 0.0]) + jnp.array([0.0, 1.0]) * upper))
        return jaxarm.rollout(a, jnp.zeros(1), jnp.zeros(1), tau, 1e-3).q[:, 0].max()

    np.testing.assert_allclose(np.asarray(jax.vmap(run)(uppers)), np.asarray(uppers), rtol=0, atol=1e-15)


def test_a_start_outside_the_limits_is_refused():
    arm = with_position_limits(sim_arm(0), [[-0.4, 0.5], [-1.0, 1.0], [-0.3, 0.2]])
    with pytest.raises(ValueError, match=r"q0\[2\] = 0\.25 is outside joint 3's position limits \[-0\.3, 0\.2\].*stops=False"):
        jaxarm.rollout(arm, [0.0, 0.0, 0.25], np.zeros(3), np.zeros((5, 3)), 1e-2)
    jaxarm.rollout(arm, [0.0, 0.0, 0.25], np.zeros(3), np.zeros((5, 3)), 1e-2, stops=False)  # allowed without stops
    with pytest.raises(ValueError, match="stops: expected True or False"):
        jaxarm.rollout(arm, np.zeros(3), np.zeros(3), np.zeros((5, 3)), 1e-2, stops="yes")
