"""Generalized-momentum observer (jaxarm.estimate): beta = g + tau_f - C^T qd agrees with the
Christoffel Coriolis matrix, the residual follows a known external joint torque through a
first-order lag of time constant 1 / K, stays at zero without contact, and contact detection with
a threshold from contact-free data raises no false alarm and names the joints that see it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import random_arm

import jaxarm
from jaxarm.estimate import contact_link, detect_contact, detection_threshold, momentum_observer
from jaxarm.estimate.momentum_observer import _momentum_and_beta

DT = 1e-3
K = 40.0
ON, OFF = 1.0, 1.6  # s: the external torque acts in between


def _run(arm, external):
    """2.5 s of the arm under a smooth commanded torque (+ ``external`` (n,) between ON and OFF),
    integrated by RK4 at 1 ms; returns t, q, qd and the commanded torque (what the drives log)."""
    T = 2500
    t = np.arange(T + 1) * DT
    gravity = np.asarray(jaxarm.inverse_dynamics(arm, np.zeros(arm.n), np.zeros(arm.n), np.zeros(arm.n)))
    wave = np.stack([np.sin(2 * np.pi * (0.5 + 0.3 * j) * t[:-1] + j) for j in range(arm.n)], axis=1)
    command = gravity + 0.3 * np.abs(gravity).max() * wave
    on = ((t[:-1] >= ON) & (t[:-1] < OFF))[:, None]
    traj = jaxarm.rollout(arm, np.zeros(arm.n), np.zeros(arm.n), command + on * external, DT, method="rk4", saturate=False)
    return t, np.asarray(traj.q), np.asarray(traj.qd), np.vstack([command, command[-1:]])


@pytest.fixture(scope="module")
def arm():
    """A 3-joint arm with rotor inertia, viscous and smooth Coulomb friction (tanh(qd / 0.05)):
    with an exact sign(qd) the simulated arm chatters at rest and no sampled observer can follow."""
    arm = random_arm(2, "RRR", drives=True)
    return arm.replace(drives=dataclasses.replace(arm.drives, coulomb_velocity_scale=np.full(arm.n, 0.05)))


def test_beta_matches_the_coriolis_matrix(arm):
    rng = np.random.default_rng(0)
    for _ in range(3):
        q, qd = rng.uniform(-1, 1, (2, arm.n))
        p, beta = _momentum_and_beta(arm, q, qd)
        C = np.asarray(jaxarm.coriolis_matrix(arm, q, qd))
        expected = np.asarray(jaxarm.gravity_torques(arm, q)) + np.asarray(jaxarm.friction_torques(arm, qd)) - C.T @ qd
        np.testing.assert_allclose(beta, expected, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(p, np.asarray(jaxarm.mass_matrix(arm, q)) @ qd, rtol=1e-12)


def test_residual_follows_the_external_torque(arm):
    external = np.array([3.0, -2.0, 1.0])
    t, q, qd, tau = _run(arm, external)
    obs = momentum_observer(arm, t, q, qd, tau, gain=K)
    r = obs.residual
    before = t < ON
    # no contact, no residual (up to the O(dt) difference between the simulation's held torque and the
    # observer's trapezoid rule)
    assert np.max(np.abs(r[before])) < 5e-3 * np.abs(external).max()
    # first-order lag: r = tau_ext (1 - exp(-K (t - ON))) while the contact lasts
    inside = (t >= ON + 2 * DT) & (t < OFF)
    lag = external[None, :] * (1 - np.exp(-K * (t[inside] - ON)))[:, None]
    assert np.max(np.abs(r[inside] - lag)) < 0.02 * np.abs(external).max(), np.max(np.abs(r[inside] - lag))
    settled = (t >= ON + 5 / K) & (t < OFF)
    np.testing.assert_allclose(r[settled].mean(axis=0), external, rtol=0.02)
    after = t >= OFF + 8 / K
    assert np.max(np.abs(r[after])) < 0.01 * np.abs(external).max()  # released: back to zero


def test_contact_detection_without_false_alarms(arm):
    rng = np.random.default_rng(1)
    noisy = lambda x, s: x + s * rng.normal(size=x.shape)  # noqa: E731
    t, q, qd, tau = _run(arm, np.zeros(arm.n))
    free = momentum_observer(arm, t, q, noisy(qd, 1e-4), noisy(tau, 0.02), gain=K)
    settle = int(5 / K / DT)
    threshold = detection_threshold(free.residual, settle=settle)
    assert not detect_contact(free.residual[settle:], threshold).any()
    t, q, qd, tau = _run(arm, np.array([0.0, 4.0, 0.0]))  # only joint 2 is pushed
    hit = momentum_observer(arm, t, q, noisy(qd, 1e-4), noisy(tau, 0.02), gain=K)
    alarm = detect_contact(hit.residual, threshold)
    first = t[np.flatnonzero(alarm)[0]]
    assert ON <= first < ON + 2 / K, first  # detected within two time constants, not before
    assert not alarm[settle:int(ON / DT)].any()
    joints = np.abs(hit.residual[alarm]) > threshold
    assert joints[:, 1].mean() > 0.9  # the pushed joint is the one that sees it
    link = contact_link(hit.residual, threshold)
    assert np.array_equal(link > 0, alarm) and np.mean(link[alarm] == 2) > 0.9  # isolated to link 2
    # a push through link 1 (joint 1 only) is isolated to link 1
    t, q, qd, tau = _run(arm, np.array([4.0, 0.0, 0.0]))
    hit = momentum_observer(arm, t, q, noisy(qd, 1e-4), noisy(tau, 0.02), gain=K)
    link = contact_link(hit.residual, threshold)
    assert np.mean(link[link > 0] == 1) > 0.9 and np.any(link > 0)


def test_bad_input_is_refused(arm):
    t = np.arange(10) * DT
    z = np.zeros((10, arm.n))
    with pytest.raises(ValueError, match="qd: expected shape"):
        momentum_observer(arm, t, z, z[:, :2], z)
    with pytest.raises(ValueError, match="gain"):
        momentum_observer(arm, t, z, z, z, gain=2000.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        momentum_observer(arm, t[::-1], z, z, z)
    bad = z.copy()
    bad[3, 0] = np.nan
    with pytest.raises(ValueError, match="tau: expected finite"):
        momentum_observer(arm, t, z, z, bad)
