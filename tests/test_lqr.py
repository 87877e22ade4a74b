"""Time-varying LQR (jaxarm.lqr): Riccati recursion against the infinite-horizon DARE, a naive
NumPy loop and the optimal-cost identity; closed-loop tracking of a Puma 560 trajectory."""

from __future__ import annotations


import jax
import numpy as np
import pytest
import scipy.linalg

import jaxarm
from jaxarm.lqr import tvlqr, tvlqr_controller, tvlqr_tracking
from tests.helpers import assert_close


def _random_system(rng, N=4, m=2):
    A = np.eye(N) + 0.1 * rng.normal(size=(N, N))
    B = rng.normal(size=(N, m))
    L = rng.normal(size=(N, N))
    Q = L @ L.T + 0.1 * np.eye(N)
    Lr = rng.normal(size=(m, m))
    R = Lr @ Lr.T + 0.5 * np.eye(m)
    return A, B, Q, R


def test_long_horizon_converges_to_the_dare_solution():
    rng = np.random.default_rng(0)
    A, B, Q, R = _random_system(rng)
    T = 400
    sol = tvlqr(np.broadcast_to(A, (T,) + A.shape), np.broadcast_to(B, (T,) + B.shape), Q, R, np.zeros_like(Q))
    P = scipy.linalg.solve_discrete_are(A, B, Q, R)
    K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
    assert sol.K.shape == (T, 2, 4) and sol.P.shape == (T + 1, 4, 4)
    assert_close(sol.P[0], P, 1e-10, "P_0 vs DARE")
    assert_close(sol.K[0], K, 1e-10, "K_0 vs DARE")
    np.testing.assert_array_equal(np.asarray(sol.P[-1]), 0.0)  # P_T = Qf
    # the closed loop A - B K of the stationary gain is stable
    assert np.max(np.abs(np.linalg.eigvals(A - B @ np.asarray(sol.K[0])))) < 1.0


def test_time_varying_gains_match_a_naive_loop_and_the_optimal_cost():
    rng = np.random.default_rng(1)
    T, N, m = 25, 4, 2
    systems = [_random_system(rng, N, m) for _ in range(T)]
    A, B, Q, R = (np.stack(x) for x in zip(*systems))
    Qf = systems[0][2] * 3.0
    sol = tvlqr(A, B, Q, R, Qf)
    P = Qf
    Ks, Ps = [None] * T, [None] * (T + 1)
    Ps[T] = P
    for k in reversed(range(T)):  # textbook form: P_k = Q + A'PA - A'PB (R + B'PB)^-1 B'PA
        S = R[k] + B[k].T @ P @ B[k]
        Ks[k] = np.linalg.inv(S) @ B[k].T @ P @ A[k]
        P = Q[k] + A[k].T @ P @ A[k] - A[k].T @ P @ B[k] @ np.linalg.inv(S) @ B[k].T @ P @ A[k]
        Ps[k] = P
    assert_close(sol.K, np.stack(Ks), 1e-10, "K")
    assert_close(sol.P, np.stack(Ps), 1e-10, "P")
    # the optimal cost from x0 under u = -K x is x0' P_0 x0, and any perturbation of the gains costs more
    x0 = rng.normal(size=N)

    def cost(K):
        x, J = x0, 0.0
        for k in range(T):
            u = -K[k] @ x
            J += x @ Q[k] @ x + u @ R[k] @ u
            x = A[k] @ x + B[k] @ u
        return J + x @ Qf @ x

    K = np.asarray(sol.K)
    assert cost(K) == pytest.approx(x0 @ np.asarray(sol.P[0]) @ x0, rel=1e-10)
    assert cost(K + 1e-3 * rng.normal(size=K.shape)) > cost(K)


