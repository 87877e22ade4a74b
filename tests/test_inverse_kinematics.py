"""Inverse kinematics: exact against the two-link closed form, round trips on real arms (pose and
position, with and without a starting guess), joint limits, batching, and clear errors."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm.control.inverse_kinematics import rotation_vector


def _inside(arm, k, rng, shrink=0.9):
    lo, hi = np.asarray(arm.limits.position).T
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    return rng.uniform(mid - shrink * half, mid + shrink * half, (k, arm.n))


def test_two_link_matches_the_closed_form():
    """Craig, Introduction to Robotics, ch. 4: for a planar 2R arm with link lengths l1, l2, cos q2 = (x^2 + y^2 - l1^2 - l2^2)
    / (2 l1 l2); from a start on the elbow-down side the solver finds that branch."""
    arm = jaxarm.load_arm("two_link_planar")
    l1, l2 = float(arm.kinematics.a[1]), float(np.asarray(arm.tool)[0, 3])  # modified DH: a_1, then the tool
    rng = np.random.default_rng(3)
    for _ in range(5):
        q_true = np.array([rng.uniform(-1.0, 1.0), rng.uniform(0.3, 2.0)])
        p = np.asarray(jaxarm.tool_pose(arm, q_true))[:3, 3]
        c2 = (p[0] ** 2 + p[1] ** 2 - l1**2 - l2**2) / (2 * l1 * l2)
        q2 = np.arccos(c2)
        q1 = np.arctan2(p[1], p[0]) - np.arctan2(l2 * np.sin(q2), l1 + l2 * np.cos(q2))
        r = jaxarm.inverse_kinematics(arm, p, q_true + 0.2)
        assert bool(r.converged) and float(r.position_error) < 1e-9
        np.testing.assert_allclose(np.asarray(r.q), [q1, q2], atol=1e-8)


@pytest.mark.parametrize("name", ["puma560", "panda", "stanford_arm"])
def test_poses_of_real_arms_are_found_from_no_guess_within_limits(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arm = jaxarm.load_arm(name)
    rng = np.random.default_rng(0)
    Q = _inside(arm, 32, rng)
    poses = jax.vmap(lambda q: jaxarm.tool_pose(arm, q))(Q)
    res = jax.jit(jax.vmap(lambda T: jaxarm.inverse_kinematics(arm, T)))(poses)
    assert bool(jnp.all(res.converged)), f"{int(jnp.sum(~res.converged))} of 32 poses not found"
    reached = jax.vmap(lambda q: jaxarm.tool_pose(arm, q))(res.q)
    np.testing.assert_allclose(np.asarray(reached), np.asarray(poses), atol=1e-8)
    lo, hi = np.asarray(arm.limits.position).T
    assert np.all(np.asarray(res.q) >= lo - 1e-12) and np.all(np.asarray(res.q) <= hi + 1e-12)
    # position only: the default start, a few iterations
    pos = jax.jit(jax.vmap(lambda p: jaxarm.inverse_kinematics(arm, p)))(poses[:, :3, 3])
    assert bool(jnp.all(pos.converged)) and float(jnp.max(pos.position_error)) < 1e-9
    assert float(jnp.max(pos.rotation_error)) == 0.0


def test_batched_equals_one_at_a_time():
    arm = jaxarm.load_arm("panda")
    rng = np.random.default_rng(1)
    Q = _inside(arm, 4, rng)
    poses = jax.vmap(lambda q: jaxarm.tool_pose(arm, q))(Q)
    starts = np.clip(Q + 0.2 * rng.normal(size=Q.shape), *np.asarray(arm.limits.position).T)
    batch = jax.vmap(lambda T, q0: jaxarm.inverse_kinematics(arm, T, q0))(poses, starts)
    for k in range(4):
        one = jaxarm.inverse_kinematics(arm, poses[k], starts[k])
        np.testing.assert_allclose(np.asarray(batch.q[k]), np.asarray(one.q), atol=1e-10)
        assert int(batch.iterations[k]) == int(one.iterations)


def test_limits_hold_and_an_unreachable_target_says_so():
    arm = jaxarm.load_arm("panda")
    lo, hi = np.asarray(arm.limits.position).T
    far = jnp.array([2.0, 0.0, 0.5])  # 2 m away: the Panda reaches about 0.86 m
    r = jaxarm.inverse_kinematics(arm, far, max_iterations=100)
    assert not bool(r.converged) and int(r.iterations) == 100
    assert 1.0 < float(r.position_error) < 1.3  # stretched towards it
    assert np.all(np.asarray(r.q) >= lo - 1e-12) and np.all(np.asarray(r.q) <= hi + 1e-12)
    # a target that needs joint 4 beyond its upper limit (-0.07 rad): not reached, joint 4 at the stop
    q = np.array([0.0, 0.3, 0.0, -0.07, 0.0, 1.5, 0.0])
    p = np.asarray(jaxarm.tool_pose(arm, np.where(np.arange(7) == 3, 0.4, q)))[:3, 3]
    stuck = jaxarm.inverse_kinematics(arm, p, q, max_iterations=300)
    assert np.all(np.asarray(stuck.q) <= hi + 1e-12)
    free = jaxarm.inverse_kinematics(arm, p, q, joint_limits=False, max_iterations=300)
    assert bool(free.converged)


def test_rotation_vector_is_the_log_of_so3_near_zero_and_near_pi():
    from jaxarm.core.spatial import rot_x

    axis = np.array([1.0, 2.0, -0.5]) / np.linalg.norm([1.0, 2.0, -0.5])
    K = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    for angle in (0.0, 1e-9, 0.3, 2.0, np.pi - 1e-9, np.pi):
        R = np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K  # Rodrigues
        r = np.asarray(rotation_vector(jnp.asarray(R)))
        if angle > np.pi - 1e-6:  # axis and -axis are the same rotation at pi
            assert min(np.linalg.norm(r - angle * axis), np.linalg.norm(r + angle * axis)) < 1e-6
        else:
            np.testing.assert_allclose(r, angle * axis, atol=1e-9)
    np.testing.assert_allclose(np.asarray(rotation_vector(rot_x(0.7))), [0.7, 0, 0], atol=1e-12)


def test_bad_input_is_named():
    arm = jaxarm.load_arm("panda")
    for kwargs, message in (
        (dict(target=np.zeros(2)), "target: expected a position"),
        (dict(target=np.array([np.nan, 0, 0])), "target: contains NaN"),
        (dict(target=np.zeros(3), q0=np.zeros(3)), "q0"),
        (dict(target=np.zeros(3), q0=np.zeros((2, 3))), "q0"),
        (dict(target=np.zeros(3), q0=np.r_[np.zeros(6), np.nan]), "q0: expected finite"),
        (dict(target=np.zeros(3), tol=0.0), "tol"),
        (dict(target=np.zeros(3), max_iterations=0), "max_iterations"),
    ):
        with pytest.raises(ValueError, match=message):
            jaxarm.inverse_kinematics(arm, **kwargs)


def test_an_eager_solve_is_kept_and_equals_the_jitted_solve():
    """Called outside any jit, a solve runs as one compiled program kept for the next call (the
    arm and the settings its constants): new targets and starts compile nothing, and the result
    is the jitted solve's."""
    from test_recompiles import count_compiles

    arm = jaxarm.load_arm("puma560")
    rng = np.random.default_rng(5)
    targets = [jaxarm.tool_pose(arm, q) for q in _inside(arm, 3, rng, 0.5)]
    starts = _inside(arm, 3, rng, 0.5)
    jaxarm.inverse_kinematics(arm, targets[0], starts[0])
    with count_compiles() as again:
        results = [jaxarm.inverse_kinematics(arm, T, q0) for T, q0 in zip(targets[1:], starts[1:])]
        jax.block_until_ready(results)
    assert len(again) == 0
    solve = jax.jit(lambda T, q0: jaxarm.inverse_kinematics(arm, T, q0))
    for T, q0, result in zip(targets[1:], starts[1:], results):
        ref = solve(T, jnp.asarray(q0))
        np.testing.assert_allclose(np.asarray(result.q), np.asarray(ref.q), rtol=0, atol=1e-12)
        assert bool(result.converged) == bool(ref.converged) and int(result.iterations) == int(ref.iterations)
    # vmapped outside any jit (over targets, then over starts): the kept solve is vmapped, and
    # JAX keeps that program too: a second call with new values compiles nothing
    batch = jax.vmap(lambda T, q0: jaxarm.inverse_kinematics(arm, T, q0).q)
    jax.block_until_ready(batch(jnp.stack(targets[:2]), jnp.asarray(np.stack(starts[:2]))))
    with count_compiles() as again:
        qs = jax.block_until_ready(batch(jnp.stack(targets[1:]), jnp.asarray(np.stack(starts[1:]))))
    assert len(again) == 0
    np.testing.assert_allclose(np.asarray(qs), np.asarray(jnp.stack([r.q for r in results])), rtol=0, atol=1e-12)
