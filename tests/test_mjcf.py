"""MJCF export: MuJoCo's mass matrix, inverse and forward dynamics and tool pose agree with
jaxarm's, and every drive/limit field lands where MuJoCo reads it."""

from __future__ import annotations

import os
import warnings
from importlib import metadata

import jax
import numpy as np
import pytest

import jaxarm
from jaxarm.mjcf import save_mjcf, to_mjcf
from jaxarm.urdf import load_urdf

from helpers import assert_close, random_arm, random_state

mujoco = pytest.importorskip("mujoco")


def _with_drives(arm, **changes):
    return arm.replace(drives=jaxarm.Drives(**{**vars(arm.drives), **changes}))


def _no_coulomb(arm):
    """MuJoCo's frictionloss is a soft constraint, not Tc sign(qd): compare dynamics without it."""
    return _with_drives(arm, coulomb_friction=np.zeros((arm.n, 2)))


def _states(seed, n, count=5):
    return tuple(np.stack(x) for x in zip(*(random_state(seed + k, n) for k in range(count))))


def _jaxarm(arm, q, qd, qdd):
    """Inverse dynamics, mass matrix and tool pose over a batch (eager vmap: no per-arm compile)."""

    def one(q, qd, qdd):
        return jaxarm.inverse_dynamics(arm, q, qd, qdd), jaxarm.mass_matrix(arm, q), jaxarm.tool_pose(arm, q)

    return jax.tree_util.tree_map(np.asarray, jax.vmap(one)(q, qd, qdd))


def _compare_with_mujoco(arm, seed, rtol=1e-9):
    """M from mj_fullM, qfrc_inverse from mj_inverse, qacc from mj_forward with ctrl = jaxarm's
    torque, and the tool site pose, at 5 random states."""
    model = mujoco.MjModel.from_xml_string(to_mjcf(arm))
    data = mujoco.MjData(model)
    assert model.nv == arm.n and model.nu == arm.n
    q, qd, qdd = _states(seed, arm.n)
    # Inside the position limits: outside them MuJoCo's limit constraints push back.
    lo, hi = np.asarray(arm.limits.position).T
    lo, hi = np.maximum(lo, -np.pi), np.minimum(hi, np.pi)
    q = lo + (hi - lo) * (q + np.pi) / (2 * np.pi)
    tau, M, T = _jaxarm(arm, q, qd, qdd)
    worst = {}
    for k in range(len(q)):
        data.qpos[:], data.qvel[:], data.qacc[:] = q[k], qd[k], qdd[k]
        mujoco.mj_inverse(model, data)  # qfrc_inverse = M qacc + bias - passive (= -damping qd)
        M_mj = np.zeros((arm.n, arm.n))
        mujoco.mj_fullM(model, data, M_mj)
        tau_mj = data.qfrc_inverse.copy()
        data.ctrl[:] = tau[k]  # motors with gear 1: the control is the joint torque
        mujoco.mj_forward(model, data)
        T_mj = np.eye(4)
        T_mj[:3, :3], T_mj[:3, 3] = data.site_xmat[0].reshape(3, 3), data.site_xpos[0]
        for what, theirs, ours in (("mass matrix", M_mj, M[k]), ("inverse dynamics", tau_mj, tau[k]), ("forward dynamics", data.qacc, qdd[k]), ("tool pose", T_mj, T[k])):
            assert_close(theirs, ours, rtol, f"{arm.name}: {what} at state {k}")
            worst[what] = max(worst.get(what, 0.0), np.abs(theirs - ours).max() / np.abs(ours).max())
    print(f"{arm.name} vs MuJoCo, max relative error:", {k: f"{v:.1e}" for k, v in worst.items()})
    return model


