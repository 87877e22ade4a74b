"""The Parts Database: a link's mass, centre of mass and inertia from primitive solids.

Swartz (CMU-RI-TR-82-17, "Dynamic Description") builds each link of the CMU Direct-Drive Arm from
*sections* -- cylinders, semi-cylinders, boxes ("rectangles"), spheres and prisms -- each with a
dimension, a density and a location, and combines them with "the formulas for transforming moments
of inertia" (chapter 10.5 of his reference; here ch. 10 of seed 004). This module is that program:

* one constructor per primitive returns an :class:`Inertial` (mass, COM, inertia about the COM)
  for the solid placed at a pose ``(xyz, rpy)`` in the link frame;
* :func:`combine` sums parts with the parallel-axis theorem (Ch.10 eq. 10.13);
* :func:`part_from_dict` / :func:`link_from_parts` read the same parts from an arm file.

Conventions: the inertia tensor is ``I = integral (r.r 1 - r r^T) dm`` (Ch.10 eq. 10.8), so its
off-diagonal elements are *minus* the products of inertia. ``rpy`` is the URDF fixed-axis roll,
pitch, yaw: the part's own axes are ``R = Rz(yaw) Ry(pitch) Rx(roll)`` in the link frame, and a
point ``p`` given in the part frame is at ``xyz + R p`` in the link frame.

Everything is plain NumPy float64: this runs once when an arm file is loaded, not in jitted code.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from ..core.spatial import rpy_to_matrix

__all__ = [
    "Inertial",
    "place",
    "combine",
    "solid_cylinder",
    "hollow_cylinder",
    "semi_cylinder",
    "box",
    "sphere",
    "triangular_prism",
    "part_from_dict",
    "link_from_parts",
    "SHAPES",
]


@dataclasses.dataclass(frozen=True, eq=False)
class Inertial:
    """Mass properties of a rigid body in some frame F (the frame its parts are placed in).

    mass: kg.  com: (3,) centre of mass in F.  inertia: (3, 3) inertia tensor about the COM,
    with axes parallel to F's (Ch.10 eq. 10.8). Arrays are stored as read-only float64 copies.
    """

    mass: float
    com: np.ndarray
    inertia: np.ndarray

    def __post_init__(self):
        com = np.array(self.com, dtype=np.float64)
        inertia = np.array(self.inertia, dtype=np.float64)
        if com.shape != (3,) or inertia.shape != (3, 3):
            raise ValueError(
                f"Inertial: expected com of shape (3,) and inertia of shape (3, 3), "
                f"got {com.shape} and {inertia.shape}"
            )
        com.setflags(write=False)
        inertia.setflags(write=False)
        object.__setattr__(self, "mass", float(self.mass))
        object.__setattr__(self, "com", com)
        object.__setattr__(self, "inertia", inertia)

    def inertia_about(self, point=(0.0, 0.0, 0.0)) -> np.ndarray:
        """(3, 3) inertia about `point` (in F, axes of F): I_c + m (d.d 1 - d d^T), d = com - point.

        Ch.10 eq. 10.13 (parallel-axis theorem).
        """
        d = self.com - np.asarray(point, dtype=np.float64)
        return self.inertia + self.mass * (d @ d * np.eye(3) - np.outer(d, d))


def place(inertial: Inertial, xyz=(0.0, 0.0, 0.0), rpy=(0.0, 0.0, 0.0)) -> Inertial:
    """Re-express `inertial`, given in a part frame P, in the frame F where P sits at pose (xyz, rpy).

    The COM moves to xyz + R c and the inertia about the COM turns to R I R^T (Ch.10 eq. 10.18,
    with R = rpy_to_matrix(rpy) taking P-coordinates to F-coordinates).
    """
    R = rpy_to_matrix(np.asarray(rpy, dtype=np.float64))
    com = np.asarray(xyz, dtype=np.float64) + R @ inertial.com
    inertia = R @ inertial.inertia @ R.T  # Ch.10 eq. 10.18
    return Inertial(inertial.mass, com, 0.5 * (inertia + inertia.T))


def combine(inertials: Sequence[Inertial]) -> Inertial:
    """One rigid body from several, all expressed in the same frame F.

    m = sum m_i;  c = sum m_i c_i / m;  I_c = sum [I_i + m_i (d_i.d_i 1 - d_i d_i^T)], d_i = c_i - c
    (Ch.10 eq. 10.13, the parallel-axis theorem, moving each part's inertia from its own COM to
    the combined COM). Parts of zero mass contribute only their inertia; if every part is massless
    the combined COM is put at the origin of F.
    """
    inertials = list(inertials)
    if not inertials:
        raise ValueError("combine: inertials: expected at least one Inertial, got none")
    for k, part in enumerate(inertials):
        if not isinstance(part, Inertial):
            raise ValueError(f"combine: inertials[{k}]: expected an Inertial, got {type(part).__name__}")
    masses = np.array([p.mass for p in inertials])
    coms = np.stack([p.com for p in inertials])
    m = masses.sum()
    c = (masses[:, None] * coms).sum(0) / m if m > 0 else np.zeros(3)
    inertia = np.zeros((3, 3))
    for mi, ci, part in zip(masses, coms, inertials):
        d = ci - c
        inertia += part.inertia + mi * (d @ d * np.eye(3) - np.outer(d, d))  # Ch.10 eq. 10.13
    return Inertial(m, c, 0.5 * (inertia + inertia.T))


# --------------------------------------------------------------------------------------------
# Primitive solids. Each entry gives, in the solid's own frame, its volume, its COM and its
# inertia about the COM per unit mass. Closed forms are the standard ones (any mechanics table);
# the semi-cylinder and the prism are derived in their constructors' docstrings.


def _cylinder(radius, length):
    i_axial = radius**2 / 2
    i_trans = (3 * radius**2 + length**2) / 12
    return np.pi * radius**2 * length, np.zeros(3), np.diag([i_trans, i_trans, i_axial])


def _hollow_cylinder(outer_radius, inner_radius, length):
    r2 = outer_radius**2 + inner_radius**2
    i_trans = (3 * r2 + length**2) / 12
    volume = np.pi * (outer_radius**2 - inner_radius**2) * length
    return volume, np.zeros(3), np.diag([i_trans, i_trans, r2 / 2])


def _semi_cylinder(radius, length):
    # About the axis point (full cylinder's centre) the half x >= 0 has the same second moments
    # per unit mass as the whole cylinder: E[x^2] = E[y^2] = r^2/4, E[z^2] = L^2/12, and every
    # product vanishes (mirror symmetry in y and in z). Its COM is at x = d = 4r/(3 pi).
    d = 4 * radius / (3 * np.pi)
    about_axis = np.diag([radius**2 / 4 + length**2 / 12, radius**2 / 4 + length**2 / 12, radius**2 / 2])
    # Ch.10 eq. 10.13 backwards: I_c = I_o - (d.d 1 - d d^T) per unit mass, d = (d, 0, 0).
    about_com = about_axis - np.diag([0.0, d**2, d**2])
    return np.pi * radius**2 * length / 2, np.array([d, 0.0, 0.0]), about_com


def _box(x, y, z):
    return x * y * z, np.zeros(3), np.diag([y**2 + z**2, x**2 + z**2, x**2 + y**2]) / 12


def _sphere(radius):
    return 4 / 3 * np.pi * radius**3, np.zeros(3), np.eye(3) * (2 / 5 * radius**2)


def _triangular_prism(a, b, length):
    # Right triangle x, y >= 0, x/a + y/b <= 1, area A = ab/2, centroid (a/3, b/3).
    # Per unit area: E[x^2] = a^2/6, E[y^2] = b^2/6, E[xy] = ab/12, so about the centroid
    # var x = a^2/6 - a^2/9 = a^2/18, var y = b^2/18, cov xy = ab/12 - ab/9 = -ab/36.
    # Extrusion: var z = L^2/12 about z = L/2, independent of x, y.
    vx, vy, vz, cxy = a**2 / 18, b**2 / 18, length**2 / 12, -a * b / 36
    # Ch.10 eq. 10.9: diagonal = sums of the other two variances; off-diagonal = -covariance.
    inertia = np.array(
        [
            [vy + vz, -cxy, 0.0],
            [-cxy, vx + vz, 0.0],
            [0.0, 0.0, vx + vy],
        ]
    )
    return a * b * length / 2, np.array([a / 3, b / 3, length / 2]), inertia


# shape name in arm files -> (dimension names, unit-mass solid)
_SOLIDS = {
    "cylinder": (("radius", "length"), _cylinder),
    "hollow_cylinder": (("outer_radius", "inner_radius", "length"), _hollow_cylinder),
    "semi_cylinder": (("radius", "length"), _semi_cylinder),
    "box": (("x", "y", "z"), _box),
    "sphere": (("radius",), _sphere),
    "triangular_prism": (("a", "b", "length"), _triangular_prism),
}
SHAPES: tuple[str, ...] = tuple(_SOLIDS)
"""Shape names accepted by :func:`part_from_dict`."""


def _show(value) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _number(where: str, field: str, value, what: str = "a number") -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: {field}: expected {what}, got {_show(value)}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{where}: {field}: expected {what}, got {value}")
    return value


def _vector3(where: str, field: str, value) -> np.ndarray:
    if (
        isinstance(value, (str, bytes, Mapping))
        or not isinstance(value, (Sequence, np.ndarray))
        or (isinstance(value, np.ndarray) and value.ndim != 1)
        or len(value) != 3
    ):
        raise ValueError(f"{where}: {field}: expected a list of 3 numbers, got {_show(value)}")
    return np.array([_number(where, f"{field}[{k}]", v) for k, v in enumerate(value)])


def _solid(shape: str, dims: dict, mass, density, xyz, rpy, where: str) -> Inertial:
    """Validate and build one primitive; every message starts with `where`."""
    names, unit_solid = _SOLIDS[shape]
    values = {}
    for name in names:
        v = _number(where, name, dims[name], "a positive number (metres)")
        if v <= 0:
            raise ValueError(f"{where}: {name}: expected a positive number (metres), got {v:g}")
        values[name] = v
    if shape == "hollow_cylinder" and values["inner_radius"] >= values["outer_radius"]:
        raise ValueError(
            f"{where}: inner_radius: expected less than outer_radius = {values['outer_radius']:g}, "
            f"got {values['inner_radius']:g}"
        )
    if (mass is None) == (density is None):
        got = "both" if mass is not None else "neither"
        raise ValueError(f"{where}: mass/density: expected exactly one of mass (kg) or density (kg/m^3), got {got}")
    volume, com, unit_inertia = unit_solid(**values)
    if mass is not None:
        m = _number(where, "mass", mass, "a non-negative number (kg)")
        if m < 0:
            raise ValueError(f"{where}: mass: expected a non-negative number (kg), got {m:g}")
    else:
        rho = _number(where, "density", density, "a non-negative number (kg/m^3)")
        if rho < 0:
            raise ValueError(f"{where}: density: expected a non-negative number (kg/m^3), got {rho:g}")
        m = rho * volume
    xyz = _vector3(where, "xyz", xyz)
    rpy = _vector3(where, "rpy", rpy)
    return place(Inertial(m, com, m * unit_inertia), xyz, rpy)


def solid_cylinder(radius, length, *, mass=None, density=None, xyz=(0, 0, 0), rpy=(0, 0, 0)) -> Inertial:
    """Solid circular cylinder. Arm-file shape ``"cylinder"``.

    Own frame: origin at the centre of the cylinder, axis (the long direction) along local z, so it
    spans z in [-length/2, length/2]. About the COM: Izz = m r^2 / 2, Ixx = Iyy = m (3 r^2 + L^2) / 12.
    Give exactly one of ``mass`` (kg) or ``density`` (kg/m^3, mass = density * pi r^2 L). The part
    frame sits at ``xyz`` with orientation ``rpy`` in the link frame; the result is in the link frame.
    """
    return _solid("cylinder", dict(radius=radius, length=length), mass, density, xyz, rpy, "solid_cylinder")


def hollow_cylinder(
    outer_radius, inner_radius, length, *, mass=None, density=None, xyz=(0, 0, 0), rpy=(0, 0, 0)
) -> Inertial:
    """Thick-walled tube, 0 < inner_radius < outer_radius. Arm-file shape ``"hollow_cylinder"``.

    Own frame: as :func:`solid_cylinder` -- origin at the centre, axis along local z. About the COM:
    Izz = m (ro^2 + ri^2) / 2, Ixx = Iyy = m (3 (ro^2 + ri^2) + L^2) / 12.
    Mass from ``density`` uses the wall volume pi (ro^2 - ri^2) L. Pose and mass as :func:`solid_cylinder`.
    """
    dims = dict(outer_radius=outer_radius, inner_radius=inner_radius, length=length)
    return _solid("hollow_cylinder", dims, mass, density, xyz, rpy, "hollow_cylinder")


def semi_cylinder(radius, length, *, mass=None, density=None, xyz=(0, 0, 0), rpy=(0, 0, 0)) -> Inertial:
    """Half of a solid cylinder, cut through its axis: the half with x >= 0. Arm-file ``"semi_cylinder"``.

    Own frame: origin on the axis at mid-length (the centre of the full cylinder, i.e. the centre of
    the flat rectangular face), axis (the long direction) along local z, the flat face in the y-z
    plane and the curved surface towards +x. The COM is at (4 r / (3 pi), 0, 0).
    About the axis point the half has the full cylinder's second moments per unit mass; moving them to
    the COM with the parallel-axis theorem (Ch.10 eq. 10.13), d = 4 r / (3 pi), gives
    Ixx = m (r^2/4 + L^2/12), Iyy = m (r^2/4 + L^2/12 - d^2), Izz = m (r^2/2 - d^2), no products.
    Mass from ``density`` uses the volume pi r^2 L / 2. Pose and mass as :func:`solid_cylinder`.
    """
    return _solid("semi_cylinder", dict(radius=radius, length=length), mass, density, xyz, rpy, "semi_cylinder")


def box(x, y, z, *, mass=None, density=None, xyz=(0, 0, 0), rpy=(0, 0, 0)) -> Inertial:
    """Rectangular block with side lengths x, y, z along its local axes. Arm-file shape ``"box"``.

    Own frame: origin at the centre, edges parallel to the local axes (no preferred long axis).
    About the COM: m/12 diag(y^2 + z^2, x^2 + z^2, x^2 + y^2) (Craig Example 6.1; Ch.10 eq. 10.10
    for the unit cube). Pose and mass as :func:`solid_cylinder` (volume x y z).
    """
    return _solid("box", dict(x=x, y=y, z=z), mass, density, xyz, rpy, "box")


def sphere(radius, *, mass=None, density=None, xyz=(0, 0, 0), rpy=(0, 0, 0)) -> Inertial:
    """Solid ball. Arm-file shape ``"sphere"``.

    Own frame: origin at the centre (rpy has no effect). About the COM: (2/5) m r^2 1.
    Pose and mass as :func:`solid_cylinder` (volume 4/3 pi r^3).
    """
    return _solid("sphere", dict(radius=radius), mass, density, xyz, rpy, "sphere")


def triangular_prism(a, b, length, *, mass=None, density=None, xyz=(0, 0, 0), rpy=(0, 0, 0)) -> Inertial:
    """Right triangular prism (a gusset or wedge). Arm-file shape ``"triangular_prism"``.

    Own frame: the right angle of the triangular cross-section is at the origin, leg ``a`` runs
    along +x and leg ``b`` along +y (the hypotenuse joins (a, 0) and (0, b)), and the triangle is
    extruded from z = 0 to z = ``length`` (the extrusion axis is local z). The COM is at
    (a/3, b/3, length/2).

    Derivation (Ch.10 eq. 10.9, per unit mass over the triangle x, y >= 0, x/a + y/b <= 1):
    E[x^2] = a^2/6, E[y^2] = b^2/6, E[xy] = ab/12, so about the COM var x = a^2/18, var y = b^2/18,
    cov(x, y) = ab/12 - ab/9 = -ab/36, and var z = L^2/12. Hence about the COM
    Ixx = m (b^2/18 + L^2/12), Iyy = m (a^2/18 + L^2/12), Izz = m (a^2 + b^2)/18, and
    Ixy = Iyx = -m cov(x, y) = +m a b / 36 (the tensor holds minus the product integral); Ixz = Iyz = 0.
    Pose and mass as :func:`solid_cylinder` (volume a b L / 2).
    """
    return _solid("triangular_prism", dict(a=a, b=b, length=length), mass, density, xyz, rpy, "triangular_prism")


def part_from_dict(d: Mapping, where: str) -> Inertial:
    """One part from an arm-file table, e.g. ``{shape = "cylinder", radius = 0.05, length = 0.3,
    density = 2700, xyz = [0, 0, 0.15], rpy = [0, 1.5708, 0]}``.

    Keys: ``shape`` (one of :data:`SHAPES`), the shape's dimensions named as in its constructor
    (cylinder: radius, length; hollow_cylinder: outer_radius, inner_radius, length; semi_cylinder:
    radius, length; box: x, y, z; sphere: radius; triangular_prism: a, b, length), exactly one of
    ``mass`` or ``density``, and optional ``xyz``, ``rpy`` (3 numbers each, default zeros).
    Every error is a ValueError whose one-line message starts with `where`, e.g.
    ``"arms/x.toml: joint 3: parts[1]: radius: expected a positive number (metres), got -0.1"``.
    """
    if not isinstance(d, Mapping):
        raise ValueError(
            f"{where}: expected a table of part fields (shape, dimensions, mass or density), got {_show(d)}"
        )
    known = ", ".join(SHAPES)
    if "shape" not in d:
        raise ValueError(f"{where}: shape: missing; expected one of {known}")
    shape = d["shape"]
    if not isinstance(shape, str) or shape not in _SOLIDS:
        raise ValueError(f"{where}: shape: unknown shape {_show(shape)}; expected one of {known}")
    names, _ = _SOLIDS[shape]
    allowed = ("shape", *names, "mass", "density", "xyz", "rpy")
    for key in d:
        if key not in allowed:
            raise ValueError(f"{where}: {key}: unknown key for shape {shape!r}; expected keys {', '.join(allowed)}")
    for name in names:
        if name not in d:
            raise ValueError(f"{where}: {name}: missing dimension; shape {shape!r} needs {', '.join(names)}")
    dims = {name: d[name] for name in names}
    return _solid(shape, dims, d.get("mass"), d.get("density"), d.get("xyz", (0, 0, 0)), d.get("rpy", (0, 0, 0)), where)


def link_from_parts(parts: Sequence[Mapping], where: str) -> Inertial:
    """Mass properties of one link from its list of part tables (combine of part_from_dict).

    Part k's errors are reported as ``f"{where}: parts[{k}]: ..."``.
    """
    if isinstance(parts, (str, bytes, Mapping)) or not isinstance(parts, Sequence) or len(parts) == 0:
        raise ValueError(f"{where}: parts: expected a non-empty list of part tables, got {_show(parts)}")
    return combine([part_from_dict(p, f"{where}: parts[{k}]") for k, p in enumerate(parts)])
