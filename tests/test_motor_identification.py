"""Motor identification from voltage, current and position logs.

The data come from voltage-driven rollouts of a small random arm with DC drives tracking a Fourier
trajectory, so the truth is known exactly: noiseless logs must give it back to rounding, 1 %
sensor noise must give Kt and R within 2 %, and the joint mode must agree with the alone mode
when the link parameters it starts from are right.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import jaxarm
from jaxarm import identification
from jaxarm import motor_identification as mi
from jaxarm.excitation import FourierTrajectory, fourier_trajectory, voltage_tracking_policy
from jaxarm.logs import Log

from helpers import random_arm


def truth_arm():
    arm = random_arm(5, "RR", "standard", drives=True)
    # smooth Coulomb sign: with the exact sign the joints chatter through velocity reversals
    drives = dataclasses.replace(arm.drives, coulomb_velocity_scale=np.full(2, 0.02), voltage_limit=np.full(2, 200.0))
    return arm.replace(drives=drives)


def prior_arm(truth, links_scale=None):
    """The truth's kinematics and gears, all drive parameters zero, links optionally perturbed."""
    zero = np.zeros(truth.n)
    drives = dataclasses.replace(
        truth.drives, rotor_inertia=zero, viscous_friction=zero, coulomb_friction=np.zeros((truth.n, 2)),
        torque_constant=zero, resistance=zero,
    )
    arm = truth.replace(drives=drives)
    if links_scale is not None:
        pi = np.asarray(identification.standard_parameters(arm, drives=False)) * links_scale
        arm = jax.tree_util.tree_map(np.asarray, identification.arm_with_parameters(arm, pi, drives=False))
    return arm


@pytest.fixture(scope="module")
def truth():
    return truth_arm()


@pytest.fixture(scope="module")
def rollout(truth):
    rng = np.random.default_rng(0)
    params = FourierTrajectory(np.array([0.2, -0.4]), 0.5 * rng.normal(size=(2, 3)), 0.5 * rng.normal(size=(2, 3)), np.asarray(2.0))
    q0, qd0, _ = fourier_trajectory(params, 0.0)
    policy = voltage_tracking_policy(truth, params, kp=200.0, kd=30.0)
    return jaxarm.rollout(truth, q0, qd0, policy, 1e-3, steps=4000, input="voltage")


@pytest.fixture(scope="module")
def exact_log(truth, rollout):
    return mi.simulated_motor_log(truth, rollout)  # instantaneous samples: exactly consistent


def torques(arm, log):
    return np.asarray(jax.vmap(lambda a, b, c: jaxarm.inverse_dynamics(arm, a, b, c))(log.q, log.dq, log.ddq))


def test_simulated_log_is_consistent(truth, exact_log):
    # Swartz eq. 11: V = R I + Kt G qd, and the logged torque drives the logged acceleration
    d = truth.drives
    np.testing.assert_allclose(exact_log.V, d.resistance * exact_log.I + d.torque_constant * d.gear_ratio * exact_log.dq, atol=1e-10)
    np.testing.assert_allclose(torques(truth, exact_log), exact_log.tau, atol=1e-8 * np.abs(exact_log.tau).max())


def test_exact_recovery_alone(truth, exact_log):
    res = mi.identify_motors(exact_log, prior_arm(truth), mode="alone")
    np.testing.assert_allclose(res.values, mi.motor_parameters(truth), rtol=1e-7, atol=1e-12)
    assert np.all(res.identifiable) and res.rank == 4 * truth.n
    np.testing.assert_allclose(torques(res.arm, exact_log), exact_log.tau, atol=1e-7 * np.abs(exact_log.tau).max())
    Kt, std = res.parameter("Kt2")
    assert Kt == pytest.approx(float(truth.drives.torque_constant[1]), rel=1e-9) and std >= 0


def test_exact_recovery_joint(truth, exact_log):
    """Links start 30 % off: identifiable standard parameters come back exactly, the rest stay at
    the prior, and the identified arm reproduces every torque."""
    prior = prior_arm(truth, links_scale=1.3)
    res = mi.identify_motors(exact_log, prior, mode="joint")
    true_pi = np.asarray(identification.standard_parameters(truth))
    ok = res.identifiable
    assert 0 < ok.sum() < ok.size  # a 2R arm has unidentifiable standard parameters
    np.testing.assert_allclose(res.standard_values[ok], true_pi[ok], rtol=1e-6, atol=1e-9)
    assert np.all(np.isinf(res.standard_std[~ok]))
    np.testing.assert_allclose(torques(res.arm, exact_log), exact_log.tau, atol=1e-7 * np.abs(exact_log.tau).max())
    true_motor = mi.motor_parameters(truth).reshape(2, -1)
    got = res.values.reshape(2, -1)
    np.testing.assert_allclose(got[:, :2], true_motor[:, :2], rtol=1e-9)  # Kt, R


