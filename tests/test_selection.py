"""Choosing the filter cutoff and the Coulomb shape from a log (jaxarm.identify.selection): blocked
cross-validation in time picks no filter for a clean log, a low-pass for a noisy one, and the
friction shape that generated the data."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import random_arm

import jaxarm
from jaxarm.identify.fit import predict_torques
from jaxarm.identify.linear_model import IdentificationError
from jaxarm.identify.selection import STRIBECK_VELOCITIES, select_preprocessing, with_coulomb_scale, with_friction_model
from jaxarm.logs import Log

RATE = 500.0


def _log(arm, seconds=8.0, *, velocity_noise=0.0, torque_noise=0.0, seed=0):
    """Sum-of-sines motion of every joint; torques from the arm, with white sensor noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds, 1.0 / RATE)
    w = 2 * np.pi * np.array([0.3, 0.7, 1.3])
    a = rng.uniform(0.3, 0.8, (arm.n, 3)) / np.arange(1, 4)
    phase = rng.uniform(0, 2 * np.pi, (arm.n, 3))
    arg = t[:, None, None] * w + phase
    q = np.sum(a * np.sin(arg), axis=-1)
    qd = np.sum(a * w * np.cos(arg), axis=-1)
    qdd = np.sum(-a * w**2 * np.sin(arg), axis=-1)
    tau = np.asarray(predict_torques(arm, q, qd, qdd))
    dq = qd + velocity_noise * rng.normal(size=qd.shape)
    tau = tau + torque_noise * np.std(tau, axis=0) * rng.normal(size=tau.shape)
    return Log(t=t, q=q, dq=dq, tau=tau, source="synthetic")


@pytest.fixture(scope="module")
def arm():
    return random_arm(5, "RR", drives=True)


def test_clean_log_needs_no_filter(arm):
    choice = select_preprocessing(arm, _log(arm))
    assert choice.cutoff is None, choice.reason()
    assert np.all(choice.coulomb_scales == 0.0)  # the data's friction switches exactly at qd = 0
    # the linear model explains clean data up to the central differences' O(h^2) error in ddq
    assert choice.best.score < 1e-4
    assert choice.best.score < 0.1 * min(c.score for c in choice.candidates if c.cutoff is not None)
    assert "no filter" in choice.reason()


def test_noisy_velocities_get_a_low_pass(arm):
    choice = select_preprocessing(arm, _log(arm, velocity_noise=0.05, torque_noise=0.02))
    assert choice.cutoff is not None and choice.cutoff <= 15.0, choice.reason()
    unfiltered = min(c.score for c in choice.candidates if c.cutoff is None)
    assert choice.best.score < 0.8 * unfiltered
    table = choice.table()
    assert sum(row["best_score"] for row in table) == 1 and len(table) == len(choice.candidates)
    # every joint took exactly one Coulomb shape, at the chosen cutoff
    taken = sorted(j for row in table for j in row["chosen_for_joints"])
    assert taken == [1, 2] and all(row["cutoff_hz"] == choice.cutoff for row in table if row["chosen_for_joints"])
    # each joint's model is within the tolerance of that joint's lowest error at the chosen cutoff
    lowest = [min(c.rmse[j] for c in choice.candidates if c.cutoff == choice.cutoff) for j in range(2)]
    assert np.all(choice.per_joint_rmse <= (1 + choice.tolerance) * np.array(lowest))
    assert {row["stribeck_velocity"] for row in table} == set(STRIBECK_VELOCITIES)


def test_smooth_friction_is_recognized(arm):
    smooth = with_coulomb_scale(arm, 0.1)
    choice = select_preprocessing(smooth, _log(smooth))
    # the arm handed in has exact-sign Coulomb friction; the data's smooth shape wins anyway
    exact = select_preprocessing(arm, _log(smooth))
    assert np.all(exact.coulomb_scales > 0) and np.all(choice.coulomb_scales > 0)
    assert exact.best.score < min(c.score for c in exact.candidates if c.coulomb_scale == 0.0)


