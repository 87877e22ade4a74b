"""The bundled arm files: they load, round-trip bit-exactly, and reproduce published numbers.

Oracles:
- two-link planar arm: seeds/ERRATA.md (Craig 6.58 with point masses, checked two ways);
- RP arm: Craig Example 6.5, closed form (6.89);
- Puma 560: Peter Corke's Robotics Toolbox. Gravity load at qz = [0 37.4837 0.2489 0 0 0] as
  printed by the toolbox (quoted in jgerstmayr/EXUDYN, main/pythonDev/TestModels/serialRobotTest.py,
  "Corke toolbox: 0 37.4837 0.2489 0 0 0"); at qn, rne(), and the inertia matrix from the
  toolbox's own unit tests (petercorke/robotics-toolbox-python tests/test_DHRobot.py test_rne,
  tests/test_SerialLink.py test_gravload / test_inertia), printed to 4 decimals;
- Panda: the published physically consistent parameters must pass the consistency check.
"""

import dataclasses
import re
import warnings

import jax
import numpy as np
import pytest

import jaxarm
from jaxarm.arm_files import ArmFileError, PhysicalConsistencyWarning, load_arm, save_arm
from jaxarm.consistency import check_link

BUNDLED = ["two_link_planar", "rp_arm", "puma560", "puma560_rtb", "stanford_arm", "panda", "cmu_dd_arm"]

# Links whose published inertial parameters are physically inconsistent (joint numbers, 1-based).
INCONSISTENT = {"puma560_rtb": {1, 3}, "stanford_arm": {5}}


def load_quietly(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhysicalConsistencyWarning)
        return load_arm(name)


@pytest.fixture(scope="module")
def arms():
    return {name: load_quietly(name) for name in BUNDLED}


def test_bundled_arms_load_and_warn_exactly_where_expected():
    for name in BUNDLED:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            arm = load_arm(name)
        messages = [str(w.message) for w in record if issubclass(w.category, PhysicalConsistencyWarning)]
        assert len(messages) == (1 if name in INCONSISTENT else 0), (name, messages)  # one short warning
        warned = {int(j) for m in messages for j in re.findall(r"joint (\d+):", m)}
        assert warned == INCONSISTENT.get(name, set()), (name, messages)
        assert all(len(m) < 400 for m in messages), messages
        assert arm.name == name and arm.n >= 2


def test_consistency_warnings_agree_with_check_link(arms):
    for name, arm in arms.items():
        bad = {i + 1 for i in range(arm.n) if not check_link(arm.links.mass[i], arm.links.com[i], arm.links.inertia[i]).ok}
        bad -= {i + 1 for i in range(arm.n) if arm.links.mass[i] == 0 and not np.any(arm.links.inertia[i])}
        assert bad == INCONSISTENT.get(name, set()), name


@pytest.mark.parametrize("name", BUNDLED)
def test_round_trip_is_bit_exact(arms, tmp_path, name):
    arm = arms[name]
    path = save_arm(arm, tmp_path / f"{name}.toml")
    again = load_quietly(path)
    assert (again.name, again.convention, again.joint_types) == (arm.name, arm.convention, arm.joint_types)
    la, ta = jax.tree_util.tree_flatten(arm)
    lb, tb = jax.tree_util.tree_flatten(again)
    assert ta == tb
    for x, y in zip(la, lb):
        assert np.array_equal(np.asarray(x), np.asarray(y))
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_two_link_planar_reproduces_errata_oracle(arms):
    arm = arms["two_link_planar"]
    q, qd, qdd = np.array([0.3, -0.7]), np.array([0.5, -1.2]), np.array([1.0, 2.0])
    M = jaxarm.mass_matrix(arm, q)
    np.testing.assert_allclose(M, [[4.0148421873, 0.6324210936], [0.6324210936, 0.25]], rtol=0, atol=1e-9)
    tau = jaxarm.inverse_dynamics(arm, q, qd, qdd)
    np.testing.assert_allclose(tau, [37.9903475476, 5.5696980583], rtol=0, atol=1e-9)


