"""The Kalman filters' input and sensor models beyond encoders (jaxarm.estimate.kalman): motor-current
and motor-voltage inputs, link-side joint torque sensors (which see the drive's torque error but
not an external torque, so that the two are told apart) and motor-current sensors under voltage
input (whose back-EMF measures the joint velocity). The logs are simulated with the physics written
out here, independently of the filter's measurement function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_kalman import DT, POSITION_STD, STEPS, TORQUE_STD, arm  # noqa: F401  (arm: the shared fixture)

import jaxarm
from jaxarm.dynamics.drives import friction_torques, reflected_inertia

DRIVE_ERROR = np.array([0.8, 0.0, -0.5])  # N m, constant, on joints 1 and 3
CONTACT = 1.2  # N m on joint 2 from step 150


def _simulate(arm, joint_torque, seed, extra=None):
    """States (STEPS + 1, 2n) under joint_torque(k, qd) + w_k + extra_k (w ~ N(0, TORQUE_STD^2)), and
    each step's accelerations at its start (STEPS, n) with the applied torques (STEPS, n)."""
    rng = np.random.default_rng(seed)
    n = arm.n
    w = TORQUE_STD * rng.normal(size=(STEPS, n))
    extra = np.zeros((STEPS, n)) if extra is None else extra
    step = jax.jit(lambda q, qd, tau: jaxarm.rollout(arm, q, qd, tau[None], DT, saturate=False))
    accel = jax.jit(lambda q, qd, tau: jaxarm.forward_dynamics(arm, q, qd, tau))
    q, qd = np.zeros(n), np.zeros(n)
    xs, qdd, taus = [np.zeros(2 * n)], [], []
    for k in range(STEPS):
        tau = joint_torque(k, qd) + w[k] + extra[k]
        qdd.append(np.asarray(accel(q, qd, tau)))
        taus.append(tau)
        r = step(jnp.asarray(q), jnp.asarray(qd), jnp.asarray(tau))
        q, qd = np.asarray(r.q[-1]), np.asarray(r.qd[-1])
        xs.append(np.concatenate([q, qd]))
    return np.array(xs), np.array(qdd), np.array(taus), rng


def _inputs(arm):
    n = arm.n
    t = np.arange(STEPS) * DT
    gravity = np.asarray(jaxarm.inverse_dynamics(arm, np.zeros(n), np.zeros(n), np.zeros(n)))
    return gravity + 0.2 * np.abs(gravity).max() * np.stack([np.sin(2 * np.pi * (0.8 + 0.4 * j) * t) for j in range(n)], axis=1)


def _drive_error_and_contact(arm):
    """A log with the drive error DRIVE_ERROR from the start and an external torque CONTACT on
    joint 2 from step 150: inputs u (STEPS, n), the external torques (STEPS, n), noisy encoders
    (STEPS + 1, n) and link-side torque sensors (STEPS + 1, n, noise 0.05 N m) reading the drive's
    torque less its friction and rotor inertia (the last sample: the last step's)."""
    n = arm.n
    u = _inputs(arm)
    external = np.zeros((STEPS, n))
    external[150:, 1] = CONTACT
    xs, qdd, _, rng = _simulate(arm, lambda k, qd: u[k] + DRIVE_ERROR, 3, extra=external)
    fric = np.array([np.asarray(friction_torques(arm, x[n:])) for x in xs[:-1]])
    sensed = u + DRIVE_ERROR - fric - np.asarray(reflected_inertia(arm)) * qdd
    sensed = np.concatenate([sensed, sensed[-1:]])
    q = xs[:, :n] + POSITION_STD * rng.normal(size=(STEPS + 1, n))
    return u, external, q, sensed + 0.05 * rng.normal(size=(STEPS + 1, n))


