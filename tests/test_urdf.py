"""URDF import/export: round trips through save_urdf/load_urdf, real robot descriptions checked
against Pinocchio, fixed-joint merging, and one test per malformed-file case."""

from __future__ import annotations

import os
import textwrap
import warnings
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm.urdf import UrdfError, load_urdf, matrix_to_rpy, save_urdf, to_urdf
from jaxarm.spatial import rot_y, rot_z, rot_x, rpy_to_matrix

from helpers import assert_close, random_arm, random_state

# --------------------------------------------------------------------------------------------
# Helpers


def _dynamics(arm, q, qd, qdd, *, forward=False):
    """Inverse dynamics, mass matrix, tool pose (and with ``forward``, forward dynamics of the
    inverse-dynamics torque) over a batch of states. Eager vmap: one dispatch per primitive for
    the whole batch, and no per-arm compilation (under jit every arm structure costs seconds)."""

    def one(q, qd, qdd):
        tau = jaxarm.inverse_dynamics(arm, q, qd, qdd)
        out = (tau, jaxarm.mass_matrix(arm, q), jaxarm.tool_pose(arm, q))
        return out + (jaxarm.forward_dynamics(arm, q, qd, tau),) if forward else out

    return jax.vmap(one)(q, qd, qdd)


def _states(seed, n, count=5):
    states = [random_state(seed + k, n) for k in range(count)]
    return tuple(np.stack(x) for x in zip(*states))


def _quiet_load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_urdf(path, **kw)


def _with_drives(arm, **changes):
    return arm.replace(drives=jaxarm.Drives(**{**vars(arm.drives), **changes}))


def _urdf_ready(arm):
    """What URDF can hold: no rotor inertia, symmetric Coulomb friction."""
    tc = np.asarray(arm.drives.coulomb_friction)
    sym = 0.5 * (tc[:, 0] - tc[:, 1])
    return _with_drives(arm, rotor_inertia=np.zeros(arm.n), coulomb_friction=np.stack([sym, -sym], axis=1))


def _assert_same_arm(loaded, arm, seed, rtol=1e-12):
    q, qd, qdd = _states(seed, arm.n)
    tau0, M0, T0 = _dynamics(arm, q, qd, qdd)
    tau1, M1, T1 = _dynamics(loaded, q, qd, qdd)
    assert_close(tau1, tau0, rtol, "inverse dynamics")
    assert_close(M1, M0, rtol, "mass matrix")
    assert_close(T1, T0, rtol, "tool pose")


# --------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize(
    "convention, types, seed",
    [("standard", "RRPRRR", 1), ("modified", "PRRRRP", 2), ("placement", "RRPRRR", 3)],
)
def test_round_trip_random_arm(tmp_path, convention, types, seed):
    arm = random_arm(seed, types, convention, drives=True, payload=True, base=True, tool=True)
    arm = _urdf_ready(arm)
    rng = np.random.default_rng(seed)
    n = arm.n
    lower = -rng.uniform(0.5, 3.0, n)
    position = np.stack([lower, lower + rng.uniform(0.5, 3.0, n)], axis=1)
    position[0] = (-np.inf, np.inf)  # a continuous joint (or an unlimited prismatic one)
    velocity = rng.uniform(1.0, 5.0, n)
    velocity[-1] = np.inf
    torque = rng.uniform(10.0, 100.0, n)
    arm = arm.replace(limits=jaxarm.Limits(position=position, velocity=velocity, torque=torque))

    path = tmp_path / "arm.urdf"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is dropped: no warning
        save_urdf(arm, path)
    loaded = load_urdf(path)
    assert loaded.name == arm.name and loaded.joint_types == arm.joint_types and loaded.convention == "placement"
    _assert_same_arm(loaded, arm, seed)
    np.testing.assert_array_equal(loaded.limits.position, position)
    np.testing.assert_array_equal(loaded.limits.velocity, velocity)
    np.testing.assert_array_equal(loaded.limits.torque, torque)
    G = np.asarray(arm.drives.gear_ratio)
    assert_close(loaded.drives.viscous_friction, arm.drives.viscous_friction * G**2, 1e-15, "damping")
    assert_close(loaded.drives.coulomb_friction, np.abs(G)[:, None] * arm.drives.coulomb_friction, 1e-15, "friction")
    np.testing.assert_array_equal(loaded.drives.gear_ratio, np.ones(n))


def _bundled(name):
    """A bundled arm file (jaxarm.load_arm), or None when that helper or the file is absent."""
    try:
        from jaxarm.arm_files import bundled_arms, load_arm
    except ImportError:
        return None
    if name not in bundled_arms():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_arm(name)


