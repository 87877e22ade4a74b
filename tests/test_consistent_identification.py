"""Physically consistent identification (jaxarm.consistent_identification): the log-Cholesky
maps, consistency of every parameter vector they produce, and fits on noiseless synthetic data
from a small arm (random states, so every parameter the torques depend on is excited)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_arm, random_inertia

from jaxarm import consistent_identification as ci
from jaxarm.consistency import check_link, pseudo_inertia
from jaxarm.identification import arm_with_parameters, predict_torques, standard_parameters

N_SAMPLES = 300  # one sample count for every fit: the compiled step is shared


def _link_from_pi(pi):
    """(m, c, I about the COM) from a standard 10-vector, independently of the module."""
    m = float(pi[0])
    c = np.asarray(pi[1:4]) / m
    xx, xy, xz, yy, yz, zz = np.asarray(pi[4:])
    I_o = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    return m, c, I_o - m * ((c @ c) * np.eye(3) - np.outer(c, c))


def _random_links(rng, k):
    """k consistent standard 10-vectors (mass, COM, rotated inertia; helpers.random_inertia)."""
    out = []
    for _ in range(k):
        m = rng.uniform(0.1, 10.0)
        c = rng.uniform(-0.5, 0.5, 3)
        I_c = random_inertia(rng, m, size=rng.uniform(0.05, 0.5))
        I_o = I_c + m * ((c @ c) * np.eye(3) - np.outer(c, c))
        out.append([m, *(m * c), I_o[0, 0], I_o[0, 1], I_o[0, 2], I_o[1, 1], I_o[1, 2], I_o[2, 2]])
    return np.asarray(out)


def _samples(arm, rng, N=N_SAMPLES, qd_scale=2.0):
    q = rng.uniform(-np.pi, np.pi, (N, arm.n))
    qd = rng.uniform(-qd_scale, qd_scale, (N, arm.n))
    qdd = rng.uniform(-5.0, 5.0, (N, arm.n))
    return q, qd, qdd, predict_torques(arm, q, qd, qdd)


# ----------------------------------------------------------------------------------------------
# The maps


def test_parameters_round_trip_through_log_cholesky():
    rng = np.random.default_rng(0)
    pi = _random_links(rng, 50)
    theta = ci.parameters_to_log_cholesky(pi)
    back = np.asarray(ci.log_cholesky_to_parameters(theta))
    np.testing.assert_allclose(back, pi, rtol=1e-10, atol=1e-12 * np.abs(pi).max())
    # and the other way: theta -> pi -> theta
    theta = rng.normal(size=(50, 10))
    again = ci.parameters_to_log_cholesky(np.asarray(ci.log_cholesky_to_parameters(theta)))
    np.testing.assert_allclose(again, theta, atol=1e-8)


def test_every_theta_is_a_consistent_body():
    rng = np.random.default_rng(1)
    theta = np.concatenate(
        [rng.uniform(-3, 3, (200, 1)), rng.uniform(-4, 2, (200, 3)), rng.normal(scale=2.0, size=(200, 3)),
         rng.normal(scale=0.5, size=(200, 3))], axis=1)
    pis = np.asarray(ci.log_cholesky_to_parameters(theta))
    Js = np.asarray(ci.log_cholesky_to_pseudo_inertia(theta))
    for pi, J in zip(pis, Js):
        m, c, I_c = _link_from_pi(pi)
        report = check_link(m, c, I_c)
        assert report.ok, report.problems
        # the factor's J is the pseudo-inertia of the body it describes (independent formula)
        np.testing.assert_allclose(J, pseudo_inertia(m, c, I_c), rtol=1e-9, atol=1e-12 * np.abs(J).max())
        assert np.linalg.eigvalsh(J).min() > 0
    # t is the centre of mass
    np.testing.assert_allclose(pis[:, 1:4] / pis[:, :1], theta[:, 7:], rtol=1e-12, atol=1e-14)


def test_semidefinite_prior_is_nudged_with_a_warning_and_inconsistent_one_refused():
    m, c = 2.0, np.array([0.1, -0.2, 0.3])
    point = np.array([m, *(m * c), *np.zeros(6)])
    I_o = m * ((c @ c) * np.eye(3) - np.outer(c, c))  # a point mass: J has rank 1
    point[4:] = [I_o[0, 0], I_o[0, 1], I_o[0, 2], I_o[1, 1], I_o[1, 2], I_o[2, 2]]
    with pytest.warns(ci.PriorNudgedWarning, match="second moments"):
        theta = ci.parameters_to_log_cholesky(point, label="link 3")
    back = np.asarray(ci.log_cholesky_to_parameters(theta))
    np.testing.assert_allclose(back[:4], point[:4], rtol=1e-12)  # mass and COM unchanged
    np.testing.assert_allclose(back, point, atol=1e-5 * np.abs(point).max())

    bad = _random_links(np.random.default_rng(2), 1)[0]
    m, c, I_c = _link_from_pi(bad)
    I_c = np.diag([1.0, 0.1, 0.1])  # violates I2 + I3 >= I1
    I_o = I_c + m * ((c @ c) * np.eye(3) - np.outer(c, c))
    bad[4:] = [I_o[0, 0], I_o[0, 1], I_o[0, 2], I_o[1, 1], I_o[1, 2], I_o[2, 2]]
    with pytest.raises(ValueError, match="link 7.*triangle"):
        ci.parameters_to_log_cholesky(bad, label="link 7")
    with pytest.warns(ci.PriorNudgedWarning, match="physically inconsistent, repaired"):
        theta = ci.parameters_to_log_cholesky(bad, repair=True)
    assert check_link(*_link_from_pi(np.asarray(ci.log_cholesky_to_parameters(theta)))).ok
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 10\)"):
        ci.parameters_to_log_cholesky(np.zeros(9))


def test_com_bounds_maps_are_inverse_and_inside():
    rng = np.random.default_rng(3)
    box = ci._check_bounds(ci.ComBox(lower=[[-0.1, -0.2, -np.inf]] * 2, upper=[[0.1, 0.2, np.inf]] * 2), 2)
    sphere = ci._check_bounds(ci.ComSphere(center=[[0.0, 0.1, 0.0]] * 2, radius=[0.2, np.inf]), 2)
    for bounds in (box, sphere):
        kind, arrays = ci._bound_arrays(bounds)
        z = rng.normal(scale=3.0, size=(2, 3))
        c = np.asarray(ci._com_from_free(jnp.asarray(z), kind, arrays))
        np.testing.assert_allclose(ci._free_from_com(c, bounds), z, rtol=1e-6, atol=1e-6)
    z = rng.normal(scale=4.0, size=(1000, 2, 3))
    c = np.asarray(ci._com_from_free(jnp.asarray(z), *ci._bound_arrays(box)))
    assert np.all(np.abs(c[..., 0]) < 0.1) and np.all(np.abs(c[..., 1]) < 0.2)
    np.testing.assert_array_equal(c[..., 2], z[..., 2])
    c = np.asarray(ci._com_from_free(jnp.asarray(z), *ci._bound_arrays(sphere)))
    assert np.all(np.linalg.norm(c[:, 0] - [0.0, 0.1, 0.0], axis=-1) < 0.2)
    with pytest.raises(ValueError, match="link 1.*not strictly inside"):
        ci._free_from_com(np.array([[0.5, 0, 0], [0, 0, 0]]), box)


# ----------------------------------------------------------------------------------------------
# Fits on synthetic data


@pytest.fixture(scope="module")
def truth():
    arm = random_arm(4, "RR", drives=False)
    n = arm.n
    pi = np.array(standard_parameters(arm))
    pi[10 * n:] = np.stack([[0.05, 0.02], [0.3, 0.1], [0.4, 0.2], [0.05, -0.1]], axis=1).reshape(-1)  # Ia, fv, fc, fo
    return arm_with_parameters(arm, pi)


def _perturbed(arm, rng, scale=0.3):
    n = arm.n
    pi = np.array(standard_parameters(arm))
    theta = ci.parameters_to_log_cholesky(pi[: 10 * n].reshape(n, 10))
    links = np.asarray(ci.log_cholesky_to_parameters(theta + scale * rng.normal(size=theta.shape)))
    drives = pi[10 * n:] * rng.uniform(0.5, 1.5, 4 * n)
    return arm_with_parameters(arm, jnp.asarray(np.concatenate([links.reshape(-1), drives])))


def test_recovers_a_known_arm_from_noiseless_data(truth):
    rng = np.random.default_rng(5)
    q, qd, qdd, tau = _samples(truth, rng)
    start = _perturbed(truth, rng)
    # no regularization: the default prior is the (wrong) start, which would bias the fit
    fit = ci.fit_consistent(start, q, qd, qdd, tau, regularization=0.0, max_steps=600, tol=1e-15, memory_size=40)
    assert all(r.ok for r in fit.consistency.values())
    scale = np.sqrt(np.mean(tau**2, axis=0))
    assert np.all(fit.rmse < 1e-4 * scale), (fit.rmse, fit.message)
    assert np.all(fit.rmse_prior > 0.05 * scale)  # the start was far off
    # the dynamics are recovered: torques on fresh states agree
    q2, qd2, qdd2, tau2 = _samples(truth, np.random.default_rng(6))
    err = predict_torques(fit.arm, q2, qd2, qdd2) - tau2
    assert np.sqrt(np.mean(err**2)) < 1e-4 * np.sqrt(np.mean(tau2**2))
    # drive parameters are identifiable here (random states), except Ia1: joint 1's rotor inertia
    # only shows in its sum with link 1's inertia about the same axis
    n = truth.n
    np.testing.assert_allclose(fit.parameters[10 * n + 1:], np.asarray(standard_parameters(truth))[10 * n + 1:], rtol=1e-3, atol=1e-5)
    assert fit.loss_history[-1] < 1e-6 * fit.loss_history[0]
    assert np.all(np.diff(fit.loss_history[:-1]) <= 1e-12 * fit.loss_history[0])  # L-BFGS + zoom: monotone


def test_regularization_pulls_unidentifiable_parameters_to_the_prior(truth):
    """Joint 1 turns about the vertical base z: link 1 only shows its inertia about that axis in
    the torques; its mass and COM are invisible and must come from the prior."""
    rng = np.random.default_rng(7)
    q, qd, qdd, tau = _samples(truth, rng)
    start = _perturbed(truth, rng, scale=0.2)
    m_true, m_start = float(truth.links.mass[0]), float(start.links.mass[0])
    assert abs(m_start - m_true) > 0.05 * m_true
    free = ci.fit_consistent(start, q, qd, qdd, tau, regularization=0.0, max_steps=300)
    pulled = ci.fit_consistent(start, q, qd, qdd, tau, prior=truth, regularization=1e-4, max_steps=300)
    for fit in (free, pulled):
        assert np.all(fit.rmse < 1e-3 * np.sqrt(np.mean(tau**2, axis=0))), fit.rmse
    err_free = abs(float(free.arm.links.mass[0]) - m_true)
    err_pulled = abs(float(pulled.arm.links.mass[0]) - m_true)
    assert err_free > 0.02 * m_true  # the data alone leave m1 where the optimizer wandered
    assert err_pulled < 1e-2 * err_free
    np.testing.assert_allclose(pulled.arm.links.com[0], truth.links.com[0], atol=1e-3)


def test_sigmoid_friction_recovered(truth):
    rng = np.random.default_rng(8)
    phi = np.array([[0.8, 9.0, 0.03], [0.5, 15.0, -0.02]])
    arm = truth.replace(drives=dataclasses.replace(truth.drives, sigmoid_friction=phi))
    n = arm.n
    pi = np.array(standard_parameters(arm))
    pi[10 * n:].reshape(n, 4)[:, 2] = 0.0  # no Coulomb term: the sigmoid replaces it
    arm = arm_with_parameters(arm, pi)
    q, qd, qdd, tau = _samples(arm, rng, qd_scale=0.6)
    start = arm.replace(drives=dataclasses.replace(arm.drives, sigmoid_friction=np.array([[0.4, 5.0, 0.0], [1.0, 5.0, 0.0]])))
    fit = ci.fit_consistent(start, q, qd, qdd, tau, friction="sigmoid", regularization=0.0, max_steps=600, tol=1e-15, memory_size=40)
    np.testing.assert_allclose(np.asarray(fit.arm.drives.sigmoid_friction), phi, rtol=2e-3, atol=2e-4)
    assert np.all(fit.rmse < 1e-4 * np.sqrt(np.mean(tau**2, axis=0)))
    # fc is held at the prior's value (zero) in sigmoid mode
    np.testing.assert_allclose(fit.parameters[10 * n:].reshape(n, 4)[:, 2], 0.0, atol=1e-15)


def test_stribeck_friction_recovered(truth):
    """Joints with a Stribeck velocity set get their static level fitted beside fc and fo: from a
    start without static friction the fit finds the true static levels and the true Coulomb
    levels (which the Stribeck term now modifies at low speed), to round-off on noiseless data."""
    rng = np.random.default_rng(11)
    G = np.abs(np.asarray(truth.drives.gear_ratio))
    Ts = np.array([0.9, 0.35]) / G  # motor side; joint side 0.9 and 0.35 N m, above fc + |fo|
    vs = np.array([0.05, 0.1])
    arm = truth.replace(drives=dataclasses.replace(truth.drives, static_friction=Ts, stribeck_velocity=vs))
    q, qd, qdd, tau = _samples(arm, rng, qd_scale=0.5)  # low speeds: the Stribeck dip is seen
    start = arm.replace(drives=dataclasses.replace(arm.drives, static_friction=np.zeros(2)))
    # the start misses the Stribeck term: it is far off at low speed
    assert np.max(np.abs(predict_torques(start, q, qd, qdd) - tau), axis=0).min() > 0.1
    fit = ci.fit_consistent(start, q, qd, qdd, tau, regularization=0.0, max_steps=600, tol=1e-15, memory_size=40)
    np.testing.assert_allclose(np.asarray(fit.arm.drives.static_friction), Ts, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(fit.arm.drives.stribeck_velocity), vs)  # held
    n = arm.n
    np.testing.assert_allclose(fit.parameters[10 * n:].reshape(n, 4)[:, 1:], np.asarray(standard_parameters(arm))[10 * n:].reshape(n, 4)[:, 1:],
                               rtol=1e-3, atol=1e-5)
    assert np.all(fit.rmse < 1e-4 * np.sqrt(np.mean(tau**2, axis=0))), fit.rmse
    assert all(r.ok for r in fit.consistency.values())
    # the sigmoid mode holds fc fixed, so it cannot carry a Stribeck term that depends on it
    with pytest.raises(ValueError, match="static_friction"):
        ci.fit_consistent(arm, q, qd, qdd, tau, friction="sigmoid", max_steps=1)


def test_com_box_is_respected_by_construction(truth):
    rng = np.random.default_rng(9)
    q, qd, qdd, tau = _samples(truth, rng)
    c = np.asarray(truth.links.com)
    # a box around the true COMs, but cutting link 2's x coordinate short of its true value
    lower, upper = c - 0.05, c + 0.05
    upper[1, 0] = c[1, 0] - 0.02
    lower[1, 0] = c[1, 0] - 0.06
    start = truth.replace(links=dataclasses.replace(truth.links, com=0.5 * (lower + upper)))
    fit = ci.fit_consistent(start, q, qd, qdd, tau, com_bounds=ci.ComBox(lower, upper), max_steps=200)
    com = np.asarray(fit.arm.links.com)
    # inside, up to round-off (the sigmoid may saturate onto a face; com = (m c) / m adds an ulp)
    assert np.all(com >= lower - 1e-12) and np.all(com <= upper + 1e-12)
    assert com[1, 0] > upper[1, 0] - 0.005  # pressed against the bound the data push towards
    assert all(r.ok for r in fit.consistency.values())


def test_bad_input_is_refused(truth):
    q, qd, qdd, tau = _samples(truth, np.random.default_rng(10), N=5)
    with pytest.raises(ValueError, match=r"tau: expected shape \(N, 2\)"):
        ci.fit_consistent(truth, q, qd, qdd, tau[:, :1])
    with pytest.raises(ValueError, match="same number of samples"):
        ci.fit_consistent(truth, q, qd, qdd, tau[:3])
    with pytest.raises(ValueError, match="friction"):
        ci.fit_consistent(truth, q, qd, qdd, tau, friction="stribeck")
    with pytest.raises(ValueError, match="joint_weights"):
        ci.fit_consistent(truth, q, qd, qdd, tau, joint_weights=[1.0, -1.0])
    bad = q.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="q: expected finite values, row 3"):
        ci.fit_consistent(truth, bad, qd, qdd, tau)
    with pytest.raises(TypeError, match="arm"):
        ci.fit_consistent("panda", q, qd, qdd, tau)
    with pytest.raises(ValueError, match="not strictly inside"):
        ci.fit_consistent(truth, q, qd, qdd, tau, com_bounds=ci.ComSphere(center=np.zeros((2, 3)), radius=[1e-3, 1e-3]))


def test_frictionless_arm_gets_no_negative_friction(truth):
    """Noise on the torques of an arm without friction, whose least-squares friction would scatter
    around zero: the consistent fit keeps every drive dissipative (Ia, fv >= 0, Tc+ >= 0 >= Tc-)
    and its report says so."""
    n = truth.n
    pi = np.array(standard_parameters(truth))
    pi[10 * n:] = 0.0
    frictionless = arm_with_parameters(truth, pi)
    rng = np.random.default_rng(11)
    q, qd, qdd, tau = _samples(frictionless, rng)
    tau = tau + 0.05 * rng.normal(size=tau.shape)
    fit = ci.fit_consistent(frictionless, q, qd, qdd, tau, regularization=0.0, max_steps=200)
    d = fit.arm.drives
    assert np.all(np.asarray(d.viscous_friction) >= 0) and np.all(np.asarray(d.rotor_inertia) >= 0)
    tc = np.asarray(d.coulomb_friction)
    assert np.all(tc[:, 0] >= 0) and np.all(tc[:, 1] <= 0), tc
    assert all(fit.consistency[f"drive {j + 1}"].ok for j in range(n))


def test_fits_at_several_weights_share_the_public_defaults_and_equal_single_fits(truth):
    """The model selection fits one fold at several weights through a private function that takes
    fit_consistent's options: it has exactly those options and no defaults of its own (they are
    fit_consistent's alone), and its fits are fit_consistent's, weight by weight."""
    import inspect

    import jaxarm
    from jaxarm.identify.consistent import _fit_consistent_weights

    public = inspect.signature(jaxarm.fit_consistent).parameters
    private = inspect.signature(_fit_consistent_weights).parameters
    assert set(public) - {"regularization"} == set(private) - {"regularizations"}
    for name, p in private.items():
        assert p.default is inspect.Parameter.empty, f"{name}: a default of its own, {p.default!r}"
    options = {k: v for k, v in jaxarm.fit_consistent.__kwdefaults__.items() if k != "regularization"}

    rng = np.random.default_rng(3)
    q, qd, qdd = (rng.uniform(-1, 1, (200, truth.n)) for _ in range(3))
    tau = np.asarray(predict_torques(truth, q, qd, qdd)) + 0.01 * rng.normal(size=(200, truth.n))
    arm = _perturbed(truth, rng)
    weights = (1e-3, 1e-1)
    together = _fit_consistent_weights(arm, q, qd, qdd, tau, weights, **{**options, "max_steps": 40})
    for w, fit in zip(weights, together):
        alone = jaxarm.fit_consistent(arm, q, qd, qdd, tau, regularization=w, max_steps=40)
        assert fit.regularization == w
        np.testing.assert_array_equal(fit.parameters, alone.parameters)
        np.testing.assert_array_equal(fit.loss_history, alone.loss_history)