@pytest.mark.parametrize("convention, types, seed", [("standard", "RRPRRR", 1), ("modified", "PRRRRP", 2), ("placement", "RRPRRR", 3)])
def test_random_arm_matches_mujoco(convention, types, seed):
    arm = random_arm(seed, types, convention, drives=True, payload=True, base=True, tool=True)
    arm = _no_coulomb(arm)
    model = _compare_with_mujoco(arm, seed)
    # Drive terms land on the joints unchanged: armature G^2 Jm, damping B G^2.
    G = np.asarray(arm.drives.gear_ratio)
    assert_close(model.dof_armature, G**2 * arm.drives.rotor_inertia, 1e-15, "armature")
    assert_close(model.dof_damping, G**2 * arm.drives.viscous_friction, 1e-15, "damping")
    np.testing.assert_array_equal(model.dof_frictionloss, np.zeros(arm.n))


def _bundled(name):
    try:
        from jaxarm.arm_files import bundled_arms, load_arm
    except ImportError:
        return None
    if name not in bundled_arms():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_arm(name)


def test_bundled_panda_matches_mujoco():
    arm = _bundled("panda")
    if arm is None:
        from test_urdf import _panda_dh

        arm = _panda_dh()
    _compare_with_mujoco(_no_coulomb(arm), 4)


def test_bundled_puma560_matches_mujoco():
    arm = _bundled("puma560")
    if arm is None:
        pytest.skip("bundled arm files not available")
    _compare_with_mujoco(_no_coulomb(arm), 5)


def test_puma560_literature_model_is_refused_with_the_joint_named():
    """Corke's Puma 560 has a massless link 1 carrying only I_zz (and link 3 breaks the triangle
    inequality): MuJoCo would reject it, so to_mjcf says which joint and why."""
    arm = _bundled("puma560_rtb")
    if arm is None:
        from test_urdf import _puma560

        arm = _puma560()
    with pytest.raises(ValueError, match=r"to_mjcf: joint 1: MuJoCo needs every moving body to have positive mass") as info:
        to_mjcf(arm)
    assert "\n" not in str(info.value)


def test_massless_body_is_refused_like_mujoco_does():
    arm = random_arm(5, "RRRRRR", "modified")
    links = arm.links
    mass = np.asarray(links.mass).copy()
    mass[1] = 0.0
    bad = arm.replace(links=jaxarm.Links(mass=mass, com=links.com, inertia=links.inertia))
    with pytest.raises(ValueError, match=r"to_mjcf: joint 2: .* got mass 0\.0"):
        to_mjcf(bad)
    # MuJoCo agrees that such a body cannot be compiled.
    text = to_mjcf(arm).replace(f'mass="{float(arm.links.mass[1])!r}"', 'mass="0"')
    with pytest.raises(ValueError, match="mass and inertia of moving bodies"):
        mujoco.MjModel.from_xml_string(text)


