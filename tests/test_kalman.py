"""Extended Kalman filter (jaxarm.estimate.kalman) on simulated arms whose torque noise and
sensors match the filter's model: its errors are consistent with its covariance (normalized
estimation error squared within chi-square bounds over Monte Carlo runs, as are the innovations),
it beats differentiating the encoders for velocity, and the augmented filter recovers a constant
external torque."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_arm
from scipy import stats

import jaxarm
from jaxarm.estimate import extended_kalman_filter
from jaxarm.estimate.kalman import _transition

DT = 2e-3
STEPS = 400
TORQUE_STD = 0.2
POSITION_STD = 2e-4


@pytest.fixture(scope="module")
def arm():
    arm = random_arm(2, "RRR", drives=True)
    return arm.replace(drives=dataclasses.replace(arm.drives, coulomb_velocity_scale=np.full(arm.n, 0.05)))


def _truth(arm, seed, external=None, external_from=0):
    """States (STEPS + 1, 2n) of the arm under u + w (w ~ N(0, TORQUE_STD^2), and ``external``
    from step ``external_from``), the applied u (STEPS, n) and noisy position measurements."""
    rng = np.random.default_rng(seed)
    n = arm.n
    t = np.arange(STEPS) * DT
    gravity = np.asarray(jaxarm.inverse_dynamics(arm, np.zeros(n), np.zeros(n), np.zeros(n)))
    u = gravity + 0.2 * np.abs(gravity).max() * np.stack([np.sin(2 * np.pi * (0.8 + 0.4 * j) * t) for j in range(n)], axis=1)
    w = TORQUE_STD * rng.normal(size=u.shape)
    if external is not None:
        w[external_from:] += external
    step = jax.jit(lambda x, uu: _transition(arm, x, uu, DT, "rk3", False))
    xs = [np.zeros(2 * n)]
    for k in range(STEPS):
        xs.append(np.asarray(step(jnp.asarray(xs[-1]), jnp.asarray(u[k] + w[k]))))
    xs = np.array(xs)
    z = xs[:, :n] + POSITION_STD * rng.normal(size=(STEPS + 1, n))
    return xs, u, z


def test_errors_are_consistent_with_the_covariance(arm):
    n, runs = arm.n, 12
    nees, nis, vel_err, diff_err = [], [], [], []
    for seed in range(runs):
        xs, u, z = _truth(arm, seed)
        est = extended_kalman_filter(arm, u, z, dt=DT, q0=z[0], torque_std=TORQUE_STD, position_std=POSITION_STD,
                                     initial_std=np.r_[np.full(n, 3 * POSITION_STD), np.full(n, 0.05)])
        e = xs - np.concatenate([est.q, est.qd], axis=1)
        nees.append(np.einsum("ki,kij,kj->k", e, np.linalg.inv(est.covariance), e))
        nis.append(est.nis)
        vel_err.append(np.sqrt(np.mean((est.qd[50:] - xs[50:, n:]) ** 2)))
        diff_err.append(np.sqrt(np.mean((np.gradient(z[:, :], DT, axis=0)[50:] - xs[50:, n:]) ** 2)))
    mean_nees = np.mean(nees, axis=0)[20:]
    lo, hi = stats.chi2.ppf([0.005, 0.995], runs * 2 * n) / runs
    inside = np.mean((mean_nees > lo) & (mean_nees < hi))
    assert inside > 0.9, (inside, lo, hi, mean_nees.mean())
    assert abs(np.mean(nis) / n - 1) < 0.1  # innovations: chi-square with n degrees of freedom
    assert np.mean(vel_err) < 0.3 * np.mean(diff_err), (np.mean(vel_err), np.mean(diff_err))


def test_a_constant_external_torque_is_recovered(arm):
    n = arm.n
    external = np.array([1.5, -1.0, 0.6])
    xs, u, z = _truth(arm, 7, external=external, external_from=100)
    est = extended_kalman_filter(arm, u, z, dt=DT, q0=z[0], torque_std=TORQUE_STD, position_std=POSITION_STD, external_std=5.0)
    tail = est.external[-100:]
    assert np.all(np.abs(tail.mean(axis=0) - external) < 0.15 * np.abs(external).max()), tail.mean(axis=0)
    # before it acts: zero within the filter's own uncertainty
    assert np.all(np.abs(est.external[60:90].mean(axis=0)) < 3 * est.std[60:90, 2 * n:].mean(axis=0))
    assert np.all(np.abs(tail.mean(axis=0) - external) < 3 * est.std[-100:, 2 * n:].mean(axis=0))
    assert est.std.shape == (STEPS + 1, 3 * n)


def test_bad_input_is_refused(arm):
    n = arm.n
    z = np.zeros((10, n))
    with pytest.raises(ValueError, match="u: expected shape"):
        extended_kalman_filter(arm, np.zeros((10, n)), z, dt=DT, q0=np.zeros(n))
    with pytest.raises(ValueError, match="measure"):
        extended_kalman_filter(arm, np.zeros((9, n)), z, dt=DT, q0=np.zeros(n), measure=("tau",))
    with pytest.raises(ValueError, match="velocity_std"):
        extended_kalman_filter(arm, np.zeros((9, n)), np.zeros((10, 2 * n)), dt=DT, q0=np.zeros(n), measure=("q", "qd"))
    with pytest.raises(ValueError, match="torque_std"):
        extended_kalman_filter(arm, np.zeros((9, n)), z, dt=DT, q0=np.zeros(n), torque_std=-1.0)


def test_estimate_command(arm, tmp_path, capsys):
    """jaxarm estimate on a log with an external torque from step 250: writes the filtered states
    and both external-torque estimates; with thresholds from the contact-free start, the contact
    is detected after it begins and not before."""
    from jaxarm import cli
    from jaxarm.logs import Log

    n = arm.n
    external = np.array([0.0, 4.0, 0.0])
    xs, u, z = _truth(arm, 3, external=external, external_from=250)
    t = np.arange(STEPS + 1) * DT
    log = Log(t=t, q=z, tau=np.vstack([u, u[-1:]]), source="sim")
    path = jaxarm.save_log(log, tmp_path / "log.csv")
    arm_file = jaxarm.save_arm(arm, tmp_path / "arm.toml")
    out, plot = tmp_path / "est.npz", tmp_path / "est.png"
    code = cli.main(["estimate", str(path), "--arm", str(arm_file), "--out", str(out), "--plot", str(plot),
                     "--position-std", str(POSITION_STD), "--torque-std", str(TORQUE_STD), "--contact-free-until", "0.45"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with np.load(out) as r:
        assert r["q"].shape == (STEPS + 1, n) and r["external_kalman"].shape == (STEPS + 1, n)
        contact = r["contact"]
        assert not contact[:250].any() and contact[250:].any()
        first = np.flatnonzero(contact)[0]
        assert 250 <= first < 250 + 50, first
        np.testing.assert_allclose(r["external_observer"][-50:].mean(axis=0), external, atol=0.5)
        assert np.sqrt(np.mean((r["qd"][50:] - xs[50:, n:]) ** 2)) < 0.05
    assert "contact:" in stdout and "first at" in stdout
    code = cli.main(["estimate", str(path), "--arm", str(arm_file), "--out", str(out)])
    assert code == 2 and "already exists" in capsys.readouterr().err
    # without a contact-free interval: robust thresholds from the whole log still find a push that
    # covers a small part of it (the first 290 samples: the push is the last 40)
    short = jaxarm.save_log(Log(t=t[:290], q=z[:290], tau=np.vstack([u, u[-1:]])[:290], source="sim"), tmp_path / "short.csv")
    code = cli.main(["estimate", str(short), "--arm", str(arm_file), "--out", str(tmp_path / "robust.npz"),
                     "--position-std", str(POSITION_STD), "--torque-std", str(TORQUE_STD)])
    _, err = capsys.readouterr()
    assert code == 0 and "robust standard deviations" in err
    with np.load(tmp_path / "robust.npz") as r:
        hits = np.flatnonzero(r["contact"])
        assert hits.size and 250 <= hits[0] < 270, hits[:5]
        assert not r["contact"][:250].any() and np.mean(r["contact"][270:]) > 0.5


def test_smoother_and_online_payload_mass(arm):
    """The RTS smoother uses the whole log: its velocity error is below the filter's and its
    errors stay consistent with its covariance; augmented with a payload's mass as a parameter
    (joint state-parameter estimation), the filter finds a 1.5 kg load it was told might be 0.5 kg."""
    n = arm.n
    xs, u, z = _truth(arm, 11)
    kw = dict(dt=DT, q0=z[0], torque_std=TORQUE_STD, position_std=POSITION_STD,
              initial_std=np.r_[np.full(n, 3 * POSITION_STD), np.full(n, 0.05)])
    filt = extended_kalman_filter(arm, u, z, **kw)
    smooth = extended_kalman_filter(arm, u, z, smooth=True, **kw)
    err = lambda est: np.sqrt(np.mean((est.qd[20:-20] - xs[20:-20, n:]) ** 2))  # noqa: E731
    assert smooth.smoothed and err(smooth) < 0.8 * err(filt), (err(smooth), err(filt))
    e = xs - np.concatenate([smooth.q, smooth.qd], axis=1)
    nees = np.einsum("ki,kij,kj->k", e, np.linalg.inv(smooth.covariance), e)[20:-20]
    assert 0.5 * 2 * n < nees.mean() < 1.5 * 2 * n, nees.mean()

    com = np.array([0.0, 0.0, 0.05])
    held = arm.replace(payload=jaxarm.Payload(mass=np.asarray(1.5), com=com, inertia=np.zeros((3, 3))))
    xs, u, z = _truth(held, 12)

    def with_mass(a, theta):
        return a.replace(payload=jaxarm.Payload(mass=theta[0], com=jnp.asarray(com), inertia=jnp.zeros((3, 3))))

    est = extended_kalman_filter(arm, u, z, parameters=with_mass, theta0=[0.5], theta_std=[1.0], **kw)
    mass, std = est.parameters[-1, 0], est.std[-1, -1]
    assert abs(mass - 1.5) < 0.1 and abs(mass - 1.5) < 4 * std, (mass, std)
    with pytest.raises(ValueError, match="parameters"):
        extended_kalman_filter(arm, u, z, parameters=with_mass, theta0=None, theta_std=[1.0], **kw)


def test_end_stops_are_in_the_process_model(arm):
    """A joint that runs into its end stop (``jaxarm.rollout``'s rigid stops) is followed: the
    prediction goes through the same stops, and the estimate stays within the encoder noise with
    innovations of the right size. Without them (``stops=False``) the filter predicts the joint
    moving on and drifts far off, which is what the option is there for."""
    n = arm.n
    lim = np.array([[-0.3, 0.3]] * n)
    stopped = arm.replace(limits=dataclasses.replace(arm.limits, position=lim))
    rng = np.random.default_rng(3)
    t = np.arange(STEPS) * DT
    gravity = np.asarray(jaxarm.inverse_dynamics(arm, np.zeros(n), np.zeros(n), np.zeros(n)))
    u = gravity + 0.5 * np.abs(gravity).max() * np.stack([np.sin(2 * np.pi * (0.8 + 0.4 * j) * t) for j in range(n)], axis=1)
    traj = jaxarm.rollout(stopped, np.zeros(n), np.zeros(n), u, DT)
    assert np.asarray(traj.stop_steps).max() > 20, traj.stop_steps  # a joint spends a while on its stop
    z = np.asarray(traj.q) + POSITION_STD * rng.normal(size=traj.q.shape)
    options = dict(dt=DT, q0=z[0], torque_std=TORQUE_STD, position_std=POSITION_STD)
    est = extended_kalman_filter(stopped, u, z, **options)
    assert np.abs(est.q - traj.q).max() < 5 * POSITION_STD
    assert 0.5 < np.mean(est.nis) / n < 2.0, np.mean(est.nis) / n  # chi-square with n degrees of freedom on average
    free = extended_kalman_filter(stopped, u, z, stops=False, **options)
    assert np.abs(free.q - traj.q).max() > 50 * POSITION_STD
    assert np.mean(free.nis) / n > 10
    with pytest.raises(ValueError, match="stops"):
        extended_kalman_filter(stopped, u, z, stops="yes", **options)