def test_stribeck_friction_is_recognized_per_joint(arm):
    """Joint 1 has a Stribeck dip (static level 3x its Coulomb level, vs = 0.05 rad/s), joint 2
    none: the selection gives joint 1 a Stribeck term near the true velocity and joint 2 none
    (simplest model within 1 %), and fit_consistent then recovers joint 1's static level."""
    G = np.abs(np.asarray(arm.drives.gear_ratio))
    tc = np.abs(np.asarray(arm.drives.coulomb_friction)).mean(axis=1)
    stribeck = arm.replace(drives=dataclasses.replace(arm.drives, static_friction=np.array([3.0 * tc[0], 0.0]),
                                                      stribeck_velocity=np.array([0.05, 0.0])))
    log = _log(stribeck, seconds=12.0)
    choice = select_preprocessing(arm, log)
    assert choice.stribeck_velocities[0] == 0.05 and choice.stribeck_velocities[1] == 0.0, choice.reason()
    assert "Stribeck 0.05" in choice.reason()
    none = [c for c in choice.candidates if c.cutoff == choice.cutoff and c.stribeck_velocity == 0.0]
    assert choice.per_joint_rmse[0] < 0.5 * min(c.rmse[0] for c in none)  # the dip is what the others miss
    # the arm handed to the fit: Stribeck velocity from the choice, static level to be fitted
    start = with_friction_model(arm, choice.coulomb_scales, choice.stribeck_velocities)
    assert np.all(np.asarray(start.drives.static_friction) == 0.0)
    pre = jaxarm.preprocess_log(log, cutoff=choice.cutoff)
    fit = jaxarm.fit_consistent(start, pre.q, pre.dq, pre.ddq, pre.tau, regularization=0.0, max_steps=400)
    np.testing.assert_allclose(float(fit.arm.drives.static_friction[0]) * G[0], 3.0 * tc[0] * G[0], rtol=2e-2)
    assert float(fit.arm.drives.static_friction[1]) == 0.0


def test_too_short_or_without_torques_is_refused(arm):
    with pytest.raises(IdentificationError, match="too short"):
        select_preprocessing(arm, _log(arm, seconds=0.1))
    log = _log(arm)
    with pytest.raises(IdentificationError, match="torques"):
        select_preprocessing(arm, Log(t=log.t, q=log.q, dq=log.dq))
    with pytest.raises(ValueError, match="folds"):
        select_preprocessing(arm, log, folds=1)


def test_regularization_weight_is_chosen_by_validation():
    """A clean log of a known arm from a wrong prior: the weight is chosen among the candidates by
    blocked cross-validation in time; a large pull towards the wrong prior validates
    worse than a small one, so it is not chosen; the rule prefers the largest weight within the
    tolerance of the lowest error."""
    from jaxarm.identify.selection import select_regularization

    truth = random_arm(5, "RR", drives=True)
    rng = np.random.default_rng(0)
    t = np.arange(0.0, 4.0, 1 / 200)
    w = 2 * np.pi * np.array([[0.4, 0.9], [0.7, 1.3]])
    q = np.stack([0.6 * np.sin(w[j, 0] * t) + 0.3 * np.sin(w[j, 1] * t + j) for j in range(2)], axis=1)
    qd = np.stack([0.6 * w[j, 0] * np.cos(w[j, 0] * t) + 0.3 * w[j, 1] * np.cos(w[j, 1] * t + j) for j in range(2)], axis=1)
    qdd = np.stack([-0.6 * w[j, 0] ** 2 * np.sin(w[j, 0] * t) - 0.3 * w[j, 1] ** 2 * np.sin(w[j, 1] * t + j) for j in range(2)], axis=1)
    tau = np.asarray(jaxarm.predict_torques(truth, q, qd, qdd)) + 0.01 * rng.normal(size=q.shape)
    log = Log(t=t, q=q, dq=qd, ddq=qdd, tau=tau, source="clean")
    prior = truth.replace(links=dataclasses.replace(truth.links, mass=np.asarray(truth.links.mass) * 1.5))
    choice = select_regularization(prior, log, weights=(1e-4, 1e-2, 10.0), max_steps=100)
    scores = {r["weight"]: r["score"] for r in choice.rows}
    assert scores[10.0] > 2 * min(scores.values())  # pulled to the wrong prior: worse on held-out data
    assert choice.weight != 10.0
    lowest = min(scores.values())
    assert choice.weight == max(w for w, s in scores.items() if s <= 1.01 * lowest)
    assert "chosen by 3-fold blocked cross-validation in time" in choice.reason()
    # one held-out block at the end (folds=1) agrees here, and says so
    single = select_regularization(prior, log, weights=(1e-4, 1e-2, 10.0), max_steps=100, folds=1)
    assert single.weight == choice.weight and "validation on the last" in single.reason()
    with pytest.raises(ValueError, match="folds"):
        select_regularization(prior, log, folds=0)
    with pytest.raises(ValueError, match="holdout"):
        select_regularization(prior, log, holdout=1.5)
    with pytest.raises(ValueError, match="frictions"):
        select_regularization(prior, log, frictions=("stribeck",))
