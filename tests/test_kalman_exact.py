"""The Kalman filters against answers computed another way.

- On an arm whose dynamics are linear (one prismatic joint along gravity with viscous friction),
  the extended and the unscented filters both equal the exact Bayesian posterior, computed by
  conditioning the joint Gaussian of all states and measurements (dense linear algebra, no
  recursion), and the RTS smoother equals the posterior given the whole log. The discrete dynamics
  are written in closed form (Kutta's RK3 of a linear ODE is the cubic Taylor polynomial of its
  matrix exponential), not taken from jaxarm.
- On Craig's two-link arm (closed-form M, V, G, Craig 6.60-6.62) the extended filter equals a
  hand-rolled NumPy EKF with finite-difference Jacobians.
- A batch of logs in one call equals the logs one at a time; float32 runs NaN-free and close to
  float64; the unscented filter is consistent (NEES) on the nonlinear arm.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from test_closed_forms import G0, craig_G, craig_M, craig_two_link, craig_V

MASS, VISCOUS = 2.0, 0.8


def lift():
    """One prismatic joint along +z carrying MASS under gravity -z, viscous friction: qdd = (u - b qd)/m - g."""
    return jaxarm.make_arm("P", convention="placement", axis=[[0.0, 0.0, 1.0]], mass=MASS,
                           inertia=[[0.01, 0.01, 0.01]], viscous_friction=VISCOUS, name="lift")


def lift_step_matrices(dt):
    """x+ = A x + B u + c for Kutta's RK3 on x' = M x + N u + k: A = I + hM + (hM)^2/2 + (hM)^3/6,
    B = h (I + hM/2 + (hM)^2/6) N, c likewise with k."""
    M = np.array([[0.0, 1.0], [0.0, -VISCOUS / MASS]])
    N = np.array([[0.0], [1.0 / MASS]])
    k = np.array([0.0, -G0])
    h = dt
    I = np.eye(2)
    A = I + h * M + (h * M) @ (h * M) / 2 + (h * M) @ (h * M) @ (h * M) / 6
    S = h * (I + h * M / 2 + (h * M) @ (h * M) / 6)
    return A, S @ N, S @ k


def exact_posterior(A, B, c, u, z, m0, P0, W, R, upto):
    """Mean and covariance of x_upto given z_0..z_{len(z)-1}, by conditioning the joint Gaussian of
    (x_0, w_0..w_{K-1}) -> (x_upto, z_0..z_{K}) written out as one linear map."""
    K = len(z) - 1
    d, p = A.shape[0], B.shape[1]
    dim = d + K * p  # the independent Gaussians: x_0 and the torque noises
    mean0 = np.concatenate([m0, np.zeros(K * p)])
    cov0 = np.zeros((dim, dim))
    cov0[:d, :d] = P0
    for k in range(K):
        cov0[d + k * p:d + (k + 1) * p, d + k * p:d + (k + 1) * p] = W
    # x_k = L_k @ xi + b_k
    L, b = [np.hstack([np.eye(d), np.zeros((d, K * p))])], [np.zeros(d)]
    for k in range(K):
        Lk = A @ L[-1]
        Lk[:, d + k * p:d + (k + 1) * p] += B
        L.append(Lk)
        b.append(A @ b[-1] + B @ u[k] + c)
    H = np.eye(z.shape[1], d)
    Ly = np.vstack([H @ L[k] for k in range(len(z))])
    by = np.concatenate([H @ b[k] for k in range(len(z))])
    Ry = np.kron(np.eye(len(z)), R)
    Sy = Ly @ cov0 @ Ly.T + Ry
    Cxy = L[upto] @ cov0 @ Ly.T
    y = z.reshape(-1)
    mean = L[upto] @ mean0 + b[upto] + Cxy @ np.linalg.solve(Sy, y - (Ly @ mean0 + by))
    cov = L[upto] @ cov0 @ L[upto].T - Cxy @ np.linalg.solve(Sy, Cxy.T)
    return mean, cov


def lift_log(K=25, dt=0.01, seed=0):
    rng = np.random.default_rng(seed)
    A, B, c = lift_step_matrices(dt)
    u = MASS * G0 + rng.normal(size=(K, 1))
    x = np.array([0.1, 0.0])
    z = [x[:1] + 1e-3 * rng.normal(size=1)]
    for k in range(K):
        x = A @ x + B @ (u[k] + 0.3 * rng.normal(size=1)) + c
        z.append(x[:1] + 1e-3 * rng.normal(size=1))
    return u, np.asarray(z), dt


def test_the_step_of_the_linear_arm_is_the_closed_form():
    u, z, dt = lift_log()
    A, B, c = lift_step_matrices(dt)
    arm = lift()
    traj = jaxarm.rollout(arm, [0.1], [0.2], u[:5], dt, stops=False)
    x = np.array([0.1, 0.2])
    for k in range(5):
        x = A @ x + B @ u[k] + c
    np.testing.assert_allclose([traj.q[5, 0], traj.qd[5, 0]], x, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("variant", ["extended", "unscented"])
def test_filters_on_a_linear_arm_equal_the_exact_bayesian_posterior(variant):
    u, z, dt = lift_log()
    A, B, c = lift_step_matrices(dt)
    m0, std0 = np.array([0.1, 0.0]), np.array([0.01, 0.5])
    W, R = np.array([[0.3**2]]), np.array([[1e-3**2]])
    options = dict(dt=dt, q0=[0.1], qd0=[0.0], torque_std=0.3, position_std=1e-3, initial_std=std0, variant=variant)
    est = jaxarm.kalman_filter(lift(), u, z, **options)
    smoothed = jaxarm.kalman_filter(lift(), u, z, smooth=True, **options)
    P0 = np.diag(std0**2)
    for k in (0, 1, 5, 12, len(z) - 1):
        mean, cov = exact_posterior(A, B, c, u, z[:k + 1], m0, P0, W, R, upto=k)
        np.testing.assert_allclose([est.q[k, 0], est.qd[k, 0]], mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(est.covariance[k], cov, rtol=1e-7, atol=1e-15)
        mean_s, cov_s = exact_posterior(A, B, c, u, z, m0, P0, W, R, upto=k)
        np.testing.assert_allclose([smoothed.q[k, 0], smoothed.qd[k, 0]], mean_s, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(smoothed.covariance[k], cov_s, rtol=1e-6, atol=1e-15)
    # The filter is not trivially the measurement: velocity is estimated, its uncertainty shrinks.
    assert est.std[-1, 1] < 0.1 * std0[1]


def hand_rolled_ekf(u, z, dt, q0, qd0, std0, torque_std, position_std, params):
    """A NumPy EKF on Craig's closed-form two-link dynamics with central-difference Jacobians."""
    m1, m2, l1, l2 = params

    def accel(q, qd, tau):
        return np.linalg.solve(craig_M(q, m1, m2, l1, l2), tau - craig_V(q, qd, m1, m2, l1, l2) - craig_G(q, m1, m2, l1, l2))

    def step(x, tau):  # Kutta's RK3 (Swartz's Runge-Kutta step)
        q, qd = x[:2], x[2:]
        a1 = accel(q, qd, tau)
        q2, qd2 = q + 0.5 * dt * qd, qd + 0.5 * dt * a1
        a2 = accel(q2, qd2, tau)
        q3, qd3 = q + dt * (2 * qd2 - qd), qd + dt * (2 * a2 - a1)
        a3 = accel(q3, qd3, tau)
        return np.concatenate([q + dt / 6 * (qd + 4 * qd2 + qd3), qd + dt / 6 * (a1 + 4 * a2 + a3)])

    def jac(fun, v, h=1e-6):
        cols = [(fun(v + h * e) - fun(v - h * e)) / (2 * h) for e in np.eye(len(v))]
        return np.stack(cols, axis=1)

    H = np.eye(2, 4)
    R = np.eye(2) * position_std**2
    W = np.eye(2) * torque_std**2

    def update(x, P, zk):
        S = H @ P @ H.T + R
        K = P @ H.T @ np.linalg.inv(S)
        x = x + K @ (zk - H @ x)
        A = np.eye(4) - K @ H
        return x, A @ P @ A.T + K @ R @ K.T

    x, P = update(np.concatenate([q0, qd0]), np.diag(std0**2), z[0])
    xs, Ps = [x], [P]
    for k in range(len(u)):
        F = jac(lambda v: step(v, u[k]), x)
        G = jac(lambda w: step(x, w), u[k])
        x_pred = step(x, u[k])
        P_pred = F @ P @ F.T + G @ W @ G.T
        x, P = update(x_pred, P_pred, z[k + 1])
        xs.append(x)
        Ps.append(P)
    return np.asarray(xs), np.asarray(Ps)


