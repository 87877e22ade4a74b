"""URDF import and export.

:func:`load_urdf` reads the serial chain between two links of a URDF into a ``"placement"``
:class:`~jaxarm.arm.Arm`; :func:`save_urdf` / :func:`to_urdf` write any arm back out.

Reading (what each URDF element becomes)
----------------------------------------
* ``revolute``, ``continuous`` (revolute without position limits) and ``prismatic`` joints on
  the chain are the arm's joints; their ``<origin>`` is the placement (``xyz``, ``rpy``) and
  ``<axis>`` (default ``1 0 0``, normalized) the joint axis, as in :class:`~jaxarm.arm.Placements`.
* ``fixed`` joints are folded away: the child link's inertia is merged into the moving body it
  is welded to (parallel-axis theorem and rotation, Ch.10 eqs 10.13 and 10.18); a fixed
  transform on the chain is composed into the next joint's placement, or after the last joint
  into ``tool``. Fixed joints between ``base_link`` and joint 1 fold into joint 1's placement,
  so ``base`` is the identity and the world frame is ``base_link``'s frame.
* Links before the first moving joint never move: their inertia is ignored (as Pinocchio and
  MuJoCo do with bodies welded to the world).
* Branches off the chain (sensor frames, a gripper's fingers, ...) ride with the link they hang
  from. Fixed branches are merged silently; moving ones are *locked at joint value 0* and merged,
  with a warning naming them (Pinocchio's ``buildReducedModel`` at the neutral configuration).
* ``<inertial>``: origin xyz/rpy, mass, inertia (ixx ixy ixz iyy iyz izz, the entries of the
  inertia tensor about the COM in the inertial frame) -> com and inertia about the COM in the
  link frame. A link without ``<inertial>`` has zero mass.
* ``<limit lower upper velocity effort>`` -> position, velocity and torque limits. A missing
  lower/upper, and velocity/effort of 0 (as many published files write for "unspecified"),
  mean "no limit".
* ``<dynamics damping friction>`` -> ``viscous_friction`` and symmetric ``coulomb_friction``
  with gear ratio 1 (joint-side values).
* Visuals, collisions and meshes are not part of the dynamics; :func:`jaxarm.model.visuals.urdf_visuals`
  reads the visual geometry for drawing (``jaxarm view``). ``<transmission>``, ``<gazebo>``
  and other extensions are ignored.
* Unsupported on the chain: ``floating`` and ``planar`` joints, ``<mimic>`` joints. Anywhere:
  closed chains (a link with two parent joints). Each raises :class:`UrdfError` naming the joint.

Every problem raises :class:`UrdfError` (a ``ValueError``) with one line naming the file and the
element, e.g. ``robot.urdf: joint 'elbow': type: unknown joint type 'ball'``.

Choosing the chain
------------------
``base_link`` defaults to the root link. ``tip_link`` defaults to the end of the only moving
chain: the leaves reachable through at least one moving joint are the candidates; when they all
end below one deepest moving link (e.g. the UR5's ``ee_link`` and ``tool0`` both welded to
``wrist_3_link``) that chain is taken, with the tip being the single leaf, or that moving link
itself when several leaves hang from it. Otherwise (an arm with a gripper's fingers) the error
lists the candidate tips; pass ``tip_link``.

Writing
-------
:func:`to_urdf` writes jaxarm's canonical bodies (:func:`jaxarm.arm.body_model`): one link per
body whose frame has z on the joint axis, a ``base_link`` (behind a fixed joint from ``world``
when ``arm.base`` is not the identity) and a ``tool`` link on a fixed joint. Reading it back
gives the same dynamics and tool pose, but the link frames are the body frames, not the arm's
DH frames. URDF has no field for reflected rotor inertia, gear ratios, asymmetric Coulomb
friction, the electrical motor model or gravity: these are dropped with an XML comment (and a
warning for the ones that change the dynamics: rotor inertia, asymmetric Coulomb friction,
gravity other than the default).
"""

