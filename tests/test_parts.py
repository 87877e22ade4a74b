"""Parts Database (Swartz): primitives against closed forms, against direct integration of
Ch.10 eq. 10.8 over sampled points, and combine() against splitting a solid into pieces."""

import numpy as np
import pytest

from jaxarm import parts
from jaxarm.parts import (
    Inertial,
    box,
    combine,
    hollow_cylinder,
    link_from_parts,
    part_from_dict,
    place,
    semi_cylinder,
    solid_cylinder,
    sphere,
    triangular_prism,
)
from jaxarm.spatial import rpy_to_matrix


def assert_same(a: Inertial, b: Inertial, rtol=1e-12):
    scale = max(np.abs(a.inertia).max(), np.abs(b.inertia).max(), 1e-300)
    assert a.mass == pytest.approx(b.mass, rel=rtol)
    np.testing.assert_allclose(a.com, b.com, rtol=0, atol=rtol * max(1.0, np.abs(a.com).max()))
    np.testing.assert_allclose(a.inertia, b.inertia, rtol=0, atol=rtol * scale)


# ---------------------------------------------------------------------------------------------
# Closed forms


def test_box_craig_example_6_1():
    m, l, w, h = 2.5, 0.3, 0.2, 0.7
    b = box(l, w, h, mass=m)
    np.testing.assert_allclose(b.com, 0.0)
    expected = m / 12 * np.diag([w**2 + h**2, l**2 + h**2, l**2 + w**2])
    np.testing.assert_allclose(b.inertia, expected, rtol=1e-14)


def test_unit_cube_about_centre_and_corner_errata_oracle():
    # Ch.10 Example 10.1 / 10.2; ERRATA oracle: centre diag(1/6), corner (11/12) 1 - (1/4) ones.
    cube = box(1, 1, 1, mass=1, xyz=(0.5, 0.5, 0.5))
    np.testing.assert_allclose(cube.com, [0.5, 0.5, 0.5])
    np.testing.assert_allclose(cube.inertia, np.eye(3) / 6, atol=1e-15)
    corner = cube.inertia_about((0, 0, 0))
    np.testing.assert_allclose(corner, 11 / 12 * np.eye(3) - 0.25 * np.ones((3, 3)), atol=1e-15)
    np.testing.assert_allclose(np.diag(corner), [2 / 3] * 3, atol=1e-15)  # Ch.10 eq. 10.14
    assert corner[0, 1] == pytest.approx(-0.25)


def test_solid_cylinder_closed_form_and_density():
    r, L, rho = 0.05, 0.4, 2700.0
    c = solid_cylinder(r, L, density=rho)
    m = rho * np.pi * r**2 * L
    assert c.mass == pytest.approx(m, rel=1e-14)
    np.testing.assert_allclose(c.inertia, np.diag([m * (3 * r**2 + L**2) / 12] * 2 + [m * r**2 / 2]), rtol=1e-14)


def test_hollow_cylinder_closed_form_and_as_difference_of_solids():
    ro, ri, L, rho = 0.06, 0.045, 0.3, 7800.0
    tube = hollow_cylinder(ro, ri, L, density=rho)
    m = rho * np.pi * (ro**2 - ri**2) * L
    assert tube.mass == pytest.approx(m, rel=1e-14)
    izz = m * (ro**2 + ri**2) / 2
    ixx = m * (3 * (ro**2 + ri**2) + L**2) / 12
    np.testing.assert_allclose(tube.inertia, np.diag([ixx, ixx, izz]), rtol=1e-14)
    # Independent check: tube + the core it lacks = the solid cylinder.
    core = solid_cylinder(ri, L, density=rho)
    assert_same(combine([tube, core]), solid_cylinder(ro, L, density=rho))


def test_sphere():
    s = sphere(0.1, mass=3.0, xyz=(1, 2, 3), rpy=(0.3, 0.2, 0.1))
    np.testing.assert_allclose(s.com, [1, 2, 3])
    np.testing.assert_allclose(s.inertia, np.eye(3) * 0.4 * 3.0 * 0.01, rtol=0, atol=1e-16)
    assert sphere(0.1, density=1000.0).mass == pytest.approx(1000 * 4 / 3 * np.pi * 1e-3)


