"""DC motors, the DAC and drive friction, each against its closed form.

Motor (Swartz eqs 11-12 with a gearbox, ERRATA motor paragraph): V = R tau / (G Kt) + Kt G qd and
tau = G Kt (V - Kt G qd) / R, armature current I = (V - Kt G qd) / R so that tau = G Kt I.
Friction (jaxarm.friction_torques): viscous B G^2 qd; Coulomb |G| Tc+ / |G| Tc- by the sign of qd
(or tanh(qd / s)); Stribeck |G| (Ts - |Tc|) exp(-(qd / vs)^2) on top; the Panda sigmoid
phi1 / (1 + exp(-phi2 (qd + phi3))) - phi1 / (1 + exp(-phi2 phi3)) (Gaz et al. 2019).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxarm
from tests.helpers import random_arm
from tests.helpers_sim import forward_dynamics, sim_arm, with_drives

friction = jax.jit(jaxarm.friction_torques)
inverse_dynamics = jax.jit(jaxarm.inverse_dynamics)


def one_model_arm(**drives):
    """The shared 3-R test arm with gear ratios of both signs and only the given friction model."""
    return with_drives(sim_arm(3), gear_ratio=[12.0, -7.5, 3.0], **drives)


# --------------------------------------------------------------------------------------
# Motors


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_motor_torque_and_voltage_are_inverses(seed):
    arm = random_arm(seed, "RRPR", drives=True)
    arm = with_drives(arm, gear_ratio=np.abs(arm.drives.gear_ratio) * np.array([1.0, -1.0, 1.0, -1.0]))
    rng = np.random.default_rng(seed)
    for _ in range(5):
        qd = rng.uniform(-3.0, 3.0, 4)
        V = rng.uniform(-60.0, 60.0, 4)  # beyond the limits too: no saturation here
        tau = jaxarm.motor_torque(arm, V, qd, saturate=False)
        np.testing.assert_allclose(jaxarm.motor_voltage(arm, tau, qd), V, rtol=1e-12, atol=1e-12)
        tau2 = rng.uniform(-50.0, 50.0, 4)
        V2 = jaxarm.motor_voltage(arm, tau2, qd)
        np.testing.assert_allclose(jaxarm.motor_torque(arm, V2, qd, saturate=False), tau2, rtol=1e-12, atol=1e-10)


def test_swartz_eq_11_12_by_hand_with_gear_ratio():
    G, Kt, R = np.array([-12.5, 40.0]), np.array([0.08, 0.21]), np.array([1.7, 0.6])
    arm = jaxarm.make_arm("RR", gear_ratio=G, torque_constant=Kt, resistance=R)
    V, qd, tau = np.array([5.0, -3.0]), np.array([0.3, -0.1]), np.array([2.0, -9.0])
    # eq 12 with the motor turning at G qd and the joint receiving G times the motor torque
    expected_tau = np.array([
        -12.5 * 0.08 * (5.0 - 0.08 * -12.5 * 0.3) / 1.7,
        40.0 * 0.21 * (-3.0 - 0.21 * 40.0 * -0.1) / 0.6,
    ])
    np.testing.assert_allclose(jaxarm.motor_torque(arm, V, qd), expected_tau, rtol=1e-14)
    # eq 11: V = R tau_motor / Kt + Kt (motor speed), tau_motor = tau / G
    expected_V = np.array([
        1.7 * (2.0 / -12.5) / 0.08 + 0.08 * (-12.5 * 0.3),
        0.6 * (-9.0 / 40.0) / 0.21 + 0.21 * (40.0 * -0.1),
    ])
    np.testing.assert_allclose(jaxarm.motor_voltage(arm, tau, qd), expected_V, rtol=1e-14)


def test_motor_current_gives_tau_equal_G_Kt_I():
    arm = random_arm(4, "RRR", drives=True)
    rng = np.random.default_rng(4)
    V, qd = rng.uniform(-30.0, 30.0, 3), rng.uniform(-2.0, 2.0, 3)
    I = jaxarm.motor_current(arm, V, qd)
    G, Kt, R = arm.drives.gear_ratio, arm.drives.torque_constant, arm.drives.resistance
    np.testing.assert_allclose(I, (V - Kt * G * qd) / R, rtol=1e-14)  # eq 11 solved for I
    np.testing.assert_allclose(jaxarm.motor_torque(arm, V, qd), G * Kt * I, rtol=1e-13)


def test_voltage_saturates_at_the_limit():
    arm = jaxarm.make_arm("RR", gear_ratio=[10.0, -5.0], torque_constant=0.1, resistance=2.0, voltage_limit=[24.0, 12.0])
    qd = np.array([0.4, -1.0])
    at_limit = jaxarm.motor_torque(arm, np.array([24.0, -12.0]), qd)
    np.testing.assert_allclose(jaxarm.motor_torque(arm, np.array([100.0, -50.0]), qd), at_limit, rtol=1e-15)
    np.testing.assert_allclose(jaxarm.saturate_voltage(arm, np.array([100.0, -50.0])), [24.0, -12.0])
    np.testing.assert_allclose(jaxarm.motor_current(arm, np.array([100.0, -50.0]), qd),
                               jaxarm.motor_current(arm, np.array([24.0, -12.0]), qd), rtol=1e-15)
    unsat = jaxarm.motor_torque(arm, np.array([100.0, -50.0]), qd, saturate=False)
    np.testing.assert_allclose(unsat, np.array([10.0, -5.0]) * 0.1 * (np.array([100.0, -50.0]) - 0.1 * np.array([10.0, -5.0]) * qd) / 2.0)
    inside = np.array([3.0, -2.0])  # within the limits saturation changes nothing
    np.testing.assert_array_equal(jaxarm.motor_torque(arm, inside, qd), jaxarm.motor_torque(arm, inside, qd, saturate=False))


def test_the_voltage_clip_differentiates_and_promotes_as_jnp_clip():
    """motor_torque and saturate_voltage clip by jaxarm.dynamics.algebra.saturated, the rollouts'
    input clip: the same values, dtypes and derivatives as jnp.clip's (a voltage exactly on a
    limit, whose derivative jnp.clip splits evenly, included; the limits themselves differentiated
    too), and float32 voltages with a float64 arm give float64 as jnp.clip's promotion does."""
    import jax.numpy as jnp

    arm = jaxarm.make_arm("RRR", gear_ratio=[10.0, -5.0, 3.0], torque_constant=0.1, resistance=2.0,
                          voltage_limit=[24.0, 12.0, 6.0])
    qd = np.array([0.4, -1.0, 0.2])
    V = np.array([30.0, 12.0, -2.0])  # beyond, exactly on, inside the limit

    def by_jnp_clip(arm, V):
        lim = jnp.asarray(arm.drives.voltage_limit)
        return jaxarm.motor_torque(arm, jnp.clip(V, -lim, lim), qd, saturate=False)

    def cost(f):
        return lambda arm, V: jnp.sum(jnp.sin(f(arm, V)))

    ours = jax.grad(cost(lambda arm, V: jaxarm.motor_torque(arm, V, qd)), argnums=(0, 1))(arm, V)
    theirs = jax.grad(cost(by_jnp_clip), argnums=(0, 1))(arm, V)
    np.testing.assert_array_equal(np.asarray(ours[1]), np.asarray(theirs[1]))
    assert ours[1][0] == 0.0 and ours[1][1] != 0.0 and ours[1][2] != 0.0  # clipped, the tie's half, inside
    np.testing.assert_array_equal(np.asarray(ours[0].drives.voltage_limit), np.asarray(theirs[0].drives.voltage_limit))
    assert ours[0].drives.voltage_limit[0] != 0.0  # the limit is what moves a clipped voltage
    grad_v = jax.grad(lambda V: jnp.sum(jaxarm.saturate_voltage(arm, V) ** 2))(V)
    np.testing.assert_array_equal(np.asarray(grad_v), [0.0, 12.0, -4.0])
    lim = jnp.asarray(arm.drives.voltage_limit)
    V32 = V.astype(np.float32)
    assert jaxarm.saturate_voltage(arm, V32).dtype == jnp.clip(jnp.asarray(V32), -lim, lim).dtype == np.float64
    assert jaxarm.motor_torque(arm, V32, qd).dtype == np.float64
    assert jaxarm.saturate_voltage(arm.astype(np.float32), V32).dtype == np.float32