from __future__ import annotations

import os
import re
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import jax
import numpy as np

from ..core.io import write_text_atomic
from ..core.spatial import matrix_to_rpy, rpy_to_matrix
from .arm import Arm, body_model, make_arm

__all__ = ["UrdfError", "load_urdf", "save_urdf", "to_urdf"]

DEFAULT_GRAVITY = (0.0, 0.0, -9.81)
MOVING_TYPES = ("revolute", "continuous", "prismatic")
JOINT_TYPES = (*MOVING_TYPES, "fixed", "floating", "planar")


class UrdfError(ValueError):
    """A URDF file that jaxarm cannot read (the message names the file and the element)."""


# --------------------------------------------------------------------------------------
# Small geometry helpers (plain NumPy float64: this runs once, outside any trace)


def _transform(xyz, rpy) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = rpy_to_matrix(np.asarray(rpy, dtype=float))
    T[:3, 3] = xyz
    return T


def _combine(parts):
    """Total (mass, com, inertia about com) of parts [(m, c, I_c)] in one frame (Ch.10 eq. 10.13)."""
    m = sum(p[0] for p in parts)
    if m > 0:
        c = sum(p[0] * p[1] for p in parts) / m
    else:
        c = np.zeros(3)
    inertia = np.zeros((3, 3))
    for mi, ci, Ii in parts:
        d = ci - c
        inertia += Ii + mi * (d @ d * np.eye(3) - np.outer(d, d))
    return m, c, inertia


# --------------------------------------------------------------------------------------
# Parsing


@dataclass
class _Joint:
    name: str
    type: str
    parent: str
    child: str
    origin: np.ndarray  # 4x4 placement in the parent link frame
    xyz: np.ndarray
    rpy: np.ndarray
    axis: np.ndarray
    lower: float
    upper: float
    velocity: float
    effort: float
    damping: float
    friction: float
    mimic: bool


@dataclass
class _Link:
    name: str
    mass: float = 0.0
    com: np.ndarray = field(default_factory=lambda: np.zeros(3))
    inertia: np.ndarray = field(default_factory=lambda: np.zeros((3, 3)))
    geometry: bool = False


