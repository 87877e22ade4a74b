"""Linearization (jaxarm.linearize): autodiff Jacobians against central finite differences,
the discrete RK3 step against the continuous model as dt -> 0 (with the order derived below),
zero-order hold against a closed form, and the second-order form against the state-space model."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm import linearize as lin
from tests.helpers import assert_close, random_arm

N_JOINTS = 3
NAME = "lin"  # one arm structure for the whole file: compiled programs are shared


def _arm(seed=0, drives=True, coulomb=True):
    arm = random_arm(seed, "RPR", "placement", drives=drives, name=NAME)
    if not coulomb:
        d = arm.drives
        arm = arm.replace(drives=dataclasses.replace(d, coulomb_friction=np.zeros_like(np.asarray(d.coulomb_friction))))
    return arm


def _nominal(seed, T=3, n=N_JOINTS, torque=3.0):
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1.0, 1.0, (T, n))
    qd = rng.choice([-1.0, 1.0], (T, n)) * rng.uniform(0.3, 1.5, (T, n))  # away from the Coulomb switch
    u = rng.uniform(-torque, torque, (T, n))
    return q, qd, u


def _fd_jacobians(fun, x, u, eps=1e-6):
    """Central differences of fun(x, u) with respect to x and u: (N, len(x)), (N, len(u))."""
    cols_x = [(fun(x + eps * e, u) - fun(x - eps * e, u)) / (2 * eps) for e in np.eye(len(x))]
    cols_u = [(fun(x, u + eps * e) - fun(x, u - eps * e)) / (2 * eps) for e in np.eye(len(u))]
    return np.stack(cols_x, 1), np.stack(cols_u, 1)


_f = jax.jit(lin._state_derivative, static_argnames=("input", "saturate"))
_F = jax.jit(lin._step, static_argnames=("method", "input", "saturate"))


@pytest.mark.parametrize("input", ["torque", "voltage"])
def test_continuous_jacobians_match_finite_differences(input):
    arm = _arm(1)
    q, qd, u = _nominal(1, torque=3.0 if input == "torque" else 10.0)  # voltages below the 24 V limit
    A, B = jaxarm.linearize.linearize_continuous(arm, q, qd, u, input=input)
    assert A.shape == (3, 6, 6) and B.shape == (3, 6, 3)
    for k in range(3):
        x = np.concatenate([q[k], qd[k]])
        Afd, Bfd = _fd_jacobians(lambda x, u: np.asarray(_f(arm, x, u, input=input)), x, u[k])
        assert_close(A[k], Afd, 1e-7, f"A[{k}] ({input})")
        assert_close(B[k], Bfd, 1e-7, f"B[{k}] ({input})")
    # top rows: d q'/d qd = I, d q'/d q = 0, d q'/d u = 0
    np.testing.assert_array_equal(np.asarray(A[:, :3, 3:]), np.broadcast_to(np.eye(3), (3, 3, 3)))
    np.testing.assert_array_equal(np.asarray(B[:, :3]), 0.0)


def test_voltage_input_matrix_is_motor_gain_and_vanishes_when_saturated():
    """B = [[0], [M^-1 diag(G Kt / R)]] inside the voltage limits (Swartz eq 12), 0 beyond them."""
    arm = _arm(2)
    q, qd, _ = _nominal(2)
    dr = arm.drives
    gain = np.asarray(dr.gear_ratio) * np.asarray(dr.torque_constant) / np.asarray(dr.resistance)
    V = np.array([[5.0, -3.0, 1.0], [5.0, -3.0, 1.0 + np.asarray(dr.voltage_limit)[2]], [-1.0 - np.asarray(dr.voltage_limit)[0], 2.0, 0.0]])
    _, B = jaxarm.linearize.linearize_continuous(arm, q, qd, V, input="voltage")
    for k, saturated in enumerate([None, 2, 0]):
        expected = np.linalg.solve(np.asarray(jaxarm.mass_matrix(arm, q[k])), np.diag(gain))
        if saturated is not None:
            expected[:, saturated] = 0.0
        assert_close(B[k, 3:], expected, 1e-10, f"voltage B, point {k}")


def test_discrete_step_jacobians_match_finite_differences():
    arm = _arm(3)
    q, qd, u = _nominal(3)
    dt = 5e-3
    Ad, Bd = jaxarm.linearize.linearize_trajectory(arm, q, qd, u, dt)
    for k in range(3):
        x = np.concatenate([q[k], qd[k]])
        Afd, Bfd = _fd_jacobians(lambda x, u: np.asarray(_F(arm, x, u, dt, None, method="rk3", input="torque", saturate=True)), x, u[k])
        assert_close(Ad[k], Afd, 1e-8, f"Ad[{k}]")
        assert_close(Bd[k], Bfd, 1e-7, f"Bd[{k}]")


def test_structured_step_jacobians_equal_forward_mode_through_the_rollout_step():
    """A step by name takes the step Jacobians built from the dynamics' structure
    (jaxarm.control.step_jacobians); the same step passed as a function goes through forward mode
    of the rollout's step. Both give the same A, B with a tool wrench, a torque beyond its limit
    (saturated: a zero column of B) and a joint that ends the step on its end stop (a zero row)."""
    from jaxarm.simulate import integrators

    arm = _arm(5)
    q, qd, u = _nominal(5, T=4)
    dt = 5e-3
    u[1, 0] = 6.0  # beyond the torque limit of 4 set below
    limits = np.tile([-3.0, 3.0], (N_JOINTS, 1))
    qd[2, 2] = abs(qd[2, 2])
    limits[2, 1] = q[2, 2] + 1e-4  # joint 3 runs into its upper stop during step 2
    q[:, 2] = np.minimum(q[:, 2], limits[2, 1])
    arm = arm.replace(limits=dataclasses.replace(arm.limits, position=limits, torque=np.full(N_JOINTS, 4.0)))
    f_ext = np.random.default_rng(5).normal(size=(4, 6))
    A1, B1 = jaxarm.linearize.linearize_trajectory(arm, q, qd, u, dt, method="semi_implicit_euler", f_ext=f_ext)
    A2, B2 = jaxarm.linearize.linearize_trajectory(arm, q, qd, u, dt, method=integrators.semi_implicit_euler, f_ext=f_ext)
    assert_close(A1, A2, 1e-12, "A")
    assert_close(B1, B2, 1e-12, "B")
    assert float(jnp.max(jnp.abs(B1[1, :, 0]))) == 0.0  # the saturated torque
    assert float(jnp.max(jnp.abs(A1[2, 2]))) == 0.0 and float(jnp.max(jnp.abs(A1[2, N_JOINTS + 2]))) == 0.0  # on the stop


def test_step_at_equilibrium_is_rk3_of_the_linear_model_and_zoh_agrees_to_fourth_order():
    """At an equilibrium (qd = 0, u = gravity torque) every RK3 stage sits at x*, so by the chain rule
    the step Jacobian is RK3 applied to dx' = A dx + B du exactly:
    Ad = I + Ah + (Ah)^2/2 + (Ah)^3/6, Bd = (h + A h^2/2 + A^2 h^3/6) B,
    which differ from the ZOH exp(Ah) by (Ah)^4/24 + O(h^5): order 4.
    (Without Coulomb friction: sign(qd) at rest makes the stages jump off the equilibrium.)"""
    arm = _arm(4, coulomb=False)
    q = np.array([[0.3, 0.1, -0.7], [-1.2, 0.4, 0.9], [2.0, -0.2, 0.1]])  # three equilibria
    g = np.stack([np.asarray(jaxarm.gravity_torques(arm, qk)) for qk in q])
    A, B = (np.asarray(x) for x in jaxarm.linearize.linearize_continuous(arm, q, 0 * q, g))
    I = np.eye(6)
    errs = []
    for h in (4e-2, 2e-2, 1e-2):
        Ad, Bd = (np.asarray(x) for x in jaxarm.linearize.linearize_trajectory(arm, q, 0 * q, g, h))
        Az, _ = (np.asarray(x) for x in jaxarm.linearize.discretize_zoh(A, B, h))
        for k in range(3):
            Ah = A[k] * h
            assert_close(Ad[k], I + Ah + Ah @ Ah / 2 + Ah @ Ah @ Ah / 6, 1e-12, f"RK3 polynomial, h={h}")
            assert_close(Bd[k], (h * I + Ah * h / 2 + Ah @ Ah * h / 6) @ B[k], 1e-12, f"RK3 input polynomial, h={h}")
            assert_close(Az[k] - Ad[k], np.linalg.matrix_power(Ah, 4) / 24, 0.2, f"leading error term, h={h}")
        errs.append(np.abs(Ad - Az).max())
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all((orders > 3.7) & (orders < 4.3)), orders


def test_step_jacobians_approach_zoh_at_second_order_along_a_moving_nominal():
    """Off equilibrium the nominal moves during the step and A(t) with it. The flow's sensitivity
    Phi' = A(t) Phi gives Phi(h) = I + A h + (A^2 + dA/dt) h^2/2 + O(h^3), and for the input
    S' = A S + B(t): S(h) = B h + (A B + dB/dt) h^2/2 + O(h^3); RK3 reproduces both to O(h^4) while
    ZOH (A, B frozen) lacks the dA/dt, dB/dt terms. So Ad - Ad_zoh = dA/dt h^2/2 + O(h^3), order 2,
    with dA/dt = (dA/dx) xdot, here a central difference of the continuous A along xdot."""
    arm = _arm(5)
    q, qd, u = (x[0] for x in _nominal(5))
    x = np.concatenate([q, qd])
    xdot = np.asarray(jaxarm.linearize.state_derivative(arm, x, u))
    eps = 1e-6  # dA/dt by a central difference along xdot (points 1, 2), A itself at point 0
    xs = np.stack([x, x + eps * xdot, x - eps * xdot])
    us = np.stack([u, u, u])
    A, B = (np.asarray(m) for m in jaxarm.linearize.linearize_continuous(arm, xs[:, :3], xs[:, 3:], us))
    Adot, Bdot = (A[1] - A[2]) / (2 * eps), (B[1] - B[2]) / (2 * eps)
    errs, rel = [], []
    for h in (1e-2, 5e-3, 2.5e-3):
        Ad, Bd = jaxarm.linearize.linearize_trajectory(arm, xs[:, :3], xs[:, 3:], us, h)
        Az, Bz = jaxarm.linearize.discretize_zoh(A[0], B[0], h)
        dA, dB = np.asarray(Ad[0] - Az), np.asarray(Bd[0] - Bz)
        errs.append(np.abs(dA).max())
        # residuals after the h^2 term are O(h^3): relative to it, O(h)
        rel.append([np.abs(dA - Adot * h * h / 2).max() / np.abs(Adot * h * h / 2).max(),
                    np.abs(dB - Bdot * h * h / 2).max() / np.abs(Bdot * h * h / 2).max()])
    rel = np.array(rel)
    assert np.all(rel[-1] < 0.05), rel
    assert np.all(rel[:-1] / rel[1:] > 1.6), rel  # halves with h
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all((orders > 1.8) & (orders < 2.2)), orders


def test_zoh_matches_the_closed_form_of_a_damped_rotor():
    """One revolute joint about the vertical (gravity has no moment), viscous friction b at the
    joint: J qdd = u - b qd, A = [[0, 1], [0, -a]], B = [[0], [1/J]], a = b / J, and
    Ad = [[1, (1 - e^{-ah}) / a], [0, e^{-ah}]], Bd = [[(h - (1 - e^{-ah}) / a) / (a J)], [(1 - e^{-ah}) / (a J)]]."""
    m, r, izz, b = 2.0, 0.3, 0.05, 0.4
    arm = jaxarm.make_arm("R", convention="placement", axis=[[0.0, 0.0, 1.0]], mass=[m], com=[[r, 0.0, 0.0]],
                          inertia=[[0.02, 0.03, izz]], viscous_friction=[b], name="rotor")
    J = izz + m * r * r
    a = b / J
    A, B = jaxarm.linearize.linearize_continuous(arm, [0.4], [0.7], [1.5])
    assert_close(A, np.array([[0.0, 1.0], [0.0, -a]]), 1e-13, "A")
    assert_close(B, np.array([[0.0], [1.0 / J]]), 1e-13, "B")
    for h in (1e-3, 0.1, 2.0):
        Ad, Bd = jaxarm.linearize.discretize_zoh(A, B, h)
        e = np.exp(-a * h)
        assert_close(Ad, np.array([[1.0, (1 - e) / a], [0.0, e]]), 1e-12, f"Ad, h={h}")
        assert_close(Bd, np.array([[(h - (1 - e) / a) / (a * J)], [(1 - e) / (a * J)]]), 1e-11, f"Bd, h={h}")
    # batched: one dt per matrix
    Ads, _ = jaxarm.linearize.discretize_zoh(jnp.stack([A, A]), jnp.stack([B, B]), jnp.array([0.1, 2.0]))
    assert_close(Ads[1], np.array([[1.0, (1 - np.exp(-2 * a)) / a], [0.0, np.exp(-2 * a)]]), 1e-12, "batched Ad")


def test_second_order_form_reproduces_the_state_space_model():
    """A = [[0, I], [-M^-1 K, -M^-1 C]], B = [[0], [M^-1]] at the forward-dynamics acceleration
    (implicit function theorem on ID(q, qd, qdd) = tau); K contains (dM/dq) qdd, checked against a
    Jacobian of the mass matrix; D = J_tool^T (tau(f_ext) - tau(0) = -J_tool^T f_ext)."""
    arm = random_arm(6, "RPR", "placement", drives=True, tool=True, name=NAME)
    q, qd, u = _nominal(6)
    qdd = np.stack([np.asarray(jaxarm.forward_dynamics(arm, q[k], qd[k], u[k])) for k in range(3)])
    form = jaxarm.linearize.second_order_form(arm, q, qd, qdd)
    A, B = jaxarm.linearize.linearize_continuous(arm, q, qd, u)
    As, Bs = jaxarm.linearize.state_space_from_second_order(form)
    assert_close(As, A, 1e-10, "A from (M, C, K)")
    assert_close(Bs, B, 1e-10, "B from M")
    form0 = jaxarm.linearize.second_order_form(arm, q, qd, 0 * qdd)
    for k in range(3):
        assert_close(form.M[k], jaxarm.mass_matrix(arm, q[k]), 1e-12, "M")
        dM = np.asarray(jax.jacfwd(lambda q: jaxarm.mass_matrix(arm, q) @ qdd[k])(jnp.asarray(q[k])))
        assert_close(form.K[k] - form0.K[k], dM, 1e-10, "K(qdd) - K(0) = d(M qdd)/dq")
        assert_close(form.D[k], np.asarray(jaxarm.jacobian(arm, q[k], frame="tool")).T, 1e-12, "D = J_tool^T")
    # dropping the dM/dq qdd term gives a wrong A where the nominal accelerates
    wrong = jaxarm.linearize.state_space_from_second_order(form0)
    assert np.abs(np.asarray(wrong.A) - np.asarray(A)).max() > 1e-3 * np.abs(np.asarray(A)).max()


def test_bad_input_is_rejected_with_named_arguments():
    arm = _arm(0)
    q, qd, u = _nominal(0)
    with pytest.raises(ValueError, match="u: expected shape"):
        jaxarm.linearize.linearize_trajectory(arm, q, qd, u[:, :2], 1e-3)
    with pytest.raises(ValueError, match="has 2 rows"):
        jaxarm.linearize.linearize_trajectory(arm, q, qd[:2], u, 1e-3)
    with pytest.raises(ValueError, match="dt: expected a positive"):
        jaxarm.linearize.linearize_trajectory(arm, q, qd, u, -1e-3)
    with pytest.raises(ValueError, match="input: expected"):
        jaxarm.linearize.linearize_continuous(arm, q, qd, u, input="current")
    with pytest.raises(ValueError, match="method"):
        jaxarm.linearize.linearize_trajectory(arm, q, qd, u, 1e-3, method="rk5")
    with pytest.raises(ValueError, match="finite"):
        jaxarm.linearize.linearize_continuous(arm, q, qd, np.full_like(u, np.nan))
    with pytest.raises(ValueError, match="torque_constant and resistance"):
        jaxarm.linearize.linearize_continuous(_arm(0, drives=False), q, qd, u, input="voltage")
    with pytest.raises(ValueError, match="B: expected shape"):
        jaxarm.linearize.discretize_zoh(np.eye(4), np.ones((3, 2)), 0.1)
    with pytest.raises(TypeError, match="arm: expected a jaxarm.Arm"):
        jaxarm.linearize.linearize_continuous("puma", q, qd, u)