def test_rp_arm_matches_craig_6_89(arms):
    arm = arms["rp_arm"]
    m1, l1, Izz1, m2, Iyy2, g = 4.0, 0.25, 0.0835, 2.0, 0.06, 9.81  # the values in arms/rp_arm.toml
    q, qd, qdd = np.array([0.4, 0.55]), np.array([0.7, -0.3]), np.array([1.3, 0.9])
    (th, d), (thd, dd) = q, qd
    M = np.diag([m1 * l1**2 + Izz1 + Iyy2 + m2 * d**2, m2])
    V = np.array([2 * m2 * d * thd * dd, -m2 * d * thd**2])
    G = np.array([(m1 * l1 + m2 * d) * g * np.cos(th), m2 * g * np.sin(th)])
    np.testing.assert_allclose(jaxarm.mass_matrix(arm, q), M, rtol=0, atol=1e-12)
    np.testing.assert_allclose(jaxarm.inverse_dynamics(arm, q, qd, qdd), M @ qdd + V + G, rtol=0, atol=1e-12)


# Puma 560 ------------------------------------------------------------------------------------

QZ = np.zeros(6)
QN = np.array([0.0, np.pi / 4, np.pi, 0.0, np.pi / 4, 0.0])


@pytest.mark.parametrize("name", ["puma560", "puma560_rtb"])
def test_puma560_gravity_load_matches_robotics_toolbox(arms, name):
    arm = arms[name]
    np.testing.assert_allclose(jaxarm.gravity_torques(arm, QZ), [0, 37.4837, 0.2489, 0, 0, 0], rtol=0, atol=1e-3)
    np.testing.assert_allclose(jaxarm.gravity_torques(arm, QN), [0, 31.6399, 6.0351, 0, 0.0283, 0], rtol=0, atol=1e-3)


def test_puma560_rne_and_inertia_match_robotics_toolbox(arms):
    """RTB's rne includes the reflected armature inertia G^2 Jm and the friction B G^2 qd + |G| Tc."""
    arm = arms["puma560_rtb"]
    z, o = np.zeros(6), np.ones(6)
    cases = [
        (z, o, arm, [3.35311, 36.0025, 7.42596, 0.190043, 0.203441, 0.194133]),
        (o, o, arm, [32.4952, 60.867, 17.7436, 1.45452, 1.29911, 0.713781]),
        (o, z, arm, [29.1421, 56.5044, 16.3528, 1.26448, 1.12392, 0.519648]),
        (o, o, arm.replace(gravity=np.zeros(3)), [32.4952, 29.2271, 11.7085, 1.45452, 1.27086, 0.713781]),
    ]
    for qd, qdd, a, expected in cases:
        np.testing.assert_allclose(jaxarm.inverse_dynamics(a, QN, qd, qdd), expected, rtol=0, atol=2e-4)
    M_rtb = [
        [3.6594, -0.4044, 0.1006, -0.0025, 0.0000, -0.0000],
        [-0.4044, 4.4137, 0.3509, 0.0000, 0.0024, 0.0000],
        [0.1006, 0.3509, 0.9378, 0.0000, 0.0015, 0.0000],
        [-0.0025, 0.0000, 0.0000, 0.1925, 0.0000, 0.0000],
        [0.0000, 0.0024, 0.0015, 0.0000, 0.1713, 0.0000],
        [-0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.1941],
    ]
    np.testing.assert_allclose(jaxarm.mass_matrix(arm, QN), M_rtb, rtol=0, atol=1e-4)


def test_puma560_consensus_inertias_are_inconsistent():
    # Link 3's principal moments (0.0125, 0.066, 0.086) break the triangle inequality; link 1 has
    # inertia but no mass. consistency.check_link agrees, so loading warns, and strict=True raises.
    assert not check_link(4.8, [-0.0203, -0.0141, 0.070], np.diag([0.066, 0.086, 0.0125])).ok
    with pytest.warns(PhysicalConsistencyWarning, match=r"puma560_rtb\.toml: physically inconsistent parameters \(joint 1: mass 0 .*; joint 3: .*triangle"):
        load_arm("puma560_rtb")
    with pytest.raises(ArmFileError, match=r"puma560_rtb\.toml: joint 1: physically inconsistent"):
        load_arm("puma560_rtb", strict=True)


