"""jaxarm.rollout: physics (energy), inputs (voltage, hold, DAC, external wrench, policies),
divergence handling, argument checks, differentiation, precision and batching.

Each check compares against something written independently: an energy balance, a hand-written
RK3 loop (tests.helpers_sim.kutta_rk3_step over jaxarm.forward_dynamics) with the motor model
of Swartz eq 12 and the DAC written out in NumPy, finite differences, or a Python loop.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from tests.helpers_sim import (
    BLOCK,
    energies,
    forward_dynamics,
    free_motion,
    kutta_rk3_step,
    motor_arm,
    pendulum,
    roll,
    sim_arm,
    with_drives,
    with_masses,
)

Q0, QD0 = np.array([0.3, -0.5, 0.8]), np.array([0.5, -0.3, 0.2])


def dac_numpy(u, full_scale, bits):
    """The nearest of the 2^bits levels -fs, -fs + step, ..., fs - step (step = 2 fs / 2^bits)."""
    step = 2.0 * full_scale / 2**bits
    idx = np.clip(np.round((np.asarray(u) + full_scale) / step), 0, 2**bits - 1)
    return -full_scale + idx * step


def hand_rollout(arm, q0, qd0, U, dt, *, voltage=False, hold=1, dac=None, f_ext=None):
    """Independent RK3 loop: input held for `hold` steps, DAC in NumPy, the motor model evaluated
    at every stage's velocity (Swartz eq 12 with the gearbox, voltage clipped at the limit)."""
    dr = arm.drives
    G, Kt, R, Vlim = (np.asarray(x) for x in (dr.gear_ratio, dr.torque_constant, dr.resistance, dr.voltage_limit))

    def torque(u, qd):
        if not voltage:
            return u
        V = np.clip(u, -Vlim, Vlim)
        return G * Kt * (V - Kt * G * qd) / R

    q, qd = np.asarray(q0, float), np.asarray(qd0, float)
    qs, us, taus = [q], [], []
    for k in range(len(U)):
        if k % hold == 0:
            u = np.asarray(U[k], float)
            if dac is not None:
                u = dac_numpy(u, dac.full_scale, dac.bits)
        fe = np.zeros(6) if f_ext is None else np.asarray(f_ext[k], float)
        us.append(np.clip(u, -Vlim, Vlim) if voltage else u)  # Trajectory.u records the saturated input
        taus.append(torque(u, qd))
        f = lambda t, qs_, qds_, u=u, fe=fe: np.asarray(forward_dynamics(arm, qs_, qds_, torque(u, qds_), fe))  # noqa: E731
        q, qd = kutta_rk3_step(f, k * dt, q, qd, dt)
        qs.append(q)
    return np.array(qs), np.array(us), np.array(taus)


# --------------------------------------------------------------------------------------
# Energy


def test_energy_is_conserved_without_friction_or_input():
    arm = sim_arm(1)
    q, qd = free_motion(arm, Q0, QD0, 1e-3, 40)  # 2 s at dt = 1 ms, RK3
    ke, pe = (np.asarray(x) for x in energies(arm, q, qd))
    E = ke + pe
    drift = np.max(np.abs(E - E[0])) / np.max(ke)  # relative to the kinetic energy exchanged
    print(f"RK3, dt = 1 ms, 2 s: max |E - E0| = {np.max(np.abs(E - E[0])):.3e} J, "
          f"relative to max KE {np.max(ke):.3f} J: {drift:.3e}")
    assert np.ptp(pe) > 0.5 * np.max(ke)  # the arm really swings
    assert drift < 1e-6


def test_energy_decreases_monotonically_with_viscous_friction():
    B = np.array([0.05, 0.08, 0.03])
    arm = with_drives(sim_arm(1), viscous_friction=B, gear_ratio=[2.0, -1.5, 1.0])
    q, qd = free_motion(arm, Q0, QD0, 1e-3, 40)
    ke, pe = (np.asarray(x) for x in energies(arm, q, qd))
    E = ke + pe
    assert np.all(np.diff(E) < 0), np.max(np.diff(E))
    # power balance: dE/dt = -sum B G^2 qd^2 (trapezoidal rule, O(dt^2))
    dissipated = np.sum(B * arm.drives.gear_ratio**2 * qd**2, axis=1)
    lost = np.sum(0.5 * (dissipated[1:] + dissipated[:-1])) * 1e-3
    print(f"viscous: energy lost {E[0] - E[-1]:.6f} J, dissipated {lost:.6f} J")
    np.testing.assert_allclose(E[0] - E[-1], lost, rtol=1e-5)


# --------------------------------------------------------------------------------------
# Motor voltage, hold, DAC and an external wrench schedule, all in one rollout (one compilation)
# against the hand-written loop

DAC = jaxarm.DAC(full_scale=10.0, bits=8)
DAC_STEP = 20.0 / 256