def test_current_input_is_the_torque_input_through_the_torque_constant(arm):
    tau = _inputs(arm)
    xs, _, _, rng = _simulate(arm, lambda k, qd: tau[k], 0)
    z = xs[:, :arm.n] + POSITION_STD * rng.normal(size=(STEPS + 1, arm.n))
    gain = np.asarray(arm.drives.gear_ratio) * np.asarray(arm.drives.torque_constant)
    options = dict(dt=DT, q0=z[0], torque_std=TORQUE_STD, position_std=POSITION_STD)
    by_torque = jaxarm.extended_kalman_filter(arm, tau, z, **options)
    by_current = jaxarm.extended_kalman_filter(arm, tau / gain, z, input="current", **options)
    np.testing.assert_allclose(by_current.q, by_torque.q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(by_current.covariance, by_torque.covariance, rtol=1e-9, atol=1e-20)


@pytest.mark.parametrize("variant", ["extended", "unscented"])
def test_torque_sensors_tell_a_drive_error_from_an_external_torque(arm, variant):
    """A constant drive error on joints 1 and 3 from the start and an external torque on joint 2
    from step 150: with link-side torque sensors the filter attributes each to its source; with
    encoders alone the 'external' estimate is their sum."""
    n = arm.n
    u, external, q, sensed = _drive_error_and_contact(arm)
    drive_error = DRIVE_ERROR
    z = np.concatenate([q, sensed], axis=1)
    est = jaxarm.kalman_filter(arm, u, z, dt=DT, q0=z[0, :n], torque_std=TORQUE_STD, position_std=POSITION_STD,
                               measure=("q", "tau"), torque_sensor_std=0.05, external_std=5.0, actuator_std=1.0,
                               variant=variant)
    assert est.actuator.shape == (STEPS + 1, n) and est.std.shape == (STEPS + 1, 4 * n)
    tail = slice(-100, None)
    np.testing.assert_allclose(est.actuator[tail].mean(axis=0), drive_error, atol=0.1)
    np.testing.assert_allclose(est.external[tail].mean(axis=0), external[-1], atol=0.2)
    assert np.all(np.abs(est.external[60:140].mean(axis=0)) < 0.2)  # no external torque before it acts
    assert np.all(np.isfinite(est.nis)) and 0.7 < np.mean(est.nis[50:]) / (2 * n) < 1.3
    single = jaxarm.kalman_filter(arm, u, z, dt=DT, q0=z[0, :n], torque_std=TORQUE_STD, position_std=POSITION_STD,
                                  measure=("q", "tau"), torque_sensor_std=0.05, external_std=5.0, actuator_std=1.0,
                                  variant=variant, dtype=jnp.float32)
    assert np.all(np.isfinite(single.covariance)) and np.all(np.isfinite(single.actuator))
    np.testing.assert_allclose(single.actuator[tail].mean(axis=0), drive_error, atol=0.15)
    encoders = jaxarm.kalman_filter(arm, u, z[:, :n], dt=DT, q0=z[0, :n], torque_std=TORQUE_STD,
                                    position_std=POSITION_STD, external_std=5.0, variant=variant)
    np.testing.assert_allclose(encoders.external[tail].mean(axis=0), drive_error + external[-1], atol=0.2)
    assert encoders.actuator is None


def test_motor_currents_measure_the_velocity_under_voltage_input(arm):
    """Voltage input (Swartz eq 12) with current sensors (eq 11): the back-EMF makes the velocity
    estimate better than from the encoders alone, and the errors stay consistent with the
    covariance (NEES within its chi-square bounds over Monte Carlo runs)."""
    n = arm.n
    dr = arm.drives
    G, Kt, R = (np.asarray(v) for v in (dr.gear_ratio, dr.torque_constant, dr.resistance))
    V = np.asarray(jaxarm.motor_voltage(arm, np.zeros(n), np.zeros(n)))[None] + R / (G * Kt) * _inputs(arm)
    current_std = 1e-3  # A: a 12-bit converter over +-2 A has a 1 mA step
    runs, nees, err_i, err_q = 6, [], [], []
    for seed in range(runs):
        xs, _, _, rng = _simulate(arm, lambda k, qd: np.asarray(jaxarm.motor_torque(arm, V[k], qd)), 10 + seed)
        qd_at = np.concatenate([xs[:-1, n:], xs[-1:, n:]])
        V_at = np.concatenate([V, V[-1:]])
        i = (V_at - Kt * G * qd_at) / R + current_std * rng.normal(size=(STEPS + 1, n))
        q = xs[:, :n] + POSITION_STD * rng.normal(size=(STEPS + 1, n))
        options = dict(dt=DT, q0=q[0], torque_std=TORQUE_STD, position_std=POSITION_STD, input="voltage",
                       initial_std=np.r_[np.full(n, 3 * POSITION_STD), np.full(n, 0.05)])
        both = jaxarm.extended_kalman_filter(arm, V, np.concatenate([q, i], axis=1), measure=("q", "current"),
                                             current_std=current_std, **options)
        alone = jaxarm.extended_kalman_filter(arm, V, q, **options)
        e = xs - np.concatenate([both.q, both.qd], axis=1)
        nees.append(np.einsum("ki,kij,kj->k", e, np.linalg.inv(both.covariance), e))
        err_i.append(np.sqrt(np.mean((both.qd[50:] - xs[50:, n:]) ** 2)))
        err_q.append(np.sqrt(np.mean((alone.qd[50:] - xs[50:, n:]) ** 2)))
    mean_nees = np.mean(nees, axis=0)[20:]
    lo, hi = stats.chi2.ppf([0.005, 0.995], runs * 2 * n) / runs
    assert np.mean((mean_nees > lo) & (mean_nees < hi)) > 0.85, mean_nees.mean()
    assert np.mean(err_i) < 0.8 * np.mean(err_q), (np.mean(err_i), np.mean(err_q))


def test_sensor_options_are_checked(arm):
    n = arm.n
    u, z = np.zeros((9, n)), np.zeros((10, 2 * n))
    base = dict(dt=DT, q0=np.zeros(n))
    with pytest.raises(ValueError, match="torque_sensor_std: required"):
        jaxarm.kalman_filter(arm, u, z, measure=("q", "tau"), **base)
    with pytest.raises(ValueError, match="motor currents are a measurement under voltage input"):
        jaxarm.kalman_filter(arm, u, z, measure=("q", "current"), current_std=0.1, **base)
    with pytest.raises(ValueError, match="encoders 'q' among"):
        jaxarm.kalman_filter(arm, u, z[:, :n], measure=("tau",), torque_sensor_std=0.1, **base)
    with pytest.raises(ValueError, match="input: expected one of"):
        jaxarm.kalman_filter(arm, u, z[:, :n], input="pwm", **base)
    with pytest.raises(ValueError, match="actuator_std: the drives' torque errors"):
        jaxarm.kalman_filter(arm, u, z[:, :n], actuator_std=1.0, **base)
    no_motor = jaxarm.load_arm("two_link_planar")
    with pytest.raises(ValueError, match="torque_constant and resistance must be > 0"):
        jaxarm.kalman_filter(no_motor, np.zeros((9, 2)), np.zeros((10, 2)), input="current", dt=DT, q0=np.zeros(2))


def test_estimate_command_reads_currents_torque_sensors_and_a_payload(arm, tmp_path, capsys):
    """jaxarm estimate --input current --torque-sensor-std: the drive error and the external torque
    of the library test above, each recovered from a log of encoders, motor currents and link-side
    torque sensors; --payload-mass: a 1.5 kg point load found from a 0.5 kg start."""
    from jaxarm import cli
    from jaxarm.logs import Log

    n = arm.n
    u, external, q, sensed = _drive_error_and_contact(arm)
    drive_error = DRIVE_ERROR
    gain = np.asarray(arm.drives.gear_ratio) * np.asarray(arm.drives.torque_constant)
    t = np.arange(STEPS + 1) * DT
    log = Log(t=t, q=q, tau=sensed, I=np.vstack([u, u[-1:]]) / gain, source="sim")
    path = jaxarm.save_log(log, tmp_path / "log.npz")
    arm_file = jaxarm.save_arm(arm, tmp_path / "arm.toml")
    out = tmp_path / "est.npz"
    common = ["--arm", str(arm_file), "--position-std", str(POSITION_STD), "--torque-std", str(TORQUE_STD)]
    code = cli.main(["estimate", str(path), "--out", str(out), "--input", "current", "--torque-sensor-std", "0.05", *common])
    _, err = capsys.readouterr()
    assert code == 0, err
    with np.load(out) as r:
        np.testing.assert_allclose(r["drive_error"][-100:].mean(axis=0), drive_error, atol=0.1)
        np.testing.assert_allclose(r["external_kalman"][-100:].mean(axis=0), external[-1], atol=0.2)
        assert r["drive_error_std"].shape == (STEPS + 1, n) and np.all(r["drive_error_std"][-1] < 0.5)
        # the observer runs on the drives' torque plus the estimated drive error: it sees the contact only
        np.testing.assert_allclose(r["external_observer"][-50:].mean(axis=0), external[-1], atol=0.3)
    code = cli.main(["estimate", str(path), "--out", str(tmp_path / "x.npz"), "--torque-sensor-std", "0.05", *common])
    assert code == 2 and "--input current or voltage" in capsys.readouterr().err

    held = arm.with_payload(1.5)
    xs, _, _, rng = _simulate(held, lambda k, qd: u[k], 12)
    log = Log(t=t, q=xs[:, :n] + POSITION_STD * rng.normal(size=(STEPS + 1, n)), tau=np.vstack([u, u[-1:]]), source="sim")
    path = jaxarm.save_log(log, tmp_path / "payload.npz")
    code = cli.main(["estimate", str(path), "--out", str(out), "--payload-mass", "0.5", "--external-std", "0.1", "--force", *common])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    with np.load(out) as r:
        mass, std = r["payload_mass"][-1], r["payload_mass_std"][-1]
    assert abs(mass - 1.5) < 0.15 and abs(mass - 1.5) < 4 * std, (mass, std)
    assert "payload mass:" in stdout and "point mass at the tool frame" in err
