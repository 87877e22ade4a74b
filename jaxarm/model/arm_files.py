"""Arm files: Swartz's Manipulator Database as TOML.

Swartz's ``sim`` program reads a *Manipulator Database* -- Denavit-Hartenberg parameters plus
the mass, centre of mass and inertia of every link, the latter possibly assembled from a
*Parts Database* -- with ``database_read``. Here that database is a TOML file:
:func:`load_arm` reads one into an :class:`~jaxarm.arm.Arm`, :func:`save_arm` writes one back,
bit for bit. Bundled arms live in ``arms/<name>.toml`` and load by bare name
(``load_arm("puma560")``; :func:`bundled_arms` lists them).

Schema
------
Units are SI (m, kg, kg m^2, s, rad, N, N m, V, ohm, A); angles are plain numbers in radians
(write 1.5707963267948966, not "pi/2"). Integers are accepted wherever a number is expected;
``inf``/``-inf`` are valid TOML floats. A field that is absent means zero / ideal, except where
marked *required*. Unknown fields are errors (typos never pass silently).

Top level::

    name       = "puma560"                   # str; default: the file name without .toml
    convention = "standard"                  # required: "standard" | "modified" | "placement"
    gravity    = [0.0, 0.0, -9.81]           # m/s^2 in the world frame; default [0, 0, -9.81]
    base = { xyz = [0, 0, 0.5], rpy = [0, 0, 0] }   # pose of frame 0 in the world (default identity):
    tool = [[1, 0, 0, 0], [0, 1, 0, 0],             # a 4x4 homogeneous transform, or an inline
            [0, 0, 1, 0.1], [0, 0, 0, 1]]           # table with xyz (3) and/or rpy (3, URDF roll-pitch-yaw)
                                             # tool = pose of the tool in the last link frame

    [payload]                                # optional load held at the tool (tool frame)
    mass = 1.0                               # kg, >= 0
    com = [0.0, 0.0, 0.05]                   # m, in the tool frame
    inertia = [1e-3, 1e-3, 1e-3]             # about its COM; same forms as a link's inertia

    [[joint]]                                # one table per joint, base to tip (>= 1 required)
    type = "revolute"                        # required: "revolute" | "prismatic"

Joint kinematics -- DH conventions ("standard" = distal, Corke / ch. 10; "modified" = proximal,
Craig 3.6; see :mod:`jaxarm.arm`). All four are required; for a revolute joint ``theta`` is the
constant offset added to q, for a prismatic joint ``d`` is::

    a = 0.4318          # m      (modified: a_{i-1})
    alpha = 0.0         # rad    (modified: alpha_{i-1})
    d = 0.0             # m
    theta = 0.0         # rad

Joint kinematics -- "placement" convention (URDF-like), all three required instead of DH::

    xyz = [0, 0, 0.333]     # m, joint placement in the parent link frame
    rpy = [0, 0, 0]         # rad, URDF fixed-axis roll, pitch, yaw
    axis = [0, 0, 1]        # unit vector in the joint frame

Link inertials (link i's frame, i.e. the frame the convention attaches to link i)::

    mass = 17.4                          # kg, >= 0
    com = [-0.3638, 0.006, 0.2275]       # m
    inertia = [0.13, 0.524, 0.539]       # kg m^2 about the COM: 3 values (diagonal xx, yy, zz),
                                         # 6 values (xx, xy, xz, yy, yz, zz) or a 3x3 matrix;
                                         # tensor convention (off-diagonals = minus the products)

or, instead of ``mass``/``com``/``inertia`` (which must then be absent), the Parts Database --
primitive solids in the link frame, combined by :func:`jaxarm.parts.link_from_parts`::

    parts = [
      { shape = "cylinder", radius = 0.05, length = 0.3, density = 2700.0, xyz = [0, 0, 0.15] },
      { shape = "box", x = 0.1, y = 0.1, z = 0.05, mass = 1.2, rpy = [0, 0, 0.3] },
    ]
    # shapes and their dimensions: cylinder (radius, length), hollow_cylinder (outer_radius,
    # inner_radius, length), semi_cylinder (radius, length), box (x, y, z), sphere (radius),
    # triangular_prism (a, b, length); exactly one of mass / density; optional xyz, rpy.

Optional per-joint limits (joint side; default: none)::

    [joint.limits]
    position = [-2.79, 2.79]     # [lower, upper], rad or m
    velocity = 2.175             # rad/s or m/s, > 0
    torque = 87.0                # N m or N, > 0

Optional per-joint drive (motor side, Corke's convention; defaults: direct drive, ideal)::

    [joint.motor]
    gear_ratio = 107.815                 # motor turns per joint turn; negative allowed; default 1
    rotor_inertia = 200e-6               # Jm, kg m^2 at the motor; reflected as G^2 Jm
    viscous_friction = 0.817e-3          # B, N m s/rad at the motor; joint torque B G^2 qd
    coulomb_friction = [0.126, -0.071]   # Tc [for qd > 0, for qd < 0], N m at the motor
                                         # (one number c means [c, -c]); joint torque |G| Tc
    torque_constant = 0.223              # Kt, N m/A (= V s/rad); 0 = no electrical model
    resistance = 2.1                     # R, ohm
    voltage_limit = 40.0                 # V, > 0; default inf

The motor table accepts exactly the :class:`~jaxarm.arm.Drives` fields that
:func:`jaxarm.arm.make_arm` takes (:data:`MOTOR_FIELDS`), one value per joint of the shape
``Drives`` holds per joint; today also the further friction models (see
:func:`jaxarm.drives.friction_torques`)::

    static_friction = 0.5                # Ts, N m at the motor (Stribeck peak, > |Tc|)
    stribeck_velocity = 0.05             # rad/s (or m/s) at the joint; > 0 when Ts is set
    coulomb_velocity_scale = 0.01        # smooth sign(qd) as tanh(qd / scale); 0 = exact sign
    sigmoid_friction = [0.546, 5.12, 0.0395]   # Gaz et al. 2019 (Panda): phi1 N m, phi2 s/rad, phi3 rad/s

Errors and warnings
-------------------
Every problem raises :class:`ArmFileError` (a ValueError) with a one-line message naming the
file, the joint (1-based) and the field, and saying what was expected, e.g.
``arms/x.toml: joint 2: inertia: expected 3 diagonal values, ...``. After loading, every link
(and the payload) is checked with :func:`jaxarm.consistency.consistency_report`; a physically
inconsistent one gives a :class:`PhysicalConsistencyWarning` (an error with ``strict=True``).
Published models sometimes fail this check (the Puma 560 consensus model does), so by default
it only warns. A link with zero mass *and* zero inertia is an idealisation, not an
inconsistency, and is not reported.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np

from ..core import spatial
from ..core.io import write_atomic, write_text_atomic  # noqa: F401 (public here since 0.1)
from .arm import CONVENTIONS, JOINT_TYPES, Arm, Drives, make_arm
from .consistency import consistency_report
from .parts import link_from_parts

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "ArmFileError",
    "PhysicalConsistencyWarning",
    "load_arm",
    "save_arm",
    "arm_from_toml",
    "arm_to_toml",
    "bundled_arms",
    "MOTOR_FIELDS",
]


class ArmFileError(ValueError):
    """A malformed arm file (or an arm that cannot be written): the message names file, joint, field."""


class PhysicalConsistencyWarning(UserWarning):
    """A link's mass, COM and inertia cannot belong to any real body (see jaxarm.consistency)."""