def test_controller_indexes_gains_by_step_and_saturates():
    T, n = 5, 2
    K = np.arange(T * n * 2 * n, dtype=float).reshape(T, n, 2 * n) * 0.01
    qn, qdn, un = np.ones((T + 1, n)), np.zeros((T + 1, n)), np.full((T, n), 0.5)
    dt = 0.1
    policy = tvlqr_controller(K, qn, qdn, un, dt, t0=1.0, torque_limit=np.array([10.0, 0.6]))
    q, qd = np.array([1.2, 0.9]), np.array([0.3, -0.1])
    for k in range(T):
        dx = np.concatenate([q - qn[k], qd - qdn[k]])
        expected = np.clip(un[k] - K[k] @ dx, [-10.0, -0.6], [10.0, 0.6])
        np.testing.assert_allclose(policy(1.0 + k * dt, q, qd), expected, rtol=1e-12)
    np.testing.assert_allclose(policy(1.0 + 9 * dt, q, qd), policy(1.0 + (T - 1) * dt, q, qd))  # clamped
    with pytest.raises(ValueError, match="u_nom: expected shape"):
        tvlqr_controller(K, qn, qdn, un[:3], dt)
    with pytest.raises(ValueError, match="K: expected gains"):
        tvlqr_controller(K[:, :, :3], qn, qdn, un, dt)


def test_bad_weights_are_rejected():
    A, B = np.zeros((3, 4, 4)), np.zeros((3, 4, 2))
    with pytest.raises(ValueError, match="R: expected positive definite"):
        tvlqr(A, B, np.eye(4), -np.eye(2))
    with pytest.raises(ValueError, match="B: expected shape"):
        tvlqr(A, np.zeros((3, 5, 2)), np.eye(4), np.eye(2))
    with pytest.raises(ValueError, match="Q: expected"):
        tvlqr(A, B, np.eye(3), np.eye(2))


@jax.jit
def _track(arm, q0, qd0, K, q_ref, qd_ref, u_ref, dt):
    """One compiled rollout for every run below: u = u_ref_k - K_k (x - x_ref_k) (PD, TV-LQR, open loop)."""
    policy = tvlqr_controller(K, q_ref, qd_ref, u_ref, dt, torque_limit=arm.limits.torque)
    return jaxarm.rollout(arm, q0, qd0, policy, dt, steps=K.shape[0], on_divergence="flag")


def test_tvlqr_tracks_a_puma_trajectory_from_a_perturbed_start():
    """Nominal: the Puma under PD + gravity compensation for 0.6 s; TV-LQR from the RK3 step
    linearization brings a start 0.05 rad off back onto it; replaying the nominal torques open loop
    does not."""
    arm = jaxarm.load_arm("puma560")
    dt, T = 5e-3, 120
    q0 = np.array([0.0, 0.5, -0.5, 0.0, 0.3, 0.0])
    goal = q0 + np.array([0.4, -0.3, 0.4, 0.3, -0.3, 0.2])
    pd_gain = np.broadcast_to(np.concatenate([200.0 * np.eye(6), 20.0 * np.eye(6)], axis=1), (T, 6, 12))
    nominal = _track(arm, q0, np.zeros(6), pd_gain, np.tile(goal, (T, 1)), np.zeros((T, 6)),
                     np.tile(np.asarray(jaxarm.gravity_torques(arm, goal)), (T, 1)), dt)
    u_nom = nominal.tau
    _, sol = tvlqr_tracking(arm, nominal.q, nominal.qd, u_nom, dt, Q=np.concatenate([np.full(6, 1e4), np.full(6, 10.0)]), R=1e-3)
    assert sol.K.shape == (T, 6, 12)
    dq0 = np.array([0.05, -0.05, 0.05, -0.05, 0.05, -0.05])
    closed = _track(arm, q0 + dq0, np.zeros(6), sol.K, nominal.q, nominal.qd, u_nom, dt)
    open_ = _track(arm, q0 + dq0, np.zeros(6), 0 * sol.K, nominal.q, nominal.qd, u_nom, dt)
    err_closed = np.abs(np.asarray(closed.q - nominal.q)).max(axis=1)
    err_open = np.abs(np.asarray(open_.q - nominal.q)).max(axis=1)
    assert err_closed[-1] < 1e-3  # rad, from 50 mrad
    assert err_closed[-1] < 0.05 * err_open[-1]
    assert err_closed[-1] < err_closed[T // 2] < err_closed[0]  # converging