@pytest.mark.parametrize("func", ["motor_torque", "motor_voltage", "motor_current"])
@pytest.mark.parametrize("kt, r", [(0.0, 1.0), (0.1, 0.0), (0.0, 0.0)])
def test_missing_motor_model_is_a_clear_error(func, kt, r):
    arm = jaxarm.make_arm("RR", torque_constant=[0.1, kt], resistance=[1.0, r], name="no-motor")
    with pytest.raises(ValueError, match=r"torque_constant.*joint 2|joint 2.*torque_constant"):
        getattr(jaxarm, func)(arm, np.ones(2), np.zeros(2))


def test_default_arm_has_no_motor_model():
    arm = jaxarm.make_arm("R")
    with pytest.raises(ValueError, match="torque_constant"):
        jaxarm.motor_torque(arm, np.ones(1), np.zeros(1))
    with pytest.raises(ValueError, match="torque_constant"):
        jaxarm.rollout(arm, np.zeros(1), np.zeros(1), np.zeros((3, 1)), 0.01, input="voltage")


def test_dac_8_bits_10_volts():
    dac = jaxarm.DAC(full_scale=10.0, bits=8)
    step = 20.0 / 256  # 0.078125 V
    V = np.array([0.0, 0.04, 0.03, -0.04, 1.0, 9.95, 10.0, 25.0, -10.0, -25.0, -9.97])
    expected = np.array([0.0, step, 0.0, -step, 13 * step, 10.0 - step, 10.0 - step, 10.0 - step, -10.0, -10.0, -10.0])
    np.testing.assert_allclose(dac(V), expected, rtol=0, atol=1e-15)
    # a fine sweep hits exactly 256 levels, -10 V .. 10 V - step, all whole multiples of the step
    out = np.asarray(dac(np.linspace(-12.0, 12.0, 20001)))
    levels = np.unique(out)
    assert len(levels) == 256
    assert levels[0] == -10.0 and levels[-1] == 10.0 - step
    np.testing.assert_allclose(np.diff(levels), step, rtol=1e-12)
    np.testing.assert_array_equal(levels / step, np.round(levels / step))
    inside = np.linspace(-9.9, 9.9, 1001)
    assert np.max(np.abs(np.asarray(dac(inside)) - inside)) <= step / 2 + 1e-15  # nearest level
    # no bits: clipping only
    np.testing.assert_allclose(jaxarm.DAC(10.0)(np.array([3.21, 12.0, -11.0])), [3.21, 10.0, -10.0])