# --------------------------------------------------------------------------------------------
# Field tables

TOP_FIELDS = ("name", "convention", "gravity", "base", "tool", "payload", "joint")
DH_FIELDS = ("a", "alpha", "d", "theta")
PLACEMENT_FIELDS = ("xyz", "rpy", "axis")
INERTIAL_FIELDS = ("mass", "com", "inertia")
PAYLOAD_FIELDS = INERTIAL_FIELDS
LIMIT_FIELDS = ("position", "velocity", "torque")
_LIMIT_ARGS = {"position": "position_limits", "velocity": "velocity_limits", "torque": "torque_limits"}
_TRANSFORM_FIELDS = ("xyz", "rpy")

MOTOR_FIELDS: tuple[str, ...] = tuple(
    f.name for f in Drives.__dataclass_fields__.values() if f.name in inspect.signature(make_arm).parameters
)
"""Fields of ``[joint.motor]``: the :class:`~jaxarm.arm.Drives` fields that make_arm accepts."""


def _joint_fields(convention: str) -> tuple[str, ...]:
    kin = PLACEMENT_FIELDS if convention == "placement" else DH_FIELDS
    return ("type", *kin, *INERTIAL_FIELDS, "parts", "limits", "motor")


def _arms_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    return [here / "arms", here.parent.parent / "arms"]


