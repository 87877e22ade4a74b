"""Closed-form dynamics from the seeds, against jaxarm's recursive algorithms.

Oracles: Craig's two-link arm with point masses at the link ends (6.58, 6.60-6.62; tool Jacobian
5.66), Craig's RP arm (Example 6.5, 6.88-6.89), the chapter-10 one-link rod (10.42-10.43) and
two-link arm of uniform rods (10.71, 10.77, 10.78 with the ERRATA's C13 sign), the derived oracle
values in seeds/ERRATA.md, and statics tau = -J^T F for a wrench the environment applies to the
tool (Craig 5.105 / 6.92 with the sign of a reaction).
"""

from __future__ import annotations

import numpy as np
import pytest

import jaxarm
from helpers import CONVENTIONS, assert_close, random_arm, random_state, random_wrench

G0 = 9.81
RTOL = 1e-12


# --------------------------------------------------------------------------------------
# Craig's planar two-link arm, point masses at the distal end of each link, gravity along -Y0.


def craig_two_link(m1, m2, l1, l2, convention):
    """The Section 6.7 arm. Modified DH (Craig's own frames): frame 1 at joint 1, frame 2 at joint 2
    (a1 = l1), masses at l1 x1 and l2 x2, tool at l2 x2. Standard DH: frame i at the distal end of
    link i, so the masses sit at the frame origins and the tool is frame 2."""
    common = dict(mass=[m1, m2], gravity=(0.0, -G0, 0.0), name=f"craig-two-link-{convention}")
    if convention == "modified":
        tool = np.eye(4)
        tool[0, 3] = l2
        return jaxarm.make_arm("RR", convention="modified", a=[0.0, l1], com=[[l1, 0, 0], [l2, 0, 0]], tool=tool, **common)
    return jaxarm.make_arm("RR", convention="standard", a=[l1, l2], com=np.zeros((2, 3)), **common)


def craig_M(q, m1, m2, l1, l2):  # Craig 6.60
    c2 = np.cos(q[1])
    return np.array(
        [
            [l2**2 * m2 + 2 * l1 * l2 * m2 * c2 + l1**2 * (m1 + m2), l2**2 * m2 + l1 * l2 * m2 * c2],
            [l2**2 * m2 + l1 * l2 * m2 * c2, l2**2 * m2],
        ]
    )


def craig_V(q, qd, m1, m2, l1, l2):  # Craig 6.61
    s2 = np.sin(q[1])
    return np.array(
        [
            -m2 * l1 * l2 * s2 * qd[1] ** 2 - 2 * m2 * l1 * l2 * s2 * qd[0] * qd[1],
            m2 * l1 * l2 * s2 * qd[0] ** 2,
        ]
    )


def craig_G(q, m1, m2, l1, l2, g=G0):  # Craig 6.62
    c1, c12 = np.cos(q[0]), np.cos(q[0] + q[1])
    return np.array([m2 * l2 * g * c12 + (m1 + m2) * l1 * g * c1, m2 * l2 * g * c12])


@pytest.mark.parametrize("convention", ["modified", "standard"])
def test_craig_two_link_oracle_values(convention):
    """ERRATA 'Derived oracle values': Craig 6.58 at one state, to the printed 10 decimals."""
    arm = craig_two_link(2.0, 1.0, 1.0, 0.5, convention)
    q, qd, qdd = np.array([0.3, -0.7]), np.array([0.5, -1.2]), np.array([1.0, 2.0])
    M = np.asarray(jaxarm.mass_matrix(arm, q))
    np.testing.assert_allclose(M, [[4.0148421873, 0.6324210936], [0.6324210936, 0.25]], rtol=0, atol=1e-10)
    tau = np.asarray(jaxarm.inverse_dynamics(arm, q, qd, qdd))
    np.testing.assert_allclose(tau, [37.9903475476, 5.5696980583], rtol=0, atol=1e-9)
    # and the closed forms reproduce the same numbers (so they are transcribed right)
    p = (2.0, 1.0, 1.0, 0.5)
    np.testing.assert_allclose(craig_M(q, *p) @ qdd + craig_V(q, qd, *p) + craig_G(q, *p), tau, rtol=1e-12)