# --------------------------------------------------------------------------------------
# Friction, one model at a time


QD = np.array([0.7, -0.35, 0.0])
ABS_G = np.array([12.0, 7.5, 3.0])


def test_viscous_friction():
    B = np.array([1e-3, 4e-3, 2e-2])
    arm = one_model_arm(viscous_friction=B)
    np.testing.assert_allclose(friction(arm, QD), B * np.array([12.0, -7.5, 3.0]) ** 2 * QD, rtol=1e-14)


def test_exact_coulomb_friction():
    tc = np.array([[0.05, -0.03], [0.02, -0.08], [0.1, -0.1]])  # asymmetric: [for qd > 0, for qd < 0]
    arm = one_model_arm(coulomb_friction=tc)
    for qd in (QD, -QD, np.array([1e-9, -1e-9, 5.0])):
        expected = np.where(qd > 0, ABS_G * tc[:, 0], np.where(qd < 0, ABS_G * tc[:, 1], 0.0))
        np.testing.assert_allclose(friction(arm, qd), expected, rtol=1e-14)
    np.testing.assert_array_equal(friction(arm, np.zeros(3)), np.zeros(3))  # zero at rest


def test_smoothed_coulomb_friction():
    tc, s = np.array([0.05, 0.02, 0.1]), np.array([0.01, 0.1, 0.5])
    arm = one_model_arm(coulomb_friction=np.stack([tc, -tc], 1), coulomb_velocity_scale=s)
    qd = np.array([0.004, -0.3, 0.2])
    np.testing.assert_allclose(friction(arm, qd), ABS_G * tc * np.tanh(qd / s), rtol=1e-13)
    np.testing.assert_array_equal(friction(arm, np.zeros(3)), np.zeros(3))
    # far from rest the smoothed model equals the exact one to within tanh's tail
    far = np.array([0.2, -3.0, 9.0])
    np.testing.assert_allclose(friction(arm, far), ABS_G * tc * np.sign(far), rtol=1e-7)
    # asymmetric levels keep their own magnitude on each side
    asym = one_model_arm(coulomb_friction=[[0.05, -0.02]] * 3, coulomb_velocity_scale=0.1)
    qd = np.array([0.05, -0.05, 0.3])
    th = np.tanh(qd / 0.1)
    np.testing.assert_allclose(friction(asym, qd), ABS_G * np.where(th > 0, 0.05 * th, -0.02 * -th), rtol=1e-13)