class _Reader:
    """Turns elements into numbers, raising one-line :class:`UrdfError` s that name the element."""

    def __init__(self, fname):
        self.fname = fname

    def error(self, where, msg):
        return UrdfError(f"{self.fname}: {where}: {msg}")

    def numbers(self, elem, attr, count, where, default=None):
        text = elem.get(attr) if elem is not None else None
        if text is None:
            if default is None:
                raise self.error(where, f"missing attribute '{attr}'")
            return np.array(default, dtype=float)
        try:
            values = np.array([float(t) for t in text.split()], dtype=float)
        except ValueError:
            raise self.error(where, f"expected {count} number(s), got {text!r}") from None
        if values.shape != (count,):
            raise self.error(where, f"expected {count} number(s), got {text!r}")
        if not np.all(np.isfinite(values)):
            raise self.error(where, f"expected finite numbers, got {text!r}")
        return values

    def number(self, elem, attr, where, default=None):
        return float(self.numbers(elem, attr, 1, where, None if default is None else [default])[0])

    def origin(self, elem, where):
        o = elem.find("origin")
        xyz = self.numbers(o, "xyz", 3, f"{where}: origin xyz", (0.0, 0.0, 0.0))
        rpy = self.numbers(o, "rpy", 3, f"{where}: origin rpy", (0.0, 0.0, 0.0))
        return xyz, rpy

    def link(self, elem) -> _Link:
        name = elem.get("name")
        where = f"link '{name}'"
        link = _Link(name=name, geometry=elem.find("visual") is not None or elem.find("collision") is not None)
        inertial = elem.find("inertial")
        if inertial is None:
            return link
        xyz, rpy = self.origin(inertial, f"{where}: inertial")
        mass_elem = inertial.find("mass")
        if mass_elem is None:
            raise self.error(f"{where}: inertial", "missing <mass value=...>")
        mass = self.number(mass_elem, "value", f"{where}: inertial mass")
        if mass < 0:
            raise self.error(f"{where}: inertial mass", f"expected a non-negative mass, got {mass!r}")
        I = np.zeros((3, 3))
        ie = inertial.find("inertia")
        if ie is not None:
            v = {k: self.number(ie, k, f"{where}: inertia {k}") for k in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz")}
            I = np.array(
                [
                    [v["ixx"], v["ixy"], v["ixz"]],
                    [v["ixy"], v["iyy"], v["iyz"]],
                    [v["ixz"], v["iyz"], v["izz"]],
                ]
            )
        R = rpy_to_matrix(rpy)
        link.mass, link.com, link.inertia = mass, xyz, R @ I @ R.T  # Ch.10 eq. 10.18
        return link

    def joint(self, elem, links) -> _Joint:
        name = elem.get("name")
        where = f"joint '{name}'"
        jtype = elem.get("type")
        if jtype is None:
            raise self.error(where, "type: missing attribute 'type'")
        if jtype not in JOINT_TYPES:
            raise self.error(where, f"type: unknown joint type {jtype!r} (expected one of {', '.join(JOINT_TYPES)})")
        ends = {}
        for role in ("parent", "child"):
            e = elem.find(role)
            lname = e.get("link") if e is not None else None
            if lname is None:
                raise self.error(where, f"{role}: missing <{role} link=...>")
            if lname not in links:
                raise self.error(where, f"{role}: link {lname!r} does not exist")
            ends[role] = lname
        xyz, rpy = self.origin(elem, where)
        axis = self.numbers(elem.find("axis"), "xyz", 3, f"{where}: axis", (1.0, 0.0, 0.0))
        if jtype in MOVING_TYPES:
            norm = np.linalg.norm(axis)
            if norm == 0:
                raise self.error(f"{where}: axis", "expected a non-zero vector, got '0 0 0'")
            axis = axis / norm
        lower, upper, velocity, effort = -np.inf, np.inf, np.inf, np.inf
        limit = elem.find("limit")
        if limit is not None:
            if jtype != "continuous":
                if limit.get("lower") is not None:
                    lower = self.number(limit, "lower", f"{where}: limit lower")
                if limit.get("upper") is not None:
                    upper = self.number(limit, "upper", f"{where}: limit upper")
                if jtype in MOVING_TYPES and not lower < upper:
                    raise self.error(f"{where}: limit", f"expected lower < upper, got lower={lower!r}, upper={upper!r}")
            bounds = {}
            for attr in ("velocity", "effort"):
                value = self.number(limit, attr, f"{where}: limit {attr}", 0.0)
                if value < 0:
                    raise self.error(f"{where}: limit {attr}", f"expected >= 0 (0 = no limit), got {value!r}")
                bounds[attr] = value if value > 0 else np.inf
            velocity, effort = bounds["velocity"], bounds["effort"]
        dyn = elem.find("dynamics")
        damping = self.number(dyn, "damping", f"{where}: dynamics damping", 0.0) if dyn is not None else 0.0
        friction = self.number(dyn, "friction", f"{where}: dynamics friction", 0.0) if dyn is not None else 0.0
        for attr, value in (("damping", damping), ("friction", friction)):
            if value < 0:
                raise self.error(f"{where}: dynamics {attr}", f"expected >= 0, got {value!r}")
        return _Joint(
            name=name,
            type=jtype,
            parent=ends["parent"],
            child=ends["child"],
            origin=_transform(xyz, rpy),
            xyz=xyz,
            rpy=rpy,
            axis=axis,
            lower=lower,
            upper=upper,
            velocity=velocity,
            effort=effort,
            damping=damping,
            friction=friction,
            mimic=elem.find("mimic") is not None,
        )


def _parse(text, fname):
    """Links (dict by name) and joints (list, document order) of a URDF document."""
    rd = _Reader(fname)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        line, col = exc.position
        msg = str(exc).split(":")[0]
        raise UrdfError(f"{fname}: malformed XML at line {line}, column {col + 1}: {msg}") from None
    if root.tag != "robot":
        raise UrdfError(f"{fname}: root element: expected <robot>, got <{root.tag}>")
    name = root.get("name") or os.path.splitext(fname)[0]
    links = {}
    for k, e in enumerate(root.findall("link")):
        lname = e.get("name")
        if not lname:
            raise UrdfError(f"{fname}: link #{k + 1}: missing attribute 'name'")
        if lname in links:
            raise UrdfError(f"{fname}: link '{lname}': name: defined twice")
        links[lname] = rd.link(e)
    if not links:
        raise UrdfError(f"{fname}: robot '{name}': no <link> elements")
    joints = []
    seen = set()
    for k, e in enumerate(root.findall("joint")):
        jname = e.get("name")
        if not jname:
            raise UrdfError(f"{fname}: joint #{k + 1}: missing attribute 'name'")
        if jname in seen:
            raise UrdfError(f"{fname}: joint '{jname}': name: defined twice")
        seen.add(jname)
        joints.append(rd.joint(e, links))
    return name, links, joints


class _Tree:
    """The link tree: parent joint of each link, child joints of each link (document order)."""

    def __init__(self, links, joints, fname):
        self.fname = fname
        self.parent = {}
        self.children = {name: [] for name in links}
        for j in joints:
            if j.child in self.parent:
                first = self.parent[j.child].name
                raise UrdfError(
                    f"{fname}: joint '{j.name}': child: link '{j.child}' already has parent joint '{first}' "
                    "(closed kinematic chains are not supported)"
                )
            self.parent[j.child] = j
            self.children[j.parent].append(j)
        roots = [name for name in links if name not in self.parent]
        if len(roots) != 1:
            if not roots:
                raise UrdfError(f"{fname}: robot: no root link (the joints form a closed kinematic chain, which is not supported)")
            raise UrdfError(f"{fname}: robot: several root links {roots} (a URDF describes one connected tree)")
        self.root = roots[0]
        reached = set(self.subtree(self.root))
        for j in joints:
            if j.child not in reached:
                raise UrdfError(f"{fname}: joint '{j.name}': closed kinematic chain through link '{j.child}' is not supported")

    def subtree(self, link):
        """Links below ``link`` (itself first), depth first."""
        out, stack = [], [link]
        while stack:
            name = stack.pop()
            out.append(name)
            stack.extend(j.child for j in reversed(self.children[name]))
        return out

    def path(self, base, tip):
        """Joints from base to tip, or None if tip is not below base."""
        joints = []
        link = tip
        while link != base:
            j = self.parent.get(link)
            if j is None:
                return None
            joints.append(j)
            link = j.parent
        return joints[::-1]

    def default_tip(self, base):
        """See the module docstring: the end of the only moving chain below ``base``."""
        leaves = []  # (leaf, deepest moving link on its path)
        stack = [(base, None)]
        while stack:
            link, moving = stack.pop()
            if not self.children[link]:
                if moving is not None:
                    leaves.append((link, moving))
            for j in reversed(self.children[link]):
                stack.append((j.child, j.child if j.type != "fixed" else moving))
        if not leaves:
            raise UrdfError(f"{self.fname}: link '{base}': no moving joint below the base link")
        ends = {m for _, m in leaves}
        deepest = [e for e in ends if not any(o != e and self.path(e, o) is not None for o in ends)]
        if len(deepest) > 1:
            names = ", ".join(repr(leaf) for leaf, _ in leaves)
            raise UrdfError(f"{self.fname}: tip_link: several candidate tip links {names}; pass tip_link=... to choose the arm's end")
        end = deepest[0]
        hanging = [leaf for leaf, m in leaves if m == end]
        return hanging[0] if len(hanging) == 1 else end


def _placement(T_fold, joint):
    """Placement (xyz, rpy) of a joint after the fixed transform T_fold; the URDF values verbatim
    when nothing is folded."""
    if T_fold is None:
        return joint.xyz, joint.rpy
    T = T_fold @ joint.origin
    return T[:3, 3].copy(), matrix_to_rpy(T[:3, :3])


def _merge_body(tree, links, start, stop):
    """Mass, com and inertia (in ``start``'s frame) of ``start`` and everything welded to it,
    not descending through joint ``stop``. Returns (mass, com, inertia, locked moving joints)."""
    parts, locked = [], []
    stack = [(start, np.eye(4))]
    while stack:
        name, T = stack.pop()
        link = links[name]
        R, p = T[:3, :3], T[:3, 3]
        parts.append((link.mass, R @ link.com + p, R @ link.inertia @ R.T))
        for j in tree.children[name]:
            if j is stop:
                continue
            if j.type != "fixed":
                locked.append(j.name)
            stack.append((j.child, T @ j.origin))  # a locked joint sits at value 0
    mass, com, inertia = _combine(parts)
    return mass, com, inertia, locked


def _chain(path, base_link, tip_link):
    """Read a URDF file and walk its serial chain base_link -> tip_link: (file name, robot name,
    links, tree, chain joints, moving joints, base link, tip link)."""
    fname = os.path.basename(os.fspath(path))
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise UrdfError(f"{fname}: cannot read: {exc.strerror or exc}") from None
    name, links, joints = _parse(text, fname)
    tree = _Tree(links, joints, fname)

    base = tree.root if base_link is None else base_link
    if base not in links:
        raise UrdfError(f"{fname}: base_link: link {base!r} does not exist")
    if tip_link is None:
        tip = tree.default_tip(base)
    else:
        tip = tip_link
        if tip not in links:
            raise UrdfError(f"{fname}: tip_link: link {tip!r} does not exist")
    chain = tree.path(base, tip)
    if chain is None:
        raise UrdfError(f"{fname}: tip_link: link {tip!r} is not below base_link {base!r}")
    moving = [j for j in chain if j.type != "fixed"]
    if not moving:
        raise UrdfError(f"{fname}: tip_link: no moving joint between links {base!r} and {tip!r}")
    for j in moving:
        if j.type in ("floating", "planar"):
            raise UrdfError(
                f"{fname}: joint '{j.name}': type: {j.type} joints are not supported (jaxarm models fixed-base "
                "serial arms; pass base_link=... to start the chain below it)"
            )
        if j.mimic:
            raise UrdfError(f"{fname}: joint '{j.name}': mimic: mimic joints are not supported on the arm's chain")

    return fname, name, links, tree, chain, moving, base, tip


def urdf_joint_names(path, *, base_link=None, tip_link=None) -> tuple:
    """The names of the moving joints of a URDF file's chain ``base_link`` -> ``tip_link``, in the
    order :func:`load_urdf` numbers them (joint 1 first): what a log's columns or a ROS
    ``joint_states`` message call them (see :func:`jaxarm.load_log`'s ``joint_names``)."""
    return tuple(j.name for j in _chain(path, base_link, tip_link)[5])


def load_urdf(path, *, base_link=None, tip_link=None, gravity=DEFAULT_GRAVITY) -> Arm:
    """Read the serial chain ``base_link`` -> ``tip_link`` of a URDF file into an :class:`Arm`.

    ``base_link`` defaults to the root link, ``tip_link`` to the end of the only moving chain
    (see the module docstring for both and for how every element is read). Returns a
    ``"placement"`` arm named after the robot, with ``base`` = identity (the world frame is
    ``base_link``'s frame), ``tool`` = the tip link's frame in the last moving link's frame, and
    ``gravity`` (URDF has no gravity; default (0, 0, -9.81)). Raises :class:`UrdfError`.
    """
    fname, name, links, tree, chain, moving, base, tip = _chain(path, base_link, tip_link)

    # Fold fixed transforms into the next joint's placement or into the tool.
    xyz, rpy, axis, types = [], [], [], []
    T_fold = None
    for j in chain:
        if j.type == "fixed":
            T_fold = j.origin if T_fold is None else T_fold @ j.origin
            continue
        p, r = _placement(T_fold, j)
        xyz.append(p)
        rpy.append(r)
        axis.append(j.axis)
        types.append("prismatic" if j.type == "prismatic" else "revolute")
        T_fold = None
    tool = np.eye(4) if T_fold is None else T_fold

    # One body per moving joint: its child link and everything welded to it.
    mass, com, inertia, locked = [], [], [], []
    for k, j in enumerate(moving):
        stop = moving[k + 1] if k + 1 < len(moving) else None
        m, c, I, lk = _merge_body(tree, links, j.child, stop)
        mass.append(m)
        com.append(c)
        inertia.append(I)
        locked.extend(lk)

    if locked:
        warnings.warn(
            f"{fname}: joints {', '.join(repr(n) for n in locked)} are not on the chain {base!r} -> {tip!r}: "
            "locked at 0 and their links merged into the body they hang from",
            stacklevel=2,
        )

    try:
        return make_arm(
            types,
            convention="placement",
            xyz=np.array(xyz),
            rpy=np.array(rpy),
            axis=np.array(axis),
            mass=np.array(mass),
            com=np.array(com),
            inertia=np.array(inertia),
            viscous_friction=[j.damping for j in moving],
            coulomb_friction=[j.friction for j in moving],
            position_limits=[(j.lower, j.upper) for j in moving],
            velocity_limits=[j.velocity for j in moving],
            torque_limits=[j.effort for j in moving],
            gravity=gravity,
            tool=tool,
            name=name,
        )
    except ValueError as exc:  # make_arm names "joint i"; say which URDF joint that is
        msg = str(exc)
        match = re.match(r"joint (\d+): ", msg)
        if match:
            msg = f"joint '{moving[int(match.group(1)) - 1].name}': " + msg[match.end():]
        raise UrdfError(f"{fname}: {msg}") from None


# --------------------------------------------------------------------------------------
# Writing


def _num(x) -> str:
    """Shortest text that reads back to the same float64 (repr round-trips)."""
    return repr(float(x) + 0.0)  # + 0.0 turns -0.0 into 0.0


def _nums(xs) -> str:
    return " ".join(_num(x) for x in np.ravel(xs))


@dataclass
class _Canonical:
    """An arm's canonical bodies in NumPy float64 (see :func:`jaxarm.arm.body_model`)."""

    rotation: np.ndarray  # (n, 3, 3) placement of body i in body i-1 (body 0 = frame 0)
    translation: np.ndarray  # (n, 3)
    mass: np.ndarray  # (n,)
    com: np.ndarray  # (n, 3) in the body frame
    inertia: np.ndarray  # (n, 3, 3) about the COM, body frame
    tip: np.ndarray  # (4, 4) tool in the last body frame
    base: np.ndarray  # (4, 4)
    gravity: np.ndarray  # (3,)
    damping: np.ndarray  # (n,) B G^2
    coulomb: np.ndarray  # (n, 2) |G| Tc
    armature: np.ndarray  # (n,) G^2 Jm


def _canonical(arm: Arm) -> _Canonical:
    if not isinstance(arm, Arm):
        raise TypeError(f"arm: expected a jaxarm.Arm, got {type(arm).__name__}")
    if np.ndim(arm.links.mass) != 1:
        raise ValueError(f"arm: expected a single arm, got leaves with a batch axis (links.mass shape {np.shape(arm.links.mass)})")
    with jax.enable_x64(True):  # exact float64 whatever the global setting
        arm64 = jax.tree_util.tree_map(lambda x: np.asarray(x, dtype=np.float64), arm)
        b = body_model(arm64, xp=np)
    mass = b.mass
    safe = np.where(mass > 0, mass, 1.0)
    com = np.where(mass[:, None] > 0, b.first_moment / safe[:, None], 0.0)
    # Parallel-axis theorem back to the COM (Ch.10 eq. 10.13)
    inertia = b.inertia_origin - mass[:, None, None] * (np.einsum("ni,ni->n", com, com)[:, None, None] * np.eye(3) - np.einsum("ni,nj->nij", com, com))
    inertia = 0.5 * (inertia + np.swapaxes(inertia, 1, 2))
    tip = np.eye(4)
    tip[:3, :3], tip[:3, 3] = b.tip_rotation, b.tip_translation
    dr = arm64.drives
    G = dr.gear_ratio
    return _Canonical(
        rotation=b.rotation,
        translation=b.translation,
        mass=mass,
        com=com,
        inertia=inertia,
        tip=tip,
        base=arm64.base,
        gravity=arm64.gravity,
        damping=dr.viscous_friction * G * G,
        coulomb=np.abs(G)[:, None] * dr.coulomb_friction,
        armature=G * G * dr.rotor_inertia,
    )


def _symmetric_coulomb(c: _Canonical, arm: Arm, func: str):
    """Per-joint symmetric Coulomb friction (mean magnitude), warning when that changes the arm."""
    plus, minus = c.coulomb[:, 0], -c.coulomb[:, 1]
    asym = np.flatnonzero(~np.isclose(plus, minus, rtol=1e-12, atol=0.0))
    if asym.size:
        warnings.warn(
            f"{func}: arm {arm.name!r}: joints {(asym + 1).tolist()} have asymmetric Coulomb friction; "
            "written as the mean magnitude (|Tc+| + |Tc-|) / 2",
            stacklevel=3,
        )
    return 0.5 * (plus + minus), asym


def _atomic_write(path, text: str) -> None:
    """Write text to path atomically (see :func:`jaxarm.core.io.write_text_atomic`)."""

    write_text_atomic(path, text)


def _origin(parent, T):
    ET.SubElement(parent, "origin", xyz=_nums(T[:3, 3]), rpy=_nums(matrix_to_rpy(T[:3, :3])))


def to_urdf(arm: Arm) -> str:
    """The arm as URDF text (see the module docstring, "Writing")."""
    c = _canonical(arm)
    n = arm.n
    robot = ET.Element("robot", name=arm.name)
    notes = [
        f"Written by jaxarm from the {arm.convention!r} arm {arm.name!r}. Link frames are jaxarm's canonical "
        "body frames (z on the joint axis); damping and friction are joint-side values (B G^2, |G| Tc).",
    ]
    coulomb, asym = _symmetric_coulomb(c, arm, "save_urdf")
    if asym.size:
        notes.append(f"Asymmetric Coulomb friction [+, -] per joint {c.coulomb.tolist()} written as the mean magnitude.")
    if np.any(c.armature != 0):
        notes.append(f"Reflected rotor inertia G^2 Jm {c.armature.tolist()} has no URDF field and is dropped.")
        warnings.warn(f"save_urdf: arm {arm.name!r}: reflected rotor inertia has no URDF field and is dropped", stacklevel=3)
    dr = arm.drives
    if np.any(np.asarray(dr.torque_constant) != 0):
        notes.append("The electrical motor model (torque constant, resistance, voltage limit) is dropped.")
    if not np.array_equal(c.gravity, DEFAULT_GRAVITY):
        notes.append(f"gravity {c.gravity.tolist()} (URDF has no gravity field; pass it to load_urdf).")
        warnings.warn(f"save_urdf: arm {arm.name!r}: gravity {c.gravity.tolist()} is not stored in URDF (only noted in a comment)", stacklevel=3)
    notes.append("Missing lower/upper and velocity/effort 0 mean 'no limit' to jaxarm.load_urdf.")
    for note in notes:
        robot.append(ET.Comment(" " + note + " "))

    if not np.array_equal(c.base, np.eye(4)):
        ET.SubElement(robot, "link", name="world")
        j = ET.SubElement(robot, "joint", name="base_joint", type="fixed")
        ET.SubElement(j, "parent", link="world")
        ET.SubElement(j, "child", link="base_link")
        _origin(j, c.base)
    ET.SubElement(robot, "link", name="base_link")
    parent = "base_link"
    lims = arm.limits
    for i in range(n):
        link = ET.SubElement(robot, "link", name=f"link{i + 1}")
        inertial = ET.SubElement(link, "inertial")
        ET.SubElement(inertial, "origin", xyz=_nums(c.com[i]), rpy="0 0 0")
        ET.SubElement(inertial, "mass", value=_num(c.mass[i]))
        I = c.inertia[i]
        ET.SubElement(
            inertial,
            "inertia",
            ixx=_num(I[0, 0]),
            ixy=_num(I[0, 1]),
            ixz=_num(I[0, 2]),
            iyy=_num(I[1, 1]),
            iyz=_num(I[1, 2]),
            izz=_num(I[2, 2]),
        )
        lo, hi = (float(x) for x in np.asarray(lims.position[i]))
        vel, eff = float(np.asarray(lims.velocity[i])), float(np.asarray(lims.torque[i]))
        revolute = arm.is_revolute[i]
        jtype = "prismatic" if not revolute else ("continuous" if np.isinf(lo) and np.isinf(hi) else "revolute")
        joint = ET.SubElement(robot, "joint", name=f"joint{i + 1}", type=jtype)
        ET.SubElement(joint, "parent", link=parent)
        ET.SubElement(joint, "child", link=f"link{i + 1}")
        T = np.eye(4)
        T[:3, :3], T[:3, 3] = c.rotation[i], c.translation[i]
        _origin(joint, T)
        ET.SubElement(joint, "axis", xyz="0 0 1")
        limit = {}
        if jtype != "continuous":
            if np.isfinite(lo):
                limit["lower"] = _num(lo)
            if np.isfinite(hi):
                limit["upper"] = _num(hi)
        if jtype != "continuous" or np.isfinite(vel) or np.isfinite(eff):
            limit["effort"] = _num(eff) if np.isfinite(eff) else "0"
            limit["velocity"] = _num(vel) if np.isfinite(vel) else "0"
        if limit:
            ET.SubElement(joint, "limit", **limit)
        if c.damping[i] != 0 or coulomb[i] != 0:
            ET.SubElement(joint, "dynamics", damping=_num(c.damping[i]), friction=_num(coulomb[i]))
        parent = f"link{i + 1}"
    ET.SubElement(robot, "link", name="tool")
    joint = ET.SubElement(robot, "joint", name="tool_joint", type="fixed")
    ET.SubElement(joint, "parent", link=parent)
    ET.SubElement(joint, "child", link="tool")
    _origin(joint, c.tip)
    ET.indent(robot, space="  ")
    return '<?xml version="1.0"?>\n' + ET.tostring(robot, encoding="unicode") + "\n"


def save_urdf(arm: Arm, path) -> None:
    """Write the arm as a URDF file (atomically: a temporary file in the same folder, then
    ``os.replace``). ``load_urdf(path)`` gives back an arm with the same dynamics and tool pose;
    reflected rotor inertia and other fields URDF cannot hold are dropped (see the module docstring)."""
    _atomic_write(path, to_urdf(arm))