def test_the_extended_filter_equals_a_hand_rolled_ekf_on_craigs_two_link_arm():
    params = (1.3, 0.9, 0.5, 0.4)
    arm = craig_two_link(*params, "standard")
    rng = np.random.default_rng(4)
    dt, K = 0.005, 120
    u = 4.0 * np.sin(np.linspace(0, 6, K))[:, None] * np.array([[1.0, -0.6]]) + np.array([[14.0, 3.5]])
    truth = jaxarm.rollout(arm, [0.2, -0.3], [0.0, 0.0], u + 0.5 * rng.normal(size=u.shape), dt)
    z = np.asarray(truth.q) + 2e-4 * rng.normal(size=(K + 1, 2))
    std0 = np.array([2e-3, 2e-3, 1.0, 1.0])
    est = jaxarm.extended_kalman_filter(arm, u, z, dt=dt, q0=[0.2, -0.3], qd0=[0.0, 0.0], torque_std=0.5,
                                        position_std=2e-4, initial_std=std0)
    xs, Ps = hand_rolled_ekf(u, z, dt, np.array([0.2, -0.3]), np.zeros(2), std0, 0.5, 2e-4, params)
    np.testing.assert_allclose(est.q, xs[:, :2], rtol=0, atol=1e-9)
    np.testing.assert_allclose(est.qd, xs[:, 2:], rtol=0, atol=1e-6)
    # Covariances entry by entry, relative to sqrt(P_ii P_jj) (the near-zero correlations included).
    scale = np.sqrt(np.einsum("kii->ki", Ps))
    assert np.max(np.abs(est.covariance - Ps) / (scale[:, :, None] * scale[:, None, :])) < 1e-6
    # It filters: velocities closer to the truth than differentiated measurements.
    err = np.sqrt(np.mean((est.qd[20:] - np.asarray(truth.qd)[20:]) ** 2))
    diff = np.sqrt(np.mean((np.diff(z, axis=0)[19:] / dt - np.asarray(truth.qd)[20:]) ** 2))
    assert err < 0.5 * diff


