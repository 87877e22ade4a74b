"""Payload identification (jaxarm.identify.payload): the rigid-body map from tool to link frame
agrees with the arm's own way of holding a payload, a known load is recovered from a noisy log of
the Panda (mass within 2 %, COM within 5 mm), the difference of two logs cancels a wrong arm
model that the single-log fit cannot, and a log without a payload is said to have none."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jaxarm
from jaxarm.identify.payload import identify_payload, payload_to_link
from jaxarm.logs import Log

PAYLOAD = dict(mass=2.0, com=np.array([0.01, -0.02, 0.08]), inertia=np.diag([0.004, 0.005, 0.003]))


def _log(arm, seed=0, seconds=8.0, noise=0.05):
    """A multi-sine motion of every joint at 200 Hz with exact derivatives and noisy torques."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds, 1 / 200)
    n = arm.n
    w = 2 * np.pi * rng.uniform(0.2, 0.8, (3, n))
    a = rng.uniform(0.2, 0.5, (3, n)) / 2
    ph = rng.uniform(0, 2 * np.pi, (3, n))
    arg = w[:, None, :] * t[None, :, None] + ph[:, None, :]
    mid = np.mean(np.asarray(arm.limits.position), axis=1)
    q = mid + np.sum(a[:, None, :] * np.sin(arg), axis=0)
    dq = np.sum(a[:, None, :] * w[:, None, :] * np.cos(arg), axis=0)
    ddq = -np.sum(a[:, None, :] * w[:, None, :] ** 2 * np.sin(arg), axis=0)
    tau = jaxarm.predict_torques(arm, q, dq, ddq)
    return Log(t=t, q=q, dq=dq, ddq=ddq, tau=tau + noise * rng.normal(size=tau.shape), source="simulated")


def test_payload_map_matches_the_arm_holding_it():
    """Torques of the arm holding the payload minus the empty arm's equal the last link's regressor
    columns times the mapped parameters (an independent route: jaxarm's body model)."""
    arm = jaxarm.load_arm("panda")
    held = arm.with_payload(**PAYLOAD)
    m, c, I = PAYLOAD["mass"], PAYLOAD["com"], PAYLOAD["inertia"]
    I_o = I + m * ((c @ c) * np.eye(3) - np.outer(c, c))
    pi_p = np.concatenate([[m], m * c, I_o[[0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]])
    rng = np.random.default_rng(3)
    q, qd, qdd = rng.uniform(-1, 1, (3, 20, arm.n))
    Y = np.asarray(jaxarm.regressor(arm, q, qd, qdd, drives=False))[:, :, -10:]
    ours = Y @ payload_to_link(np.asarray(arm.tool), pi_p)
    theirs = jaxarm.predict_torques(held, q, qd, qdd) - jaxarm.predict_torques(arm, q, qd, qdd)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-9)


def test_known_payload_is_recovered():
    arm = jaxarm.load_arm("panda")
    res = identify_payload(arm, _log(arm.with_payload(**PAYLOAD)))
    assert abs(res.mass - PAYLOAD["mass"]) < 0.02 * PAYLOAD["mass"], res.mass
    assert np.linalg.norm(res.com - PAYLOAD["com"]) < 5e-3, res.com
    assert res.consistent and not res.repaired
    assert np.all(res.rmse < res.rmse_without)
    # the reported standard deviations describe the actual errors (within 4 sigma)
    assert abs(res.mass - PAYLOAD["mass"]) < 4 * res.std[0]
    assert np.all(np.abs(res.com - PAYLOAD["com"]) < 4 * res.com_std + 1e-9)
    again = arm.with_payload(res.mass, res.com, res.inertia)  # what with_payload accepts
    assert float(again.payload.mass) == res.mass


def test_difference_of_two_logs_cancels_a_wrong_arm_model():
    """The true arm's links are 10 % heavier than the model's and it has friction the model lacks:
    fitted alone, that error lands in the payload; the difference with a log of the same motion
    without the payload removes it."""
    model = jaxarm.load_arm("panda")
    truth = model.replace(links=dataclasses.replace(model.links, mass=np.asarray(model.links.mass) * 1.1),
                          drives=dataclasses.replace(model.drives, viscous_friction=np.full(model.n, 0.5)))
    with_load = _log(truth.with_payload(**PAYLOAD), seed=1)
    without = _log(truth, seed=1)  # same motion; the noise draws are the same too, as on a real robot they are not
    without = Log(t=without.t, q=without.q, dq=without.dq, ddq=without.ddq,
                  tau=without.tau + 0.05 * np.random.default_rng(9).normal(size=without.tau.shape))
    alone = identify_payload(model, with_load)
    both = identify_payload(model, with_load, baseline=without)
    assert abs(alone.mass - PAYLOAD["mass"]) > 0.1 * PAYLOAD["mass"]  # the model error is in there
    assert abs(both.mass - PAYLOAD["mass"]) < 0.02 * PAYLOAD["mass"], both.mass
    assert np.linalg.norm(both.com - PAYLOAD["com"]) < 5e-3, both.com
    assert "difference" in both.method


def test_no_payload_and_bad_input():
    arm = jaxarm.load_arm("panda")
    log = _log(arm, noise=0.0)
    with pytest.raises(jaxarm.IdentificationError, match="no payload"):
        identify_payload(arm, log)
    with pytest.raises(jaxarm.IdentificationError, match="same motion"):
        identify_payload(arm, log, baseline=Log(t=log.t[:-5], q=log.q[:-5], tau=log.tau[:-5]))


def test_identify_payload_command(tmp_path, capsys):
    """The command reads a log, writes the arm holding the identified payload and a report, and a
    log without a payload is refused with nothing written."""
    import json

    from jaxarm import cli

    arm = jaxarm.load_arm("panda")
    log = _log(arm.with_payload(**PAYLOAD), noise=0.02)
    path = jaxarm.save_log(log, tmp_path / "load.csv")
    out, report = tmp_path / "held.toml", tmp_path / "payload.json"
    code = cli.main(["identify-payload", str(path), "--arm", "panda", "--out", str(out), "--report", str(report), "--cutoff", "none"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    held = jaxarm.load_arm(out)
    assert abs(float(held.payload.mass) - PAYLOAD["mass"]) < 0.02 * PAYLOAD["mass"]
    assert np.linalg.norm(np.asarray(held.payload.com) - PAYLOAD["com"]) < 5e-3
    rep = json.loads(report.read_text())
    assert rep["consistent"] and len(rep["std"]) == 10 and "mass" in stdout
    empty = jaxarm.save_log(_log(arm, noise=0.02), tmp_path / "empty.csv")
    code = cli.main(["identify-payload", str(empty), "--arm", "panda", "--out", str(tmp_path / "x.toml"), "--cutoff", "none"])
    _, err = capsys.readouterr()
    assert code == 2 and "no payload" in err and not (tmp_path / "x.toml").exists()