def _puma560():
    """Corke's Puma 560 (standard DH, SI), used when no bundled file is available."""
    return jaxarm.make_arm(
        "RRRRRR",
        convention="standard",
        a=[0, 0.4318, 0.0203, 0, 0, 0],
        alpha=[np.pi / 2, 0, -np.pi / 2, np.pi / 2, -np.pi / 2, 0],
        d=[0, 0, 0.15005, 0.4318, 0, 0],
        mass=[0, 17.4, 4.8, 0.82, 0.34, 0.09],
        com=[[0, 0, 0], [-0.3638, 0.006, 0.2275], [-0.0203, -0.0141, 0.070], [0, 0.019, 0], [0, 0, 0], [0, 0, 0.032]],
        inertia=[[0, 0.35, 0], [0.13, 0.524, 0.539], [0.066, 0.086, 0.0125], [1.8e-3, 1.3e-3, 1.8e-3], [0.3e-3, 0.4e-3, 0.3e-3], [0.15e-3, 0.15e-3, 0.04e-3]],
        gear_ratio=[-62.6111, 107.815, -53.7063, 76.0364, 71.923, 76.686],
        viscous_friction=[1.48e-3, 0.817e-3, 1.38e-3, 71.2e-6, 82.6e-6, 36.7e-6],
        coulomb_friction=[[0.395, -0.435], [0.126, -0.071], [0.132, -0.105], [11.2e-3, -16.9e-3], [9.26e-3, -14.5e-3], [3.96e-3, -10.5e-3]],
        rotor_inertia=[200e-6, 200e-6, 200e-6, 33e-6, 33e-6, 33e-6],
        name="puma560",
    )


def _panda_dh():
    """The Franka Panda in modified DH (Franka's published kinematics, rough inertials)."""
    return jaxarm.make_arm(
        "RRRRRRR",
        convention="modified",
        a=[0, 0, 0, 0.0825, -0.0825, 0, 0.088],
        alpha=[0, -np.pi / 2, np.pi / 2, np.pi / 2, -np.pi / 2, np.pi / 2, np.pi / 2],
        d=[0.333, 0, 0.316, 0, 0.384, 0, 0],
        mass=[4.97, 0.65, 3.23, 3.59, 1.23, 1.67, 0.74],
        com=[[0.0039, 0.0021, -0.0476], [-0.0031, -0.0287, 0.0035], [0.0275, 0.0393, -0.0665], [-0.0532, 0.1044, 0.0275], [-0.0120, 0.0411, -0.0384], [0.0601, -0.0141, -0.0105], [0.0105, -0.0043, 0.0616]],
        inertia=[[0.70, 0.70, 0.009], [0.008, 0.028, 0.026], [0.037, 0.036, 0.011], [0.026, 0.020, 0.028], [0.036, 0.029, 0.0086], [0.0020, 0.0044, 0.0054], [0.0125, 0.0100, 0.0048]],
        tool=np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0.107], [0, 0, 0, 1.0]]),
        name="panda",
    )