@pytest.fixture(scope="module")
def logs():
    """Six logs of Craig's two-link arm under different torques with torque noise (one compiled,
    vmapped rollout), encoders with 2e-4 rad noise: (arm, u (6, K, 2), z (6, K+1, 2), truth (6, K+1, 4), dt)."""
    import jax

    params = (1.3, 0.9, 0.5, 0.4)
    arm = craig_two_link(*params, "standard")
    B, K, dt = 6, 200, 0.005
    rng = np.random.default_rng(1)
    t = np.arange(K) * dt
    u = np.array([14.0, 3.5]) + 3.0 * np.sin(2.0 * t[None, :, None] * (1 + np.arange(B)[:, None, None] % 3)
                                             + rng.uniform(0, 6, size=(B, 1, 2)))
    w = 0.3 * rng.normal(size=u.shape)
    run = jax.jit(jax.vmap(lambda uu: jaxarm.rollout(arm, jnp.array([0.2, -0.3]), jnp.zeros(2), uu, dt)))
    truth = run(jnp.asarray(u + w))
    z = np.asarray(truth.q) + 2e-4 * rng.normal(size=(B, K + 1, 2))
    return arm, u, z, np.concatenate([np.asarray(truth.q), np.asarray(truth.qd)], axis=-1), dt


@pytest.mark.parametrize("variant", ["extended", "unscented"])
def test_a_batch_of_logs_in_one_call_equals_one_at_a_time(variant, logs):
    arm, us, zs, _, dt = logs
    options = dict(dt=dt, q0=[0.2, -0.3], torque_std=0.3, position_std=2e-4, variant=variant)
    batch = jaxarm.kalman_filter(arm, us, zs, **options)
    assert batch.q.shape == (6, 201, 2) and batch.covariance.shape == (6, 201, 4, 4) and batch.nis.shape == (6, 201)
    for b in (0, 5):
        one = jaxarm.kalman_filter(arm, us[b], zs[b], **options)
        np.testing.assert_allclose(batch.q[b], one.q, rtol=0, atol=1e-12)
        np.testing.assert_allclose(batch.covariance[b], one.covariance, rtol=1e-9, atol=1e-18)
    with pytest.raises(ValueError, match=r"u: expected shape \(6, 200, 2\)"):
        jaxarm.kalman_filter(arm, us[:2], zs, **options)
    with pytest.raises(ValueError, match="variant: expected one of"):
        jaxarm.kalman_filter(arm, us[0], zs[0], dt=dt, q0=[0.2, -0.3], variant="particle")