def test_semi_cylinder_com_offset_and_inertia():
    r, L, m = 0.08, 0.25, 1.7
    half = semi_cylinder(r, L, mass=m)
    d = 4 * r / (3 * np.pi)
    np.testing.assert_allclose(half.com, [d, 0, 0], atol=1e-16)
    # About the axis point, the half has the full cylinder's per-unit-mass moments.
    full_per_mass = np.diag([(3 * r**2 + L**2) / 12] * 2 + [r**2 / 2])
    np.testing.assert_allclose(half.inertia_about((0, 0, 0)), m * full_per_mass, rtol=1e-14)
    np.testing.assert_allclose(
        half.inertia, m * np.diag([r**2 / 4 + L**2 / 12, r**2 / 4 + L**2 / 12 - d**2, r**2 / 2 - d**2]), rtol=1e-14
    )
    assert semi_cylinder(r, L, density=2.0).mass == pytest.approx(2.0 * np.pi * r**2 * L / 2)


def test_two_semi_cylinders_make_the_cylinder():
    r, L, rho = 0.08, 0.25, 2700.0
    a = semi_cylinder(r, L, density=rho)
    b = semi_cylinder(r, L, density=rho, rpy=(0, 0, np.pi))  # the x <= 0 half
    assert_same(combine([a, b]), solid_cylinder(r, L, density=rho))


def _prism_by_quadrature(a, b, L, m):
    """Ch.10 eq. 10.8 by Gauss-Legendre on the triangle (collapsed coordinates x = a u,
    y = b (1 - u) v, Jacobian a b (1 - u)); exact for these polynomials. Returns COM and I_c."""
    t, w = np.polynomial.legendre.leggauss(8)
    t, w = (t + 1) / 2, w / 2  # on [0, 1]
    U, V, Z = np.meshgrid(t, t, t, indexing="ij")
    W = w[:, None, None] * w[None, :, None] * w[None, None, :] * a * b * (1 - U) * L
    pts = np.stack([a * U, b * (1 - U) * V, L * Z], axis=-1).reshape(-1, 3)
    W = W.reshape(-1)
    rho = m / W.sum()
    com = (W[:, None] * pts).sum(0) / W.sum()
    d = pts - com
    second = rho * (W[:, None, None] * d[:, :, None] * d[:, None, :]).sum(0)  # integral d d^T dm
    return W.sum(), com, np.trace(second) * np.eye(3) - second


def test_triangular_prism_by_quadrature_and_sign_of_product():
    a, b, L, m = 0.3, 0.5, 0.2, 2.0
    p = triangular_prism(a, b, L, mass=m)
    volume, com, inertia = _prism_by_quadrature(a, b, L, m)
    assert volume == pytest.approx(a * b * L / 2, rel=1e-13)
    np.testing.assert_allclose(p.com, com, rtol=1e-13)
    np.testing.assert_allclose(p.com, [a / 3, b / 3, L / 2], rtol=1e-14)
    np.testing.assert_allclose(p.inertia, inertia, rtol=0, atol=1e-13 * np.abs(inertia).max())
    # the tensor holds minus the product integral: the centred product integral is -m a b / 36
    assert p.inertia[0, 1] == pytest.approx(+m * a * b / 36, rel=1e-13)
    assert p.inertia[0, 1] > 0
    assert p.inertia[0, 2] == 0 and p.inertia[1, 2] == 0


# ---------------------------------------------------------------------------------------------
# Every primitive against a Monte Carlo integration of Ch.10 eq. 10.8, at a random pose: checks
# each documented own-frame (where the origin is, which half, which axis) and the placement.


def _sample(shape, dims, n, rng):
    """Points uniform in the solid, in its documented own frame."""
    if shape == "box":
        x, y, z = dims
        return (rng.random((n, 3)) - 0.5) * np.array([x, y, z])
    if shape == "sphere":
        (r,) = dims
        p = (rng.random((2 * n, 3)) * 2 - 1) * r
        return p[(p**2).sum(1) <= r**2]
    if shape == "triangular_prism":
        a, b, L = dims
        u = rng.random((n, 3))
        flip = u[:, 0] + u[:, 1] > 1  # fold the unit square onto the triangle u + v <= 1
        u[flip, :2] = 1 - u[flip, :2]
        return u * np.array([a, b, L])
    r_out, r_in, L = {
        "cylinder": lambda r, L: (r, 0.0, L),
        "hollow_cylinder": lambda ro, ri, L: (ro, ri, L),
        "semi_cylinder": lambda r, L: (r, 0.0, L),
    }[shape](*dims)
    p = (rng.random((2 * n, 3)) - 0.5) * np.array([2 * r_out, 2 * r_out, L])
    rho2 = p[:, 0] ** 2 + p[:, 1] ** 2
    keep = (rho2 <= r_out**2) & (rho2 >= r_in**2)
    if shape == "semi_cylinder":
        keep &= p[:, 0] >= 0
    return p[keep]


