"""jaxarm against an independent implementation: Pinocchio (Carpentier et al.).

The Pinocchio model is built here from the arm's parameter tables with our own DH -> placement
conversion (jaxarm's body_model is *not* used), so a shared mistake in the conversion cannot hide:
- standard DH: joint i sits at frame i-1 and moves about its z; the constant
  Rz(theta_i) Tz(d_i) Tx(a_i) Rx(alpha_i) is the placement of joint i+1 and of link frame i, in
  which link i's inertial parameters are given;
- modified DH: joint i is placed at Rx(alpha_{i-1}) Tx(a_{i-1}) Rz(theta_i) Tz(d_i), then moves
  about z; link frame i is the joint frame;
- placement (URDF): placement xyz / rpy (Rz Ry Rx), then motion about/along the unit axis.
Pinocchio's universe is frame 0 (gravity rotated into it by the base), rotor inertia enters as
armature G^2 Jm. Compared: rnea, crba, aba (with and without external forces), the tool frame's
pose and Jacobians, and the wrench every joint transmits.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pin = pytest.importorskip("pinocchio")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxarm  # noqa: E402
from helpers import assert_close, random_arm, random_state, random_wrench  # noqa: E402
from jaxarm.kinematics import body_poses  # noqa: E402

RTOL = 1e-9
CASES = [(c, t) for t in ("RRPRRR", "PRPRRP") for c in ("standard", "modified", "placement")]
CASES.append(("placement-signed-axes", "RPRPRR"))
IDS = [f"{c}-{t}" for c, t in CASES]
# coordinate axes of both signs: -z takes the special branch of jaxarm's z-to-axis rotation
SIGNED_AXES = np.array([[0, 0, -1], [0, 0, 1], [-1, 0, 0], [0, 0, -1], [0, -1, 0], [1, 0, 0]], dtype=float)


# --------------------------------------------------------------------------------------
# Our own conversion


def _rx(a):
    c, s = np.cos(a), np.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _ry(a):
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def _rz(a):
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def _T(R=np.eye(3), p=np.zeros(3)):
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = R, p
    return T


def Rx(a):
    return _T(_rx(a))


def Rz(a):
    return _T(_rz(a))


def Tx(x):
    return _T(p=np.array([x, 0.0, 0.0]))


def Tz(z):
    return _T(p=np.array([0.0, 0.0, z]))


def _se3(T):
    return pin.SE3(np.array(T[:3, :3]), np.array(T[:3, 3]))


def _joint_model(revolute, axis=None):
    if axis is None:
        return pin.JointModelRZ() if revolute else pin.JointModelPZ()
    axis = np.asarray(axis, dtype=float)
    for k, name in enumerate("XYZ"):  # a positive coordinate axis gets the aligned joint
        if np.array_equal(axis, np.eye(3)[k]):
            return getattr(pin, f"JointModel{'R' if revolute else 'P'}{name}")()
    return pin.JointModelRevoluteUnaligned(axis) if revolute else pin.JointModelPrismaticUnaligned(axis)


def to_pinocchio(arm):
    """(model, tool frame id) for a jaxarm Arm, from its DH / placement table."""
    n = arm.n
    kin = arm.kinematics
    joints, links = [], []  # joint placement in the parent joint frame; link frame in the joint frame
    if arm.convention == "standard":
        F = [Rz(kin.theta[i]) @ Tz(kin.d[i]) @ Tx(kin.a[i]) @ Rx(kin.alpha[i]) for i in range(n)]
        joints = [np.eye(4)] + F[:-1]
        links = F
        axes = [None] * n
    elif arm.convention == "modified":
        joints = [Rx(kin.alpha[i]) @ Tx(kin.a[i]) @ Rz(kin.theta[i]) @ Tz(kin.d[i]) for i in range(n)]
        links = [np.eye(4)] * n
        axes = [None] * n
    else:
        joints = [_T(_rz(r[2]) @ _ry(r[1]) @ _rx(r[0]), xyz) for xyz, r in zip(np.asarray(kin.xyz), np.asarray(kin.rpy))]
        links = [np.eye(4)] * n
        axes = list(np.asarray(kin.axis))

    model = pin.Model()
    parent = 0
    for i in range(n):
        jid = model.addJoint(parent, _joint_model(arm.is_revolute[i], axes[i]), _se3(joints[i]), f"joint{i + 1}")
        L = links[i]
        R_L, p_L = L[:3, :3], L[:3, 3]
        m, c, I = float(arm.links.mass[i]), np.asarray(arm.links.com[i]), np.asarray(arm.links.inertia[i])
        model.appendBodyToJoint(jid, pin.Inertia(m, R_L @ c + p_L, R_L @ I @ R_L.T), pin.SE3.Identity())
        parent = jid
    tool_in_joint = links[-1] @ np.asarray(arm.tool)
    R_t, p_t = tool_in_joint[:3, :3], tool_in_joint[:3, 3]
    P = arm.payload
    if float(P.mass) > 0:
        model.appendBodyToJoint(parent, pin.Inertia(float(P.mass), R_t @ np.asarray(P.com) + p_t, R_t @ np.asarray(P.inertia) @ R_t.T), pin.SE3.Identity())
    fid = model.addFrame(pin.Frame("tool", parent, _se3(tool_in_joint), pin.FrameType.OP_FRAME))
    R_base = np.asarray(arm.base)[:3, :3]
    model.gravity = pin.Motion(R_base.T @ np.asarray(arm.gravity), np.zeros(3))
    G, Jm = np.asarray(arm.drives.gear_ratio), np.asarray(arm.drives.rotor_inertia)
    model.armature = G**2 * Jm
    return model, fid, tool_in_joint


def pin_fext(model, tool_in_joint, f_tool):
    """Pinocchio's per-joint external forces (local joint frames) for a tool wrench (tool frame)."""
    fext = [pin.Force.Zero() for _ in range(model.njoints)]
    fext[-1] = _se3(tool_in_joint).act(pin.Force(np.asarray(f_tool[:3]), np.asarray(f_tool[3:])))
    return pin.StdVec_Force(fext) if hasattr(pin, "StdVec_Force") else fext