@pytest.mark.parametrize("smooth", [0.0, 1e-3])
def test_stribeck_friction_limits(smooth):
    tc, ts, vs = np.array([0.05, 0.02, 0.1]), np.array([0.09, 0.05, 0.25]), np.array([0.1, 0.02, 0.5])
    arm = one_model_arm(coulomb_friction=np.stack([tc, -tc], 1), static_friction=ts, stribeck_velocity=vs,
                        coulomb_velocity_scale=smooth)
    if not smooth:  # qd -> 0+: the breakaway (static) level |G| Ts (a smoothed sign goes to 0 instead)
        for tiny in (1e-6 * vs, 1e-9 * vs):
            np.testing.assert_allclose(friction(arm, tiny), ABS_G * ts, rtol=1e-11)
            np.testing.assert_allclose(friction(arm, -tiny), -ABS_G * ts, rtol=1e-11)
    big = 40.0 * vs  # far along the curve: Coulomb level |G| Tc
    np.testing.assert_allclose(friction(arm, big), ABS_G * tc, rtol=1e-12)
    np.testing.assert_allclose(friction(arm, -big), -ABS_G * tc, rtol=1e-12)
    mid = np.array([0.07, -0.01, 0.6])
    direction = np.tanh(mid / smooth) if smooth else np.sign(mid)
    expected = ABS_G * (tc + (ts - tc) * np.exp(-((mid / vs) ** 2))) * direction
    np.testing.assert_allclose(friction(arm, mid), expected, rtol=1e-12)
    # the magnitude falls monotonically from Ts to Tc for qd > 0 (beyond the smoothing scale)
    sweep = np.asarray(jax.vmap(lambda v: friction(arm, v))(np.linspace(0.01, 3.0, 300)[:, None] * np.ones(3)))
    assert np.all(np.diff(sweep, axis=0) <= 1e-15)


# Gaz et al. 2019, supplementary Table I, as quoted in ../shared/data/panda/README.md
PANDA_PHI = np.array([
    [0.54615, 5.1181, 0.039533],
    [0.87224, 9.0657, 0.025882],
    [0.64068, 10.136, -0.04607],
    [1.2794, 5.5903, 0.036194],
    [0.83904, 8.3469, 0.026226],
    [0.30301, 17.133, -0.021047],
    [0.56489, 10.336, 0.0035526],
])


def test_sigmoid_friction_is_the_panda_formula():
    panda = jaxarm.make_arm(
        "R" * 7, convention="modified",
        a=[0, 0, 0, 0.0825, -0.0825, 0, 0.088], alpha=np.pi / 2 * np.array([0, -1, 1, 1, -1, 1, 1]),
        d=[0.333, 0, 0.316, 0, 0.384, 0, 0], sigmoid_friction=PANDA_PHI, name="panda-friction",
    )
    p1, p2, p3 = PANDA_PHI.T
    rng = np.random.default_rng(7)
    for qd in (rng.uniform(-2.0, 2.0, 7), rng.uniform(-0.05, 0.05, 7), np.full(7, 5.0)):
        expected = p1 / (1.0 + np.exp(-p2 * (qd + p3))) - p1 / (1.0 + np.exp(-p2 * p3))
        np.testing.assert_allclose(jaxarm.friction_torques(panda, qd), expected, rtol=1e-13, atol=1e-16)
    np.testing.assert_array_equal(jaxarm.friction_torques(panda, np.zeros(7)), np.zeros(7))
    # saturates at phi1 minus the offset for fast motion: the model's Coulomb-like level
    np.testing.assert_allclose(jaxarm.friction_torques(panda, np.full(7, 50.0)), p1 - p1 / (1.0 + np.exp(-p2 * p3)), rtol=1e-12)


# --------------------------------------------------------------------------------------
# All models together: inverse and forward dynamics share them