@pytest.mark.parametrize("name", ["puma560", "panda"])
def test_round_trip_bundled_arms(tmp_path, name):
    arm = _bundled(name) or {"puma560": _puma560, "panda": _panda_dh}[name]()
    arm = _urdf_ready(arm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a bundled arm may use standard gravity 9.80665
        save_urdf(arm, tmp_path / f"{name}.urdf")
    _assert_same_arm(load_urdf(tmp_path / f"{name}.urdf", gravity=arm.gravity), arm, 7)


def test_export_notes_what_urdf_cannot_hold(tmp_path):
    arm = random_arm(5, "RRPRRR", "standard", drives=True)  # rotor inertia, asymmetric Coulomb, motor model
    with pytest.warns(UserWarning) as record:
        text = to_urdf(arm)
    messages = " | ".join(str(w.message) for w in record)
    assert "rotor inertia" in messages and "asymmetric Coulomb" in messages
    assert "Reflected rotor inertia" in text and "dropped" in text and "electrical motor model" in text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_urdf(arm, tmp_path / "a.urdf")
    loaded = load_urdf(tmp_path / "a.urdf")
    # Dropping the rotor inertia and symmetrizing Coulomb is exactly what changed.
    tc = np.abs(arm.drives.gear_ratio) * 0.5 * (arm.drives.coulomb_friction[:, 0] - arm.drives.coulomb_friction[:, 1])
    assert_close(loaded.drives.coulomb_friction[:, 0], tc, 1e-15, "mean Coulomb")
    np.testing.assert_array_equal(loaded.drives.rotor_inertia, np.zeros(arm.n))


def test_gravity_is_noted_and_can_be_passed_back(tmp_path):
    arm = random_arm(6, "RRRPRR", "modified", gravity=(0.0, 9.81, 0.0))
    with pytest.warns(UserWarning, match="gravity"):
        save_urdf(arm, tmp_path / "g.urdf")
    assert "gravity [0.0, 9.81, 0.0]" in (tmp_path / "g.urdf").read_text()
    _assert_same_arm(load_urdf(tmp_path / "g.urdf", gravity=(0.0, 9.81, 0.0)), arm, 6)


def test_save_is_atomic(tmp_path, monkeypatch):
    arm = random_arm(8, "RRPRRR", "standard")
    path = tmp_path / "arm.urdf"
    path.write_text("old contents")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_urdf(arm, path)
    assert path.read_text() == "old contents"
    assert os.listdir(tmp_path) == ["arm.urdf"]  # the temporary file is gone
    monkeypatch.undo()
    save_urdf(arm, path)
    assert os.listdir(tmp_path) == ["arm.urdf"]
    assert path.read_text().startswith("<?xml")


def test_exported_urdf_reads_in_pinocchio(tmp_path):
    pin = pytest.importorskip("pinocchio")
    arm = _urdf_ready(random_arm(9, "RPRRRR", "standard", base=True, tool=True, payload=True))
    save_urdf(arm, tmp_path / "a.urdf")
    model = pin.buildModelFromUrdf(str(tmp_path / "a.urdf"))
    data = model.createData()
    q, qd, qdd = random_state(9, arm.n)
    tau = pin.rnea(model, data, _pin_q(model, q), qd, qdd)
    assert_close(tau, jaxarm.rigid_body_torques(arm, q, qd, qdd), 1e-12, "rnea")


@pytest.mark.parametrize("seed", range(3))
def test_rpy_is_exact_in_gimbal_lock(seed):
    """matrix_to_rpy must reconstruct rotations with pitch = +-pi/2 that carry rounding noise
    (placements such as Rx(pi/2) Rz(pi/2) of DH arms land there)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(200):
        L = rot_z(rng.uniform(-3, 3)) @ rot_y(rng.choice([-1, 1]) * np.pi / 2) @ rot_x(rng.uniform(-3, 3))
        Q = rpy_to_matrix(rng.uniform(-3, 3, 3))
        R = Q @ (Q.T @ L)  # the same rotation with rounding noise
        worst = max(worst, np.abs(rpy_to_matrix(matrix_to_rpy(R)) - R).max())
    assert worst < 1e-15
    R = rpy_to_matrix(np.array([0.3, -1.2, 2.5]))
    np.testing.assert_allclose(matrix_to_rpy(R), [0.3, -1.2, 2.5], atol=1e-15)


# --------------------------------------------------------------------------------------------
# Real robot descriptions against Pinocchio


def _robot_file(relative):
    """A URDF of the installed example-robot-data package (cmeel layout), or skip."""
    try:
        files = metadata.files("example-robot-data") or []
    except metadata.PackageNotFoundError:
        pytest.skip("example-robot-data is not installed")
    for f in files:
        if str(f).replace("\\", "/").endswith("example-robot-data/robots/" + relative):
            return str(f.locate())
    pytest.skip(f"example-robot-data has no {relative}")


def _pin_q(model, q):
    """Pinocchio configuration of joint values q (continuous joints use cos, sin)."""
    out = []
    for j, x in zip(model.joints[1:], q):
        out.extend([np.cos(x), np.sin(x)] if j.nq == 2 else [x])
    return np.array(out)


def _compare_with_pinocchio(arm, model, frame, seed):
    pin = pytest.importorskip("pinocchio")
    data = model.createData()
    assert model.nv == arm.n
    rng = np.random.default_rng(seed)
    lo = np.maximum(np.asarray(arm.limits.position[:, 0]), -np.pi)
    hi = np.minimum(np.asarray(arm.limits.position[:, 1]), np.pi)
    q = rng.uniform(lo, hi, (5, arm.n))
    qd = rng.uniform(-2, 2, (5, arm.n))
    qdd = rng.uniform(-3, 3, (5, arm.n))
    tau, M, T, fd = _dynamics(arm, q, qd, qdd, forward=True)
    worst = {}
    for k in range(5):
        qp = _pin_q(model, q[k])
        drive = model.damping * qd[k] + model.friction * np.sign(qd[k])  # URDF <dynamics>
        tau_p = pin.rnea(model, data, qp, qd[k], qdd[k]) + drive
        M_p = pin.crba(model, data, qp)
        M_p = np.triu(M_p) + np.triu(M_p, 1).T
        fd_p = pin.aba(model, data, qp, qd[k], tau_p - drive)
        pin.framesForwardKinematics(model, data, qp)
        T_p = data.oMf[model.getFrameId(frame)].homogeneous
        for what, ours, theirs in (("inverse dynamics", tau[k], tau_p), ("mass matrix", M[k], M_p), ("forward dynamics", fd[k], fd_p), ("tip pose", T[k], T_p)):
            assert_close(ours, theirs, 1e-9, f"{what} at state {k}")
            err = np.abs(np.asarray(ours) - theirs).max() / np.abs(theirs).max()
            worst[what] = max(worst.get(what, 0.0), err)
    # Pinocchio merges fixed-joint links into the parent body too: the inertias agree.
    for i in range(arm.n):
        inertia = model.inertias[i + 1]
        assert_close(arm.links.mass[i], inertia.mass, 1e-12, f"mass {i + 1}")
        assert_close(arm.links.com[i], inertia.lever, 1e-12, f"com {i + 1}")
        assert_close(arm.links.inertia[i], inertia.inertia, 1e-12, f"inertia {i + 1}")
    print(f"{arm.name} vs Pinocchio, max relative error:", {k: f"{v:.1e}" for k, v in worst.items()})


def test_ur5_matches_pinocchio():
    pin = pytest.importorskip("pinocchio")
    path = _robot_file("ur_description/urdf/ur5_robot.urdf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # geometry is for drawing (jaxarm view): nothing to warn about
        arm = load_urdf(path, tip_link="tool0")
    assert arm.name == "ur5" and arm.n == 6 and arm.joint_types == ("revolute",) * 6
    np.testing.assert_array_equal(arm.base, np.eye(4))
    np.testing.assert_array_equal(arm.limits.torque, [150, 150, 150, 28, 28, 28])
    np.testing.assert_array_equal(arm.limits.velocity, [3.15, 3.15, 3.15, 3.2, 3.2, 3.2])
    _compare_with_pinocchio(arm, pin.buildModelFromUrdf(path), "tool0", seed=1)
    # Without tip_link: ee_link and tool0 both hang from wrist_3_link by fixed joints, so the chain
    # is unambiguous and ends at that link (tool = identity); the dynamics are the same.
    default = _quiet_load(path)
    np.testing.assert_array_equal(default.tool, np.eye(4))
    q, qd, qdd = _states(3, 6)
    assert_close(_dynamics(default, q, qd, qdd)[0], _dynamics(arm, q, qd, qdd)[0], 1e-14, "tau")


def test_panda_matches_pinocchio_with_fingers_locked():
    pin = pytest.importorskip("pinocchio")
    path = _robot_file("panda_description/urdf/panda.urdf")
    with pytest.raises(UrdfError) as info:
        _quiet_load(path)
    msg = str(info.value)
    assert "\n" not in msg and "tip_link" in msg
    assert "'panda_leftfinger'" in msg and "'panda_rightfinger'" in msg and "'panda_hand_tcp'" in msg

    with pytest.warns(UserWarning) as record:
        arm = load_urdf(path, tip_link="panda_hand_tcp")
    messages = [str(w.message) for w in record]
    assert len(messages) == 1
    assert "'panda_finger_joint1', 'panda_finger_joint2' are not on the chain 'panda_link0' -> 'panda_hand_tcp'" in messages[0]
    assert arm.n == 7 and arm.name == "panda"
    np.testing.assert_allclose(arm.drives.viscous_friction, 0.003)
    full = pin.buildModelFromUrdf(path)
    fingers = [full.getJointId("panda_finger_joint1"), full.getJointId("panda_finger_joint2")]
    model = pin.buildReducedModel(full, fingers, pin.neutral(full))
    _compare_with_pinocchio(arm, model, "panda_hand_tcp", seed=2)
    # The tip only moves the tool frame: panda_link8 gives the same bodies.
    link8 = _quiet_load(path, tip_link="panda_link8")
    np.testing.assert_allclose(link8.tool[:3, 3], [0, 0, 0.107])
    for field in ("mass", "com", "inertia"):
        np.testing.assert_array_equal(getattr(link8.links, field), getattr(arm.links, field))


def test_jit_vmap_grad_on_a_urdf_arm(tmp_path):
    """One jitted function (vmap, grad and jacfwd inside) on a small URDF arm, checked against
    Pinocchio: RNEA, RNEA derivatives, and the exact mass sensitivity (torque is linear in each
    link mass at fixed COM and inertia about the COM)."""
    pin = pytest.importorskip("pinocchio")
    path = tmp_path / "robot.urdf"
    text = _two_joint(link2_inertial='<origin xyz="0.2 0.05 0"/><mass value="1"/>')
    limit = '<limit lower="-3" upper="3" effort="10" velocity="2"/>'
    text = text.replace('<axis xyz="0 0 1"/>', '<axis xyz="0 0 1"/>' + limit)
    path.write_text(text.replace('<axis xyz="0 1 0"/>', '<origin xyz="0.3 0 0.1"/><axis xyz="0 1 0"/>' + limit))
    arm = load_urdf(path)
    q, qd, qdd = _states(11, arm.n, count=4)

    def total(masses, q, qd, qdd):
        links = jaxarm.Links(mass=masses, com=arm.links.com, inertia=arm.links.inertia)
        return jnp.sum(jaxarm.inverse_dynamics(arm.replace(links=links), q, qd, qdd))

    @jax.jit
    def everything(arm, q, qd, qdd):
        tau = jax.vmap(jaxarm.inverse_dynamics, in_axes=(None, 0, 0, 0))(arm, q, qd, qdd)
        d_mass = jax.grad(total)(arm.links.mass, q[0], qd[0], qdd[0])
        d_q = jax.jacfwd(lambda x: jaxarm.inverse_dynamics(arm, x, qd[0], qdd[0]))(q[0])
        return tau, d_mass, d_q

    tau, d_mass, d_q = everything(arm, q, qd, qdd)
    model = pin.buildModelFromUrdf(str(path))
    data = model.createData()
    for k in range(4):
        assert_close(tau[k], pin.rnea(model, data, q[k], qd[k], qdd[k]), 1e-12, "jit+vmap vs Pinocchio")
    pin.computeRNEADerivatives(model, data, q[0], qd[0], qdd[0])
    assert_close(d_q, data.dtau_dq, 1e-12, "jacfwd vs Pinocchio's RNEA derivatives")
    base = pin.rnea(model, data, q[0], qd[0], qdd[0]).sum()
    for i in range(arm.n):
        inertia = model.inertias[i + 1]
        model.inertias[i + 1] = pin.Inertia(inertia.mass + 1.0, inertia.lever, inertia.inertia)
        assert_close(d_mass[i], pin.rnea(model, data, q[0], qd[0], qdd[0]).sum() - base, 1e-12, f"grad wrt mass {i + 1}")
        model.inertias[i + 1] = inertia


# --------------------------------------------------------------------------------------------
# A hand-written chain: fixed joints on and off the chain, odd axes, every joint type


def _gadget(extra=""):
    return textwrap.dedent(
        """\
        <?xml version="1.0"?>
        <robot name="gadget">
          <link name="world"/>
          <joint name="mount" type="fixed">
            <parent link="world"/><child link="base"/>
            <origin xyz="0.1 -0.2 0.3" rpy="0.2 -0.4 1.1"/>
          </joint>
          <link name="base">
            <inertial><mass value="7"/><inertia ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial>
          </link>
          <joint name="j1" type="revolute">
            <parent link="base"/><child link="l1"/>
            <origin xyz="0 0 0.2" rpy="0 0 0.3"/>
            <axis xyz="0 0 2"/>
            <limit lower="-2" upper="2.5" effort="40" velocity="3"/>
            <dynamics damping="0.7" friction="0.2"/>
          </joint>
          <link name="l1">
            <visual><geometry><mesh filename="package://gadget/l1.stl"/></geometry></visual>
            <inertial>
              <origin xyz="0.05 0.01 0.1" rpy="0.3 0.2 -0.1"/>
              <mass value="2.5"/>
              <inertia ixx="0.02" ixy="0.001" ixz="-0.002" iyy="0.03" iyz="0.0015" izz="0.025"/>
            </inertial>
          </link>
          <joint name="bracket" type="fixed">
            <parent link="l1"/><child link="l1b"/>
            <origin xyz="0.3 0 0.05" rpy="1.5707963267948966 0 0"/>
          </joint>
          <link name="l1b">
            <inertial>
              <origin xyz="0 0.1 0" rpy="0 0 0.5"/>
              <mass value="1.2"/>
              <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.012" iyz="0" izz="0.008"/>
            </inertial>
          </link>
          <joint name="j2" type="prismatic">
            <parent link="l1b"/><child link="l2"/>
            <origin xyz="0 0.2 0" rpy="0 1.5707963267948966 0"/>
            <axis xyz="0.6 0 0.8"/>
            <limit lower="-0.1" upper="0.4" effort="200" velocity="0.5"/>
          </joint>
          <link name="l2">
            <inertial>
              <origin xyz="0.02 -0.03 0.15" rpy="0 0 0"/>
              <mass value="1.8"/>
              <inertia ixx="0.03" ixy="0" ixz="0.001" iyy="0.028" iyz="0" izz="0.006"/>
            </inertial>
          </link>
          <joint name="cam_joint" type="fixed">
            <parent link="l2"/><child link="cam"/>
            <origin xyz="0.05 0.05 0.1" rpy="0.1 0.2 0.3"/>
          </joint>
          <link name="cam">
            <inertial>
              <origin xyz="0.01 0 0" rpy="0 0.4 0"/>
              <mass value="0.3"/>
              <inertia ixx="0.0004" ixy="0" ixz="0" iyy="0.0005" iyz="0" izz="0.0003"/>
            </inertial>
          </link>
          <joint name="j3" type="continuous">
            <parent link="l2"/><child link="l3"/>
            <origin xyz="0 0 0.3" rpy="-0.5 0 0"/>
            <axis xyz="0 -1 0"/>
            <dynamics damping="0.1"/>
          </joint>
          <link name="l3">
            <inertial>
              <origin xyz="0.1 0 0.02" rpy="0 0 0"/>
              <mass value="0.9"/>
              <inertia ixx="0.002" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.011"/>
            </inertial>
          </link>
          <joint name="j4" type="revolute">
            <parent link="l3"/><child link="l4"/>
            <origin xyz="0.2 0 0" rpy="0 0 0"/>
            <axis xyz="1 0 0"/>
            <limit lower="-3" upper="3" effort="10" velocity="2"/>
          </joint>
          <link name="l4">
            <inertial><origin xyz="0.05 0 0"/><mass value="0.6"/><inertia ixx="0.001" ixy="0" ixz="0" iyy="0.002" iyz="0" izz="0.002"/></inertial>
          </link>
          <joint name="j5" type="revolute">
            <parent link="l4"/><child link="l5"/>
            <origin xyz="0.1 0 0" rpy="0 0 1.5707963267948966"/>
            <axis xyz="0 0 -1"/>
            <limit lower="-3" upper="3" effort="10" velocity="2"/>
          </joint>
          <link name="l5">
            <inertial><origin xyz="0 0.03 0" rpy="0.1 0 0"/><mass value="0.5"/><inertia ixx="0.0012" ixy="0.0001" ixz="0" iyy="0.0008" iyz="0" izz="0.001"/></inertial>
          </link>
          <joint name="j6" type="prismatic">
            <parent link="l5"/><child link="l6"/>
            <origin xyz="0 0.08 0" rpy="0 -1.5707963267948966 0"/>
            <axis xyz="0 1 0"/>
            <limit lower="0" upper="0.1" effort="50" velocity="0.2"/>
          </joint>
          <link name="l6">
            <inertial><mass value="0.2"/><inertia ixx="0.0002" ixy="0" ixz="0" iyy="0.0002" iyz="0" izz="0.0001"/></inertial>
          </link>
          <joint name="flange_joint" type="fixed">
            <parent link="l6"/><child link="flange"/>
            <origin xyz="0.2 0 0" rpy="0 1.5707963267948966 0"/>
          </joint>
          <link name="flange">
            <inertial><mass value="0.4"/><inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.0015"/></inertial>
          </link>
          <joint name="tcp_joint" type="fixed">
            <parent link="flange"/><child link="tcp"/>
            <origin xyz="0 0 0.12" rpy="0 0 0.7"/>
          </joint>
          <link name="tcp"/>
          EXTRA
        </robot>
        """
    ).replace("EXTRA", extra)


_PAN = """
  <joint name="pan" type="revolute">
    <parent link="l1"/><child link="pan_link"/>
    <origin xyz="0 0.1 0.1" rpy="0 0 0"/>
    <axis xyz="1 0 0"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/>
  </joint>
  <link name="pan_link">
    <inertial><origin xyz="0 0.05 0"/><mass value="0.5"/><inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.001"/></inertial>
  </link>
"""


def test_fixed_joints_merge_like_pinocchio(tmp_path):
    pin = pytest.importorskip("pinocchio")
    path = tmp_path / "gadget.urdf"
    path.write_text(_gadget())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arm = load_urdf(path)  # default tip: 'tcp' (the camera hangs from an earlier link)
    assert arm.joint_types == ("revolute", "prismatic", "revolute", "revolute", "revolute", "prismatic")
    assert arm.name == "gadget"
    np.testing.assert_array_equal(arm.base, np.eye(4))
    np.testing.assert_array_equal(arm.limits.position[:3], [[-2, 2.5], [-0.1, 0.4], [-np.inf, np.inf]])
    np.testing.assert_array_equal(arm.limits.torque, [40, 200, np.inf, 10, 10, 50])
    np.testing.assert_array_equal(arm.drives.viscous_friction, [0.7, 0, 0.1, 0, 0, 0])
    np.testing.assert_array_equal(arm.drives.coulomb_friction[:2], [[0.2, -0.2], [0, 0]])
    np.testing.assert_allclose(np.asarray(arm.kinematics.axis)[0], [0, 0, 1])
    # Nothing folded into joint 3's placement: the URDF numbers verbatim.
    np.testing.assert_array_equal(arm.kinematics.rpy[2], [-0.5, 0, 0])
    _compare_with_pinocchio(arm, pin.buildModelFromUrdf(str(path)), "tcp", seed=4)


def test_base_link_moves_the_world_frame(tmp_path):
    path = tmp_path / "gadget.urdf"
    path.write_text(_gadget())
    world = _quiet_load(path)
    mount = np.eye(4)
    mount[:3, :3] = rpy_to_matrix(np.array([0.2, -0.4, 1.1]))
    mount[:3, 3] = [0.1, -0.2, 0.3]
    g = mount[:3, :3].T @ np.array([0, 0, -9.81])
    from_base = _quiet_load(path, base_link="base", gravity=g)
    q, qd, qdd = _states(12, 6)
    tau_w, M_w, T_w = _dynamics(world, q, qd, qdd)
    tau_b, M_b, T_b = _dynamics(from_base, q, qd, qdd)
    assert_close(tau_b, tau_w, 1e-12, "tau")
    assert_close(M_b, M_w, 1e-12, "M")
    assert_close(np.einsum("ij,kjl->kil", mount, T_b), T_w, 1e-12, "tool pose")


def test_moving_side_branch_is_locked_and_merged(tmp_path):
    pin = pytest.importorskip("pinocchio")
    path = tmp_path / "gadget.urdf"
    path.write_text(_gadget(_PAN))
    with pytest.raises(UrdfError, match="several candidate tip links") as info:
        _quiet_load(path)
    assert all(f"'{leaf}'" in str(info.value) for leaf in ("cam", "tcp", "pan_link"))
    with pytest.warns(UserWarning) as record:
        arm = load_urdf(path, tip_link="tcp")
    assert any("joints 'pan' are not on the chain 'world' -> 'tcp': locked at 0" in str(w.message) for w in record)
    full = pin.buildModelFromUrdf(str(path))
    model = pin.buildReducedModel(full, [full.getJointId("pan")], pin.neutral(full))
    _compare_with_pinocchio(arm, model, "tcp", seed=5)


def test_missing_inertial_is_zero_mass(tmp_path):
    text = _gadget().replace(
        '<inertial><mass value="0.4"/><inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.0015"/></inertial>', ""
    )
    (tmp_path / "a.urdf").write_text(_gadget())
    (tmp_path / "b.urdf").write_text(text)
    a, b = _quiet_load(tmp_path / "a.urdf"), _quiet_load(tmp_path / "b.urdf")
    assert_close(b.links.mass[-1], a.links.mass[-1] - 0.4, 1e-15, "mass without the flange")


# --------------------------------------------------------------------------------------------
# Bad files: one line naming the element


def _two_joint(joint2='type="revolute"', link2_inertial='<mass value="1"/>', extra=""):
    return textwrap.dedent(
        """\
        <robot name="bad">
          <link name="base"/>
          <link name="upper"><inertial><mass value="2"/><inertia ixx="0.1" ixy="0" ixz="0" iyy="0.1" iyz="0" izz="0.1"/></inertial></link>
          <link name="fore"><inertial>LINK2_INERTIAL<inertia ixx="0.1" ixy="0" ixz="0" iyy="0.1" iyz="0" izz="0.1"/></inertial></link>
          <joint name="shoulder" type="revolute">
            <parent link="base"/><child link="upper"/><axis xyz="0 0 1"/>
          </joint>
          <joint name="elbow" JOINT2>
            <parent link="upper"/><child link="fore"/><axis xyz="0 1 0"/>
          </joint>
          EXTRA
        </robot>
        """
    ).replace("LINK2_INERTIAL", link2_inertial).replace("JOINT2", joint2).replace("EXTRA", extra)


BAD_FILES = {
    "malformed XML": (
        '<robot name="bad">\n  <link name="base">\n  <link name="upper"/>\n</robot>\n',
        r"robot\.urdf: malformed XML at line 4, column \d+: mismatched tag",
    ),
    "negative mass": (
        _two_joint(link2_inertial='<mass value="-1.5"/>'),
        r"robot\.urdf: link 'fore': inertial mass: expected a non-negative mass, got -1\.5",
    ),
    "unknown joint type": (_two_joint('type="ball"'), r"robot\.urdf: joint 'elbow': type: unknown joint type 'ball'"),
    "missing parent link": (
        _two_joint().replace('<parent link="upper"/>', '<parent link="ghost"/>'),
        r"robot\.urdf: joint 'elbow': parent: link 'ghost' does not exist",
    ),
    "missing child link": (
        _two_joint().replace('<child link="fore"/>', '<child link="ghost"/>'),
        r"robot\.urdf: joint 'elbow': child: link 'ghost' does not exist",
    ),
    "mimic joint": (
        _two_joint().replace('<axis xyz="0 1 0"/>', '<axis xyz="0 1 0"/><mimic joint="shoulder"/>'),
        r"robot\.urdf: joint 'elbow': mimic: mimic joints are not supported",
    ),
    "floating joint": (_two_joint('type="floating"'), r"robot\.urdf: joint 'elbow': type: floating joints are not supported"),
    "planar joint": (_two_joint('type="planar"'), r"robot\.urdf: joint 'elbow': type: planar joints are not supported"),
    "closed chain": (
        _two_joint(extra='<joint name="loop" type="revolute"><parent link="base"/><child link="fore"/></joint>'),
        r"robot\.urdf: joint 'loop': child: link 'fore' already has parent joint 'elbow' \(closed kinematic chains are not supported\)",
    ),
    "bad origin": (
        _two_joint().replace('<axis xyz="0 1 0"/>', '<origin xyz="0 0"/><axis xyz="0 1 0"/>'),
        r"robot\.urdf: joint 'elbow': origin xyz: expected 3 number\(s\), got '0 0'",
    ),
    "zero axis": (_two_joint().replace('<axis xyz="0 1 0"/>', '<axis xyz="0 0 0"/>'), r"robot\.urdf: joint 'elbow': axis: expected a non-zero vector"),
    "limits reversed": (
        _two_joint().replace('<axis xyz="0 1 0"/>', '<axis xyz="0 1 0"/><limit lower="1" upper="-1" effort="1" velocity="1"/>'),
        r"robot\.urdf: joint 'elbow': limit: expected lower < upper, got lower=1\.0, upper=-1\.0",
    ),
    "negative effort": (
        _two_joint().replace('<axis xyz="0 1 0"/>', '<axis xyz="0 1 0"/><limit effort="-3" velocity="1"/>'),
        r"robot\.urdf: joint 'elbow': limit effort: expected >= 0",
    ),
    "negative damping": (
        _two_joint().replace('<axis xyz="0 1 0"/>', '<axis xyz="0 1 0"/><dynamics damping="-0.1"/>'),
        r"robot\.urdf: joint 'elbow': dynamics damping: expected >= 0, got -0\.1",
    ),
    "mass without value": (_two_joint(link2_inertial="<mass/>"), r"robot\.urdf: link 'fore': inertial mass: missing attribute 'value'"),
    "not a robot": ("<model name='x'/>", r"robot\.urdf: root element: expected <robot>, got <model>"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_file_gives_one_line_naming_the_element(tmp_path, case):
    text, pattern = BAD_FILES[case]
    path = tmp_path / "robot.urdf"
    path.write_text(text)
    with pytest.raises(UrdfError, match=pattern) as info:
        _quiet_load(path)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"tip_link": "nowhere"}, r"robot\.urdf: tip_link: link 'nowhere' does not exist"),
        ({"base_link": "nowhere"}, r"robot\.urdf: base_link: link 'nowhere' does not exist"),
        ({"base_link": "fore", "tip_link": "upper"}, r"robot\.urdf: tip_link: link 'upper' is not below base_link 'fore'"),
        ({"base_link": "fore"}, r"robot\.urdf: link 'fore': no moving joint below the base link"),
    ],
)
def test_bad_chain_choice(tmp_path, kwargs, pattern):
    path = tmp_path / "robot.urdf"
    path.write_text(_two_joint())
    with pytest.raises(UrdfError, match=pattern):
        load_urdf(path, **kwargs)


def test_missing_file(tmp_path):
    with pytest.raises(UrdfError, match=r"nothere\.urdf: cannot read"):
        load_urdf(tmp_path / "nothere.urdf")


def test_mimic_and_floating_joints_off_the_chain_are_fine(tmp_path):
    """Only joints *on* the chain must be supported: a mimic finger next to the arm is locked."""
    extra = """
      <link name="finger"><inertial><mass value="0.1"/><inertia ixx="1e-5" ixy="0" ixz="0" iyy="1e-5" iyz="0" izz="1e-5"/></inertial></link>
      <joint name="finger_joint" type="prismatic"><parent link="upper"/><child link="finger"/><axis xyz="1 0 0"/>
        <limit lower="0" upper="0.04" effort="10" velocity="0.1"/><mimic joint="elbow"/></joint>"""
    path = tmp_path / "robot.urdf"
    path.write_text(_two_joint(extra=extra))
    with pytest.warns(UserWarning, match="'finger_joint' are not on the chain"):
        arm = load_urdf(path, tip_link="fore")
    assert_close(arm.links.mass, [2.1, 1.0], 1e-15, "finger merged into the upper arm")


def test_rollout_and_its_gradient_work_unchanged_on_a_urdf_arm(tmp_path):
    """A URDF-loaded arm is an ordinary Arm: an RK3 rollout of the Panda exported to URDF and read
    back matches the DH original step for step, and differentiates with respect to its masses."""

    arm = jaxarm.load_arm("panda")
    path = tmp_path / "panda.urdf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_urdf(arm, path)
    back = jaxarm.load_arm(str(path), gravity=tuple(np.asarray(arm.gravity)))
    lo, hi = np.asarray(arm.limits.position).T
    q0 = np.clip(np.linspace(-0.4, 0.6, arm.n), lo + 0.1, hi - 0.1)  # inside the end stops
    tau = np.tile(np.asarray(jaxarm.gravity_torques(arm, q0)), (40, 1))
    ref = jaxarm.rollout(arm, q0, np.zeros(arm.n), tau, 1e-3)
    got = jaxarm.rollout(back, q0, np.zeros(arm.n), tau, 1e-3)
    np.testing.assert_allclose(got.q, ref.q, rtol=0, atol=1e-12)
    # Euler keeps the gradient's compile time small (one forward-dynamics call per step; the time
    # loop evaluates it again in reverse mode instead of storing its intermediates: Panda, 40 Euler
    # steps, gradient w.r.t. the masses under jaxarm.jit compiles in about 19 s, docs/how-it-works.md).
    # Jitted with jaxarm's compiler options, as docs/how-it-works.md advises.
    def final(mass):
        heavier = back.replace(links=back.links.replace(mass=mass))
        return jaxarm.rollout(heavier, q0, np.zeros(arm.n), tau, 1e-3, method="euler").q[-1].sum()

    mass = jnp.asarray(back.links.mass)
    grad = np.asarray(jaxarm.jit(jax.grad(final))(mass))
    assert np.all(np.isfinite(grad)) and np.any(grad != 0)
    # against central differences of the same rollout, for the three links whose mass acts most
    value = jaxarm.jit(final)
    h = 1e-4
    for j in np.argsort(-np.abs(grad))[:3]:
        fd = (float(value(mass.at[j].add(h))) - float(value(mass.at[j].add(-h)))) / (2 * h)
        assert fd == pytest.approx(grad[j], rel=1e-6, abs=1e-12), f"link {j + 1}: d/d mass {grad[j]} vs central difference {fd}"
