"""Identification of linear models: the regressor against the inverse dynamics it linearises
(all conventions, revolute and prismatic, drives, payload, URDF), the standard-parameter map,
base parameters against SVD ranks and closed-form groupings, least squares against its own
statistics (Monte Carlo), and the whole pipeline on simulated logs.

Compilation dominates the cost: every arm here shares a few structures ("RPR" per convention,
the planar 2R, the Puma), and the exactness checks run in one jitted function per structure."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm import identification as ident
from jaxarm.logs import Log

from helpers import assert_close, random_arm, random_state

TYPES = "RPR"


def _states(seed, n, count=4):
    return tuple(np.stack(x) for x in zip(*[random_state(seed + k, n) for k in range(count)]))


def _drives(arm, **changes):
    return arm.replace(drives=jaxarm.Drives(**{**vars(arm.drives), **changes}))


def _full_arm(seed, convention, types=TYPES):
    """A random arm with drives, payload, base and tool, the Panda's sigmoid friction (known
    torques) and tanh-smoothed Coulomb friction on joint 2 (fc s + fo |s| stays exact)."""
    arm = random_arm(seed, types, convention, drives=True, payload=True, base=True, tool=True)
    n = len(types)
    sig = np.array([[0.5, 5.0, 0.04], [0.8, 9.0, -0.03], [0.3, 17.0, 0.02]])[:n]
    return _drives(arm, sigmoid_friction=sig, coulomb_velocity_scale=np.array([0.0, 0.05, 0.0])[:n]).replace(name="x")


def _urdf_arm(tmp_path):
    """A 2-joint URDF (revolute, prismatic; odd origins and axes; damping and friction)."""
    text = textwrap.dedent(
        """\
        <?xml version="1.0"?>
        <robot name="rpr">
          <link name="base"/>
          <joint name="j1" type="revolute">
            <parent link="base"/><child link="l1"/>
            <origin xyz="0 0 0.3" rpy="0.1 0 0.2"/><axis xyz="0 0 1"/>
            <limit lower="-3" upper="3" effort="50" velocity="2"/>
            <dynamics damping="0.4" friction="0.3"/>
          </joint>
          <link name="l1">
            <inertial><origin xyz="0.05 0.02 0.1" rpy="0.3 0.1 0"/><mass value="3"/>
              <inertia ixx="0.05" ixy="0.001" ixz="0" iyy="0.04" iyz="0.002" izz="0.03"/></inertial>
          </link>
          <joint name="j2" type="prismatic">
            <parent link="l1"/><child link="l2"/>
            <origin xyz="0.1 0 0.2" rpy="0 0.4 0"/><axis xyz="0 0.6 0.8"/>
            <limit lower="-0.5" upper="0.5" effort="100" velocity="1"/>
          </joint>
          <link name="l2">
            <inertial><origin xyz="0.1 0 0" rpy="0 0 0"/><mass value="2"/>
              <inertia ixx="0.02" ixy="0" ixz="0" iyy="0.03" iyz="0" izz="0.03"/></inertial>
          </link>
        </robot>
        """
    )
    path = tmp_path / "rpr.urdf"
    path.write_text(text)
    return jaxarm.load_urdf(path).replace(name="x")


@jax.jit
def _everything(arm, q, qd, qdd, pi, pi_elsewhere):
    """Regressor and known torques (with and without drives) beside the public inverse dynamics
    of arm_with_parameters, and d tau / d pi by autodiff of *that* at another point."""
    n = arm.n
    Y = ident.regressor(arm, q, qd, qdd)
    known = ident.known_torques(arm, q, qd, qdd)
    Y_links = ident.regressor(arm, q, qd, qdd, drives=False)
    known_links = ident.known_torques(arm, q, qd, qdd, drives=False)
    tau_of = lambda a: jax.vmap(jaxarm.inverse_dynamics, (None, 0, 0, 0))(a, q, qd, qdd)  # noqa: E731
    tau = tau_of(ident.arm_with_parameters(arm, pi))
    tau_links = tau_of(ident.arm_with_parameters(arm, pi[: 10 * n], drives=False))
    tau_own = tau_of(arm)
    J = jax.jacfwd(lambda p: tau_of(ident.arm_with_parameters(arm, p)))(pi_elsewhere)
    return Y, known, Y_links, known_links, tau, tau_links, tau_own, J


def _check_exact(arm, seed):
    n = arm.n
    q, qd, qdd = _states(seed, n)
    pi_arm = np.asarray(ident.standard_parameters(arm))
    rng = np.random.default_rng(seed)
    pi = pi_arm * (1.0 + 0.3 * rng.normal(size=pi_arm.shape))  # a different, generic arm
    elsewhere = pi_arm * (1.0 + 0.5 * rng.uniform(size=pi_arm.shape))
    Y, known, Y_links, known_links, tau, tau_links, tau_own, J = _everything(arm, q, qd, qdd, pi, elsewhere)
    assert Y.shape == (4, n, 14 * n) and Y_links.shape == (4, n, 10 * n)
    assert set(arm.joint_types) == {"revolute", "prismatic"}
    assert_close(jnp.einsum("knp,p->kn", Y, pi) + known, tau, 1e-10, "Y pi + known vs inverse_dynamics(arm_with_parameters)")
    assert_close(jnp.einsum("knp,p->kn", Y, pi_arm) + known, tau_own, 1e-10, "Y pi(arm) + known vs inverse_dynamics(arm)")
    assert_close(jnp.einsum("knp,p->kn", Y_links, pi[: 10 * n]) + known_links, tau_links, 1e-10, "links only, drives known")
    assert_close(J, Y, 1e-10, "Y vs d tau / d pi at another point")
    assert_close(Y[..., : 10 * n], Y_links, 1e-14, "link columns with and without drives")
    # known samples of a known arm: the same functions evaluated by NumPy, not traced
    for drives, (Y_traced, known_traced) in ((True, (Y, known)), (False, (Y_links, known_links))):
        assert_close(ident.regressor(arm, q, qd, qdd, drives=drives), Y_traced, 1e-13, f"NumPy regressor, drives={drives}")
        assert_close(ident.known_torques(arm, q, qd, qdd, drives=drives), known_traced, 1e-13, f"NumPy known torques, drives={drives}")
    assert_close(ident.predict_torques(arm, q, qd, qdd), tau_own, 1e-13, "NumPy inverse dynamics")
    assert_close(ident.regressor(arm, q[0], qd[0], qdd[0]), Y[0], 1e-13, "NumPy regressor of one state")
    return q, qd, qdd, tau_own


@pytest.mark.parametrize("convention, types", [("standard", "PR"), ("modified", "RP")])
def test_regressor_is_exact_for_dh_arms(convention, types):
    _check_exact(_full_arm(1, convention, types), 3)


def test_regressor_is_exact_for_placement_and_urdf_arms(tmp_path):
    _check_exact(_full_arm(2, "placement", "RP"), 5)
    urdf = _urdf_arm(tmp_path)
    assert urdf.joint_types == ("revolute", "prismatic") and np.any(urdf.drives.viscous_friction > 0)
    _check_exact(urdf.with_payload(0.7, (0.01, 0.02, 0.03), np.diag([1e-3, 2e-3, 3e-3])), 7)


def test_standard_parameters_round_trip():
    arm = _full_arm(4, "modified")
    pi = np.asarray(ident.standard_parameters(arm))
    names = ident.parameter_names(arm)
    assert len(names) == len(pi) == 42 and names[:4] == ["m1", "mx1", "my1", "mz1"] and names[30:34] == ["Ia1", "fv1", "fc1", "fo1"]
    back = ident.arm_with_parameters(arm, pi)
    for field in ("mass", "com", "inertia"):
        assert_close(getattr(back.links, field), getattr(arm.links, field), 1e-12, field)
    for field in ("rotor_inertia", "viscous_friction", "coulomb_friction"):
        assert_close(getattr(back.drives, field), getattr(arm.drives, field), 1e-12, field)
    # Closed forms of the map for link 2 and drive 3.
    m, c, Ic = arm.links.mass[1], arm.links.com[1], arm.links.inertia[1]
    Io = Ic + m * (c @ c * np.eye(3) - np.outer(c, c))
    assert_close(pi[10:20], np.r_[m, m * c, Io[0, 0], Io[0, 1], Io[0, 2], Io[1, 1], Io[1, 2], Io[2, 2]], 1e-14, "link 2")
    G, dr = arm.drives.gear_ratio[2], arm.drives
    tc = dr.coulomb_friction[2]
    expected = [G**2 * dr.rotor_inertia[2], G**2 * dr.viscous_friction[2], abs(G) * (tc[0] - tc[1]) / 2, abs(G) * (tc[0] + tc[1]) / 2]
    assert_close(pi[38:42], expected, 1e-14, "drive 3")
    # The other direction, from an arbitrary vector, and a massless link.
    rng = np.random.default_rng(0)
    other = pi * (1 + 0.2 * rng.normal(size=pi.shape))
    assert_close(ident.standard_parameters(ident.arm_with_parameters(arm, other)), other, 1e-12, "pi -> arm -> pi")
    other[0:4] = 0.0
    light = ident.arm_with_parameters(arm, other)
    assert float(light.links.mass[0]) == 0.0 and np.all(np.asarray(light.links.com[0]) == 0.0)
    with pytest.raises(ValueError, match=r"pi: expected shape \(42,\)"):
        ident.arm_with_parameters(arm, pi[:30])
    with pytest.raises(ValueError, match="pi: expected finite"):
        ident.arm_with_parameters(arm, np.where(np.arange(42) == 3, np.nan, pi))


def test_regressor_input_errors():
    arm = _full_arm(4, "modified")
    q, qd, qdd = _states(1, 3)
    with pytest.raises(ValueError, match=r"regressor: q: expected shape \(3,\) or \(N, 3\)"):
        ident.regressor(arm, q[:, :2], qd, qdd)
    with pytest.raises(ValueError, match="equal shapes"):
        ident.regressor(arm, q, qd[:2], qdd)
    with pytest.raises(ValueError, match=r"qd: expected finite values, got non-finite entries at row\(s\) \[2\]"):
        ident.known_torques(arm, q, np.where(np.arange(4)[:, None] == 2, np.inf, qd), qdd)
    with pytest.raises(TypeError, match="expected a jaxarm.Arm"):
        ident.regressor("panda", q, qd, qdd)


# --------------------------------------------------------------------------------------------
# Base parameters


def _vertical_arm(seed=4):
    """The 'RPR' modified-DH arm with joint 1 about the vertical: alpha_0 = a_0 = 0, no base tilt."""
    arm = _full_arm(seed, "modified")
    kin = arm.kinematics
    kin = jaxarm.DH(a=np.r_[0.0, kin.a[1:]], alpha=np.r_[0.0, kin.alpha[1:]], d=kin.d, theta=kin.theta)
    return arm.replace(kinematics=kin, base=np.eye(4))


def _normalised_svd_rank(Y, rtol):
    Y = np.asarray(Y).reshape(-1, Y.shape[-1])
    norms = np.linalg.norm(Y, axis=0)
    keep = norms > rtol * norms.max()
    s = np.linalg.svd(Y[:, keep] / norms[keep], compute_uv=False)
    return int(np.sum(s > rtol * s[0]))


def test_base_parameters_structure():
    arm = _vertical_arm()
    names = ident.parameter_names(arm)
    Y = np.asarray(ident.regressor(arm, *ident.random_states(arm, 64, seed=1)))
    base = ident.base_parameters(Y, names=names, order=ident.grouping_order(arm))
    assert base.rank == _normalised_svd_rank(Y, base.rtol)
    assert base.rank == ident.base_parameters(Y, order="pivoted").rank
    assert base.K.shape == (base.rank, 42) and np.allclose(base.K[:, list(base.independent)], np.eye(base.rank))
    # Link 1 turns about the vertical: its mass and horizontal first moment never enter.
    for name in ("m1", "mx1", "my1", "mz1", "Ixx1", "Iyy1"):
        assert name in base.unidentifiable
    assert not {"Izz1", "fc1", "fv1"} & set(base.unidentifiable)
    # Dependent columns are the independent ones times K -- on fresh states, too.
    Y_new = np.asarray(ident.regressor(arm, *ident.random_states(arm, 64, seed=2))).reshape(-1, 42)
    assert_close(Y_new[:, list(base.independent)] @ base.K, Y_new, 1e-9, "Y = Y_ind K on fresh states")
    # Two different standard vectors with the same beta give the same torques.
    pi = np.asarray(ident.standard_parameters(arm))
    null = np.linalg.svd(base.K)[2][base.rank :]
    assert null.shape[0] == 42 - base.rank
    pi2 = pi + 0.05 * null.T @ np.random.default_rng(3).normal(size=null.shape[0])
    assert_close(base.project(pi2), base.project(pi), 1e-12, "same beta")
    assert np.max(np.abs(pi2 - pi)) > 1e-3
    q, qd, qdd = _states(40, 3)
    assert_close(
        ident.predict_torques(ident.arm_with_parameters(arm, pi2), q, qd, qdd),
        ident.predict_torques(ident.arm_with_parameters(arm, pi), q, qd, qdd),
        1e-10,
        "torques from pi and pi + null-space vector",
    )
    # The eager entry points: a single state, and predict_torques against Y pi + known.
    Y1 = ident.regressor(arm, q[1], qd[1], qdd[1])
    assert Y1.shape == (3, 42)
    tau1 = Y1 @ pi + ident.known_torques(arm, q[1], qd[1], qdd[1])
    assert_close(ident.predict_torques(arm, q[1], qd[1], qdd[1]), tau1, 1e-10, "single state")
    # Descriptions list the standard parameters each base parameter mixes.
    row = base.independent.index(names.index("Izz1"))
    assert base.descriptions[row].startswith("Izz1") and "Ia1" in base.descriptions[row]


def test_planar_two_link_closed_form():
    """Planar 2R (Khalil & Dombre 12.5): with a_1 = a, the base parameters are Izz1 + a^2 m2
    (+ Ia1), mx1 + a m2, my1, Izz2, mx2, my2 -- 6 without drives."""
    a = 0.7
    arm = jaxarm.make_arm("RR", convention="modified", a=[0.0, a], mass=[2.0, 1.0], com=[[0.3, 0.1, 0], [0.4, 0, 0.2]],
                          inertia=[[0.1, 0.2, 0.25], [0.05, 0.1, 0.12]], gravity=(0, -9.81, 0))
    base = ident.structural_base_parameters(arm, drives=True, samples=64)
    names = ident.parameter_names(arm, drives=True)
    links = [name for name in base.names if name[:-1] not in ident.DRIVE_PARAMETERS]
    assert sorted(links) == sorted(["Izz1", "mx1", "my1", "Izz2", "mx2", "my2"])
    assert base.rank == 6 + 4 + 3  # + Ia, fv, fc, fo per joint, Ia1 joining Izz1
    K = base.K
    assert K[base.names.index("Izz1"), names.index("m2")] == pytest.approx(a * a, rel=1e-10)
    assert K[base.names.index("mx1"), names.index("m2")] == pytest.approx(a, rel=1e-10)
    assert base.descriptions[base.names.index("Izz1")] == "Izz1 + 0.49 m2 + Ia1"
    assert np.count_nonzero(K) == base.rank + 3  # nothing else mixes


def test_puma560_has_36_base_inertial_parameters():
    """The classic count for the Puma 560 without drives (Gautier & Khalil 1990, Khalil &
    Dombre ch. 12) -- checked here against an SVD rank, not only the literature number."""
    arm = jaxarm.load_arm("puma560").replace(name="")
    Y = np.asarray(ident.regressor(arm, *ident.random_states(arm, 64, seed=5), drives=False))
    base = ident.base_parameters(Y, names=ident.parameter_names(arm, drives=False), order=ident.grouping_order(arm, drives=False))
    assert base.rank == _normalised_svd_rank(Y, 1e-8) == 36
    assert {"m1", "mx1", "my1", "mz1"} <= set(base.unidentifiable)


def test_base_parameters_errors():
    with pytest.raises(ValueError, match=r"Y: expected shape \(N \* n, p\)"):
        ident.base_parameters(np.ones(5))
    with pytest.raises(ident.IdentificationError, match="Y is zero"):
        ident.base_parameters(np.zeros((6, 2)))
    with pytest.raises(ValueError, match="names: expected 2 names"):
        ident.base_parameters(np.eye(2), names=["a"])
    with pytest.raises(ValueError, match="order: expected a permutation"):
        ident.base_parameters(np.eye(2), order=[0, 0])


# --------------------------------------------------------------------------------------------
# Least squares


def _synthetic(seed, N=400, r=5, n=2):
    rng = np.random.default_rng(seed)
    Y = rng.normal(size=(N, n, r)) * np.array([1.0, 10.0, 0.1, 3.0, 1.0])[:r]
    beta = rng.normal(size=r)
    return Y, beta


def test_least_squares_statistics_monte_carlo():
    """OLS: the spread of the estimates over 400 noise draws matches the reported std (each
    within 15 %: the sample std of 400 draws is itself +-3.5 %), sigma^2 is unbiased, and the
    normalised errors are chi-square with r degrees of freedom (mean r within 4 sigma)."""
    Y, beta = _synthetic(0)
    sigma, draws = 0.1, 400
    rng = np.random.default_rng(1)
    exact = ident.least_squares(Y, Y @ beta)
    assert_close(exact.estimate, beta, 1e-12, "noiseless")
    estimates, stds, sig2, chi2 = [], [], [], []
    for _ in range(draws):
        fit = ident.least_squares(Y, Y @ beta + sigma * rng.normal(size=Y.shape[:2]))
        estimates.append(fit.estimate)
        stds.append(fit.std)
        sig2.append(fit.sigma2)
        err = fit.estimate - beta
        chi2.append(err @ np.linalg.solve(fit.covariance, err))
    spread = np.std(estimates, axis=0, ddof=1)
    ratio = spread / np.mean(stds, axis=0)
    assert np.all(np.abs(ratio - 1) < 0.15), ratio
    assert np.mean(sig2) == pytest.approx(sigma**2, rel=0.02)
    r = len(beta)
    assert abs(np.mean(chi2) - r) < 4 * np.sqrt(2 * r / draws)
    assert fit.rmse.shape == (2,) and np.all(np.abs(fit.rmse / sigma - 1) < 0.15)
    assert np.all(fit.relative_std == pytest.approx(100 * fit.std / np.abs(fit.estimate)))


def test_joint_variance_weighting():
    """Joint 1 is 10x noisier than joint 2: Gautier's two-step WLS finds the noisy joint's weight
    1/sigma_1^2 (mean over 200 draws within 5 %; the quiet joint's is biased low by the other
    joint's noise leaking into its OLS residual, here by ~25 %), estimates beta with a much
    smaller error than OLS, and reports a std that matches the spread (each within 20 %)."""
    Y, beta = _synthetic(2)
    sigmas = np.array([0.2, 0.02])
    rng = np.random.default_rng(3)
    err_ols, err_wls, weights = [], [], []
    for _ in range(200):
        tau = Y @ beta + sigmas * rng.normal(size=Y.shape[:2])
        ols = ident.least_squares(Y, tau)
        wls = ident.least_squares(Y, tau, weighting="joint-variance")
        err_ols.append(ols.estimate - beta)
        err_wls.append(wls.estimate - beta)
        weights.append(wls.weights[0] * sigmas**2)
    ratio = np.mean(weights, axis=0)
    assert abs(ratio[0] - 1) < 0.05 and 0.6 < ratio[1] < 1.05, ratio
    assert np.sum(np.square(err_wls)) < 0.1 * np.sum(np.square(err_ols))
    spread = np.std(err_wls, axis=0, ddof=1)
    assert np.all(np.abs(spread / wls.std - 1) < 0.2)
    # Explicit weights give the same fit as the computed ones.
    again = ident.least_squares(Y, tau, weights=wls.weights[0])
    assert_close(again.estimate, wls.estimate, 1e-10, "explicit weights")


def test_least_squares_errors():
    Y, beta = _synthetic(4, N=10)
    with pytest.raises(ValueError, match="Y, tau: expected"):
        ident.least_squares(Y, np.ones(5))
    with pytest.raises(ValueError, match="weights: expected positive"):
        ident.least_squares(Y, Y @ beta, weights=[1.0, -1.0])
    with pytest.raises(ValueError, match="weighting: expected None or 'joint-variance'"):
        ident.least_squares(Y, Y @ beta, weighting="huber")
    with pytest.raises(ident.IdentificationError, match="4 equations for 5 parameters"):
        ident.least_squares(Y[:2], (Y @ beta)[:2])
    Y2 = Y.copy()
    Y2[..., 4] = 2 * Y2[..., 1]
    with pytest.raises(ident.IdentificationError, match="rank deficient"):
        ident.least_squares(Y2, Y2 @ beta)


# --------------------------------------------------------------------------------------------
# The pipeline on simulated logs


def _simulated_log(arm, seed, N=1500, rate=500.0, still=None, constant_velocity=False):
    """A smooth multi-sine trajectory with exact derivatives and the arm's exact torques."""
    rng = np.random.default_rng(seed)
    t = np.arange(N) / rate
    n = arm.n
    w = 2 * np.pi * rng.uniform(0.2, 1.5, (3, n))
    amp = rng.uniform(0.2, 0.6, (3, n))
    phase = rng.uniform(0, 2 * np.pi, (3, n))
    arg = w[:, None, :] * t[None, :, None] + phase[:, None, :]
    q = np.sum(amp[:, None, :] * np.sin(arg), axis=0)
    dq = np.sum(amp[:, None, :] * w[:, None, :] * np.cos(arg), axis=0)
    ddq = -np.sum(amp[:, None, :] * w[:, None, :] ** 2 * np.sin(arg), axis=0)
    if constant_velocity:
        dq = np.ones_like(q) * np.array([0.4, -0.3, 0.5])
        q = t[:, None] * dq
        ddq = np.zeros_like(q)
    if still is not None:
        q[:, still], dq[:, still], ddq[:, still] = 0.3, 0.0, 0.0
    tau = ident.predict_torques(arm, q, dq, ddq)
    return Log(t=t, q=q, dq=dq, ddq=ddq, tau=tau, source=f"simulated-{seed}")


def test_identify_linear_recovers_noiseless_parameters():
    truth = _vertical_arm(6)
    rng = np.random.default_rng(7)
    pi_true = np.asarray(ident.standard_parameters(truth))
    prior_pi = pi_true * (1 + 0.3 * rng.normal(size=pi_true.shape))
    prior = ident.arm_with_parameters(truth, prior_pi)  # same sigmoid friction and payload (known)
    log = _simulated_log(truth, 8)
    res = ident.identify_linear(prior, log)
    beta_true = res.base.project(pi_true)
    assert res.rank == res.base.rank == len(res.beta)
    assert_close(res.beta, beta_true, 1e-8, "beta from noiseless data")
    assert_close(res.base.project(res.parameters), res.beta, 1e-10, "K pi = beta")
    assert np.all(res.rmse < 1e-8 * np.abs(log.tau).max())
    # The full vector is the prior plus the smallest change that reaches beta.
    assert np.linalg.norm(res.parameters - prior_pi) <= np.linalg.norm(pi_true - prior_pi) + 1e-9
    fresh = _simulated_log(truth, 9)
    assert_close(ident.predict_torques(res.arm, fresh), fresh.tau, 1e-8, "fitted arm on a fresh trajectory")
    report = res.report()
    assert report["rank"] == res.rank and len(report["base_parameters"]) == res.rank
    # With noise: the reported std describes the actual error (chi-square, 1 draw, 30 dof: loose).
    noisy = Log(t=log.t, q=log.q, dq=log.dq, ddq=log.ddq, tau=log.tau + 0.05 * rng.normal(size=log.tau.shape))
    fit = ident.identify_linear(prior, noisy, weighting="joint-variance")
    err = fit.beta - beta_true
    chi2 = err @ np.linalg.solve(fit.fit.covariance, err)
    assert chi2 < fit.rank + 6 * np.sqrt(2 * fit.rank)


def test_identify_linear_keeps_drives_physical_on_a_frictionless_arm():
    """Noise on the torques of an arm without friction or rotor inertia: plain least squares puts
    the friction on both sides of zero (checked here, so the test can fail), the identified arm
    keeps every drive dissipative (Ia, fv >= 0, Tc+ >= 0 >= Tc-), says which bounds are active,
    still reproduces the base parameters it did not bound, and fits no worse than it must."""
    truth = _vertical_arm(6)
    n = truth.n
    pi = np.array(ident.standard_parameters(truth))
    pi[10 * n:] = 0.0
    frictionless = ident.arm_with_parameters(truth, pi)
    log = _simulated_log(frictionless, 8)
    rng = np.random.default_rng(3)
    noisy = Log(t=log.t, q=log.q, dq=log.dq, ddq=log.ddq, tau=log.tau + 0.05 * rng.normal(size=log.tau.shape))
    res = ident.identify_linear(frictionless, noisy)
    plain = ident.least_squares(ident.regressor(frictionless, log.q, log.dq, log.ddq)[:, :, list(res.base.independent)],
                                noisy.tau - np.asarray(ident.known_torques(frictionless, log.q, log.dq, log.ddq)))
    fv_plain = [plain.estimate[res.base.descriptions.index(f"fv{j + 1}")] for j in range(n)]
    assert min(fv_plain) < 0, fv_plain  # the unconstrained fit is unphysical here
    assert res.active_bounds and any(b.startswith("fv") for b in res.active_bounds), res.active_bounds
    report = jaxarm.consistency_report(res.arm, drives=True)
    assert all(report[f"drive {j + 1}"].ok for j in range(n)), {k: v.problems for k, v in report.items()}
    d = res.arm.drives
    assert np.all(np.asarray(d.rotor_inertia) >= 0) and np.all(np.asarray(d.viscous_friction) >= 0)
    tc = np.asarray(d.coulomb_friction)
    assert np.all(tc[:, 0] >= 0) and np.all(tc[:, 1] <= 0)
    assert_close(res.base.project(res.parameters), res.beta, 1e-10, "K pi = beta after the null-space move")
    # The bounded fit costs little: its residual is within 5 % of the unconstrained one.
    assert np.sum(res.fit.residual**2) <= 1.05 * np.sum(plain.residual**2)
    assert np.sum(res.fit.residual**2) >= np.sum(plain.residual**2) * (1 - 1e-9)
    assert res.report()["active_bounds"] == list(res.active_bounds)


def test_identify_linear_explains_what_is_missing():
    truth = _vertical_arm(6)
    log = _simulated_log(truth, 8)
    with pytest.raises(ident.IdentificationError, match="no tau columns"):
        ident.identify_linear(truth, Log(t=log.t, q=log.q, dq=log.dq, ddq=log.ddq))
    with pytest.raises(ident.IdentificationError, match="no ddq columns; run jaxarm.preprocess_log"):
        ident.identify_linear(truth, Log(t=log.t, q=log.q, dq=log.dq, tau=log.tau))
    with pytest.raises(ident.IdentificationError, match="the log is too short"):
        ident.identify_linear(truth, log.slice(None, log.t[5]))
    with pytest.raises(ident.IdentificationError, match=r"joint\(s\) \[2\] do not move"):
        ident.identify_linear(truth, _simulated_log(truth, 8, N=300, still=1))
    with pytest.raises(ident.IdentificationError, match="excites only .* base parameters"):
        ident.identify_linear(truth, _simulated_log(truth, 8, N=300, constant_velocity=True))
    with pytest.raises(ident.IdentificationError, match="the log has 3 joints, the arm"):
        ident.identify_linear(jaxarm.load_arm("two_link_planar"), log)
