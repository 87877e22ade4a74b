"""jaxarm against MuJoCo, an independent rigid-body simulator.

The MJCF is written here by hand from the arm's placements (not with jaxarm.to_mjcf): one body per
joint at ``pos``/``quat`` = the joint's xyz/rpy in the parent link frame, a hinge about the joint
axis through the body origin, and ``<inertial pos mass fullinertia>`` = the link's COM and inertia
about the COM in the link frame. No geoms, contacts disabled, no damping or armature. MuJoCo's
"RK4" integrator is the classical fourth-order Runge-Kutta, so jaxarm's rk4 must reproduce its
trajectory to rounding; jaxarm's rk3 differs by its own O(dt^3) error.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxarm
from jaxarm import spatial
from tests.helpers_sim import free_motion, sim_arm

mujoco = pytest.importorskip("mujoco")

DT = 1e-3
ARM_SEEDS = (1, 6)


def num(x):
    return " ".join(f"{float(v):.17g}" for v in np.ravel(x))


def to_mjcf(arm: jaxarm.Arm, timestep: float) -> str:
    kin, links = arm.kinematics, arm.links
    assert arm.convention == "placement" and all(arm.is_revolute)
    body = ""
    for i in reversed(range(arm.n)):
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, np.asarray(spatial.rpy_to_matrix(np.asarray(kin.rpy[i]))).ravel())
        I = np.asarray(links.inertia[i])
        full = [I[0, 0], I[1, 1], I[2, 2], I[0, 1], I[0, 2], I[1, 2]]  # MuJoCo's order: xx yy zz xy xz yz
        body = (
            f'<body name="link{i + 1}" pos="{num(kin.xyz[i])}" quat="{num(quat)}">'
            f'<joint name="joint{i + 1}" type="hinge" pos="0 0 0" axis="{num(kin.axis[i])}" damping="0" armature="0"/>'
            f'<inertial pos="{num(links.com[i])}" mass="{num(links.mass[i])}" fullinertia="{num(full)}"/>'
            f"{body}</body>"
        )
    return f"""
<mujoco model="{arm.name}">
  <compiler angle="radian" inertiafromgeom="false"/>
  <option timestep="{timestep!r}" integrator="RK4" gravity="{num(arm.gravity)}">
    <flag contact="disable"/>
  </option>
  <worldbody>{body}</worldbody>
</mujoco>"""


@pytest.fixture(scope="module", params=ARM_SEEDS)
def model(request):
    arm = sim_arm(request.param)
    m = mujoco.MjModel.from_xml_string(to_mjcf(arm.replace(name=f"arm{request.param}"), DT))
    return arm, m, f"arm {request.param}"


@jax.jit
def jaxarm_terms(arm, q, qd):
    return jaxarm.mass_matrix(arm, q), jaxarm.bias_forces(arm, q, qd)


def test_mjcf_is_the_same_arm(model):
    arm, m, label = model
    assert m.nq == m.nv == 3 and m.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4
    np.testing.assert_allclose(m.body_mass[1:], arm.links.mass, rtol=1e-15)
    np.testing.assert_allclose(m.opt.gravity, arm.gravity)


def test_mass_matrix_and_bias_match_mujoco(model):
    arm, m, label = model
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(4):
        q, qd = rng.uniform(-np.pi, np.pi, 3), rng.uniform(-2.0, 2.0, 3)
        d.qpos[:], d.qvel[:] = q, qd
        mujoco.mj_forward(m, d)
        M_mj = np.zeros((3, 3))
        mujoco.mj_fullM(m, d, M_mj)
        M, b = (np.asarray(x) for x in jaxarm_terms(arm, q, qd))
        np.testing.assert_allclose(M, M_mj, rtol=0, atol=1e-9 * max(1.0, np.abs(M_mj).max()))
        np.testing.assert_allclose(b, d.qfrc_bias, rtol=0, atol=1e-9 * max(1.0, np.abs(d.qfrc_bias).max()))
        worst = max(worst, np.abs(M - M_mj).max(), np.abs(b - d.qfrc_bias).max())
    print(f"{label}: max |M - M_mujoco|, |bias - qfrc_bias| = {worst:.1e}")


def mujoco_free_motion(m, q0, qd0, steps):
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:] = q0, qd0
    qs = [d.qpos.copy()]
    for _ in range(steps):
        mujoco.mj_step(m, d)
        qs.append(d.qpos.copy())
    return np.array(qs)


def test_free_motion_under_gravity_matches_mujoco_rk4(model):
    arm, m, label = model
    q0, qd0 = np.array([0.3, -0.5, 0.8]), np.array([0.5, -0.3, 0.2])
    q_mj = mujoco_free_motion(m, q0, qd0, 1000)  # 1 s
    q_rk4 = free_motion(arm, q0, qd0, DT, 20, "rk4")[0]
    q_rk3 = free_motion(arm, q0, qd0, DT, 20, "rk3")[0]
    err4 = np.max(np.abs(q_rk4 - q_mj))
    err3 = np.max(np.abs(q_rk3 - q_mj))
    print(f"{label}: 1 s of free motion, max |q - q_mujoco|: rk4 {err4:.2e}, rk3 {err3:.2e} "
          f"(joint travel {np.ptp(q_mj, axis=0).round(2)})")
    assert np.ptp(q_mj, axis=0).max() > 0.5  # the arm really moves
    assert err4 < 1e-9  # (the brief's bound was 1e-6; both are the classical RK4 of the same ODE)
    assert err3 < 1e-4
    assert err3 > 10 * err4  # rk3 differs by its own truncation error, rk4 only by rounding