CASES = [
    ("cylinder", (0.05, 0.3)),
    ("hollow_cylinder", (0.06, 0.03, 0.2)),
    ("semi_cylinder", (0.08, 0.15)),
    ("box", (0.1, 0.2, 0.05)),
    ("sphere", (0.07,)),
    ("triangular_prism", (0.2, 0.1, 0.15)),
]
CONSTRUCTORS = {
    "cylinder": solid_cylinder,
    "hollow_cylinder": hollow_cylinder,
    "semi_cylinder": semi_cylinder,
    "box": box,
    "sphere": sphere,
    "triangular_prism": triangular_prism,
}


@pytest.mark.parametrize("shape,dims", CASES)
def test_primitive_matches_sampled_integral_at_a_pose(shape, dims):
    rng = np.random.default_rng(sum(map(ord, shape)))  # stable across runs
    xyz, rpy, m = rng.normal(size=3) * 0.3, rng.uniform(-np.pi, np.pi, 3), 1.3
    part = CONSTRUCTORS[shape](*dims, mass=m, xyz=xyz, rpy=rpy)

    local = _sample(shape, dims, 300_000, rng)
    pts = xyz + local @ rpy_to_matrix(rpy).T  # link-frame points
    com = pts.mean(0)
    d = pts - com
    second = m * (d[:, :, None] * d[:, None, :]).mean(0)
    inertia = np.trace(second) * np.eye(3) - second  # Ch.10 eq. 10.8
    size = max(dims)
    np.testing.assert_allclose(part.com, com, rtol=0, atol=5e-3 * size)
    np.testing.assert_allclose(part.inertia, inertia, rtol=0, atol=1.5e-2 * np.abs(inertia).max())


def test_sampled_integral_detects_a_wrong_product_sign():
    """The Monte Carlo check above is sharp enough to catch Ixy = -m a b / 36."""
    a, b, L, m = 0.2, 0.1, 0.15, 1.3
    rng = np.random.default_rng(0)
    d = _sample("triangular_prism", (a, b, L), 300_000, rng)
    d = d - d.mean(0)
    ixy = -m * (d[:, 0] * d[:, 1]).mean()
    assert ixy == pytest.approx(m * a * b / 36, rel=1e-2)
    assert abs(ixy - (-m * a * b / 36)) > 50 * abs(ixy - m * a * b / 36)


# ---------------------------------------------------------------------------------------------
# Placement and combine()


def test_rotated_part_is_R_I_RT():
    rng = np.random.default_rng(1)
    xyz, rpy = rng.normal(size=3), rng.uniform(-np.pi, np.pi, 3)
    local = triangular_prism(0.3, 0.2, 0.1, mass=2.0)
    placed = triangular_prism(0.3, 0.2, 0.1, mass=2.0, xyz=xyz, rpy=rpy)
    R = rpy_to_matrix(rpy)
    np.testing.assert_allclose(placed.com, xyz + R @ local.com, rtol=1e-14)
    np.testing.assert_allclose(placed.inertia, R @ local.inertia @ R.T, atol=1e-15)
    assert_same(place(local, xyz, rpy), placed)


def test_cylinder_pitched_a_quarter_turn_lies_along_x():
    r, L, m = 0.05, 0.5, 1.0
    c = solid_cylinder(r, L, mass=m, rpy=(0, np.pi / 2, 0))
    np.testing.assert_allclose(np.diag(c.inertia), [m * r**2 / 2] + [m * (3 * r**2 + L**2) / 12] * 2, rtol=1e-12)


def test_two_half_boxes_make_the_box():
    x, y, z, m = 0.4, 0.2, 0.1, 3.0
    halves = [box(x / 2, y, z, mass=m / 2, xyz=(s * x / 4, 0, 0)) for s in (-1, 1)]
    assert_same(combine(halves), box(x, y, z, mass=m))
    # and the same shifted and turned in the link frame
    xyz, rpy = (0.1, -0.2, 0.3), (0.4, -0.5, 0.6)
    R = rpy_to_matrix(np.array(rpy))
    halves = [box(x / 2, y, z, mass=m / 2, xyz=xyz + R @ [s * x / 4, 0, 0], rpy=rpy) for s in (-1, 1)]
    assert_same(combine(halves), box(x, y, z, mass=m, xyz=xyz, rpy=rpy))