@pytest.fixture(scope="module")
def voltage_case():
    arm = motor_arm()
    rng = np.random.default_rng(3)
    U = rng.uniform(-12.0, 12.0, (BLOCK, 3))
    U[10] = [12.0, -12.0, 9.99]  # beyond the DAC's full scale on both sides
    F = np.concatenate([rng.uniform(-20, 20, (BLOCK, 3)), rng.uniform(-3, 3, (BLOCK, 3))], 1)  # (T, 6) wrench schedule
    traj = roll(arm, Q0, QD0, U, 0.005, f_ext=F, input="voltage", hold=5, dac=DAC)
    return arm, U, F, traj


def test_voltage_input_equals_hand_rk3_with_motor_model(voltage_case):
    arm, U, F, traj = voltage_case
    q, u, tau = hand_rollout(arm, Q0, QD0, U, 0.005, voltage=True, hold=5, dac=DAC, f_ext=F)
    assert int(traj.diverged_step) == -1
    assert np.ptp(q) > 0.1  # it moves
    np.testing.assert_allclose(traj.u, u, rtol=0, atol=1e-14)
    np.testing.assert_allclose(traj.tau, tau, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(traj.q, q, rtol=1e-11, atol=1e-11)
    # tau is what motor_torque gives for the held voltage at the step's starting velocity
    np.testing.assert_allclose(traj.tau, jax.vmap(lambda v, w: jaxarm.motor_torque(arm, v, w))(traj.u, traj.qd[:-1]), rtol=1e-13)


def test_wrench_schedule_is_applied_row_by_row(voltage_case):
    arm, U, F, traj = voltage_case
    without = hand_rollout(arm, Q0, QD0, U, 0.005, voltage=True, hold=5, dac=DAC)[0]
    assert np.max(np.abs(traj.q[-1] - without[-1])) > 1e-2  # the wrench matters ...
    reversed_rows = hand_rollout(arm, Q0, QD0, U, 0.005, voltage=True, hold=5, dac=DAC, f_ext=F[::-1])[0]
    assert np.max(np.abs(traj.q[-1] - reversed_rows[-1])) > 1e-3  # ... and row k acts at step k


def test_hold_keeps_the_input_over_each_block_of_5(voltage_case):
    arm, U, _, traj = voltage_case
    lim = np.asarray(arm.drives.voltage_limit)
    u = np.asarray(traj.u).reshape(BLOCK // 5, 5, 3)
    np.testing.assert_array_equal(u, np.repeat(u[:, :1], 5, axis=1))  # constant over each block
    # sampled at the block's first step (then saturated at the drive's voltage limit)
    np.testing.assert_allclose(u[:, 0], np.clip(dac_numpy(U[::5], 10.0, 8), -lim, lim), atol=1e-14)
    assert np.all(np.any(np.diff(u[:, 0], axis=0) != 0, axis=1))  # and changes between blocks


def test_dac_quantizes_and_clips_in_rollout(voltage_case):
    arm, U, _, traj = voltage_case
    lim = np.asarray(arm.drives.voltage_limit)  # Trajectory.u is after the DAC and the voltage clip
    u = np.asarray(traj.u)
    inside = np.abs(u) < lim
    np.testing.assert_allclose((u / DAC_STEP)[inside], np.round(u / DAC_STEP)[inside], atol=1e-12)  # whole levels
    assert u.min() >= -10.0 and u.max() <= 10.0 - DAC_STEP
    np.testing.assert_allclose(u[10], np.clip([10.0 - DAC_STEP, -10.0, 10.0 - DAC_STEP], -lim, lim), atol=1e-14)
    assert np.max(np.abs(u[::5] - np.clip(np.clip(U[::5], -10.0, 10.0 - DAC_STEP), -lim, lim))) <= DAC_STEP / 2 + 1e-12


def slider():
    """One prismatic joint along x (gravity along -z does not act on it), mass 2 kg."""
    return jaxarm.make_arm("P", convention="placement", axis=[[1.0, 0.0, 0.0]], mass=2.0, inertia=[[0.01, 0.02, 0.02]],
                           name="slider")


def test_constant_wrench_on_a_slider_without_jit():
    """rollout called directly (no jit) with a constant (6,) wrench: the tool is pushed along the
    joint by F_x, the other components do nothing, and RK3 integrates the constant acceleration
    (u + F_x) / m exactly."""
    f6 = np.array([3.0, -40.0, 25.0, 1.0, -2.0, 0.5])
    U = np.full((20, 1), 1.0)
    traj = jaxarm.rollout(slider(), np.array([0.1]), np.array([-0.4]), U, 0.01, f_ext=f6)
    t = np.asarray(traj.t)
    np.testing.assert_allclose(traj.q[:, 0], 0.1 - 0.4 * t + 0.5 * (1.0 + 3.0) / 2.0 * t**2, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(traj.qdd[:, 0], 2.0, rtol=1e-14)


# --------------------------------------------------------------------------------------
# Policies


@functools.partial(jax.jit, static_argnames="steps")
def pd_rollout(arm, q0, qd0, kp, kd, q_target, dt, steps):
    policy = jaxarm.pd_controller(kp, kd, q_target, gravity_compensation=arm)
    return jaxarm.rollout(arm, q0, qd0, policy, dt, steps=steps, on_divergence="flag")


def test_pd_with_gravity_compensation_converges():
    arm = pendulum()
    target = np.array([1.0])
    traj = pd_rollout(arm, np.array([-0.4]), np.array([0.3]), 20.0, 4.0, target, 0.01, 400)  # 4 s
    err = np.abs(traj.q[-1] - target).max()
    print(f"PD + gravity compensation after 4 s: |q - q*| = {err:.2e}, |qd| = {np.abs(traj.qd[-1]).max():.2e}")
    assert err < 1e-6 and np.abs(traj.qd[-1]).max() < 1e-5
    # the applied torque tends to the gravity torque at the target, which is far from zero
    g = jaxarm.gravity_torques(arm, target)
    assert np.abs(g).max() > 1.0
    np.testing.assert_allclose(traj.tau[-1], g, rtol=1e-5)
    # the first torque is the PD term plus g(q0)
    pd_term = 20.0 * (target + 0.4) - 4.0 * 0.3
    np.testing.assert_allclose(traj.tau[0], pd_term + jaxarm.gravity_torques(arm, np.array([-0.4])), rtol=1e-12)


AMP, FREQ = np.array([0.2, -0.15, 0.25]), np.array([1.0, 1.5, 0.8])


def reference(t):
    return AMP * jnp.sin(FREQ * t), AMP * FREQ * jnp.cos(FREQ * t), -AMP * FREQ**2 * jnp.sin(FREQ * t)


@jax.jit
def computed_torque_rollout(arm, q0, qd0, kp, kd, dt, t0):
    q_ref, qd_ref, qdd_ref = (lambda t, i=i: reference(t)[i] for i in range(3))
    policy = jaxarm.computed_torque_controller(arm, kp, kd, q_ref, qd_ref, qdd_ref)
    return jaxarm.rollout(arm, q0, qd0, policy, dt, steps=BLOCK, t0=t0, on_divergence="flag")


def tracking_error(dt, seconds=1.0, kp=1e4, kd=200.0):
    arm = sim_arm(1)
    q, qd, t0 = reference(0.0)[0], reference(0.0)[1], 0.0
    err = 0.0
    for _ in range(int(round(seconds / (BLOCK * dt)))):
        traj = computed_torque_rollout(arm, q, qd, kp, kd, dt, t0)
        err = max(err, float(np.max(np.abs(traj.q - reference(traj.t[:, None])[0]))))
        q, qd, t0 = traj.q[-1], traj.qd[-1], traj.t[-1]
    return err


def test_computed_torque_with_perfect_model_tracks_a_sinusoid():
    """The policy is sampled once per step and held (zero-order hold), so even a perfect model
    leaves an O(dt) tracking error (~ dt jerk / (2 kp)); here it is below 1e-6 at dt = 1 ms."""
    e1, e2 = tracking_error(1e-3), tracking_error(5e-4)
    print(f"computed torque: max tracking error {e1:.2e} (dt = 1 ms), {e2:.2e} (dt = 0.5 ms), ratio {e1 / e2:.2f}")
    assert e1 < 1e-6
    assert 1.8 < e1 / e2 < 2.2  # first order in dt: the held input, not a model error


# --------------------------------------------------------------------------------------
# Divergence and argument checks


def test_divergence_raises_naming_the_step():
    U = np.zeros((12, 1))
    U[7] = 1e30
    with pytest.raises(jaxarm.DivergenceError, match=r"step 7 \(t = 0\.08 s\)"):
        jaxarm.rollout(slider(), np.zeros(1), np.zeros(1), U, 0.01)


def test_divergence_flag_freezes_the_state():
    arm = sim_arm(1)
    U = np.zeros((BLOCK, 3))
    U[17, 1] = 1e30
    traj = roll(arm, Q0, QD0, U, 0.01)
    clean = roll(arm, Q0, QD0, np.zeros((BLOCK, 3)), 0.01)
    assert int(traj.diverged_step) == 17
    assert np.all(np.isfinite(traj.q)) and np.all(np.isfinite(traj.qd))
    np.testing.assert_array_equal(traj.q[:18], clean.q[:18])  # untouched up to the bad step
    np.testing.assert_array_equal(traj.q[17:], np.broadcast_to(traj.q[17], (BLOCK - 16, 3)))  # frozen after it
    np.testing.assert_array_equal(traj.qd[17:], np.broadcast_to(traj.qd[17], (BLOCK - 16, 3)))
    assert int(clean.diverged_step) == -1
    with pytest.raises(jaxarm.DivergenceError, match="step 17"):
        jaxarm.check_divergence(traj)
    assert jaxarm.check_divergence(clean) is clean


def test_torque_inputs_are_clipped_at_the_torque_limits():
    limited = sim_arm(1).replace(limits=dataclasses.replace(sim_arm(1).limits, torque=np.array([5.0, 3.0, 8.0])))
    U = np.random.default_rng(4).uniform(-10.0, 10.0, (BLOCK, 3))
    traj = roll(limited, Q0, QD0, U, 0.01)
    clipped = np.clip(U, -np.array([5.0, 3.0, 8.0]), [5.0, 3.0, 8.0])
    np.testing.assert_array_equal(traj.tau, clipped)
    np.testing.assert_allclose(traj.q, roll(sim_arm(1), Q0, QD0, clipped, 0.01).q, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_schedule_is_rejected(bad):
    U = np.zeros((5, 3))
    U[2, 1] = bad
    with pytest.raises(ValueError, match="inputs.*NaN or inf"):
        jaxarm.rollout(sim_arm(1), Q0, QD0, U, 0.01)


@pytest.mark.parametrize("dt", [0.0, -0.01])
def test_non_positive_dt_is_rejected(dt):
    with pytest.raises(ValueError, match="dt"):
        jaxarm.rollout(sim_arm(1), Q0, QD0, np.zeros((5, 3)), dt)


@pytest.mark.parametrize("shape", [(5, 2), (5,), (5, 3, 1), (5, 4)])
def test_wrong_schedule_shape_names_inputs(shape):
    with pytest.raises(ValueError, match=r"inputs.*\(T, 3\)"):
        jaxarm.rollout(sim_arm(1), Q0, QD0, np.zeros(shape), 0.01)


def test_other_argument_errors():
    arm = sim_arm(1)
    with pytest.raises(ValueError, match="f_ext"):
        jaxarm.rollout(arm, Q0, QD0, np.zeros((5, 3)), 0.01, f_ext=np.zeros((4, 6)))
    with pytest.raises(ValueError, match="steps"):
        jaxarm.rollout(arm, Q0, QD0, jaxarm.pd_controller(1.0, 1.0, Q0), 0.01)
    with pytest.raises(ValueError, match="q0"):
        jaxarm.rollout(arm, np.zeros(2), QD0, np.zeros((5, 3)), 0.01)
    with pytest.raises(ValueError, match="hold"):
        jaxarm.rollout(arm, Q0, QD0, np.zeros((5, 3)), 0.01, hold=0)
    with pytest.raises(ValueError, match="input"):
        jaxarm.rollout(arm, Q0, QD0, np.zeros((5, 3)), 0.01, input="current")
    with pytest.raises(ValueError, match="on_divergence"):
        jaxarm.rollout(arm, Q0, QD0, np.zeros((5, 3)), 0.01, on_divergence="ignore")


# --------------------------------------------------------------------------------------
# Gradients (the pendulum and Euler steps keep the reverse-mode compilation short; the scan, the
# divergence masking and the checkpointing are the same for every arm and method)

P_Q0, P_QD0 = np.array([0.4]), np.array([-0.2])
U_PENDULUM = 0.5 * np.sin(np.linspace(0.0, 3.0, BLOCK))[:, None]


def loss_of(traj):
    return jnp.sum(jnp.sin(traj.q[-1])) + 0.1 * jnp.sum(traj.qd[-1] ** 2) + 0.01 * jnp.sum(traj.q**2)


@functools.partial(jax.jit, static_argnums=2)
@functools.partial(jax.grad, argnums=(0, 1))
def loss_grad(arm, u, checkpoint):
    traj = jaxarm.rollout(arm, P_Q0, P_QD0, u, 0.01, method="euler", checkpoint=checkpoint, on_divergence="flag")
    return loss_of(traj)


def loss_value(arm, u):
    return float(loss_of(roll(arm, P_Q0, P_QD0, u, 0.01, method="euler")))


def test_grad_through_rollout_matches_finite_differences():
    arm = pendulum()
    g_arm, g_u = loss_grad(arm, U_PENDULUM, False)
    h = 1e-6
    rows = range(0, BLOCK, 7)
    fd_u = [(loss_value(arm, U_PENDULUM + h * e) - loss_value(arm, U_PENDULUM - h * e)) / (2 * h)
            for e in np.eye(BLOCK)[list(rows), :, None]]
    np.testing.assert_allclose(np.asarray(g_u)[list(rows), 0], fd_u, rtol=1e-6, atol=1e-9)
    m = arm.links.mass
    fd_m = (loss_value(with_masses(arm, m + h), U_PENDULUM) - loss_value(with_masses(arm, m - h), U_PENDULUM)) / (2 * h)
    print(f"dloss/dmass = {float(g_arm.links.mass[0]):.9f} (finite differences {fd_m:.9f})")
    assert abs(fd_m) > 1e-3
    np.testing.assert_allclose(g_arm.links.mass, [fd_m], rtol=1e-6)


def test_checkpointed_gradient_equals_plain_gradient():
    arm = pendulum()
    plain = loss_grad(arm, U_PENDULUM, False)
    ckpt = loss_grad(arm, U_PENDULUM, True)
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(ckpt)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_reverse_mode_linearizes_each_loop_body_once(monkeypatch):
    """Differentiated with respect to its inputs (or its arm) only, a rollout's state starts without
    a tangent. It is given one from the start, so the scan's derivative rule linearizes the time
    loop's body once, instead of again (with the Runge-Kutta stage loop inside it) once the state's
    tangent appears (a Puma torque gradient traced in about 1.9 s instead of 3-3.6 s). Counted at
    jax's linearization of a loop body (an internal function; the test skips where this jax has
    none)."""
    from jax._src.interpreters import ad

    if not hasattr(ad, "linearize_jaxpr"):
        pytest.skip("this jax linearizes loop bodies differently (no jax._src.interpreters.ad.linearize_jaxpr)")
    seen = []  # (jaxpr, calls): kept alive so that no two bodies share an id
    original = ad.linearize_jaxpr

    def counted(jaxpr, *args, **kw):
        for entry in seen:
            if entry[0] is jaxpr.jaxpr:
                entry[1] += 1
                break
        else:
            seen.append([jaxpr.jaxpr, 1])
        return original(jaxpr, *args, **kw)

    monkeypatch.setattr(ad, "linearize_jaxpr", counted)
    arm = sim_arm(3)
    u = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (8, arm.n)))

    def loss(arm, u, q0):
        return jnp.sum(jaxarm.rollout(arm, q0, jnp.zeros(arm.n), u, 0.01, on_divergence="flag").q[-1] ** 2)

    for argnums in (1, 0, (0, 1, 2)):  # the inputs; the arm; everything
        seen.clear()
        jax.make_jaxpr(jax.grad(loss, argnums=argnums))(arm, u, jnp.asarray(Q0))
        time_loop = [calls for body, calls in seen if any(e.primitive.name == "scan" for e in body.eqns)]  # holds the stage loop
        assert time_loop == [1], f"argnums={argnums}: the time loop's body linearized {time_loop} times"


def test_reverse_mode_keeps_the_stage_accelerations_and_recomputes_the_rest(capsys):
    """A rollout's dynamics are evaluated again in reverse mode (integrators._recomputed), except
    for the forward dynamics' accelerations, which are kept: the derivative is taken at them, and
    recomputing them cost a whole forward dynamics per stage. What the reverse pass keeps of one
    evaluation: its arguments, the accelerations and the arm's constants, nothing of the
    recursion's intermediates; for a known arm and for a traced one."""
    from jax.ad_checkpoint import print_saved_residuals

    from jaxarm.dynamics.forward import ACCELERATION
    from jaxarm.simulate import integrators

    arm = sim_arm(3)
    x = [jnp.asarray(np.random.default_rng(k).uniform(-1, 1, arm.n)) for k in range(3)]
    known = integrators._recomputed(lambda q, qd, tau: jaxarm.forward_dynamics(arm, q, qd, tau))
    traced = integrators._recomputed(lambda a, q, qd, tau: jaxarm.forward_dynamics(a, q, qd, tau))
    for f, args in ((known, x), (traced, [arm, *x])):
        print_saved_residuals(lambda *a: jnp.sum(f(*a) ** 2), *args)
        kept = capsys.readouterr().out.splitlines()
        named = [r for r in kept if f"named '{ACCELERATION}'" in r]
        assert len(named) == 1, kept
        rest = [r for r in kept if r not in named and "from a constant" not in r and "from the argument" not in r
                and "from a literal" not in r and "output of mul" not in r]  # (the squares of the loss itself)
        assert not rest, rest
        assert sum("output of mul" in r for r in kept) <= 1, kept


# --------------------------------------------------------------------------------------
# Precision


def test_float32_arm_agrees_with_float64():
    """arm.astype(float32) runs in float32 throughout (with x64 enabled) and stays within 1e-4
    of float64 (the pendulum with Euler steps: its float64 compilation is shared)."""
    arm = pendulum()
    U = np.asarray(U_PENDULUM)
    ref = roll(arm, P_Q0, P_QD0, U, 0.01, method="euler")
    low = roll(arm.astype(jnp.float32), P_Q0.astype(np.float32), P_QD0.astype(np.float32), U, 0.01, method="euler")
    assert low.q.dtype == jnp.float32 and low.qd.dtype == jnp.float32 and low.tau.dtype == jnp.float32
    err = np.max(np.abs(np.asarray(low.q, float) - ref.q))
    print(f"float32 vs float64 over {BLOCK} steps: max |dq| = {err:.2e}")
    assert err < 1e-4
    assert err > 0  # really computed in lower precision


# --------------------------------------------------------------------------------------
# Batches (pendulums with Euler steps: the loop reuses the gradient tests' compilation;
# jaxarm.rollout_batch with batches not divisible by the device count is in test_sharding.py)

vmapped_rollout = jax.jit(jax.vmap(functools.partial(jaxarm.rollout, dt=0.01, method="euler", on_divergence="flag")))


def test_vmap_over_states_inputs_and_arms_equals_a_loop():
    arms = [pendulum(mass=m) for m in (1.5, 2.5, 0.8)]
    rng = np.random.default_rng(11)
    q0, qd0 = rng.uniform(-1, 1, (3, 1)), rng.uniform(-0.5, 0.5, (3, 1))
    U = rng.uniform(-2.0, 2.0, (3, BLOCK, 1))
    traj = vmapped_rollout(jaxarm.stack_arms(arms), q0, qd0, U)
    for i, (a, q, v, u) in enumerate(zip(arms, q0, qd0, U)):
        one = roll(a, q, v, u, 0.01, method="euler")
        for name in ("q", "qd", "qdd", "tau", "u", "t"):
            np.testing.assert_allclose(getattr(traj, name)[i], getattr(one, name), rtol=1e-12, atol=1e-12, err_msg=f"{name}[{i}]")
    assert traj.q.shape == (3, BLOCK + 1, 1) and traj.diverged_step.shape == (3,)
    # the same initial state and input with a different mass gives a different motion
    same = vmapped_rollout(jaxarm.stack_arms(arms), np.repeat(q0[:1], 3, 0), np.repeat(qd0[:1], 3, 0), np.repeat(U[:1], 3, 0))
    assert not np.allclose(same.q[0, -1], same.q[1, -1])


def test_a_batch_of_arms_varying_in_masses_keeps_its_kinematics_folded():
    """rollout_batch(arm_batched=True) compiles in the leaves shared by the whole batch (here the
    Panda's kinematics), and _bodies computes the placements of an arm whose kinematics are known
    while its masses are traced as constants: the same motion as vmap over the stacked arms
    (every leaf traced), and a forward dynamics whose kinematic zeros fold."""
    from jaxarm.dynamics import kinematics
    from jaxarm.simulate import batch

    arm = jaxarm.load_arm("panda")
    rng = np.random.default_rng(5)
    B, T = 4, 30
    members = [arm.replace(links=arm.links.replace(mass=np.asarray(arm.links.mass) * rng.uniform(0.8, 1.2, arm.n),
                                                   com=np.asarray(arm.links.com) + rng.normal(0, 0.01, (arm.n, 3))))
               for _ in range(B)]
    arms = jaxarm.stack_arms(members)
    mid = np.mean(np.asarray(arm.limits.position), axis=1)
    q0 = mid + rng.uniform(-0.2, 0.2, (B, arm.n))
    qd0 = rng.uniform(-0.3, 0.3, (B, arm.n))
    U = np.stack([np.asarray(jaxarm.gravity_torques(a, q)) for a, q in zip(members, q0)])[:, None, :] + rng.uniform(-1, 1, (B, T, arm.n))
    dt = 2e-3
    traj = jaxarm.rollout_batch(arms, q0, qd0, U, dt, arm_batched=True)
    ref = jax.jit(jax.vmap(functools.partial(jaxarm.rollout, dt=dt, on_divergence="flag")))(arms, q0, qd0, U)
    np.testing.assert_allclose(traj.q, ref.q, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(traj.qdd, ref.qdd, rtol=1e-9, atol=1e-9)
    as_data = jaxarm.rollout_batch(arms, q0, qd0, U, dt, arm_batched=True, constant_arm=False)
    np.testing.assert_allclose(as_data.q, ref.q, rtol=1e-11, atol=1e-11)
    assert not np.allclose(traj.q[0, -1], traj.q[1, -1])  # the members differ
    f32 = jaxarm.rollout_batch(arms.astype(jnp.float32), *(np.asarray(x, np.float32) for x in (q0, qd0, U)), dt, arm_batched=True)
    assert f32.q.dtype == jnp.float32 and f32.qdd.dtype == jnp.float32  # float32 placements for a float32 batch
    np.testing.assert_allclose(f32.q, ref.q, atol=1e-3)
    # the shared leaves are the kinematics, limits and the rest; the masses and COMs vary
    shared = batch._SharedLeaves(arms)
    assert len(shared.varying(arms)) == 2
    # traced masses, known kinematics: the placements are numpy arrays (folded), the inertias traced
    seen = {}

    def grab(mass):
        bodies = kinematics._bodies(arm.replace(links=arm.links.replace(mass=mass)))
        seen["rotation"], seen["mass"] = bodies.rotation, bodies.mass
        return bodies.mass

    jax.make_jaxpr(grab)(jnp.asarray(arm.links.mass))
    assert isinstance(seen["rotation"], np.ndarray) and isinstance(seen["mass"], jax.core.Tracer)
    np.testing.assert_allclose(seen["rotation"], np.asarray(jaxarm.body_model(arm).rotation), atol=1e-15)
    # and the gradient with respect to the masses equals the one through a fully traced arm
    q, qd = jnp.asarray(q0[0]), jnp.asarray(qd0[0])
    tau = jnp.asarray(U[0, 0])

    def fd_masses(mass):
        return jnp.sum(jaxarm.forward_dynamics(arm.replace(links=arm.links.replace(mass=mass)), q, qd, tau) ** 2)

    def fd_traced(a):
        return jnp.sum(jaxarm.forward_dynamics(a, q, qd, tau) ** 2)

    g_masses = jax.grad(fd_masses)(jnp.asarray(arm.links.mass))
    g_traced = jax.grad(fd_traced)(jax.tree_util.tree_map(jnp.asarray, arm)).links.mass
    np.testing.assert_allclose(g_masses, g_traced, rtol=1e-10, atol=1e-12)


def test_a_shared_arm_differentiated_over_a_batch_reads_its_inertias_per_state(monkeypatch):
    """jax.grad of a loss over a vmapped batch of rollouts with respect to the one arm they share
    (identification from several experiments) reads the arm's inertial parameters per state, one
    vector per body, so that reverse mode sums their cotangents over the batch once per body
    (algebra.per_state_entries). The gradient is the sum of the experiments' own gradients (each
    without vmap, so read as before), links and drives alike, and the inertia's gradient stays
    symmetric. A vmap of grad, a batch of one, a stacked arm and forward mode read them as before."""
    from jaxarm.dynamics import newton_euler

    calls = []
    real = newton_euler.per_state_entries
    monkeypatch.setattr(newton_euler, "per_state_entries", lambda *a, **k: calls.append(1) or real(*a, **k))
    arm = with_drives(sim_arm(4), viscous_friction=0.05, rotor_inertia=1e-4)
    # the inertial and drive parameters traced, the kinematics known (as identification has them)
    params = jax.tree_util.tree_map(jnp.asarray, (arm.links, arm.drives))
    rng = np.random.default_rng(3)
    B, T = 3, 8
    q0 = rng.uniform(-0.5, 0.5, (B, arm.n))
    qd0 = rng.uniform(-0.5, 0.5, (B, arm.n))
    U = rng.uniform(-2, 2, (B, T, arm.n))

    def one(p, q, qd, u):
        traj = jaxarm.rollout(arm.replace(links=p[0], drives=p[1]), q, qd, u, 2e-3, on_divergence="flag")
        return jnp.sum(jnp.sin(traj.q[1:])) + 0.1 * jnp.sum(traj.qd[-1] ** 2)

    def batch_loss(p, q, qd, u):
        return jnp.sum(jax.vmap(one, in_axes=(None, 0, 0, 0))(p, q, qd, u))

    g = jax.jit(jax.grad(batch_loss))(params, q0, qd0, U)
    assert calls, "the batched gradient did not read the inertias per state"
    calls.clear()
    one_grad = jax.jit(jax.grad(one))
    parts = [one_grad(params, q0[i], qd0[i], U[i]) for i in range(B)]
    assert not calls
    total = jax.tree_util.tree_map(lambda *xs: sum(xs), *parts)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree_util.tree_leaves(total)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=jax.tree_util.keystr(path))
    inertia = np.asarray(g[0].inertia)
    assert np.max(np.abs(inertia)) > 1e-3
    np.testing.assert_allclose(inertia, np.swapaxes(inertia, -1, -2), rtol=0, atol=1e-14)
    assert np.all(np.asarray(g[1].viscous_friction) != 0) and np.all(np.asarray(g[0].mass) != 0)
    # no per-state reads where nothing is summed over a batch (traced only)
    jax.make_jaxpr(jax.vmap(jax.grad(one), in_axes=(None, 0, 0, 0)))(params, q0, qd0, U)
    jax.make_jaxpr(jax.grad(batch_loss))(params, q0[:1], qd0[:1], U[:1])
    stacked = jax.tree_util.tree_map(lambda x: jnp.stack([x] * B), params)
    jax.make_jaxpr(jax.grad(lambda p: jnp.sum(jax.vmap(one)(p, q0, qd0, U))))(stacked)
    jax.make_jaxpr(lambda p: jax.jvp(lambda b: batch_loss(b, q0, qd0, U), (p,), (p,)))(params)
    assert not calls


def test_batch_argument_errors():
    base = sim_arm(1)
    other = sim_arm(1).replace(name="other")
    with pytest.raises(ValueError, match=r"arms\[1\]"):
        jaxarm.stack_arms([base, other])
    with pytest.raises(ValueError, match="q0, qd0"):
        jaxarm.rollout_batch(base, Q0, QD0, np.zeros((5, 3)), 0.01)
    with pytest.raises(ValueError, match="inputs"):
        jaxarm.rollout_batch(base, np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((3, 5, 3)), 0.01)
    with pytest.raises(ValueError, match="arm_batched"):
        jaxarm.rollout_batch(jaxarm.stack_arms([base] * 3), np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 5, 3)), 0.01,
                             arm_batched=True)