def test_the_unscented_filter_is_consistent_and_close_to_the_extended_one(logs):
    arm, us, zs, truths, dt = logs
    options = dict(dt=dt, q0=[0.2, -0.3], torque_std=0.3, position_std=2e-4)
    ukf = jaxarm.unscented_kalman_filter(arm, us, zs, **options)
    ekf = jaxarm.extended_kalman_filter(arm, us, zs, **options)
    assert ukf.variant == "unscented" and ekf.variant == "extended"
    e = np.concatenate([ukf.q, ukf.qd], axis=-1) - truths
    nees = np.einsum("bki,bkij,bkj->bk", e, np.linalg.inv(ukf.covariance), e)[:, 20:]
    assert 4 * 0.7 < nees.mean() < 4 * 1.3  # chi-square with 4 degrees of freedom has mean 4
    np.testing.assert_allclose(ukf.qd, ekf.qd, rtol=0, atol=0.05 * np.abs(truths[..., 2:]).max())
    assert np.all(np.isfinite(ukf.nis)) and abs(np.mean(ukf.nis[:, 20:]) / 2 - 1) < 0.3


@pytest.mark.parametrize("variant", ["extended", "unscented"])
def test_float32_filters_run_nan_free_and_close_to_float64(variant, logs):
    arm, us, zs, truths, dt = logs
    options = dict(dt=dt, q0=[0.2, -0.3], torque_std=0.3, position_std=2e-4, variant=variant)
    f64 = jaxarm.kalman_filter(arm, us, zs, **options)
    f32 = jaxarm.kalman_filter(arm, us, zs, dtype=jnp.float32, **options)
    assert f32.q.dtype == np.float32 and f32.covariance.dtype == np.float32
    for field in ("q", "qd", "covariance", "nis"):
        assert np.all(np.isfinite(getattr(f32, field))), field
    np.testing.assert_allclose(f32.q, f64.q, rtol=0, atol=5e-5)
    np.testing.assert_allclose(f32.qd, f64.qd, rtol=0, atol=0.02 * np.abs(truths[..., 2:]).max())


@pytest.mark.parametrize("variant", ["extended", "unscented"])
def test_filters_with_different_settings_in_one_call_equal_one_at_a_time(variant, logs):
    """Noise settings given per filter ((B, n) arrays) run B filters in one vmap-ed call: on one
    log repeated, or one log each; every row equals the filter run alone with its settings."""
    arm, us, zs, _, dt = logs
    torque_std = np.array([[0.1, 0.1], [0.3, 0.3], [1.0, 0.5]])
    options = dict(dt=dt, q0=[0.2, -0.3], position_std=2e-4, variant=variant)
    tuned = jaxarm.kalman_filter(arm, us[0], zs[0], torque_std=torque_std, **options)
    assert tuned.q.shape == (3, 201, 2) and tuned.covariance.shape == (3, 201, 4, 4)
    for b in range(3):
        one = jaxarm.kalman_filter(arm, us[0], zs[0], torque_std=torque_std[b], **options)
        np.testing.assert_allclose(tuned.q[b], one.q, rtol=0, atol=1e-12)
        np.testing.assert_allclose(tuned.covariance[b], one.covariance, rtol=1e-9, atol=1e-18)
    assert not np.allclose(tuned.std[0], tuned.std[2])  # the settings did differ
    # one log and one setting row each, position noise per filter too
    pos = np.array([[2e-4, 2e-4], [5e-4, 5e-4], [1e-3, 1e-3]])
    pairs = jaxarm.kalman_filter(arm, us[:3], zs[:3], torque_std=torque_std, dt=dt, q0=[0.2, -0.3], position_std=pos,
                                 variant=variant)
    one = jaxarm.kalman_filter(arm, us[2], zs[2], torque_std=torque_std[2], dt=dt, q0=[0.2, -0.3], position_std=pos[2],
                               variant=variant)
    np.testing.assert_allclose(pairs.q[2], one.q, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="must all have the same number of rows"):
        jaxarm.kalman_filter(arm, us[:2], zs[:2], torque_std=torque_std, **options)