@pytest.mark.parametrize("convention", ["modified", "standard"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_craig_two_link_M_V_G(convention, seed):
    """Craig 6.60-6.62 as functions of (q, qd): M by composite bodies, V = bias - G, G."""
    rng = np.random.default_rng(seed)
    p = (*rng.uniform(0.5, 5.0, 2), *rng.uniform(0.2, 1.5, 2))
    arm = craig_two_link(*p, convention)
    q, qd, qdd = random_state(seed, 2)
    G = np.asarray(jaxarm.gravity_torques(arm, q))
    assert_close(jaxarm.mass_matrix(arm, q), craig_M(q, *p), RTOL, "M (6.60)")
    assert_close(G, craig_G(q, *p), RTOL, "G (6.62)")
    assert_close(np.asarray(jaxarm.bias_forces(arm, q, qd)) - G, craig_V(q, qd, *p), 1e-11, "V (6.61)")
    tau = craig_M(q, *p) @ qdd + craig_V(q, qd, *p) + craig_G(q, *p)  # 6.59 = 6.58
    assert_close(jaxarm.inverse_dynamics(arm, q, qd, qdd), tau, RTOL, "tau (6.58)")


@pytest.mark.parametrize("convention", ["modified", "standard"])
def test_craig_two_link_tool_jacobian(convention):
    """Craig 5.66: in the tool frame {3}, J = [[l1 s2, 0], [l1 c2 + l2, l2]] (x, y rows), w_z = qd1 + qd2."""
    l1, l2 = 0.8, 0.45
    arm = craig_two_link(1.0, 1.0, l1, l2, convention)
    q = np.array([0.4, 1.1])
    J = np.asarray(jaxarm.jacobian(arm, q, frame="tool"))
    s2, c2 = np.sin(q[1]), np.cos(q[1])
    expected = np.zeros((6, 2))
    expected[:2] = [[l1 * s2, 0.0], [l1 * c2 + l2, l2]]
    expected[5] = [1.0, 1.0]
    assert_close(J, expected, RTOL, "tool Jacobian (5.66)")


# --------------------------------------------------------------------------------------
# Craig Example 6.5: the RP arm.


def craig_rp_arm(m1, m2, l1, inertia1, inertia2, convention):
    """Joint 1 revolute about Z0, joint 2 prismatic along the arm, which points at angle q1 from
    X0 in the X0-Y0 plane; gravity along -Y0. Link 1's COM at l1 from joint 1 along the arm, link 2's
    COM at the prismatic joint's frame origin (distance d2 = q2 from the joint-1 axis).
    ``inertia1`` = (Ixx1, Iyy1, Izz1), ``inertia2`` = (Ixx2, Iyy2, Izz2) in Craig's frames, where
    Izz1 and Iyy2 are the moments about axes parallel to the joint-1 axis."""
    Ixx1, Iyy1, Izz1 = inertia1
    Ixx2, Iyy2, Izz2 = inertia2
    common = dict(mass=[m1, m2], gravity=(0.0, -G0, 0.0), name=f"craig-rp-{convention}")
    if convention == "standard":
        # T1 = Rz(q1 - pi/2) Rx(-pi/2): z1 = (cos q1, sin q1, 0) along the arm, y1 = -Z0.
        # T2 = Tz(q2): frame 2 slides along z1 with frame-1 axes.
        return jaxarm.make_arm(
            "RP",
            convention="standard",
            theta=[-np.pi / 2, 0.0],
            alpha=[-np.pi / 2, 0.0],
            com=[[0, 0, l1], [0, 0, 0]],
            # moments about (x, y, z) of frames 1 and 2; y is the joint-1 direction
            inertia=[[Ixx1, Izz1, Iyy1], [Ixx2, Iyy2, Izz2]],
            **common,
        )
    # placement: joint 1 about z, joint 2 slides along x1 (the arm) with the frame-1 axes.
    return jaxarm.make_arm(
        "RP",
        convention="placement",
        axis=[[0, 0, 1], [1, 0, 0]],
        com=[[l1, 0, 0], [0, 0, 0]],
        inertia=[[Iyy1, Ixx1, Izz1], [Izz2, Ixx2, Iyy2]],
        **common,
    )


@pytest.mark.parametrize("convention", ["standard", "placement"])
@pytest.mark.parametrize("seed", [0, 1])
def test_craig_rp_arm(convention, seed):
    """Craig 6.88-6.89: M = diag(m1 l1^2 + Izz1 + Iyy2 + m2 d2^2, m2),
    V = (2 m2 d2 qd1 qd2, -m2 d2 qd1^2), G = ((m1 l1 + m2 d2) g cos q1, m2 g sin q1)."""
    rng = np.random.default_rng(100 + seed)
    m1, m2 = rng.uniform(0.5, 5.0, 2)
    l1 = rng.uniform(0.2, 1.0)
    # principal moments obeying the triangle inequalities: (s2 + s3, s1 + s3, s1 + s2)
    s = rng.uniform(0.01, 0.1, (2, 3))
    I1, I2 = s.sum(1, keepdims=True) - s
    arm = craig_rp_arm(m1, m2, l1, I1, I2, convention)
    Izz1, Iyy2 = I1[2], I2[1]
    q, qd, qdd = random_state(seed, 2)
    q[1] = rng.uniform(0.1, 1.5)  # an extension d2
    th, d2 = q
    M = np.diag([m1 * l1**2 + Izz1 + Iyy2 + m2 * d2**2, m2])
    V = np.array([2 * m2 * d2 * qd[0] * qd[1], -m2 * d2 * qd[0] ** 2])
    G = np.array([(m1 * l1 + m2 * d2) * G0 * np.cos(th), m2 * G0 * np.sin(th)])
    assert_close(jaxarm.mass_matrix(arm, q), M, RTOL, "M (6.89)")
    assert_close(jaxarm.gravity_torques(arm, q), G, RTOL, "G (6.89)")
    assert_close(np.asarray(jaxarm.bias_forces(arm, q, qd)) - G, V, 1e-11, "V (6.89)")
    assert_close(jaxarm.inverse_dynamics(arm, q, qd, qdd), M @ qdd + V + G, RTOL, "tau (6.88)")
    # Lagrangian energies of Example 6.5 (6.81, 6.84 up to its constant)
    k = 0.5 * (m1 * l1**2 + Izz1 + Iyy2 + m2 * d2**2) * qd[0] ** 2 + 0.5 * m2 * qd[1] ** 2
    assert_close(jaxarm.kinetic_energy(arm, q, qd), k, RTOL, "k (6.81)")
    assert_close(jaxarm.potential_energy(arm, q), G0 * (m1 * l1 + m2 * d2) * np.sin(th), RTOL, "u (6.84)")


# --------------------------------------------------------------------------------------
# Chapter 10 (standard DH): uniform rods with the COM at mid-link.


def rod_inertia(m, a, Izz=None):
    """A thin rod along x: (0, m a^2/12, m a^2/12) about its centre, or Iyy = Izz given."""
    I = m * a**2 / 12.0 if Izz is None else Izz
    return [1e-6 * I, I, I]


def chapter10_arm(masses, lengths, Izz=None, gravity=(0.0, 0.0, 0.0)):
    n = len(masses)
    inertia = [rod_inertia(m, a, None if Izz is None else Izz[i]) for i, (m, a) in enumerate(zip(masses, lengths))]
    return jaxarm.make_arm(
        "R" * n,
        convention="standard",
        a=lengths,
        mass=masses,
        com=[[-a / 2.0, 0.0, 0.0] for a in lengths],  # frame i at the distal end
        inertia=inertia,
        gravity=gravity,
        name=f"chapter10-{n}-link",
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_one_link_rod(seed):
    """Ch.10 10.42-10.43: tau = (I_33 + m a^2/4) qdd = I_0,33 qdd; with gravity along -Y0 added
    as a base acceleration (ERRATA), + m g (a/2) cos q."""
    rng = np.random.default_rng(200 + seed)
    m, a = rng.uniform(0.5, 5.0), rng.uniform(0.2, 1.5)
    arm = chapter10_arm([m], [a])
    I0 = m * a**2 / 12.0 + m * a**2 / 4.0  # = m a^2 / 3 by the parallel-axis theorem
    for k in range(3):
        q, qd, qdd = random_state(10 * seed + k, 1)
        assert_close(jaxarm.inverse_dynamics(arm, q, qd, qdd), I0 * qdd, RTOL, "tau (10.43)")
    assert_close(jaxarm.mass_matrix(arm, q), [[I0]], RTOL, "M")
    heavy = chapter10_arm([m], [a], gravity=(0.0, -G0, 0.0))
    assert_close(jaxarm.inverse_dynamics(heavy, q, qd, qdd), I0 * qdd + m * G0 * a / 2 * np.cos(q), RTOL, "tau with gravity")


def chapter10_H_C(q, m1, m2, a1, a2, I1, I2, *, printed_c13=False):
    """(10.78): H and the velocity-product matrix C for (qd1^2, qd1 qd2, qd2^2)."""
    c2, s2 = np.cos(q[1]), np.sin(q[1])
    I1p, I2p = I1 + m1 * a1**2 / 4, I2 + m2 * a2**2 / 4  # parallel-axis, about O_0 and O_1
    H = np.array(
        [
            [I1p + I2p + m2 * a1 * (a1 + a2 * c2), I2p + 0.5 * m2 * a1 * a2 * c2],
            [I2p + 0.5 * m2 * a1 * a2 * c2, I2p],
        ]
    )
    c13 = 0.5 * m2 * a1 * a2 * s2 * (1.0 if printed_c13 else -1.0)  # ERRATA: the printed '+' is wrong
    C = np.array([[0.0, -m2 * a1 * a2 * s2, c13], [0.5 * m2 * a1 * a2 * s2, 0.0, 0.0]])
    return H, C


def products(qd):
    return np.array([qd[0] ** 2, qd[0] * qd[1], qd[1] ** 2])


def test_chapter10_two_link_oracle_value():
    """ERRATA 'Derived oracle values': m = a = 1, Izz = 1/12, no gravity."""
    arm = chapter10_arm([1.0, 1.0], [1.0, 1.0], Izz=[1 / 12, 1 / 12])
    q, qd, qdd = np.array([0.3, -0.7]), np.array([0.5, -1.2]), np.array([2.0, 0.4])
    tau = np.asarray(jaxarm.inverse_dynamics(arm, q, qd, qdd))
    np.testing.assert_allclose(tau, [5.226625601161, 1.484314976380], rtol=0, atol=1e-11)
    H, C = chapter10_H_C(q, 1.0, 1.0, 1.0, 1.0, 1 / 12, 1 / 12)
    np.testing.assert_allclose(H @ qdd + C @ products(qd), tau, rtol=1e-13)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chapter10_two_link_closed_form(seed):
    """(10.71), (10.77), (10.78) with C13 = -1/2 m2 a1 a2 sin q2; the printed +1/2 must not match."""
    rng = np.random.default_rng(300 + seed)
    m1, m2 = rng.uniform(0.5, 5.0, 2)
    a1, a2 = rng.uniform(0.2, 1.5, 2)
    I1, I2 = m1 * a1**2 / 12 * rng.uniform(0.5, 1.5), m2 * a2**2 / 12 * rng.uniform(0.5, 1.5)
    arm = chapter10_arm([m1, m2], [a1, a2], Izz=[I1, I2])
    q, qd, qdd = random_state(seed, 2)
    H, C = chapter10_H_C(q, m1, m2, a1, a2, I1, I2)
    assert_close(jaxarm.mass_matrix(arm, q), H, RTOL, "H (10.78)")
    assert_close(jaxarm.bias_forces(arm, q, qd), C @ products(qd), 1e-11, "C (10.78)")
    tau = np.asarray(jaxarm.inverse_dynamics(arm, q, qd, qdd))
    assert_close(tau, H @ qdd + C @ products(qd), RTOL, "tau (10.78)")
    # tau_2 alone, (10.71)
    I2p = I2 + m2 * a2**2 / 4
    tau2 = I2p * (qdd[0] + qdd[1]) + m2 * a1 * a2 / 2 * (np.cos(q[1]) * qdd[0] + np.sin(q[1]) * qd[0] ** 2)
    assert_close(tau[1], tau2, RTOL, "tau2 (10.71)")
    _, C_printed = chapter10_H_C(q, m1, m2, a1, a2, I1, I2, printed_c13=True)
    assert abs(tau[0] - (H @ qdd + C_printed @ products(qd))[0]) > 1e-3 * abs(qd[1] ** 2 * m2 * a1 * a2 * np.sin(q[1]))


# --------------------------------------------------------------------------------------
# Statics: an external wrench on the tool.


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_statics_tool_wrench(convention):
    """The environment pushes the tool with F (moment N about the tool origin): the joints need
    tau_static - J^T (F, N) (Craig 5.105 with the reaction sign). jaxarm takes f_ext in the tool
    frame, so the tool Jacobian pairs with it directly; a world-frame wrench must first be rotated
    into the tool frame, and then pairs with the base Jacobian."""
    arm = random_arm(7, "RRPRRR", convention, drives=True, payload=True, base=True, tool=True)
    q, _, _ = random_state(7, arm.n)
    zero = np.zeros(arm.n)
    f_tool = random_wrench(7)
    static = np.asarray(jaxarm.inverse_dynamics(arm, q, zero, zero))
    delta = np.asarray(jaxarm.inverse_dynamics(arm, q, zero, zero, f_tool)) - static
    J_tool = np.asarray(jaxarm.jacobian(arm, q, frame="tool"))
    J_base = np.asarray(jaxarm.jacobian(arm, q, frame="base"))
    assert_close(delta, -J_tool.T @ f_tool, RTOL, "tool-frame wrench")
    # the same wrench seen from the world: rotate force and moment by the tool orientation
    R = np.asarray(jaxarm.tool_pose(arm, q))[:3, :3]
    w_world = np.concatenate([R @ f_tool[:3], R @ f_tool[3:]])
    assert_close(delta, -J_base.T @ w_world, RTOL, "world-frame wrench")
    # a world wrench passed as if it were in the tool frame is a different load
    wrong = np.asarray(jaxarm.inverse_dynamics(arm, q, zero, zero, w_world)) - static
    assert np.max(np.abs(wrong - delta)) > 1e-3 * np.max(np.abs(delta))
    # f_ext only adds the static term: it enters the same way at any (qd, qdd)
    _, qd, qdd = random_state(8, arm.n)
    moving = np.asarray(jaxarm.inverse_dynamics(arm, q, qd, qdd, f_tool)) - np.asarray(jaxarm.inverse_dynamics(arm, q, qd, qdd))
    assert_close(moving, -J_tool.T @ f_tool, RTOL, "wrench while moving")


def test_statics_point_force_on_two_link():
    """A force (fx, fy) pushing Craig's two-link arm at the tool point (tool frame, Craig 5.105):
    tau = -J^T F with J from 5.66, i.e. tau1 = -(l1 s2 fx + (l1 c2 + l2) fy), tau2 = -l2 fy."""
    l1, l2 = 0.8, 0.45
    arm = craig_two_link(1.5, 0.7, l1, l2, "modified")
    q = np.array([0.9, -0.4])
    fx, fy = 3.0, -2.0
    zero = np.zeros(2)
    delta = np.asarray(jaxarm.inverse_dynamics(arm, q, zero, zero, [fx, fy, 0, 0, 0, 0])) - np.asarray(jaxarm.gravity_torques(arm, q))
    s2, c2 = np.sin(q[1]), np.cos(q[1])
    assert_close(delta, [-(l1 * s2 * fx + (l1 * c2 + l2) * fy), -l2 * fy], RTOL, "tau = -J^T F")
