"""Output-error refinement (jaxarm.identify.output_error): on a log simulated at a fine step and
sampled like a real one, the simulation under the logged torques is right for the true arm,
refinement from a wrong arm brings the simulated motion and the torques back to the truth's,
several starts are refined at once and the best is kept, and bad input is refused."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from helpers import random_arm

import jaxarm
from jaxarm.identify.output_error import refine_output_error, simulation_error
from jaxarm.logs import Log

RATE = 500.0
FINE = 8  # simulation substeps per logged sample


@pytest.fixture(scope="module")
def truth_and_log():
    """A 2-joint arm with drive friction driven by smooth torques for 2 s: simulated at 4 kHz,
    logged at 500 Hz (q, dq, the torque at the sample times, and ddq from forward dynamics)."""
    truth = random_arm(3, "RR", drives=True)
    truth = truth.replace(drives=dataclasses.replace(truth.drives, coulomb_velocity_scale=np.full(2, 0.05)))
    samples = 1000
    dt = 1.0 / (RATE * FINE)
    t_fine = np.arange(samples * FINE) * dt
    q0 = np.zeros(2)
    gravity = np.asarray(jaxarm.inverse_dynamics(truth, q0, np.zeros(2), np.zeros(2)))
    wave = np.stack([1.5 * np.sin(2 * np.pi * 0.7 * t_fine) + 0.8 * np.sin(2 * np.pi * 1.9 * t_fine + 1.0),
                     1.0 * np.sin(2 * np.pi * 1.1 * t_fine + 0.3)], axis=1)
    tau_fine = gravity + wave * np.abs(gravity).max() * 0.3
    traj = jaxarm.rollout(truth, q0, np.zeros(2), tau_fine, dt, method="rk4", saturate=False)
    q, dq = np.asarray(traj.q)[:-1:FINE], np.asarray(traj.qd)[:-1:FINE]
    tau = tau_fine[::FINE]
    ddq = np.asarray(jax.vmap(jaxarm.forward_dynamics, (None, 0, 0, 0))(truth, q, dq, tau))
    return truth, Log(t=t_fine[::FINE], q=q, dq=dq, ddq=ddq, tau=tau, source="simulated")


def test_true_arm_simulates_the_log(truth_and_log):
    truth, log = truth_and_log
    err = simulation_error(truth, log, window=0.1)
    assert np.all(err < 2e-6), err  # RK3 at 2 ms under a mid-step held torque: tiny, not zero
    wrong = truth.replace(links=dataclasses.replace(truth.links, mass=np.asarray(truth.links.mass) * 1.5))
    assert np.all(simulation_error(wrong, log, window=0.1) > 50 * err)


def test_refinement_recovers_the_motion_and_the_torques(truth_and_log):
    truth, log = truth_and_log
    links = truth.links
    wrong = truth.replace(links=dataclasses.replace(links, mass=np.asarray(links.mass) * np.array([1.15, 0.85])),
                          drives=dataclasses.replace(truth.drives, viscous_friction=np.asarray(truth.drives.viscous_friction) * 1.5))
    fit = refine_output_error(wrong, log, window=0.1, iterations=20)
    assert fit.best == 0 and fit.windows == 19 and fit.window_steps == 50
    assert np.all(fit.position_rmse < 0.01 * fit.position_rmse_start), (fit.position_rmse, fit.position_rmse_start)
    assert np.all(fit.torque_rmse < 0.01 * fit.torque_rmse_start), (fit.torque_rmse, fit.torque_rmse_start)
    report = jaxarm.consistency_report(fit.arm, drives=True)
    assert all(r.ok for r in report.values())
    # on every sample of the log (not only the windows' samples) it predicts the truth's torques
    ours, theirs, start = (jaxarm.predict_torques(a, log.q, log.dq, log.ddq) for a in (fit.arm, truth, wrong))
    assert np.max(np.abs(ours - theirs)) < 0.03 * np.max(np.abs(start - theirs))
    # several starts at once: the true arm as a second start ends with the lowest cost and is kept
    both = refine_output_error(wrong, log, window=0.1, iterations=3, starts=(truth,))
    assert both.best == 1 and both.cost.shape == (2,) and both.cost[1] < both.cost[0]
    assert set(both.report()) >= {"position_rmse", "torque_rmse", "cost", "best", "message"}


def test_bad_input_is_refused(truth_and_log):
    truth, log = truth_and_log
    with pytest.raises(jaxarm.IdentificationError, match="preprocessed"):
        refine_output_error(truth, Log(t=log.t, q=log.q, tau=log.tau))
    with pytest.raises(jaxarm.IdentificationError, match="shorter than one window"):
        refine_output_error(truth, log, window=5.0)
    with pytest.raises(ValueError, match="torque_weight"):
        refine_output_error(truth, log, torque_weight=-1.0)
    with pytest.raises(ValueError, match="starts"):
        refine_output_error(truth, log, starts=(jaxarm.load_arm("two_link_planar").replace(name="x"), "y"))