def test_stacked_half_cylinders_make_the_cylinder():
    r, L, rho = 0.04, 0.6, 2700.0
    halves = [solid_cylinder(r, L / 2, density=rho, xyz=(0, 0, s * L / 4)) for s in (-1, 1)]
    assert_same(combine(halves), solid_cylinder(r, L, density=rho))


def test_combine_unequal_parts_mass_and_com():
    a = sphere(0.1, mass=1.0, xyz=(0, 0, 0))
    b = sphere(0.1, mass=3.0, xyz=(1, 0, 0))
    ab = combine([a, b])
    assert ab.mass == 4.0
    np.testing.assert_allclose(ab.com, [0.75, 0, 0])
    # two balls on the x-axis: Ixx only from the balls, Iyy = Izz gain m1 m2 / (m1 + m2) * 1^2
    i_ball = 0.4 * 0.01
    np.testing.assert_allclose(ab.inertia, np.diag([4 * i_ball, 4 * i_ball + 0.75, 4 * i_ball + 0.75]), atol=1e-15)


def test_combine_of_one_part_is_that_part_and_empty_is_an_error():
    p = triangular_prism(0.3, 0.2, 0.1, mass=2.0, xyz=(1, 2, 3), rpy=(0.1, 0.2, 0.3))
    assert_same(combine([p]), p)
    with pytest.raises(ValueError, match="inertials"):
        combine([])


@pytest.mark.parametrize("shape,dims", CASES)
def test_mass_and_density_agree(shape, dims):
    by_density = CONSTRUCTORS[shape](*dims, density=1234.0, xyz=(0.1, 0, 0), rpy=(0, 0.2, 0))
    by_mass = CONSTRUCTORS[shape](*dims, mass=by_density.mass, xyz=(0.1, 0, 0), rpy=(0, 0.2, 0))
    assert by_density.mass > 0
    assert_same(by_density, by_mass)


def test_inertial_is_frozen_and_read_only():
    p = box(1, 1, 1, mass=1)
    with pytest.raises(Exception):
        p.mass = 2.0
    with pytest.raises(ValueError):
        p.inertia[0, 0] = 5.0


# ---------------------------------------------------------------------------------------------
# Arm-file tables

TABLES = {
    "cylinder": {"radius": 0.05, "length": 0.3},
    "hollow_cylinder": {"outer_radius": 0.06, "inner_radius": 0.03, "length": 0.2},
    "semi_cylinder": {"radius": 0.08, "length": 0.15},
    "box": {"x": 0.1, "y": 0.2, "z": 0.05},
    "sphere": {"radius": 0.07},
    "triangular_prism": {"a": 0.2, "b": 0.1, "length": 0.15},
}


@pytest.mark.parametrize("shape,dims", CASES)
def test_part_from_dict_matches_constructor(shape, dims):
    d = {"shape": shape, **TABLES[shape], "density": 2700, "xyz": [0.1, 0.2, 0.3], "rpy": [0.3, -0.2, 0.1]}
    assert tuple(TABLES[shape].values()) == dims
    assert_same(part_from_dict(d, "here"), CONSTRUCTORS[shape](*dims, density=2700, xyz=d["xyz"], rpy=d["rpy"]))


def test_link_from_parts_is_combine_of_parts():
    tables = [
        {"shape": "cylinder", "radius": 0.05, "length": 0.3, "mass": 2.0, "xyz": [0, 0, 0.15]},
        {"shape": "box", "x": 0.1, "y": 0.1, "z": 0.1, "density": 2700, "rpy": [0, 0, 0.3]},
        {"shape": "sphere", "radius": 0.04, "mass": 0.5, "xyz": [0.2, 0, 0]},
    ]
    link = link_from_parts(tables, "arm")
    assert_same(link, combine([part_from_dict(t, "arm") for t in tables]))
    assert link.mass == pytest.approx(2.0 + 2.7 + 0.5)


WHERE = "arms/x.toml: joint 3: parts[1]"
GOOD = {"shape": "cylinder", "radius": 0.05, "length": 0.3, "mass": 1.0}