def test_puma560_is_the_consensus_model_made_consistent():
    """The flagship arm loads silently (strict), and differs from the literature model only where
    that model is impossible: link 1's mass and transverse moments (which enter no joint torque:
    exact equality) and link 3's moments (the nearest consistent ones, a 0.3 % change of M)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arm = load_arm("puma560", strict=True)
    rtb = load_quietly("puma560_rtb")
    assert all(check_link(arm.links.mass[i], arm.links.com[i], arm.links.inertia[i]).ok for i in range(6))
    for field in ("kinematics", "drives", "limits", "gravity"):
        for x, y in zip(jax.tree_util.tree_leaves(getattr(arm, field)), jax.tree_util.tree_leaves(getattr(rtb, field))):
            np.testing.assert_array_equal(x, y)
    changed = [i for i in range(6) if not (np.array_equal(arm.links.mass[i], rtb.links.mass[i])
                                           and np.array_equal(arm.links.inertia[i], rtb.links.inertia[i]))]
    assert changed == [0, 2]
    # Link 3 put back to the published moments: every joint torque equals the literature model's.
    inertia = np.asarray(arm.links.inertia).copy()
    inertia[2] = np.asarray(rtb.links.inertia)[2]
    link1_only = arm.replace(links=dataclasses.replace(arm.links, inertia=jax.numpy.asarray(inertia)))
    rng = np.random.default_rng(3)
    for _ in range(5):
        q, qd, qdd = rng.uniform(-2.5, 2.5, (3, 6))
        np.testing.assert_allclose(jaxarm.inverse_dynamics(link1_only, q, qd, qdd),
                                   jaxarm.inverse_dynamics(rtb, q, qd, qdd), rtol=1e-13, atol=1e-12)
    # Link 3's projection moves M by at most 0.0026 (and does move it).
    dM = max(np.abs(np.asarray(jaxarm.mass_matrix(arm, q) - jaxarm.mass_matrix(rtb, q))).max()
             for q in rng.uniform(-2.5, 2.5, (20, 6)))
    assert 1e-4 < dM <= 0.0026 + 1e-12


def test_puma560_drive_parameters(arms):
    arm = arms["puma560"]
    np.testing.assert_array_equal(arm.drives.gear_ratio, [-62.6111, 107.815, -53.7063, 76.0364, 71.923, 76.686])
    np.testing.assert_array_equal(arm.drives.coulomb_friction[0], [0.395, -0.435])
    np.testing.assert_array_equal(arm.limits.torque, [97.6, 186.4, 89.4, 24.2, 20.1, 21.3])
    np.testing.assert_allclose(np.degrees(arm.limits.position[1]), [-45, 225])


# Panda, Stanford, CMU DD arm -----------------------------------------------------------------


def test_panda_consistent_and_gravity_finite():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PhysicalConsistencyWarning)
        arm = load_arm("panda", strict=True)
    assert arm.n == 7 and arm.convention == "modified"
    np.testing.assert_array_equal(arm.gravity, [0.0, 0.0, -9.80665])
    q = np.array([0.0, -0.3, 0.0, -2.2, 0.0, 2.0, np.pi / 4])
    tau = np.asarray(jaxarm.gravity_torques(arm, q))
    assert np.all(np.isfinite(tau)) and np.abs(tau).max() < 87.0
    # Flange at q = 0: 0.088 m out along x0 and 0.333 + 0.316 + 0.384 - 0.107 = 0.926 m up.
    np.testing.assert_allclose(jaxarm.forward_kinematics(arm, np.zeros(7))[1][:3, 3], [0.088, 0.0, 0.926], atol=1e-12)
    np.testing.assert_array_equal(arm.limits.torque, [87, 87, 87, 87, 12, 12, 12])


def test_stanford_arm_has_a_prismatic_boom(arms):
    arm = arms["stanford_arm"]
    assert arm.joint_types[2] == "prismatic" and arm.convention == "standard"
    q = np.array([0.1, -0.4, 0.5, 0.2, 0.3, -0.1])
    assert np.all(np.isfinite(np.asarray(jaxarm.gravity_torques(arm, q))))


def test_cmu_dd_arm_is_built_from_parts_and_consistent():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PhysicalConsistencyWarning)
        arm = load_arm("cmu_dd_arm", strict=True)
    assert arm.joint_types == ("revolute",) * 6
    np.testing.assert_array_equal(arm.drives.gear_ratio, np.ones(6))  # direct drive
    assert np.all(arm.links.mass > 0) and np.all(arm.drives.torque_constant > 0)
    assert np.all(arm.drives.resistance > 0) and np.all(np.isfinite(arm.drives.voltage_limit))
    # Odd joints roll, even joints pivot: at q = 0 (arm straight up) the odd axes are vertical
    # and the even axes horizontal.
    frames, tool = jaxarm.forward_kinematics(arm, np.zeros(6))
    axes = np.asarray(frames)[:6, :3, 2]  # joint i moves about z_{i-1}
    np.testing.assert_allclose(np.abs(axes[0::2, 2]), 1.0, atol=1e-12)
    np.testing.assert_allclose(axes[1::2, 2], 0.0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(tool)[:3, 3], [0.0, 0.0, 1.7], atol=1e-12)
