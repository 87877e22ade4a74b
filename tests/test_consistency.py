"""Physical consistency checks: real bodies pass, each kind of violation fails with its own flag
and a sentence giving the numbers, and tolerances scale with the link."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm.consistency import LinkConsistency, check_link, pseudo_inertia
from jaxarm.parts import box, combine, place, semi_cylinder, solid_cylinder, sphere, triangular_prism
from jaxarm.spatial import rpy_to_matrix

FLAGS = ("mass_positive", "inertia_symmetric", "inertia_psd", "triangle_inequalities", "pseudo_inertia_psd")


def failed(r: LinkConsistency) -> set:
    return {f for f in FLAGS if not getattr(r, f)}


def random_rotation(rng):
    return rpy_to_matrix(rng.uniform(-np.pi, np.pi, 3))


def random_real_link(rng, length=1.0, density=1000.0):
    """A link built from random solid parts: physically consistent by construction."""
    makers = [
        lambda: box(*rng.uniform(0.1, 1, 3) * length, density=density),
        lambda: solid_cylinder(*rng.uniform(0.05, 1, 2) * length, density=density),
        lambda: semi_cylinder(*rng.uniform(0.05, 1, 2) * length, density=density),
        lambda: triangular_prism(*rng.uniform(0.05, 1, 3) * length, density=density),
        lambda: sphere(rng.uniform(0.05, 0.5) * length, density=density),
    ]
    pieces = [makers[rng.integers(len(makers))]() for _ in range(rng.integers(1, 4))]
    placed = [place(p, rng.normal(size=3) * length, rng.uniform(-np.pi, np.pi, 3)) for p in pieces]
    return combine(placed)


# ---------------------------------------------------------------------------------------------
# pseudo_inertia


def test_pseudo_inertia_is_the_second_moment_of_homogeneous_points():
    """J = sum_k m_k [p_k; 1][p_k; 1]^T for point masses (its definition as an integral)."""
    rng = np.random.default_rng(0)
    p, w = rng.normal(size=(7, 3)), rng.uniform(0.1, 2.0, 7)
    m = w.sum()
    c = (w[:, None] * p).sum(0) / m
    d = p - c
    second = (w[:, None, None] * d[:, :, None] * d[:, None, :]).sum(0)
    inertia_c = np.trace(second) * np.eye(3) - second
    ph = np.concatenate([p, np.ones((7, 1))], axis=1)
    expected = (w[:, None, None] * ph[:, :, None] * ph[:, None, :]).sum(0)
    np.testing.assert_allclose(pseudo_inertia(m, c, inertia_c), expected, atol=1e-12)


def test_pseudo_inertia_under_jax_jit_and_grad():
    rng = np.random.default_rng(1)
    link = random_real_link(rng)
    J_np = pseudo_inertia(link.mass, link.com, link.inertia)
    assert isinstance(J_np, np.ndarray)
    J_jax = jax.jit(pseudo_inertia)(jnp.asarray(link.mass), jnp.asarray(link.com), jnp.asarray(link.inertia))
    np.testing.assert_allclose(np.asarray(J_jax), J_np, rtol=1e-12)
    # d J[3, 3] / dm = 1 and d J[0:3, 3] / dm = c
    g = jax.jacfwd(pseudo_inertia)(jnp.asarray(2.0), jnp.asarray(link.com), jnp.asarray(link.inertia))
    np.testing.assert_allclose(np.asarray(g[:3, 3]), link.com, rtol=1e-12)
    assert float(g[3, 3]) == 1.0


# ---------------------------------------------------------------------------------------------
# Real bodies pass


@pytest.mark.parametrize("seed", range(20))
def test_random_real_links_pass(seed):
    rng = np.random.default_rng(seed)
    length = 10.0 ** rng.uniform(-3, 1)  # millimetre parts to 10 m beams
    link = random_real_link(rng, length=length, density=10.0 ** rng.uniform(1, 4))
    r = check_link(link.mass, link.com, link.inertia)
    assert r.ok, r.problems
    assert r.problems == ()


def test_point_mass_away_from_origin_passes():
    # I_c = 0: J = m [c; 1][c; 1]^T is rank one, on the boundary of the PSD cone
    r = check_link(2.0, [0.3, -1.2, 0.7], np.zeros((3, 3)))
    assert r.ok, r.problems
    assert np.linalg.matrix_rank(pseudo_inertia(2.0, np.array([0.3, -1.2, 0.7]), np.zeros((3, 3)))) == 1


@pytest.mark.parametrize("seed", range(5))
def test_thin_rod_and_flat_plate_on_the_boundary_pass(seed):
    rng = np.random.default_rng(seed)
    R, c, m = random_rotation(rng), rng.normal(size=3), 1.5
    rod = m * 0.8**2 / 12 * np.diag([1.0, 1.0, 0.0])  # I1 + I3 = I2 exactly
    plate = m / 12 * np.diag([0.3**2, 0.5**2, 0.3**2 + 0.5**2])  # I1 + I2 = I3 exactly
    for inertia in (rod, plate):
        r = check_link(m, c, R @ inertia @ R.T)
        assert r.ok, r.problems


@pytest.mark.parametrize("seed", range(5))
def test_just_beyond_the_thin_rod_fails(seed):
    rng = np.random.default_rng(seed)
    R, c, m = random_rotation(rng), rng.normal(size=3), 1.5
    bad = m * 0.8**2 / 12 * np.diag([1.0, 1.0 + 1e-6, 0.0])
    r = check_link(m, c, R @ bad @ R.T)
    assert failed(r) == {"triangle_inequalities", "pseudo_inertia_psd"}, r.problems


def test_zero_mass_zero_inertia_is_only_not_massive():
    r = check_link(0.0, np.zeros(3), np.zeros((3, 3)))
    assert failed(r) == {"mass_positive"}
    assert r.problems == ("mass 0 is not positive",)
    assert not r.ok


# ---------------------------------------------------------------------------------------------
# Each violation fails with its own flag


def test_negative_mass():
    r = check_link(-1.0, [0.1, 0, 0], np.eye(3) * 0.01)
    assert failed(r) == {"mass_positive", "pseudo_inertia_psd"}
    assert any("mass -1 is not positive" in p for p in r.problems)


def test_negative_eigenvalue():
    R = random_rotation(np.random.default_rng(3))
    r = check_link(1.0, np.zeros(3), R @ np.diag([-0.01, 0.2, 0.2]) @ R.T)
    # I_c not PSD implies a triangle inequality fails too (2 I1 = (I1 + I2 - I3) + (I1 + I3 - I2))
    assert failed(r) == {"inertia_psd", "triangle_inequalities", "pseudo_inertia_psd"}
    (msg,) = [p for p in r.problems if "not positive semidefinite: principal moments" in p]
    assert "(-0.01, 0.2, 0.2)" in msg


def test_triangle_violation_message():
    r = check_link(1.0, [0.0, 0.1, 0.0], np.diag([0.1, 0.2, 0.5]))
    assert failed(r) == {"triangle_inequalities", "pseudo_inertia_psd"}
    assert "principal moments (0.1, 0.2, 0.5) violate the triangle inequality 0.1 + 0.2 >= 0.5" in r.problems
    assert any(p.startswith("pseudo-inertia") for p in r.problems)
    assert len(r.problems) == 2


def test_non_symmetric_inertia():
    inertia = np.eye(3) * 0.5
    inertia[0, 1] = 0.1
    r = check_link(1.0, np.zeros(3), inertia)
    assert failed(r) == {"inertia_symmetric"}
    assert r.problems == ("inertia is not symmetric: I[0,1] = 0.1 but I[1,0] = 0",)


def test_puma_560_link_3_consensus_inertia_violates_the_triangle_inequality():
    # mass 4.8, I_c = diag(0.066, 0.086, 0.0125): 0.066 + 0.0125 = 0.0785 < 0.086
    r = check_link(4.8, [-0.0203, -0.0141, 0.070], np.diag([0.066, 0.086, 0.0125]))
    assert r.mass_positive and r.inertia_symmetric and r.inertia_psd
    assert failed(r) == {"triangle_inequalities", "pseudo_inertia_psd"}
    assert "0.0125 + 0.066 >= 0.086" in r.problems[0]


# ---------------------------------------------------------------------------------------------
# pseudo-inertia PSD <=> (m > 0 and) the triangle inequalities; tolerances are relative


def test_pseudo_inertia_psd_iff_triangle_inequalities_and_eig_of_J():
    """check_link's verdict on J agrees with the triangle inequalities on the principal moments and
    with the eigenvalues of pseudo_inertia() itself, on both sides of the boundary."""
    rng = np.random.default_rng(7)
    counts = {True: 0, False: 0}
    for _ in range(400):
        m, length = 10.0 ** rng.uniform(-3, 3), 10.0 ** rng.uniform(-3, 1)
        moments = rng.uniform(0.0, 1.0, 3) * m * length**2
        s = np.sort(moments)
        if abs(s[0] + s[1] - s[2]) < 1e-3 * s[2]:
            continue  # too close to the boundary for eig(J) to give an unambiguous sign
        expected = bool(s[0] + s[1] >= s[2])
        R, c = random_rotation(rng), rng.normal(size=3) * length
        inertia = R @ np.diag(moments) @ R.T
        r = check_link(m, c, inertia)
        J = pseudo_inertia(m, c, inertia)
        eig_J = np.linalg.eigvalsh(J)
        assert (eig_J[0] >= 0) == expected
        assert r.triangle_inequalities == expected
        assert r.pseudo_inertia_psd == expected
        assert r.inertia_psd
        counts[expected] += 1
    assert counts[True] > 100 and counts[False] > 100  # both sides of the boundary were exercised


@pytest.mark.parametrize("mass_scale,length_scale", [(1e-3, 1e-3), (1.0, 1.0), (1e3, 10.0)])
def test_tolerances_are_relative(mass_scale, length_scale):
    m = 2.0 * mass_scale
    c = np.array([0.3, -0.2, 0.5]) * length_scale
    unit = np.diag([1.0, 1.0, 2.0])  # flat plate: on the triangle boundary
    scale = m * length_scale**2
    assert check_link(m, c, unit * scale).ok
    # a violation of 1e-6 relative is found at every scale (an absolute 1e-9 would miss it at 1 g, 1 mm)
    r = check_link(m, c, np.diag([1.0, 1.0, 2.0 + 2e-6]) * scale)
    assert failed(r) == {"triangle_inequalities", "pseudo_inertia_psd"}
    r = check_link(m, c, np.diag([-1e-6, 1.0, 1.0]) * scale)
    assert "inertia_psd" in failed(r)
    asym = unit * scale
    asym[0, 2] += 1e-6 * scale
    assert failed(check_link(m, c, asym)) == {"inertia_symmetric"}


def test_far_com_and_round_off_does_not_trip_the_pseudo_inertia():
    # A small part far from the origin: J is dominated by m c c^T, yet only round-off separates it
    # from the boundary for a point mass; rotations add round-off of order 1e-16 relative.
    rng = np.random.default_rng(11)
    for _ in range(20):
        R = random_rotation(rng)
        c = rng.normal(size=3) * 100.0
        r = check_link(0.01, c, R @ (1e-8 * np.diag([1.0, 1.0, 0.0])) @ R.T)
        assert r.ok, r.problems


def test_check_link_accepts_jax_arrays_and_rejects_bad_shapes():
    com, inertia = jnp.asarray([-0.0203, -0.0141, 0.070]), jnp.diag(jnp.asarray([0.066, 0.086, 0.0125]))
    r = check_link(jnp.asarray(4.8), com, inertia)
    assert failed(r) == {"triangle_inequalities", "pseudo_inertia_psd"}
    with pytest.raises(ValueError, match="inertia"):
        check_link(1.0, np.zeros(3), np.eye(4))
    with pytest.raises(ValueError, match="finite"):
        check_link(1.0, np.zeros(3), np.full((3, 3), np.nan))


def test_link_consistency_is_frozen():
    r = check_link(1.0, np.zeros(3), np.eye(3))
    assert r.ok
    with pytest.raises(Exception):
        r.mass_positive = False


def test_consistency_report_names_every_body_and_flags_massless_links():
    import jaxarm

    arm = jaxarm.make_arm("RRR", mass=[0.0, 2.0, 1.0], inertia=[[0, 0, 0], [0.1, 0.1, 0.3], [0.1, 0.2, 0.1]])
    report = jaxarm.consistency_report(arm)
    assert list(report) == ["joint 1", "joint 2", "joint 3"]
    assert report["joint 1"].massless and not report["joint 1"].ok
    assert report["joint 2"].ok is False and not report["joint 2"].massless  # 0.1 + 0.1 < 0.3
    assert report["joint 3"].ok
    held = jaxarm.consistency_report(arm.with_payload(1.0, inertia=[0.01, 0.01, 0.5]))
    assert list(held)[-1] == "payload" and not held["payload"].ok


def test_drive_consistency_flags_friction_that_feeds_energy_in():
    arm = jaxarm.load_arm("two_link_planar")
    report = jaxarm.consistency_report(arm, drives=True)
    assert {"drive 1", "drive 2"} <= set(report) and all(report[k].ok for k in ("drive 1", "drive 2"))
    assert "drive 1" not in jaxarm.consistency_report(arm)  # drives only when asked
    drives = dataclasses.replace(arm.drives, viscous_friction=np.array([-0.05, 0.0]),
                                 coulomb_friction=np.array([[0.1, -0.1], [-0.048, 0.2]]))
    bad = jaxarm.consistency_report(arm.replace(drives=drives), drives=True)
    assert not bad["drive 1"].ok and "viscous friction -0.05 < 0" in bad["drive 1"].problems[0]
    assert not bad["drive 2"].ok and len(bad["drive 2"].problems) == 2  # Tc+ < 0 and Tc- > 0
    assert any("Tc+ = -0.048" in p for p in bad["drive 2"].problems)