def _error(d, where=WHERE) -> str:
    with pytest.raises(ValueError) as info:
        part_from_dict(d, where)
    msg = str(info.value)
    assert msg.startswith(where + ": ")
    assert "\n" not in msg
    return msg


def test_good_table_is_accepted():
    assert part_from_dict(GOOD, WHERE).mass == 1.0


def test_error_unknown_shape_lists_known_shapes():
    msg = _error({**GOOD, "shape": "cone"})
    assert "shape" in msg and "'cone'" in msg
    for name in parts.SHAPES:
        assert name in msg


def test_error_missing_shape():
    d = dict(GOOD)
    del d["shape"]
    msg = _error(d)
    assert "shape: missing" in msg and "box" in msg


def test_error_unknown_key():
    msg = _error({**GOOD, "radiuss": 0.1})
    assert "radiuss" in msg and "unknown key" in msg and "radius" in msg


def test_error_key_of_another_shape():
    msg = _error({**GOOD, "x": 0.1})
    assert "x: unknown key for shape 'cylinder'" in msg


def test_error_missing_dimension():
    d = dict(GOOD)
    del d["length"]
    msg = _error(d)
    assert "length: missing dimension" in msg and "radius, length" in msg


@pytest.mark.parametrize("value", [0, -0.1])
def test_error_non_positive_dimension(value):
    msg = _error({**GOOD, "radius": value})
    assert "radius: expected a positive number" in msg and f"got {value:g}" in msg


@pytest.mark.parametrize("value", ["5cm", True, None, float("nan"), [0.1]])
def test_error_dimension_not_a_number(value):
    msg = _error({**GOOD, "length": value})
    assert "length: expected a positive number" in msg


@pytest.mark.parametrize("inner", [0.06, 0.07])
def test_error_inner_radius_not_below_outer(inner):
    d = {"shape": "hollow_cylinder", "outer_radius": 0.06, "inner_radius": inner, "length": 0.2, "mass": 1.0}
    msg = _error(d)
    assert "inner_radius" in msg and "outer_radius = 0.06" in msg and f"got {inner:g}" in msg


def test_error_both_mass_and_density():
    msg = _error({**GOOD, "density": 2700})
    assert "mass" in msg and "density" in msg and "both" in msg


def test_error_neither_mass_nor_density():
    d = dict(GOOD)
    del d["mass"]
    msg = _error(d)
    assert "mass" in msg and "density" in msg and "neither" in msg


def test_error_negative_mass():
    msg = _error({**GOOD, "mass": -1.0})
    assert "mass: expected a non-negative number" in msg and "got -1" in msg


def test_error_negative_density():
    d = dict(GOOD)
    del d["mass"]
    msg = _error({**d, "density": -2700})
    assert "density: expected a non-negative number" in msg and "got -2700" in msg


@pytest.mark.parametrize("field", ["xyz", "rpy"])
@pytest.mark.parametrize("value", [[0, 0], [0, 0, 0, 0], "abc", 1.0])
def test_error_wrong_length_pose(field, value):
    msg = _error({**GOOD, field: value})
    assert f"{field}: expected a list of 3 numbers" in msg


def test_error_pose_element_not_a_number():
    msg = _error({**GOOD, "rpy": [0, "a", 0]})
    assert "rpy[1]: expected a number" in msg


def test_error_not_a_table():
    _error(["cylinder", 0.1])


def test_constructor_errors_name_the_constructor_and_field():
    with pytest.raises(ValueError, match=r"^solid_cylinder: radius: expected a positive number"):
        solid_cylinder(-1.0, 1.0, mass=1.0)
    with pytest.raises(ValueError, match=r"^box: mass/density: .* got both"):
        box(1, 1, 1, mass=1.0, density=1.0)
    with pytest.raises(ValueError, match=r"^hollow_cylinder: inner_radius"):
        hollow_cylinder(0.1, 0.2, 1.0, mass=1.0)


def test_link_from_parts_errors_name_the_part_index():
    bad = [GOOD, {**GOOD, "radius": -1}]
    with pytest.raises(ValueError, match=r"^arms/x.toml: joint 3: parts\[1\]: radius"):
        link_from_parts(bad, "arms/x.toml: joint 3")
    for empty in ([], {}, "cylinder"):
        with pytest.raises(ValueError, match=r"^arms/x.toml: joint 3: parts: expected a non-empty list"):
            link_from_parts(empty, "arms/x.toml: joint 3")