def all_friction_arm():
    return with_drives(
        sim_arm(5),
        gear_ratio=[20.0, -15.0, 8.0],
        rotor_inertia=[2e-5, 5e-5, 1e-4],
        viscous_friction=[2e-4, 1e-3, 5e-4],
        coulomb_friction=[[0.01, -0.015], [0.02, -0.02], [0.005, -0.01]],
        coulomb_velocity_scale=[0.0, 0.05, 0.0],  # exact sign on joints 1 and 3, tanh on joint 2
        static_friction=[0.02, 0.03, 0.02],
        stribeck_velocity=[0.1, 0.2, 0.05],
        sigmoid_friction=PANDA_PHI[:3],
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_forward_dynamics_inverts_inverse_dynamics_with_all_friction(seed):
    arm = all_friction_arm()
    rng = np.random.default_rng(seed)
    q, qd, qdd = rng.uniform(-3, 3, 3), rng.uniform(-2, 2, 3), rng.uniform(-5, 5, 3)
    if seed == 3:
        qd = np.array([0.0, 1e-4, -1e-4])  # at rest and in the Stribeck region
    tau = inverse_dynamics(arm, q, qd, qdd, None)
    fr = np.asarray(friction(arm, qd))
    assert np.all(np.abs(fr[qd != 0]) > 0)  # friction is really on
    np.testing.assert_allclose(forward_dynamics(arm, q, qd, tau, np.zeros(6)), qdd, rtol=1e-9, atol=1e-9)
    # friction enters both with the same sign: removing it from tau leaves the rigid-body part
    frictionless = with_drives(arm, viscous_friction=0.0, coulomb_friction=0.0, static_friction=0.0, sigmoid_friction=0.0)
    np.testing.assert_allclose(tau - fr, inverse_dynamics(frictionless, q, qd, qdd, None), rtol=1e-12, atol=1e-12)


def smooth_friction_arm(symmetric):
    arm = with_drives(all_friction_arm(), coulomb_velocity_scale=[0.02, 0.05, 0.01])  # smooth Coulomb everywhere
    if symmetric:
        arm = with_drives(arm, coulomb_friction=[[0.01, -0.01], [0.02, -0.02], [0.005, -0.005]])
    return arm


friction_jacobian = jax.jit(jax.jacfwd(jaxarm.friction_torques, argnums=1))


def central_difference_jacobian(arm, qd, h=1e-6):
    return np.stack([(friction(arm, qd + h * e) - friction(arm, qd - h * e)) / (2 * h) for e in np.eye(3)], 1)


@pytest.mark.parametrize("symmetric", [True, False])
def test_friction_gradient_is_finite_with_smooth_models(symmetric):
    arm = smooth_friction_arm(symmetric)
    for qd in (np.zeros(3), np.full(3, 1e-7), np.array([0.03, -0.2, 1.5])):
        J = np.asarray(friction_jacobian(arm, qd))
        assert np.all(np.isfinite(J)), (qd, J)
        assert np.allclose(J, np.diag(np.diag(J)))  # each joint's friction depends on its own velocity
        np.testing.assert_allclose(J, central_difference_jacobian(arm, qd), rtol=1e-5, atol=1e-8)
    # the exact-sign model is not differentiable at rest: jax still returns a finite value there
    assert np.all(np.isfinite(np.asarray(friction_jacobian(all_friction_arm(), np.zeros(3)))))


def test_friction_gradient_at_rest_with_asymmetric_smoothed_coulomb_and_stribeck():
    """Smoothed Coulomb with Tc+ != |Tc-| plus Stribeck is C1 at rest: |G| Ts tanh(qd / s) to first
    order on both sides, slope |G| Ts / s. (A version that split the direction into max(s, 0) and
    max(-s, 0) got |G| ((Tc+ + |Tc-|) / 2 + Ts - Tc+) / s from jnp.maximum's tie rule.)"""
    arm = smooth_friction_arm(symmetric=False)
    J = np.asarray(friction_jacobian(arm, np.zeros(3)))
    G, Ts, s = np.abs(arm.drives.gear_ratio), arm.drives.static_friction, arm.drives.coulomb_velocity_scale
    p1, p2, p3 = PANDA_PHI[:3].T
    sig = p1 * p2 * np.exp(-p2 * p3) / (1 + np.exp(-p2 * p3)) ** 2
    expected = G * Ts / s + arm.drives.viscous_friction * G**2 + sig
    np.testing.assert_allclose(np.diag(J), central_difference_jacobian(arm, np.zeros(3)).diagonal(), rtol=1e-5)
    np.testing.assert_allclose(np.diag(J), expected, rtol=1e-9)


@pytest.mark.parametrize("models", [(), ("viscous",), ("coulomb",), ("stribeck",), ("sigmoid",), ("viscous", "coulomb", "stribeck", "sigmoid")])
def test_a_known_arm_leaves_its_switched_off_friction_models_out_and_computes_the_same(models):
    """A known arm (closed over by a jit) traces only the friction models whose parameters are
    set; the torques equal those of the same arm traced (all models evaluated) at velocities of
    both signs and at rest. Without Coulomb, Stribeck or sigmoid friction, no exponential or tanh
    is left in the program (the dearest operations of a dynamics evaluation)."""
    full = all_friction_arm()
    off = {"viscous_friction": 0.0, "coulomb_friction": 0.0, "static_friction": 0.0, "sigmoid_friction": 0.0}
    keep = {"viscous": ["viscous_friction"], "coulomb": ["coulomb_friction"], "stribeck": ["static_friction", "coulomb_friction"],
            "sigmoid": ["sigmoid_friction"]}
    for m in models:
        for field in keep[m]:
            off.pop(field, None)
    arm = with_drives(full, **off)
    known = jax.jit(lambda qd: jaxarm.friction_torques(arm, qd))
    traced = jax.jit(jaxarm.friction_torques)
    for qd in (np.array([0.7, -0.2, 0.0]), np.array([-1.5, 1e-4, 2.0])):
        np.testing.assert_allclose(known(qd), traced(arm, qd), rtol=1e-15, atol=1e-15)
    text = str(jax.make_jaxpr(lambda qd: jaxarm.friction_torques(arm, qd))(np.zeros(3)))
    if not any(m in models for m in ("coulomb", "stribeck", "sigmoid")):
        assert "exp" not in text and "tanh" not in text
    if "stribeck" in models or "sigmoid" in models:
        assert "exp" in text


@pytest.mark.parametrize("scale", [0.0, 0.05])
def test_a_partly_traced_drive_model_leaves_out_the_models_whose_known_parameters_are_zero(scale, monkeypatch):
    """Identification traces the viscous and Coulomb coefficients (arm_with_parameters) while the
    Stribeck and sigmoid parameters and the Coulomb smoothing scale stay known: the models those
    switch off are left out field by field (no exponential; the Coulomb direction as an exact sign
    or a tanh, not both), and the torques and their Jacobian with respect to the coefficients equal
    those with every model evaluated (as before, drives._MODELS_BY_FIELD off)."""
    from jaxarm.dynamics import drives

    arm = with_drives(all_friction_arm(), static_friction=0.0, sigmoid_friction=0.0, coulomb_velocity_scale=scale)
    coeffs = (np.asarray(arm.drives.viscous_friction), np.asarray(arm.drives.coulomb_friction))
    assert np.all(coeffs[0] != 0) and np.all(coeffs[1] != 0)

    def torques(c, qd):
        return jaxarm.friction_torques(arm.replace(drives=arm.drives.replace(viscous_friction=c[0], coulomb_friction=c[1])), qd)

    text = str(jax.make_jaxpr(torques)(coeffs, np.zeros(3)))
    assert "exp" not in text
    assert ("tanh" in text) == (scale > 0) and (" sign " in text) == (scale == 0)
    qds = [np.array([0.7, -0.2, 0.0]), np.array([-1.5, 1e-4, 2.0])]
    now = [(torques(coeffs, qd), jax.jacrev(torques)(coeffs, qd)) for qd in qds]
    monkeypatch.setattr(drives, "_MODELS_BY_FIELD", False)

    def before(c, qd):  # a new function: jax caches traces by function
        return torques(c, qd)

    assert "exp" in str(jax.make_jaxpr(before)(coeffs, np.zeros(3)))
    for qd, (value, jac) in zip(qds, now):
        np.testing.assert_allclose(value, before(coeffs, qd), rtol=1e-14, atol=1e-15)
        for a, b in zip(jax.tree_util.tree_leaves(jac), jax.tree_util.tree_leaves(jax.jacrev(before)(coeffs, qd))):
            np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-15)