def test_panda_urdf_through_mujoco():
    """example-robot-data's Panda: URDF -> jaxarm -> MJCF -> MuJoCo (jaxarm matches Pinocchio on
    the same file in test_urdf.py, so this closes the triangle)."""
    try:
        files = metadata.files("example-robot-data") or []
    except metadata.PackageNotFoundError:
        pytest.skip("example-robot-data is not installed")
    paths = [f.locate() for f in files if str(f).endswith("robots/panda_description/urdf/panda.urdf")]
    if not paths:
        pytest.skip("example-robot-data has no panda.urdf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arm = load_urdf(paths[0], tip_link="panda_hand_tcp")
    model = _compare_with_mujoco(arm, 6)
    np.testing.assert_array_equal(model.dof_damping, np.full(7, 0.003))
    np.testing.assert_array_equal(model.jnt_range, np.asarray(arm.limits.position))
    np.testing.assert_array_equal(model.actuator_ctrlrange[:, 1], np.asarray(arm.limits.torque))


def test_inertia_is_not_altered():
    """fullinertia, inertiafromgeom="false", no bound/balance: MuJoCo only diagonalizes it."""
    arm = random_arm(7, "RRPRRR", "placement", payload=True)
    model = mujoco.MjModel.from_xml_string(to_mjcf(arm))
    bodies = jaxarm.body_model(arm)
    mass = np.asarray(bodies.mass)
    com = np.asarray(bodies.first_moment) / mass[:, None]
    for i in range(arm.n):
        b = i + 2  # world, base, link1, ...
        assert model.body_mass[b] == pytest.approx(mass[i], rel=1e-15)
        assert_close(model.body_ipos[b], com[i], 1e-14, f"com {i + 1}")
        R = np.zeros(9)
        mujoco.mju_quat2Mat(R, model.body_iquat[b])
        R = R.reshape(3, 3)
        I_mj = R @ np.diag(model.body_inertia[b]) @ R.T
        c = com[i]
        I_ours = np.asarray(bodies.inertia_origin[i]) - mass[i] * (c @ c * np.eye(3) - np.outer(c, c))
        assert_close(I_mj, I_ours, 1e-12, f"inertia {i + 1}")


def test_options_limits_and_motors():
    arm = random_arm(8, "RPRRRR", "standard", drives=True, gravity=(0.5, 0.0, -9.8))
    position = np.array([[-1.0, 2.0], [-np.inf, np.inf], [-2.5, 0.5], [-1, 1], [-1, 1], [-1, 1]])
    torque = np.array([30.0, 150.0, np.inf, 5, 5, 5])
    velocity = np.array([1.0, 2.0, 3.0, 4.0, 4.0, 4.0])
    arm = arm.replace(limits=jaxarm.Limits(position=position, velocity=velocity, torque=torque))
    with pytest.warns(UserWarning, match="asymmetric Coulomb"):
        text = to_mjcf(arm, timestep=0.002)
    assert '<compiler angle="radian" autolimits="true" inertiafromgeom="false"' in text
    assert "Velocity limits [1.0, 2.0, 3.0, 4.0, 4.0, 4.0] have no MuJoCo field" in text
    assert "Asymmetric Coulomb friction" in text
    model = mujoco.MjModel.from_xml_string(text)
    assert model.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4
    assert model.opt.timestep == 0.002
    np.testing.assert_array_equal(model.opt.gravity, [0.5, 0.0, -9.8])
    assert model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT
    hinge, slide = mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE
    np.testing.assert_array_equal(model.jnt_type, [hinge, slide, hinge, hinge, hinge, hinge])
    np.testing.assert_array_equal(model.jnt_limited, [1, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(model.jnt_range[[0, 2]], position[[0, 2]])
    np.testing.assert_array_equal(model.jnt_actfrclimited, [1, 1, 0, 1, 1, 1])
    np.testing.assert_array_equal(model.jnt_actfrcrange[:2], [[-30, 30], [-150, 150]])
    np.testing.assert_array_equal(model.actuator_ctrllimited, [1, 1, 0, 1, 1, 1])
    np.testing.assert_array_equal(model.actuator_ctrlrange[:2], [[-30, 30], [-150, 150]])
    np.testing.assert_array_equal(model.actuator_gear[:, 0], np.ones(6))
    G = np.asarray(arm.drives.gear_ratio)
    tc = np.asarray(arm.drives.coulomb_friction)
    assert_close(model.dof_frictionloss, np.abs(G) * 0.5 * (tc[:, 0] - tc[:, 1]), 1e-15, "frictionloss")
    assert_close(model.dof_armature, G**2 * arm.drives.rotor_inertia, 1e-15, "armature")
    with pytest.raises(ValueError, match="timestep: expected a positive number"):
        to_mjcf(arm, timestep=0.0)


def test_save_mjcf_is_atomic(tmp_path, monkeypatch):
    arm = random_arm(9, "RRPRRR", "modified")
    path = tmp_path / "arm.xml"
    path.write_text("old")
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        save_mjcf(arm, path)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["arm.xml"]
    monkeypatch.undo()
    save_mjcf(arm, path, timestep=0.005)
    assert os.listdir(tmp_path) == ["arm.xml"]
    model = mujoco.MjModel.from_xml_path(str(path))
    assert model.opt.timestep == 0.005 and model.nv == 6