def bundled_arms() -> tuple[str, ...]:
    """Names of the arms shipped in ``arms/`` (load them with ``load_arm(name)``)."""
    names = set()
    for folder in _arms_dirs():
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.toml"))
    return tuple(sorted(names))


def _resolve(name_or_path) -> Path:
    """A bare name (no suffix, no slash) is a bundled arm; anything else is a path."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ArmFileError(f"load_arm: expected an arm name or a path, got {type(name_or_path).__name__}")
    text = os.fspath(name_or_path)
    bare = isinstance(name_or_path, str) and "/" not in text and "\\" not in text and Path(text).suffix == ""
    if not bare:
        return Path(text)
    for folder in _arms_dirs():
        candidate = folder / f"{text}.toml"
        if candidate.is_file():
            return candidate
    known = ", ".join(bundled_arms()) or "(none found)"
    raise ArmFileError(f"{text!r}: no bundled arm of that name; bundled arms: {known} (or give a path to a .toml file)")


# --------------------------------------------------------------------------------------------
# Reading


def _show(value) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value, pre: str, field: str, finite: bool = True) -> float:
    """A TOML integer or float (not a bool); finite unless ``finite=False`` (limits may be inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArmFileError(f"{pre}{field}: expected a number, got {_show(value)}")
    value = float(value)
    if finite and not np.isfinite(value):
        raise ArmFileError(f"{pre}{field}: expected a finite number, got {value}")
    return value


def _vector(value, length: int, pre: str, field: str, finite: bool = True) -> np.ndarray:
    if not isinstance(value, list) or len(value) != length:
        got = f"{len(value)} values" if isinstance(value, list) else _show(value)
        raise ArmFileError(f"{pre}{field}: expected a list of {length} numbers, got {got}")
    return np.array([_number(v, pre, f"{field}[{k}]", finite) for k, v in enumerate(value)], dtype=np.float64)


def _matrix(value, rows: int, cols: int, pre: str, field: str) -> np.ndarray:
    if not (isinstance(value, list) and len(value) == rows and all(isinstance(r, list) and len(r) == cols for r in value)):
        raise ArmFileError(f"{pre}{field}: expected a {rows}x{cols} matrix (a list of {rows} lists of {cols} numbers), got {_show(value)}")
    return np.array(
        [[_number(v, pre, f"{field}[{r}][{c}]") for c, v in enumerate(row)] for r, row in enumerate(value)],
        dtype=np.float64,
    )


def _inertia(value, pre: str, field: str = "inertia") -> np.ndarray:
    """3 diagonal values, 6 values (xx, xy, xz, yy, yz, zz) or a 3x3 matrix -> (3, 3)."""
    expected = "expected 3 diagonal values, 6 values (xx, xy, xz, yy, yz, zz) or a 3x3 matrix"
    if isinstance(value, list) and len(value) == 3 and all(isinstance(r, list) for r in value):
        return _matrix(value, 3, 3, pre, field)
    if isinstance(value, list) and len(value) == 3:
        return np.diag(_vector(value, 3, pre, field))
    if isinstance(value, list) and len(value) == 6:
        xx, xy, xz, yy, yz, zz = _vector(value, 6, pre, field)
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    got = f"{len(value)} values" if isinstance(value, list) else _show(value)
    raise ArmFileError(f"{pre}{field}: {expected}, got {got}")


def _transform(value, pre: str, field: str) -> np.ndarray:
    """A 4x4 array or an inline table {xyz, rpy} -> (4, 4) (validated for rigidity by make_arm)."""
    if isinstance(value, Mapping):
        for key in value:
            if key not in _TRANSFORM_FIELDS:
                raise ArmFileError(f"{pre}{field}.{key}: unknown field; expected one of: {', '.join(_TRANSFORM_FIELDS)}")
        T = np.eye(4)
        if "rpy" in value:
            T[:3, :3] = spatial.rpy_to_matrix(_vector(value["rpy"], 3, pre, f"{field}.rpy"))
        if "xyz" in value:
            T[:3, 3] = _vector(value["xyz"], 3, pre, f"{field}.xyz")
        return T
    if isinstance(value, list):
        return _matrix(value, 4, 4, pre, field)
    raise ArmFileError(f"{pre}{field}: expected a 4x4 transform or an inline table {{ xyz = [..], rpy = [..] }}, got {_show(value)}")


def _table(value, pre: str, field: str, allowed, header: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ArmFileError(f"{pre}{field}: expected a table ([{header}] or {field} = {{ ... }}), got {_show(value)}")
    for key in value:
        if key not in allowed:
            raise ArmFileError(f"{pre}{field}.{key}: unknown field; expected one of: {', '.join(allowed)}")
    return value


def _default_arm(types, convention) -> Arm:
    return make_arm(types, convention=convention)


def _per_joint_value(value, tail: tuple, pre: str, field: str, finite: bool = True) -> np.ndarray:
    if tail == ():
        return np.asarray(_number(value, pre, field, finite))
    if len(tail) == 1:
        return _vector(value, tail[0], pre, field, finite)
    return _matrix(value, tail[0], tail[1], pre, field)  # pragma: no cover - no such field today


def arm_from_toml(text: str, *, where: str = "<string>", default_name: str = "arm", strict: bool = False) -> Arm:
    """Parse arm-file text (see the module docstring); ``where`` prefixes every message."""
    return _from_text(text, where, default_name, strict, stacklevel=4)


def _from_text(text: str, where: str, default_name: str, strict: bool, stacklevel: int) -> Arm:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ArmFileError(f"{where}: TOML syntax error: {exc}") from None
    arm = _arm_from_dict(data, where, default_name)
    _check_consistency(arm, where, strict, stacklevel)
    return arm


def _arm_from_dict(data: Mapping, where: str, default_name: str) -> Arm:
    top = f"{where}: "
    for key in data:
        if key not in TOP_FIELDS:
            raise ArmFileError(f"{top}{key}: unknown top-level field; expected one of: {', '.join(TOP_FIELDS)}")

    name = data.get("name", default_name)
    if not isinstance(name, str):
        raise ArmFileError(f"{top}name: expected a string, got {_show(name)}")
    if "convention" not in data:
        raise ArmFileError(f"{top}convention: missing; expected one of {', '.join(repr(c) for c in CONVENTIONS)}")
    convention = data["convention"]
    if convention not in CONVENTIONS:
        raise ArmFileError(f"{top}convention: expected one of {', '.join(repr(c) for c in CONVENTIONS)}, got {_show(convention)}")
    gravity = _vector(data["gravity"], 3, top, "gravity") if "gravity" in data else np.array([0.0, 0.0, -9.81])
    base = _transform(data["base"], top, "base") if "base" in data else None
    tool = _transform(data["tool"], top, "tool") if "tool" in data else None

    joints = data.get("joint")
    if joints is None or (isinstance(joints, list) and len(joints) == 0):
        raise ArmFileError(f"{top}joint: expected at least one [[joint]] table, found none")
    if not isinstance(joints, list) or not all(isinstance(j, Mapping) for j in joints):
        raise ArmFileError(f"{top}joint: expected an array of [[joint]] tables, got {_show(joints)}")

    n = len(joints)
    allowed = _joint_fields(convention)
    kin_fields = PLACEMENT_FIELDS if convention == "placement" else DH_FIELDS
    types = []
    kin = {f: [] for f in kin_fields}
    mass, com, inertia = np.zeros(n), np.zeros((n, 3)), np.zeros((n, 3, 3))
    limit_rows: list[dict] = []
    motor_rows: list[dict] = []

    for i, joint in enumerate(joints):
        pre = f"{where}: joint {i + 1}: "
        for key in joint:
            if key not in allowed:
                raise ArmFileError(f"{pre}{key}: unknown field; expected one of (convention {convention!r}): {', '.join(allowed)}")
        if "type" not in joint:
            raise ArmFileError(f"{pre}type: missing; expected 'revolute' or 'prismatic'")
        jtype = joint["type"]
        if jtype not in JOINT_TYPES:
            raise ArmFileError(f"{pre}type: expected 'revolute' or 'prismatic', got {_show(jtype)}")
        types.append(jtype)

        for f in kin_fields:
            if f not in joint:
                needs = ", ".join(kin_fields)
                raise ArmFileError(f"{pre}{f}: missing; convention {convention!r} needs {needs} for every joint")
            kin[f].append(_vector(joint[f], 3, pre, f) if convention == "placement" else _number(joint[f], pre, f))

        if "parts" in joint:
            given = [f for f in INERTIAL_FIELDS if f in joint]
            if given:
                raise ArmFileError(f"{pre}parts: give either parts or mass/com/inertia, not both (found {', '.join(given)})")
            try:
                link = link_from_parts(joint["parts"], f"{where}: joint {i + 1}")
            except ValueError as exc:
                raise ArmFileError(str(exc)) from None
            mass[i], com[i], inertia[i] = link.mass, link.com, link.inertia
        else:
            if "mass" in joint:
                mass[i] = _number(joint["mass"], pre, "mass")
            if "com" in joint:
                com[i] = _vector(joint["com"], 3, pre, "com")
            if "inertia" in joint:
                inertia[i] = _inertia(joint["inertia"], pre)

        limits = _table(joint.get("limits", {}), pre, "limits", LIMIT_FIELDS, "joint.limits")
        row = {}
        for f, value in limits.items():
            field = f"limits.{f}"
            row[f] = _vector(value, 2, pre, field, False) if f == "position" else _number(value, pre, field, False)
        limit_rows.append(row)

        motor = _table(joint.get("motor", {}), pre, "motor", MOTOR_FIELDS, "joint.motor")
        motor_rows.append(dict(motor))

    # Drive and limit arrays start from make_arm's defaults; each joint overrides what it gives.
    default = _default_arm(types, convention)
    kwargs = {}
    for f in MOTOR_FIELDS:
        arr = np.array(np.asarray(getattr(default.drives, f)), dtype=np.float64)
        tail = arr.shape[1:]
        given = False
        for i, row in enumerate(motor_rows):
            if f not in row:
                continue
            given = True
            pre = f"{where}: joint {i + 1}: "
            value = row[f]
            if f == "coulomb_friction" and not isinstance(value, list):
                c = _number(value, pre, "motor.coulomb_friction")
                arr[i] = [c, -c]
            elif f == "coulomb_friction":
                arr[i] = _vector(value, 2, pre, "motor.coulomb_friction")
            else:
                arr[i] = _per_joint_value(value, tail, pre, f"motor.{f}", finite=f != "voltage_limit")
        if given:
            kwargs[f] = arr
    for f, arg in _LIMIT_ARGS.items():
        arr = np.array(np.asarray(getattr(default.limits, f)), dtype=np.float64)
        if any(f in row for row in limit_rows):
            for i, row in enumerate(limit_rows):
                if f in row:
                    arr[i] = row[f]
            kwargs[arg] = arr

    kin_kwargs = {f: np.array(v, dtype=np.float64) for f, v in kin.items()}
    try:
        arm = make_arm(
            types,
            convention=convention,
            **kin_kwargs,
            mass=mass,
            com=com,
            inertia=inertia,
            gravity=gravity,
            base=base,
            tool=tool,
            name=name,
            **kwargs,
        )
    except ValueError as exc:
        raise ArmFileError(f"{where}: {exc}") from None

    if "payload" in data:
        payload = _table(data["payload"], top, "payload", PAYLOAD_FIELDS, "payload")
        p_mass = _number(payload["mass"], top, "payload.mass") if "mass" in payload else 0.0
        p_com = _vector(payload["com"], 3, top, "payload.com") if "com" in payload else np.zeros(3)
        p_inertia = _inertia(payload["inertia"], top, "payload.inertia") if "inertia" in payload else np.zeros((3, 3))
        if not np.allclose(p_inertia, p_inertia.T, rtol=1e-9, atol=1e-12 * max(1.0, np.abs(p_inertia).max())):
            raise ArmFileError(f"{top}payload.inertia: expected a symmetric matrix, got {p_inertia.tolist()}")
        try:
            arm = arm.with_payload(p_mass, p_com, p_inertia)
        except ValueError as exc:
            raise ArmFileError(f"{where}: {exc}") from None
    return arm


def _check_consistency(arm: Arm, where: str, strict: bool, stacklevel: int = 2) -> None:
    """One warning (or with strict=True an error) naming every physically inconsistent link, the
    payload and the drives, each with its first problem (``jaxarm.consistency_report`` lists them
    all); a massless link (no mass, no inertia) is an idealisation, not an inconsistency."""
    bad = [(label, report) for label, report in consistency_report(arm, drives=True).items()
           if not (report.ok or report.massless)]
    if not bad:
        return
    if strict:
        label, report = bad[0]
        kind = "drive parameters" if label.startswith("drive") else "inertial parameters"
        raise ArmFileError(f"{where}: {label}: physically inconsistent {kind}: {'; '.join(report.problems)} (strict=True)")
    first = "; ".join(f"{label}: {report.problems[0].split('; ')[0]}" for label, report in bad)
    msg = (f"{where}: physically inconsistent parameters ({first}). Simulation runs; identification needs "
           f"repair=True, MJCF export refuses; jaxarm.consistency_report(arm) says more.")
    warnings.warn(msg, PhysicalConsistencyWarning, stacklevel=stacklevel)


def load_arm(name_or_path, *, strict: bool = False, **urdf_options) -> Arm:
    """Load an arm file (schema: this module's docstring) into a validated :class:`Arm`.

    ``name_or_path``: a bare name such as ``"puma560"`` (no suffix, no slash) loads the bundled
    ``arms/puma560.toml``; anything else is a path. Every problem raises :class:`ArmFileError`
    naming the file, the joint (1-based) and the field. Physically inconsistent links give a
    :class:`PhysicalConsistencyWarning`, or an :class:`ArmFileError` with ``strict=True``.
    A ``.urdf`` path is read by :func:`jaxarm.urdf.load_urdf` (options ``base_link``,
    ``tip_link``, ``gravity``), with the same consistency check.
    """
    path = _resolve(name_or_path)
    if path.suffix.lower() == ".urdf":
        from .urdf import (
            load_urdf,  # URDF import is optional work; the module loads on demand
        )

        arm = load_urdf(path, **urdf_options)
        _check_consistency(arm, str(path), strict, stacklevel=3)
        return arm
    if urdf_options:
        raise ArmFileError(f"{path}: {', '.join(sorted(urdf_options))}: options only for .urdf files")
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArmFileError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ArmFileError(f"{where}: cannot read: {exc}") from None
    return _from_text(text, where, path.stem, strict, stacklevel=4)


# --------------------------------------------------------------------------------------------
# Writing


def _num(x) -> str:
    """A float as TOML that reads back to the same bits (repr round-trips; inf/-inf/nan are TOML)."""
    return repr(float(x))


def _array(x) -> str:
    x = np.asarray(x)
    if x.ndim == 1:
        return "[" + ", ".join(_num(v) for v in x) + "]"
    return "[" + ", ".join(_array(row) for row in x) + "]"


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _transform_text(T) -> str | None:
    """None for the identity, { xyz = [...] } for a pure translation, else the 4x4 matrix."""
    T = np.asarray(T, dtype=np.float64)
    if _same_bits(T, np.eye(4)):
        return None
    if _same_bits(T[:3, :3], np.eye(3)) and _same_bits(T[3], [0.0, 0.0, 0.0, 1.0]):
        return "{ xyz = " + _array(T[:3, 3]) + " }"
    return _array(T)


def _inertia_text(I) -> str:
    I = np.asarray(I, dtype=np.float64)
    off = I[~np.eye(3, dtype=bool)]
    if _same_bits(off, np.zeros(6)):  # only +0.0 off the diagonal: 3 values read back exactly
        return _array(np.diag(I))
    return _array(I)


def _string(s: str) -> str:
    """A TOML basic string: quote and backslash escaped, control characters as \\uXXXX."""
    body = "".join(
        "\\" + ch if ch in '"\\' else f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in s
    )
    return f'"{body}"'


def arm_to_toml(arm: Arm, *, comment: str | None = None) -> str:
    """The arm-file text for ``arm`` (one arm, no batch axis); :func:`arm_from_toml` inverts it
    bit for bit. Only values that differ from the defaults are written, except name, convention,
    gravity and every joint's type, kinematics, mass, com and inertia."""
    if not isinstance(arm, Arm):
        raise ArmFileError(f"save_arm: arm: expected a jaxarm.Arm, got {type(arm).__name__}")
    default = _default_arm(arm.joint_types, arm.convention)
    flat, _ = jax.tree_util.tree_flatten_with_path(arm)
    flat_default, _ = jax.tree_util.tree_flatten_with_path(default)
    for (key, leaf), (_, ref) in zip(flat, flat_default):
        if np.shape(leaf) != np.shape(ref):
            field = jax.tree_util.keystr(key).lstrip(".")
            raise ArmFileError(
                f"save_arm: {field}: leaves have a batch axis (shape {np.shape(leaf)}, expected {np.shape(ref)}); "
                "save one arm at a time"
            )
    unsupported = [
        f for f in Drives.__dataclass_fields__ if f not in MOTOR_FIELDS
        and not _same_bits(getattr(arm.drives, f), getattr(default.drives, f))
    ]
    if unsupported:
        raise ArmFileError(f"save_arm: drives.{unsupported[0]}: no arm-file field for this drive parameter")

    lines = []
    if comment:
        for line in comment.splitlines():  # TOML comments may hold tabs but no other control characters
            clean = "".join(ch if ch == "\t" or (ord(ch) >= 0x20 and ord(ch) != 0x7F) else " " for ch in line)
            lines.append(f"# {clean}".rstrip())
        lines.append("")
    lines.append(f"name = {_string(arm.name)}")
    lines.append(f"convention = {_string(arm.convention)}")
    lines.append(f"gravity = {_array(arm.gravity)}")
    for field in ("base", "tool"):
        text = _transform_text(getattr(arm, field))
        if text is not None:
            lines.append(f"{field} = {text}")

    p = arm.payload
    if not all(_same_bits(getattr(p, f), getattr(default.payload, f)) for f in PAYLOAD_FIELDS):
        lines += ["", "[payload]", f"mass = {_num(p.mass)}", f"com = {_array(p.com)}", f"inertia = {_inertia_text(p.inertia)}"]

    kin_fields = PLACEMENT_FIELDS if arm.convention == "placement" else DH_FIELDS
    for i in range(arm.n):
        lines += ["", "[[joint]]", f"type = {_string(arm.joint_types[i])}"]
        for f in kin_fields:
            value = np.asarray(getattr(arm.kinematics, f))[i]
            lines.append(f"{f} = {_array(value) if np.ndim(value) else _num(value)}")
        lines.append(f"mass = {_num(arm.links.mass[i])}")
        lines.append(f"com = {_array(arm.links.com[i])}")
        lines.append(f"inertia = {_inertia_text(arm.links.inertia[i])}")

        limit_lines = []
        for f in LIMIT_FIELDS:
            value = np.asarray(getattr(arm.limits, f))[i]
            if not _same_bits(value, np.asarray(getattr(default.limits, f))[i]):
                limit_lines.append(f"{f} = {_array(value) if np.ndim(value) else _num(value)}")
        if limit_lines:
            lines += ["", "[joint.limits]", *limit_lines]

        motor_lines = []
        for f in MOTOR_FIELDS:
            value = np.asarray(getattr(arm.drives, f), dtype=np.float64)[i]
            if _same_bits(value, np.asarray(getattr(default.drives, f))[i]):
                continue
            if f == "coulomb_friction" and _same_bits(value[1], -value[0]):
                motor_lines.append(f"{f} = {_num(value[0])}")
            else:
                motor_lines.append(f"{f} = {_array(value) if np.ndim(value) else _num(value)}")
        if motor_lines:
            lines += ["", "[joint.motor]", *motor_lines]
    return "\n".join(lines) + "\n"


def save_arm(arm: Arm, path, *, comment: str | None = None) -> Path:
    """Write ``arm`` to an arm file that :func:`load_arm` reads back with every leaf bit-identical
    (for float64 leaves). ``comment`` (optional, may span lines) becomes a ``#`` header.

    Atomic: the text goes to a temporary file in the same directory, is flushed and fsync'ed, and
    then replaces ``path`` with ``os.replace``; on any error the temporary file is removed and an
    existing file at ``path`` is left untouched. Arms whose leaves carry a batch axis are refused.
    """
    path = Path(path)
    text = arm_to_toml(arm, comment=comment)
    return write_text_atomic(path, text)
