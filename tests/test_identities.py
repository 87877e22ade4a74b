"""Identities every correct rigid-body dynamics obeys, on random arms of all three conventions
with revolute and prismatic joints, drives, payloads, and random base and tool frames.

M symmetric positive definite; composite bodies (Walker-Orin method 3) == Newton-Euler columns
(method 1); M-dot - 2C skew-symmetric; C qd + g == bias; g = dV/dq; energy balance; forward
dynamics inverts inverse dynamics; the Jacobian is the derivative of forward kinematics; kinetic
and potential energy and the base reaction wrench recomputed from forward kinematics alone.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from helpers import assert_close, random_arm, random_state, random_wrench, reference_frames
from jaxarm.kinematics import body_poses

CASES = [
    ("standard", "RRPRRR"),
    ("modified", "PRPRRP"),
    ("placement", "RPRRPR"),
]
IDS = [f"{c}-{t}" for c, t in CASES]


@pytest.fixture(params=list(range(len(CASES))), ids=IDS)
def arm(request):
    convention, types = CASES[request.param]
    return random_arm(request.param, types, convention, drives=True, payload=True, base=True, tool=True)


@pytest.fixture(params=list(range(len(CASES))), ids=IDS)
def rigid_arm(request):
    """No drives: the links alone (payload, base and tool still random)."""
    convention, types = CASES[request.param]
    return random_arm(50 + request.param, types, convention, payload=True, base=True, tool=True)


def state(arm, seed=0):
    return random_state(seed, arm.n)


def axis_components(arm, wrenches):
    """The joint-axis component of each joint wrench: moment z (revolute) or force z (prismatic)."""
    W = np.asarray(wrenches)
    return np.array([W[i, 5] if rev else W[i, 2] for i, rev in enumerate(arm.is_revolute)])


def vee(S):
    return np.array([S[2, 1], S[0, 2], S[1, 0]])


# --------------------------------------------------------------------------------------
# Mass matrix


def test_mass_matrix_spd_and_two_methods(arm):
    for seed in (0,):
        q, _, _ = state(arm, seed)
        M = np.asarray(jaxarm.mass_matrix(arm, q))
        np.testing.assert_array_equal(M, M.T)
        eig = np.linalg.eigvalsh(M)
        assert eig.min() > 1e-9 * eig.max(), f"M not positive definite: eigenvalues {eig}"
        # Walker-Orin method 3 (composite bodies) vs method 1 (Newton-Euler, qdd = e_j)
        assert_close(jaxarm.mass_matrix_by_columns(arm, q), M, 1e-12, "method 1 vs method 3")


def test_mass_matrix_columns_are_inverse_dynamics(arm):
    """M e_j = tau(q, 0, e_j) - tau(q, 0, 0): column j from the full inverse dynamics (with gravity
    and drives; friction is zero at rest), not from the gravity-free helper method 1 uses."""
    q, _, _ = state(arm, 2)
    zero = np.zeros(arm.n)
    M = np.asarray(jaxarm.mass_matrix(arm, q))
    qdd = np.random.default_rng(3).normal(size=arm.n)
    lhs = np.asarray(jaxarm.inverse_dynamics(arm, q, zero, qdd)) - np.asarray(jaxarm.inverse_dynamics(arm, q, zero, zero))
    assert_close(lhs, M @ qdd, 1e-12, "M qdd")


# --------------------------------------------------------------------------------------
# Coriolis matrix, bias, gravity


def test_mdot_minus_2c_is_skew(arm):
    q, qd, _ = state(arm)
    _, Mdot = jax.jvp(lambda x: jaxarm.mass_matrix(arm, x), (jnp.asarray(q),), (jnp.asarray(qd),))
    C = np.asarray(jaxarm.coriolis_matrix(arm, q, qd))
    S = np.asarray(Mdot) - 2.0 * C
    scale = np.abs(np.asarray(Mdot)).max()
    assert np.abs(S + S.T).max() <= 1e-12 * scale, f"M-dot - 2C not skew: {np.abs(S + S.T).max():.3e} vs {scale:.3e}"
    # and C really is the Coriolis matrix: M-dot = C + C^T (the same statement), C qd + g = bias
    g = np.asarray(jaxarm.gravity_torques(arm, q))
    assert_close(C @ qd + g, jaxarm.bias_forces(arm, q, qd), 1e-12, "C qd + g")
    # the bias is quadratic in qd: bias(q, 2 qd) - g = 4 (bias(q, qd) - g)
    b1 = np.asarray(jaxarm.bias_forces(arm, q, qd)) - g
    b2 = np.asarray(jaxarm.bias_forces(arm, q, 2.0 * qd)) - g
    assert_close(b2, 4.0 * b1, 1e-12, "bias quadratic in qd")


def test_gravity_is_gradient_of_potential(arm):
    for seed in (0,):
        q, _, _ = state(arm, seed)
        dV = jax.grad(lambda x: jaxarm.potential_energy(arm, x))(jnp.asarray(q))
        assert_close(jaxarm.gravity_torques(arm, q), dV, 1e-12, "g = dV/dq")


def test_gravity_torques_scale_with_gravity(arm):
    """Gravity enters linearly: flipping it flips g(q), and without it g(q) = 0."""
    q, _, _ = state(arm, 3)
    g = np.asarray(jaxarm.gravity_torques(arm, q))
    flipped = arm.replace(gravity=-np.asarray(arm.gravity))
    assert_close(jaxarm.gravity_torques(flipped, q), -g, 1e-13, "flipped gravity")
    weightless = arm.replace(gravity=np.zeros(3))
    assert np.abs(np.asarray(jaxarm.gravity_torques(weightless, q))).max() == 0.0


# --------------------------------------------------------------------------------------
# Energies recomputed from forward kinematics alone


def _link_inertials(arm):
    """(mass, com, inertia-about-COM) per DH link frame plus the payload in the tool frame."""
    L, P = arm.links, arm.payload
    return [(L.mass[i], L.com[i], L.inertia[i]) for i in range(arm.n)] + [(P.mass, P.com, P.inertia)]


def _frames(arm, q):
    frames, tool = jaxarm.forward_kinematics(arm, q)
    return jnp.concatenate([frames[1:], tool[None]])  # link frames 1..n, then the tool


def energies_from_kinematics(arm, q, qd):
    """Kinetic (links + payload + rotors) and potential energy from frame poses and their rates."""
    T, Tdot = jax.jvp(lambda x: _frames(arm, x), (jnp.asarray(q),), (jnp.asarray(qd),))
    T, Tdot = np.asarray(T), np.asarray(Tdot)
    g = np.asarray(arm.gravity)
    kinetic, potential = 0.0, 0.0
    for (m, c, I), F, Fd in zip(_link_inertials(arm), T, Tdot):
        R, p, Rd, pd = F[:3, :3], F[:3, 3], Fd[:3, :3], Fd[:3, 3]
        W = Rd @ R.T
        np.testing.assert_allclose(W, -W.T, atol=1e-12)
        w = vee(W)
        v = Rd @ c + pd
        kinetic += 0.5 * m * v @ v + 0.5 * w @ (R @ I @ R.T) @ w
        potential -= m * g @ (R @ c + p)
    kinetic += 0.5 * np.sum(np.asarray(jaxarm.reflected_inertia(arm)) * qd**2)
    return kinetic, potential


def test_energies_from_kinematics(arm):
    q, qd, _ = state(arm, 4)
    k, u = energies_from_kinematics(arm, q, qd)
    assert_close(jaxarm.kinetic_energy(arm, q, qd), k, 1e-12, "kinetic energy")
    scale = sum(float(m) * np.linalg.norm(arm.gravity) * 3.0 for m, _, _ in _link_inertials(arm))
    assert abs(float(jaxarm.potential_energy(arm, q)) - u) <= 1e-13 * scale


def test_energy_balance_links_only(rigid_arm):
    """d/dt (k + u) along (qd, qdd) == qd . rigid_body_torques (no drives, no friction)."""
    arm = rigid_arm
    q, qd, qdd = state(arm, 5)
    energy = lambda x, v: jaxarm.kinetic_energy(arm, x, v) + jaxarm.potential_energy(arm, x)  # noqa: E731
    _, dE = jax.jvp(energy, (jnp.asarray(q), jnp.asarray(qd)), (jnp.asarray(qd), jnp.asarray(qdd)))
    power = qd @ np.asarray(jaxarm.rigid_body_torques(arm, q, qd, qdd))
    assert abs(float(dE) - power) <= 1e-12 * max(abs(power), 1.0)


def test_energy_balance_with_drives(arm):
    """With rotors the kinetic energy includes 1/2 G^2 Jm qd^2; friction dissipates, so the power
    that goes into energy is qd . (inverse_dynamics - friction)."""
    q, qd, qdd = state(arm, 6)
    energy = lambda x, v: jaxarm.kinetic_energy(arm, x, v) + jaxarm.potential_energy(arm, x)  # noqa: E731
    _, dE = jax.jvp(energy, (jnp.asarray(q), jnp.asarray(qd)), (jnp.asarray(qd), jnp.asarray(qdd)))
    tau = np.asarray(jaxarm.inverse_dynamics(arm, q, qd, qdd)) - np.asarray(jaxarm.friction_torques(arm, qd))
    power = qd @ tau
    assert abs(float(dE) - power) <= 1e-12 * max(abs(power), 1.0)


# --------------------------------------------------------------------------------------
# Forward vs inverse dynamics


def test_forward_inverts_inverse(arm):
    f_ext = random_wrench(1)
    for seed, f in ((0, None), (1, f_ext)):
        q, qd, qdd = state(arm, 10 + seed)
        tau = jaxarm.inverse_dynamics(arm, q, qd, qdd, f)
        assert_close(jaxarm.forward_dynamics(arm, q, qd, tau, f), qdd, 1e-10, f"FD(ID) f_ext={f is not None}")
        # and back: ID(FD(tau)) == tau
        tau2 = np.random.default_rng(seed).normal(size=arm.n) * 10.0
        qdd2 = jaxarm.forward_dynamics(arm, q, qd, tau2, f)
        assert_close(jaxarm.inverse_dynamics(arm, q, qd, qdd2, f), tau2, 1e-10, "ID(FD)")


def test_forward_dynamics_is_m_inverse(arm):
    """qdd = M^-1 (tau - bias - friction) with M, bias from their own functions."""
    q, qd, _ = state(arm, 12)
    tau = np.random.default_rng(5).normal(size=arm.n) * 10.0
    M = np.asarray(jaxarm.mass_matrix(arm, q))
    rhs = tau - np.asarray(jaxarm.bias_forces(arm, q, qd)) - np.asarray(jaxarm.friction_torques(arm, qd))
    assert_close(jaxarm.forward_dynamics(arm, q, qd, tau), np.linalg.solve(M, rhs), 1e-10, "M^-1 rhs")


# --------------------------------------------------------------------------------------
# Kinematics


def test_jacobian_is_derivative_of_tool_pose(arm):
    q, _, _ = state(arm, 13)
    T = np.asarray(jaxarm.tool_pose(arm, q))
    dT = np.asarray(jax.jacfwd(lambda x: jaxarm.tool_pose(arm, x))(jnp.asarray(q)))  # (4, 4, n)
    R = T[:3, :3]
    lin = dT[:3, 3, :]
    ang = np.stack([vee(dT[:3, :3, i] @ R.T) for i in range(arm.n)], axis=1)
    for i in range(arm.n):
        W = dT[:3, :3, i] @ R.T
        np.testing.assert_allclose(W, -W.T, atol=1e-12)
    J_base = np.vstack([lin, ang])
    assert_close(jaxarm.jacobian(arm, q), J_base, 1e-12, "jacobian(frame='base')")
    assert_close(jaxarm.jacobian(arm, q, frame="tool"), np.vstack([R.T @ lin, R.T @ ang]), 1e-12, "jacobian(frame='tool')")


def test_forward_kinematics_matches_parameter_table(arm):
    """Every link frame and the tool, against the DH / URDF products evaluated directly in NumPy."""
    for seed in (14, 15):
        q, _, _ = state(arm, seed)
        frames, tool = jaxarm.forward_kinematics(arm, q)
        ref_frames, ref_tool = reference_frames(arm, q)
        assert_close(frames, ref_frames, 1e-13, "link frames")
        assert_close(tool, ref_tool, 1e-13, "tool")


def test_forward_kinematics_frames(arm):
    """frames[0] is the base; every frame and the tool are rigid transforms; tool_pose agrees."""
    q, _, _ = state(arm, 14)
    frames, tool = (np.asarray(x) for x in jaxarm.forward_kinematics(arm, q))
    assert frames.shape == (arm.n + 1, 4, 4)
    np.testing.assert_allclose(frames[0], arm.base, atol=1e-15)
    for T in [*frames, tool]:
        np.testing.assert_allclose(T[:3, :3] @ T[:3, :3].T, np.eye(3), atol=1e-13)
        np.testing.assert_allclose(T[3], [0, 0, 0, 1], atol=0)
    np.testing.assert_array_equal(np.asarray(jaxarm.tool_pose(arm, q)), tool)
    # the tool frame is the last link frame times arm.tool
    assert_close(tool, frames[-1] @ np.asarray(arm.tool), 1e-14, "tool = frame_n @ tool")


# --------------------------------------------------------------------------------------
# Joint wrenches


def test_joint_wrench_axis_components_are_torques(arm):
    f_ext = random_wrench(2)
    for f in (None, f_ext):
        q, qd, qdd = state(arm, 15)
        W = jaxarm.joint_wrenches(arm, q, qd, qdd, f)
        assert W.shape == (arm.n, 6)
        assert_close(axis_components(arm, W), jaxarm.rigid_body_torques(arm, q, qd, qdd, f), 1e-14, "axis components")


def test_base_reaction_wrench_from_momentum(rigid_arm):
    """The wrench joint 1 transmits to the arm (the base reaction) recomputed from Newton and Euler
    for the whole arm: F = dP/dt - m_tot g - F_ext, N_0 = dL_0/dt - sum c x m g - (p x F + N)_ext,
    with linear momentum P and angular momentum L_0 about the world origin from forward kinematics."""
    arm = rigid_arm
    q, qd, qdd = state(arm, 16)
    f_tool = random_wrench(3)
    inertials = _link_inertials(arm)
    g = np.asarray(arm.gravity)

    def momenta(x, v):
        T, Td = jax.jvp(lambda y: _frames(arm, y), (x,), (v,))
        P = jnp.zeros(3)
        L = jnp.zeros(3)
        for (m, c, I), F, Fd in zip(inertials, T, Td):
            R, p, Rd, pd = F[:3, :3], F[:3, 3], Fd[:3, :3], Fd[:3, 3]
            W = Rd @ R.T
            w = jnp.stack([W[2, 1], W[0, 2], W[1, 0]])
            cw, vc = R @ c + p, Rd @ c + pd
            P = P + m * vc
            L = L + m * jnp.cross(cw, vc) + R @ I @ R.T @ w  # about the world origin
        return P, L

    x, v, a = jnp.asarray(q), jnp.asarray(qd), jnp.asarray(qdd)
    _, (Pdot, Ldot) = jax.jvp(momenta, (x, v), (v, a))
    T = np.asarray(_frames(arm, q))
    c_world = [T[i][:3, :3] @ c + T[i][:3, 3] for i, (_, c, _) in enumerate(inertials)]
    m_tot = sum(float(m) for m, _, _ in inertials)
    R_tool, p_tool = T[-1][:3, :3], T[-1][:3, 3]
    F_ext, N_ext = R_tool @ f_tool[:3], R_tool @ f_tool[3:]
    # body 1's frame (z on joint 1's axis); the joint wrench is about its origin o1
    rots, origins = body_poses(arm, jaxarm.body_model(arm), jnp.asarray(q))
    R1, o1 = np.asarray(rots[0]), np.asarray(origins[0])
    F = np.asarray(Pdot) - m_tot * g - F_ext
    N0 = np.asarray(Ldot) - sum(np.cross(c, float(m) * g) for (m, _, _), c in zip(inertials, c_world)) - np.cross(p_tool, F_ext) - N_ext
    W = np.asarray(jaxarm.joint_wrenches(arm, q, qd, qdd, f_tool))[0]
    assert_close(R1 @ W[:3], F, 1e-12, "base reaction force")
    assert_close(R1 @ W[3:] + np.cross(o1, R1 @ W[:3]), N0, 1e-12, "base reaction moment about the world origin")


# --------------------------------------------------------------------------------------
# Drives: reflected inertia and friction


def test_drive_terms_exact(arm):
    q, _, qdd = state(arm, 17)
    qd = np.array([0.0, 1.3, -0.7, 0.0, -2.0, 0.4, 0.9])[: arm.n]
    dr = arm.drives
    G, Jm, B, Tc = (np.asarray(x) for x in (dr.gear_ratio, dr.rotor_inertia, dr.viscous_friction, dr.coulomb_friction))
    assert np.any(G < 0) and np.all(Tc[:, 0] > 0) and np.all(Tc[:, 1] < 0)
    coulomb = np.abs(G) * np.where(qd > 0, Tc[:, 0], np.where(qd < 0, Tc[:, 1], 0.0))
    friction = B * G**2 * qd + coulomb
    assert_close(jaxarm.reflected_inertia(arm), G**2 * Jm, 1e-15, "G^2 Jm")
    assert_close(jaxarm.friction_torques(arm, qd), friction, 1e-15, "friction")
    f = np.asarray(jaxarm.friction_torques(arm, qd))
    assert np.all(f[qd == 0] == 0.0), "friction must vanish at rest"
    assert np.all(np.sign(f[qd != 0]) == np.sign(qd[qd != 0])), "friction opposes motion"
    for f_ext in (None, random_wrench(4)):
        diff = np.asarray(jaxarm.inverse_dynamics(arm, q, qd, qdd, f_ext)) - np.asarray(jaxarm.rigid_body_torques(arm, q, qd, qdd, f_ext))
        assert_close(diff, G**2 * Jm * qdd + friction, 1e-12, "inverse_dynamics - rigid_body_torques")
    # the mass matrix carries the rotors on its diagonal, the link part does not see them
    rigid = arm.replace(drives=dataclasses.replace(dr, rotor_inertia=np.zeros(arm.n)))
    dM = np.asarray(jaxarm.mass_matrix(arm, q)) - np.asarray(jaxarm.mass_matrix(rigid, q))
    assert_close(dM, np.diag(G**2 * Jm), 1e-12, "M - M_links")