def frictionless(arm):
    dr = arm.drives
    return arm.replace(drives=dataclasses.replace(dr, viscous_friction=np.zeros(arm.n), coulomb_friction=np.zeros((arm.n, 2))))


@pytest.fixture(scope="module", params=list(range(len(CASES))), ids=IDS)
def case(request):
    convention, types = CASES[request.param]
    signed = convention == "placement-signed-axes"
    convention = "placement" if signed else convention
    arm = random_arm(200 + request.param, types, convention, drives=True, payload=True, base=True, tool=True)
    if signed:
        arm = arm.replace(kinematics=dataclasses.replace(arm.kinematics, axis=SIGNED_AXES))
    model, fid, tool_in_joint = to_pinocchio(frictionless(arm))
    return arm, model, fid, tool_in_joint


# --------------------------------------------------------------------------------------
# The conversion itself is checked once against Pinocchio's own helpers.


def test_own_rpy_matches_pinocchio():
    r = np.array([0.3, -1.1, 2.0])
    np.testing.assert_allclose(_rz(r[2]) @ _ry(r[1]) @ _rx(r[0]), pin.rpy.rpyToMatrix(r), atol=1e-15)


# --------------------------------------------------------------------------------------
# Dynamics


@pytest.mark.parametrize("seed", [0, 1])
def test_inverse_dynamics_vs_rnea(case, seed):
    arm, model, fid, tool_in_joint = case
    data = model.createData()
    q, qd, qdd = random_state(seed, arm.n)
    fa = frictionless(arm)
    assert_close(jaxarm.inverse_dynamics(fa, q, qd, qdd), pin.rnea(model, data, q, qd, qdd), RTOL, "rnea")
    # with friction: jaxarm adds exactly friction_torques on top of rnea
    tau = np.asarray(jaxarm.inverse_dynamics(arm, q, qd, qdd)) - np.asarray(jaxarm.friction_torques(arm, qd))
    assert_close(tau, pin.rnea(model, data, q, qd, qdd), RTOL, "rnea + friction")


def test_inverse_dynamics_with_tool_wrench_vs_rnea(case):
    arm, model, fid, tool_in_joint = case
    data = model.createData()
    q, qd, qdd = random_state(2, arm.n)
    f_tool = random_wrench(5)
    fext = pin_fext(model, tool_in_joint, f_tool)
    ours = jaxarm.inverse_dynamics(frictionless(arm), q, qd, qdd, f_tool)
    assert_close(ours, pin.rnea(model, data, q, qd, qdd, fext), RTOL, "rnea with fext")


def test_joint_wrenches_vs_rnea_forces(case):
    """data.f[i] after rnea: the wrench joint i transmits, in joint i's frame about its origin.
    Both are rotated into the world; the joint origins coincide by construction."""
    arm, model, fid, tool_in_joint = case
    data = model.createData()
    q, qd, qdd = random_state(3, arm.n)
    f_tool = random_wrench(6)
    pin.rnea(model, data, q, qd, qdd, pin_fext(model, tool_in_joint, f_tool))
    kin = model.createData()  # rnea leaves data.oMi alone: joint poses from forwardKinematics
    pin.forwardKinematics(model, kin, q)
    W = np.asarray(jaxarm.joint_wrenches(arm, q, qd, qdd, f_tool))
    rots, origins = (np.asarray(x) for x in body_poses(arm, jaxarm.body_model(arm), jnp.asarray(q)))
    base = np.asarray(arm.base)
    for i in range(arm.n):
        oMi = kin.oMi[i + 1]
        np.testing.assert_allclose(origins[i], base[:3, :3] @ oMi.translation + base[:3, 3], atol=1e-12)
        R = base[:3, :3] @ oMi.rotation
        f = data.f[i + 1]
        assert_close(rots[i] @ W[i, :3], R @ f.linear, RTOL, f"joint {i + 1} force")
        assert_close(rots[i] @ W[i, 3:], R @ f.angular, RTOL, f"joint {i + 1} moment")