def test_a_schedule_closed_over_inside_jit_is_accepted_and_nan_still_refused():
    """A concrete schedule captured by a jitted function (not an argument) is checked with numpy;
    inside the trace the jnp check would be a tracer and could not be turned into a bool."""
    import jax
    import jax.numpy as jnp

    import jaxarm

    arm = jaxarm.load_arm("two_link_planar")
    u = jnp.ones((5, 2))
    q = jax.jit(lambda q0: jaxarm.rollout(arm, q0, jnp.zeros(2), u, 1e-3).q[-1])(jnp.zeros(2))
    assert q.shape == (2,) and bool(jnp.all(jnp.isfinite(q)))
    bad = u.at[2, 1].set(jnp.nan)
    with pytest.raises(ValueError, match="NaN or inf"):
        jax.jit(lambda q0: jaxarm.rollout(arm, q0, jnp.zeros(2), bad, 1e-3).q[-1])(jnp.zeros(2))


def test_the_steps_clip_end_stops_and_divergence_guard_keep_one_array_each_in_reverse_mode(monkeypatch):
    """The torque clip, the end stops and the divergence guard of a rollout step differentiate by
    rules of their own (algebra.saturated, rollouts._end_stops, _selected) that keep one array each
    per step for the reverse pass (the end stops two), fewer than jax's own rules keep (13
    against 16 per step for a batch of two): the same gradients, with inputs beyond the torque
    limits, one exactly on a limit (a tie, whose derivative jax splits evenly), joints driven
    into their end stops, and with respect to the limits themselves (where jax's own rules are
    used)."""
    from jaxarm.dynamics import algebra
    from jaxarm.simulate import rollouts

    arm = sim_arm(3)
    arm = arm.replace(limits=dataclasses.replace(arm.limits, torque=np.array([3.0, 2.0, 1.0]),
                                                 position=np.array([[-0.3, 0.3]] * 3)))
    rng = np.random.default_rng(5)
    T = 40
    u = jnp.asarray(rng.normal(0.0, 3.0, (T, 3)))
    u = u.at[3, 1].set(2.0)  # exactly on the limit
    q0 = jnp.asarray([0.1, -0.2, 0.25])

    def cost(u, q0, limits):
        a = arm.replace(limits=limits)
        traj = jaxarm.rollout(a, q0, jnp.zeros(3), u, 0.01, method="rk3", on_divergence="flag")
        return jnp.sum(traj.q[-1] ** 2) + jnp.sum(jnp.sin(traj.qd[T // 2])), traj.stop_steps

    (_, stops), grads = jax.jit(jax.value_and_grad(cost, argnums=(0, 1, 2), has_aux=True))(u, q0, arm.limits)
    assert np.all(np.asarray(stops) > 0), stops  # every joint was held by a stop at some step

    def stored(fn):  # the arrays the time loop of a batch of two rollouts stacks for the reverse pass
        batch = lambda us: jnp.sum(jax.vmap(lambda u: fn(u, q0, arm.limits)[0])(us))  # noqa: E731
        res = jax.tree_util.tree_leaves(jax.eval_shape(lambda us: jax.vjp(batch, us)[1], jnp.stack([u, -u])))
        return sum(1 for r in res if r.shape[:1] == (T,))

    ours = stored(cost)
    monkeypatch.setattr(algebra, "saturated", algebra.saturated_plain)
    monkeypatch.setattr(rollouts, "_end_stops", rollouts._end_stops_plain)
    monkeypatch.setattr(rollouts, "_selected", rollouts._selected_plain)
    (_, stops_jax), grads_jax = jax.jit(jax.value_and_grad(cost, argnums=(0, 1, 2), has_aux=True))(u, q0, arm.limits)
    theirs = stored(cost)
    np.testing.assert_array_equal(np.asarray(stops), np.asarray(stops_jax))
    for g, h in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_jax)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-13, atol=1e-15)
    assert float(jnp.abs(grads[0][3, 1])) > 0  # the tie's half derivative reached the input
    print(f"stored per step: {ours} with the rules, {theirs} with jax's own")
    assert ours <= theirs - 3, (ours, theirs)


def test_a_voltage_rollouts_clip_at_the_voltage_limits_differentiates_as_jnp_clip(monkeypatch):
    """Voltage inputs are clipped at the drives' limits by the same rule as torques
    (jaxarm.dynamics.algebra.saturated): the gradient with respect to the voltages, some beyond joint 1's 6 V
    limit and one exactly on it, equals the one through jnp.clip's own derivative."""
    from jaxarm.dynamics import algebra

    arm = motor_arm()
    rng = np.random.default_rng(8)
    T = 30
    V = jnp.asarray(rng.uniform(-12.0, 12.0, (T, 3))).at[4, 0].set(6.0)

    def cost(V):
        traj = jaxarm.rollout(arm, jnp.zeros(3), jnp.zeros(3), V, 0.005, input="voltage", on_divergence="flag")
        return jnp.sum(traj.q[-1] ** 2) + jnp.sum(traj.qd[-1])

    ours = jax.jit(jax.grad(cost))(V)
    monkeypatch.setattr(algebra, "saturated", algebra.saturated_plain)
    theirs = jax.jit(jax.grad(cost))(V)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-13, atol=1e-16)
    clipped = np.abs(np.asarray(V[:, 0])) > 6.0
    assert clipped.any() and np.all(np.asarray(ours)[clipped, 0] == 0.0)  # no derivative through the clip
    assert float(ours[4, 0]) != 0.0  # the tie's half derivative