@pytest.fixture(scope="module")
def average_log(truth, rollout):
    return mi.simulated_motor_log(truth, rollout, sampling="average")  # what anti-aliased sensors see


@pytest.fixture(scope="module")
def noisy_log(truth, average_log):
    G = np.abs(np.asarray(truth.drives.gear_ratio))
    raw = mi.add_sensor_noise(
        average_log, relative=0.01, encoder_resolution=2 * np.pi / (4096 * G), voltage_range=200.0, current_range=50.0, adc_bits=16, seed=0
    )
    return mi.preprocess_motor_log(raw, cutoff=5.0)


def true_torques_at(log, average_log):
    return average_log.tau[np.searchsorted(average_log.t, log.t)]


def test_recovery_at_one_percent_noise(truth, noisy_log, average_log):
    res = mi.identify_motors(noisy_log, prior_arm(truth), mode="alone", min_speed=0.05)
    rel = mi.relative_error(res.values, mi.motor_parameters(truth)).reshape(2, -1)
    assert np.all(rel[:, :2] < 0.02), rel  # Kt, R within 2 %
    assert np.all(rel[0, 2:] < 0.05), rel  # joint 1 (large drive torques): Jm, B, Tc+- within 5 %
    # joint 2's drive torques are small beside its link torques, so its drive parameters are
    # loosely determined, but the torques predicted from the filtered measurements are right
    tau = true_torques_at(noisy_log, average_log)
    err = np.sqrt(np.mean((torques(res.arm, noisy_log) - tau) ** 2, axis=0))
    assert np.all(err < 0.02 * np.sqrt(np.mean(tau**2, axis=0))), err
    # the electrical fit's standard deviations are consistent with its errors (within 6 sigma + 0.1 %)
    got, true = res.values.reshape(2, -1)[:, :2], mi.motor_parameters(truth).reshape(2, -1)[:, :2]
    assert np.all(np.abs(got - true) < 6 * res.std.reshape(2, -1)[:, :2] + 1e-3 * np.abs(true))


def test_joint_mode_agrees_with_alone_mode_when_links_are_right(truth, exact_log, noisy_log, average_log):
    alone = mi.identify_motors(exact_log, prior_arm(truth), mode="alone")
    joint = mi.identify_motors(exact_log, prior_arm(truth), mode="joint")
    seen = np.isfinite(joint.std)  # the rotor inertia of joint 1 merges with a link inertia
    assert 0 < np.sum(~seen) < seen.size
    np.testing.assert_allclose(joint.values[seen], alone.values[seen], rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(torques(joint.arm, exact_log), torques(alone.arm, exact_log), atol=1e-8 * np.abs(exact_log.tau).max())
    # noisy: the same electrical fit; both predict the true torques, the joint mode (15 base
    # parameters from 2.4 s of data instead of 8) less tightly: within 2 % and 5 % of their RMS
    alone = mi.identify_motors(noisy_log, prior_arm(truth), mode="alone", min_speed=0.05)
    joint = mi.identify_motors(noisy_log, prior_arm(truth), mode="joint", min_speed=0.05)
    np.testing.assert_array_equal(alone.values.reshape(2, -1)[:, :2], joint.values.reshape(2, -1)[:, :2])
    tau = true_torques_at(noisy_log, average_log)
    for res, tol in ((alone, 0.02), (joint, 0.05)):
        err = np.sqrt(np.mean((torques(res.arm, noisy_log) - tau) ** 2, axis=0))
        assert np.all(err < tol * np.sqrt(np.mean(tau**2, axis=0))), (res.mode, err)


def test_missing_channels_and_still_joints_raise(truth, exact_log):
    fields = {c: getattr(exact_log, c) for c in ("t", "q", "dq", "ddq", "V", "I")}
    for missing in ("V", "I", "ddq"):
        log = Log(**{**fields, missing: None})
        with pytest.raises(mi.MotorIdentificationError, match=f"no {missing} channel"):
            mi.identify_motors(log, truth)
    still = fields.copy()
    still["q"] = fields["q"].copy()
    still["q"][:, 1] = 0.3
    still["dq"] = fields["dq"].copy()
    still["dq"][:, 1] = 0.0
    with pytest.raises(mi.MotorIdentificationError, match="joint 2 never moves"):
        mi.identify_motors(Log(**still), truth)
    with pytest.raises(TypeError, match="Log"):
        mi.identify_motors(fields, truth)
    with pytest.raises(ValueError, match="mode"):
        mi.identify_motors(exact_log, truth, mode="both")
    assert issubclass(mi.MotorIdentificationError, ValueError)