def test_mass_matrix_vs_crba(case):
    arm, model, fid, tool_in_joint = case
    data = model.createData()
    for seed in (0, 1):
        q, _, _ = random_state(seed, arm.n)
        M = np.array(pin.crba(model, data, q))
        M = np.triu(M) + np.triu(M, 1).T  # Pinocchio fills the upper triangle
        assert_close(jaxarm.mass_matrix(arm, q), M, RTOL, "crba")


@pytest.mark.parametrize("with_wrench", [False, True])
def test_forward_dynamics_vs_aba(case, with_wrench):
    arm, model, fid, tool_in_joint = case
    data = model.createData()
    q, qd, _ = random_state(4, arm.n)
    tau = np.random.default_rng(4).normal(size=arm.n) * 10.0
    f_tool = random_wrench(7) if with_wrench else None
    extra = (pin_fext(model, tool_in_joint, f_tool),) if with_wrench else ()
    # with friction: Pinocchio sees the joint torque left after friction
    reference = pin.aba(model, data, q, qd, tau - np.asarray(jaxarm.friction_torques(arm, qd)), *extra)
    assert_close(jaxarm.forward_dynamics(arm, q, qd, tau, f_tool), reference, RTOL, "aba")


def test_forward_dynamics_derivatives_vs_aba_derivatives(case):
    """d qdd / d(q, qd, tau) of jaxarm's forward dynamics with a tool wrench, in forward and in
    reverse mode (its derivative rule goes through inverse dynamics: Carpentier & Mansard 2018),
    against Pinocchio's analytical ABA derivatives (computeABADerivatives)."""
    arm, model, fid, tool_in_joint = case
    data = model.createData()
    q, qd, _ = random_state(5, arm.n)
    tau = np.random.default_rng(5).normal(size=arm.n) * 10.0
    f_tool = random_wrench(8)
    friction = np.asarray(jaxarm.friction_torques(arm, qd))
    dq, dv, minv = (np.array(a) for a in pin.computeABADerivatives(model, data, q, qd, tau - friction, pin_fext(model, tool_in_joint, f_tool)))
    minv = np.triu(minv) + np.triu(minv, 1).T  # Pinocchio fills the upper triangle
    # jaxarm's qdd = ABA(q, qd, tau - friction(qd)): the friction's slope enters d/dqd through M^-1
    dfric = np.asarray(jax.jacfwd(lambda v: jaxarm.friction_torques(arm, v))(jnp.asarray(qd)))
    expected = (dq, dv - minv @ dfric, minv)
    fd = lambda x, v, t: jaxarm.forward_dynamics(arm, x, v, t, f_tool)  # noqa: E731
    for mode in (jax.jacfwd, jax.jacrev):
        got = mode(fd, argnums=(0, 1, 2))(jnp.asarray(q), jnp.asarray(qd), jnp.asarray(tau))
        for g, want, name in zip(got, expected, ("q", "qd", "tau")):
            assert_close(g, want, 1e-8, f"{mode.__name__} d qdd / d {name}")


# --------------------------------------------------------------------------------------
# Kinematics


def test_tool_pose_vs_frames_forward_kinematics(case):
    arm, model, fid, tool_in_joint = case
    data = model.createData()
    for seed in (0, 1):
        q, _, _ = random_state(seed, arm.n)
        pin.framesForwardKinematics(model, data, q)
        expected = np.asarray(arm.base) @ data.oMf[fid].homogeneous
        assert_close(jaxarm.tool_pose(arm, q), expected, RTOL, "tool pose")


def test_jacobians_vs_frame_jacobian(case):
    arm, model, fid, tool_in_joint = case
    data = model.createData()
    q, _, _ = random_state(5, arm.n)
    pin.computeJointJacobians(model, data, q)
    pin.updateFramePlacements(model, data)
    R_base = np.asarray(arm.base)[:3, :3]
    J_world = np.array(pin.getFrameJacobian(model, data, fid, pin.ReferenceFrame.LOCAL_WORLD_ALIGNED))
    J_world = np.vstack([R_base @ J_world[:3], R_base @ J_world[3:]])  # frame 0 -> world
    J_local = np.array(pin.getFrameJacobian(model, data, fid, pin.ReferenceFrame.LOCAL))
    assert_close(jaxarm.jacobian(arm, q, frame="base"), J_world, RTOL, "jacobian base")
    assert_close(jaxarm.jacobian(arm, q, frame="tool"), J_local, RTOL, "jacobian tool")
