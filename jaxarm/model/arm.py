"""The arm model: an immutable pytree of physical parameters.

An :class:`Arm` holds arrays only (its leaves), so ``jax.grad(f)(arm)`` returns the
derivative of ``f`` with respect to every physical parameter -- this *is* parameter
identification. Static structure (joint count, joint types, kinematic convention,
name) is hashable metadata: changing it recompiles, changing a value does not.

Kinematic conventions
---------------------
``"standard"`` (distal DH, chapter 10 / Corke):
    ``T_i = Rz(theta_i + q_i) Tz(d_i) Tx(a_i) Rx(alpha_i)``; link i's frame sits at
    the distal end of link i, joint i moves about z_{i-1}.
``"modified"`` (proximal DH, Craig 3.6):
    ``T_i = Rx(alpha_{i-1}) Tx(a_{i-1}) Rz(theta_i + q_i) Tz(d_i)``; link i's frame
    sits on joint i's axis. Row i of the table holds ``a_{i-1}, alpha_{i-1}, d_i, theta_i``.
``"placement"`` (URDF-like):
    joint i is a fixed placement (``xyz``, ``rpy``) in the parent body's frame
    followed by a motion about a unit ``axis``; the child body frame moves with it.

For prismatic joints ``q_i`` adds to ``d_i`` instead of ``theta_i``.

All three reduce to one canonical form used by every algorithm (:func:`body_model`):
body i's frame has its z axis on joint i's axis, its placement in body i-1 is a
constant transform, and the joint's motion is a rotation about / translation along z.

Units are SI (m, kg, kg m^2, s, rad, N, N m, V, ohm). Gravity is the gravitational
acceleration vector expressed in the world frame, default (0, 0, -9.81): "down" is -z.
The world frame is where ``base`` is expressed (base = pose of frame 0 in world).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..core import spatial

REVOLUTE = "revolute"
PRISMATIC = "prismatic"
JOINT_TYPES = (REVOLUTE, PRISMATIC)
CONVENTIONS = ("standard", "modified", "placement")


def _register(data_fields, meta_fields):
    def wrap(cls):
        cls = dataclasses.dataclass(frozen=True, eq=False)(cls)
        if "replace" not in cls.__dict__:  # arm.links.replace(mass=...), as arm.replace(links=...)
            def replace(self, **changes):
                """A copy with the given fields changed (``dataclasses.replace``)."""
                return dataclasses.replace(self, **changes)

            cls.replace = replace
        return jax.tree_util.register_dataclass(cls, data_fields=data_fields, meta_fields=meta_fields)

    return wrap


@_register(["a", "alpha", "d", "theta"], [])
class DH:
    """Denavit-Hartenberg table, each field (n,). Meaning of a row depends on the convention."""

    a: np.ndarray
    alpha: np.ndarray
    d: np.ndarray
    theta: np.ndarray


@_register(["xyz", "rpy", "axis"], [])
class Placements:
    """URDF-like joints: placement xyz (n, 3), rpy (n, 3) in the parent body frame; unit axis (n, 3)."""

    xyz: np.ndarray
    rpy: np.ndarray
    axis: np.ndarray


@_register(["mass", "com", "inertia"], [])
class Links:
    """Per-link inertial parameters in the link frame: mass (n,), com (n, 3), inertia about the COM (n, 3, 3)."""

    mass: np.ndarray
    com: np.ndarray
    inertia: np.ndarray


@_register(
    [
        "gear_ratio",
        "rotor_inertia",
        "viscous_friction",
        "coulomb_friction",
        "torque_constant",
        "resistance",
        "voltage_limit",
        "static_friction",
        "stribeck_velocity",
        "coulomb_velocity_scale",
        "sigmoid_friction",
    ],
    [],
)
class Drives:
    """Per-joint drive (motor + gearbox) parameters, all (n,) except coulomb_friction (n, 2).

    Motor-side values: motor speed is ``gear_ratio * qd``, joint torque ``gear_ratio * motor torque``.
    ``coulomb_friction[:, 0]`` applies for positive joint velocity, ``[:, 1]`` for negative
    (usually negative itself). ``torque_constant == 0`` means "no electrical motor model".

    Friction models (each term is zero with its default parameters, so a joint "selects" a model
    by the parameters it sets; see :func:`jaxarm.friction_torques`):
    viscous ``B``; Coulomb ``Tc+/Tc-`` with exact sign (``coulomb_velocity_scale == 0``) or
    smoothed by tanh(qd / scale); Stribeck breakaway ``static_friction`` (motor side, peak
    magnitude Ts > |Tc|) decaying with ``stribeck_velocity`` (joint side, rad/s or m/s);
    and the Panda's sigmoid model ``sigmoid_friction`` (n, 3) = (phi1, phi2, phi3), joint side.
    """

    gear_ratio: np.ndarray
    rotor_inertia: np.ndarray
    viscous_friction: np.ndarray
    coulomb_friction: np.ndarray
    torque_constant: np.ndarray
    resistance: np.ndarray
    voltage_limit: np.ndarray
    static_friction: np.ndarray
    stribeck_velocity: np.ndarray
    coulomb_velocity_scale: np.ndarray
    sigmoid_friction: np.ndarray


@_register(["position", "velocity", "torque"], [])
class Limits:
    """Joint limits: position (n, 2) [lower, upper], velocity (n,), torque (n,) (infinite = none)."""

    position: np.ndarray
    velocity: np.ndarray
    torque: np.ndarray


@_register(["mass", "com", "inertia"], [])
class Payload:
    """A load held by the tool: mass (), com (3,) in the tool frame, inertia (3, 3) about its COM."""

    mass: np.ndarray
    com: np.ndarray
    inertia: np.ndarray


@_register(
    ["kinematics", "links", "drives", "limits", "payload", "gravity", "base", "tool"],
    ["joint_types", "convention", "name"],
)
class Arm:
    """A serial arm. Build with :func:`make_arm` or :func:`jaxarm.load_arm`.

    Leaves (arrays): ``kinematics`` (:class:`DH` or :class:`Placements`), ``links``,
    ``drives``, ``limits``, ``payload``, ``gravity`` (3,), ``base`` (4, 4), ``tool`` (4, 4).
    Static: ``joint_types`` (tuple of "revolute"/"prismatic"), ``convention``, ``name``.
    """

    kinematics: DH | Placements
    links: Links
    drives: Drives
    limits: Limits
    payload: Payload
    gravity: np.ndarray
    base: np.ndarray
    tool: np.ndarray
    joint_types: tuple
    convention: str
    name: str

    @property
    def n(self) -> int:
        """Number of joints."""
        return len(self.joint_types)

    @property
    def is_revolute(self) -> tuple:
        return tuple(t == REVOLUTE for t in self.joint_types)

    def replace(self, **changes) -> "Arm":
        """A copy with some fields replaced (the arm itself is immutable)."""
        return dataclasses.replace(self, **changes)

    def astype(self, dtype) -> "Arm":
        """The same arm with every leaf cast to ``dtype`` (e.g. jnp.float32 for speed)."""
        return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype), self)

    def with_payload(self, mass, com=(0.0, 0.0, 0.0), inertia=None) -> "Arm":
        """The arm holding a payload at the tool (com in the tool frame, inertia about its COM)."""
        inertia = np.zeros((3, 3)) if inertia is None else _inertia_matrix(inertia, "payload.inertia")
        payload = Payload(
            mass=np.asarray(mass, dtype=float),
            com=_vector(com, 3, "payload.com"),
            inertia=inertia,
        )
        if np.ndim(payload.mass) != 0 or not payload.mass >= 0:
            raise ValueError(f"payload.mass: expected a non-negative number, got {mass!r}")
        return self.replace(payload=payload)

    def __repr__(self) -> str:
        return f"Arm(name={self.name!r}, n={self.n}, convention={self.convention!r}, joint_types={self.joint_types})"


# --------------------------------------------------------------------------------------
# Construction with validation


def _vector(x, length, field):
    arr = np.asarray(x, dtype=float)
    if arr.shape != (length,):
        raise ValueError(f"{field}: expected {length} numbers, got shape {arr.shape}")
    return arr


def _inertia_matrix(x, field):
    arr = np.asarray(x, dtype=float)
    if arr.shape == (3,):
        return np.diag(arr)
    if arr.shape == (6,):  # xx, xy, xz, yy, yz, zz
        xx, xy, xz, yy, yz, zz = arr
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    if arr.shape != (3, 3):
        raise ValueError(f"{field}: expected 3 diagonal values, 6 values (xx, xy, xz, yy, yz, zz) or a 3x3 matrix, got shape {arr.shape}")
    return arr


def _per_joint(x, n, field, default, tail=()):
    """Broadcast a per-joint field to (n, *tail) with a clear error on a wrong shape."""
    if x is None:
        return np.broadcast_to(np.asarray(default, dtype=float), (n, *tail)).copy()
    arr = np.asarray(x, dtype=float)
    if arr.shape == tail and n != 1 and tail != ():
        arr = np.broadcast_to(arr, (n, *tail))
    if arr.shape == () and tail == ():
        arr = np.full((n,), float(arr))
    if arr.shape != (n, *tail):
        raise ValueError(f"{field}: expected shape {(n, *tail)} (one value per joint), got {arr.shape}")
    return arr.copy()


def _transform(x, field):
    if x is None:
        return np.eye(4)
    arr = np.asarray(x, dtype=float)
    if arr.shape != (4, 4):
        raise ValueError(f"{field}: expected a 4x4 homogeneous transform, got shape {arr.shape}")
    R = arr[:3, :3]
    if not np.allclose(arr[3], [0, 0, 0, 1]) or not np.allclose(R @ R.T, np.eye(3), atol=1e-9) or np.linalg.det(R) < 0:
        raise ValueError(f"{field}: expected a rigid transform (orthonormal rotation, last row 0 0 0 1)")
    return arr


def make_arm(
    joint_types,
    *,
    convention="standard",
    a=None,
    alpha=None,
    d=None,
    theta=None,
    xyz=None,
    rpy=None,
    axis=None,
    mass=None,
    com=None,
    inertia=None,
    gear_ratio=None,
    rotor_inertia=None,
    viscous_friction=None,
    coulomb_friction=None,
    torque_constant=None,
    resistance=None,
    voltage_limit=None,
    static_friction=None,
    stribeck_velocity=None,
    coulomb_velocity_scale=None,
    sigmoid_friction=None,
    position_limits=None,
    velocity_limits=None,
    torque_limits=None,
    gravity=(0.0, 0.0, -9.81),
    base=None,
    tool=None,
    name="arm",
) -> Arm:
    """Build a validated :class:`Arm` from per-joint arrays.

    ``joint_types``: sequence of "revolute"/"prismatic" (or "R"/"P"). Absent fields mean
    zero / ideal: no mass, gear ratio 1, no rotor inertia, no friction, no limits.
    ``inertia`` per link: (n, 3) diagonals, (n, 6) (xx, xy, xz, yy, yz, zz) or (n, 3, 3), about the COM.
    """
    short = {"r": REVOLUTE, "p": PRISMATIC}
    types = []
    for i, t in enumerate(joint_types):
        t = short.get(str(t).lower(), str(t).lower())
        if t not in JOINT_TYPES:
            raise ValueError(f"joint {i + 1}: type: expected 'revolute' or 'prismatic', got {t!r}")
        types.append(t)
    n = len(types)
    if n == 0:
        raise ValueError("joint_types: an arm needs at least one joint")
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")

    if convention == "placement":
        if any(v is not None for v in (a, alpha, d, theta)):
            raise ValueError("a/alpha/d/theta: DH values given for a 'placement' arm; use xyz/rpy/axis")
        kin = Placements(
            xyz=_per_joint(xyz, n, "xyz", 0.0, (3,)),
            rpy=_per_joint(rpy, n, "rpy", 0.0, (3,)),
            axis=_per_joint(axis, n, "axis", (0.0, 0.0, 1.0), (3,)),
        )
        norms = np.linalg.norm(kin.axis, axis=1)
        if np.any(np.abs(norms - 1.0) > 1e-6):
            bad = int(np.argmax(np.abs(norms - 1.0)))
            raise ValueError(f"joint {bad + 1}: axis: expected a unit vector, got {kin.axis[bad].tolist()}")
    else:
        if any(v is not None for v in (xyz, rpy, axis)):
            raise ValueError("xyz/rpy/axis: placement values given for a DH arm")
        kin = DH(
            a=_per_joint(a, n, "a", 0.0),
            alpha=_per_joint(alpha, n, "alpha", 0.0),
            d=_per_joint(d, n, "d", 0.0),
            theta=_per_joint(theta, n, "theta", 0.0),
        )

    mass_arr = _per_joint(mass, n, "mass", 0.0)
    if inertia is None:
        inertia_arr = np.zeros((n, 3, 3))
    else:
        raw = np.asarray(inertia, dtype=float)
        if raw.ndim == 0 or raw.shape[0] != n:
            raise ValueError(f"inertia: expected one entry per joint ({n}), got shape {raw.shape}")
        inertia_arr = np.stack([_inertia_matrix(raw[i], f"joint {i + 1}: inertia") for i in range(n)])
    links = Links(mass=mass_arr, com=_per_joint(com, n, "com", 0.0, (3,)), inertia=inertia_arr)

    coulomb = None if coulomb_friction is None else np.asarray(coulomb_friction, dtype=float)
    if coulomb is not None and coulomb.shape == (n,):  # symmetric: +Tc for qd > 0, -Tc for qd < 0
        coulomb = np.stack([coulomb, -coulomb], axis=1)
    drives = Drives(
        gear_ratio=_per_joint(gear_ratio, n, "gear_ratio", 1.0),
        rotor_inertia=_per_joint(rotor_inertia, n, "rotor_inertia", 0.0),
        viscous_friction=_per_joint(viscous_friction, n, "viscous_friction", 0.0),
        coulomb_friction=_per_joint(coulomb, n, "coulomb_friction", 0.0, (2,)),
        torque_constant=_per_joint(torque_constant, n, "torque_constant", 0.0),
        resistance=_per_joint(resistance, n, "resistance", 0.0),
        voltage_limit=_per_joint(voltage_limit, n, "voltage_limit", np.inf),
        static_friction=_per_joint(static_friction, n, "static_friction", 0.0),
        stribeck_velocity=_per_joint(stribeck_velocity, n, "stribeck_velocity", 0.0),
        coulomb_velocity_scale=_per_joint(coulomb_velocity_scale, n, "coulomb_velocity_scale", 0.0),
        sigmoid_friction=_per_joint(sigmoid_friction, n, "sigmoid_friction", 0.0, (3,)),
    )
    pos = _per_joint(position_limits, n, "position_limits", (-np.inf, np.inf), (2,))
    limits = Limits(
        position=pos,
        velocity=_per_joint(velocity_limits, n, "velocity_limits", np.inf),
        torque=_per_joint(torque_limits, n, "torque_limits", np.inf),
    )
    payload = Payload(mass=np.asarray(0.0), com=np.zeros(3), inertia=np.zeros((3, 3)))
    arm = Arm(
        kinematics=kin,
        links=links,
        drives=drives,
        limits=limits,
        payload=payload,
        gravity=_vector(gravity, 3, "gravity"),
        base=_transform(base, "base"),
        tool=_transform(tool, "tool"),
        joint_types=tuple(types),
        convention=convention,
        name=str(name),
    )
    validate_arm(arm)
    return arm


def validate_arm(arm: Arm, where: str = "") -> None:
    """Check values that would make the dynamics meaningless; raise ValueError naming the field.

    Physical consistency of the inertias (triangle inequalities etc.) is *not* checked here:
    see :func:`jaxarm.consistency_report`, which published models sometimes fail.
    """
    pre = f"{where}: " if where else ""
    leaves = {
        "links.mass": arm.links.mass,
        "links.com": arm.links.com,
        "links.inertia": arm.links.inertia,
        "gravity": arm.gravity,
    }
    for field, value in leaves.items():
        v = np.asarray(value)
        if not np.all(np.isfinite(v)):
            if field == "gravity":
                raise ValueError(f"{pre}gravity: expected 3 finite numbers, got {v.tolist()}")
            i = int(np.argwhere(~np.isfinite(v))[0][0])
            raise ValueError(f"{pre}joint {i + 1}: {field.split('.')[-1]}: expected finite numbers, got {v[i].tolist()}")
    for i in range(arm.n):
        j = f"{pre}joint {i + 1}: "
        if arm.links.mass[i] < 0:
            raise ValueError(f"{j}mass: expected a non-negative mass, got {arm.links.mass[i]}")
        I = np.asarray(arm.links.inertia[i])
        if not np.allclose(I, I.T, rtol=1e-9, atol=1e-12 * max(1.0, np.abs(I).max())):
            raise ValueError(f"{j}inertia: expected a symmetric matrix, got {I.tolist()}")
        dr = arm.drives
        if dr.rotor_inertia[i] < 0:
            raise ValueError(f"{j}rotor_inertia: expected >= 0, got {dr.rotor_inertia[i]}")
        if dr.viscous_friction[i] < 0:
            raise ValueError(f"{j}viscous_friction: expected >= 0, got {dr.viscous_friction[i]}")
        if dr.resistance[i] < 0:
            raise ValueError(f"{j}resistance: expected >= 0, got {dr.resistance[i]}")
        if dr.torque_constant[i] < 0:
            raise ValueError(f"{j}torque_constant: expected >= 0, got {dr.torque_constant[i]}")
        if dr.static_friction[i] < 0:
            raise ValueError(f"{j}static_friction: expected >= 0, got {dr.static_friction[i]}")
        if dr.static_friction[i] > 0 and not dr.stribeck_velocity[i] > 0:
            raise ValueError(f"{j}stribeck_velocity: expected > 0 when static_friction is set, got {dr.stribeck_velocity[i]}")
        if dr.coulomb_velocity_scale[i] < 0:
            raise ValueError(f"{j}coulomb_velocity_scale: expected >= 0 (0 = exact sign), got {dr.coulomb_velocity_scale[i]}")
        if dr.sigmoid_friction[i][1] < 0:
            raise ValueError(f"{j}sigmoid_friction: expected phi2 >= 0, got {dr.sigmoid_friction[i].tolist()}")
        if not dr.voltage_limit[i] > 0:
            raise ValueError(f"{j}voltage_limit: expected > 0, got {dr.voltage_limit[i]}")
        if dr.gear_ratio[i] == 0 or not np.isfinite(dr.gear_ratio[i]):
            raise ValueError(f"{j}gear_ratio: expected a finite non-zero ratio (negative is allowed), got {dr.gear_ratio[i]}")
        lo, hi = arm.limits.position[i]
        if not lo < hi:
            raise ValueError(f"{j}limits.position: expected lower < upper, got [{lo}, {hi}]")
        if not arm.limits.velocity[i] > 0:
            raise ValueError(f"{j}limits.velocity: expected > 0, got {arm.limits.velocity[i]}")
        if not arm.limits.torque[i] > 0:
            raise ValueError(f"{j}limits.torque: expected > 0, got {arm.limits.torque[i]}")
    if np.asarray(arm.payload.mass) < 0:
        raise ValueError(f"{pre}payload.mass: expected a non-negative mass, got {arm.payload.mass}")


def stack_arms(arms) -> Arm:
    """Stack arms of identical structure into one Arm whose leaves have a leading batch axis.

    Use with ``jax.vmap(f, in_axes=(0, ...))`` to evaluate many arms (e.g. different masses) at once.
    """
    arms = list(arms)
    first = jax.tree_util.tree_structure(arms[0])
    for k, other in enumerate(arms[1:], start=1):
        if jax.tree_util.tree_structure(other) != first:
            raise ValueError(f"arms[{k}]: structure (joint types / convention) differs from arms[0]")
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *arms)


# --------------------------------------------------------------------------------------
# Canonical body model


class Bodies(NamedTuple):
    """The canonical form every algorithm uses (see module docstring).

    rotation: (n, 3, 3) placement rotation of body i's (pre-motion) frame in body i-1's frame
    translation: (n, 3) placement translation (body 0 = frame 0 of the arm)
    mass: (n,), first_moment: (n, 3) = m c, inertia_origin: (n, 3, 3) about body i's origin;
    all in body i's frame, payload included in the last body.
    tip_rotation, tip_translation: pose of the tool frame in the last body frame.
    link_rotation, link_translation: (n, 3, 3), (n, 3) pose of DH link frame i in body frame i.
    """

    rotation: jnp.ndarray
    translation: jnp.ndarray
    mass: jnp.ndarray
    first_moment: jnp.ndarray
    inertia_origin: jnp.ndarray
    tip_rotation: jnp.ndarray
    tip_translation: jnp.ndarray
    link_rotation: jnp.ndarray
    link_translation: jnp.ndarray


def _inertia_about_origin(mass, com, inertia_com, xp=jnp):
    """Parallel-axis theorem in tensor form (Ch.10 eq. 10.13): I_o = I_c + m (c.c 1 - c c^T)."""
    cc = (com * com).sum(-1)
    eye = xp.eye(3, dtype=xp.result_type(com))
    return inertia_com + mass[..., None, None] * (cc[..., None, None] * eye - com[..., :, None] * com[..., None, :])


def body_model(arm: Arm, xp=jnp) -> Bodies:
    """Reduce any convention to placements + motion about local z, with inertias per body.
    ``xp=numpy`` computes it in NumPy (for a concrete arm: no XLA program to compile)."""
    n = arm.n
    kin = arm.kinematics
    def asf(x):  # keep the arm's own float dtype (float32 arms stay float32); ints become floats
        x = xp.asarray(x)
        return x if xp.issubdtype(x.dtype, xp.floating) else x.astype(jnp.result_type(float))

    def per_joint(f, x):  # f on each row of x (n, ...), stacked
        if xp is jnp:
            return jax.vmap(f)(x)
        return np.stack([f(r) for r in x]) if len(x) else np.zeros((0, 3, 3), x.dtype)

    def add_last(a, v):  # a with v added to its last row
        if xp is jnp:
            return a.at[-1].add(v)
        a = a.copy()
        a[-1] += v
        return a

    links = jax.tree_util.tree_map(asf, arm.links)
    payload = jax.tree_util.tree_map(asf, arm.payload)
    tool = asf(arm.tool)
    zeros3 = xp.zeros((n, 3), links.com.dtype)
    eye = xp.broadcast_to(xp.eye(3, dtype=links.com.dtype), (n, 3, 3))

    if arm.convention == "modified":
        a, al, d, th = (asf(x) for x in (kin.a, kin.alpha, kin.d, kin.theta))
        # Craig 3.6: T = Rx(alpha_{i-1}) Tx(a_{i-1}) Rz(theta_i) Tz(d_i), then the joint motion.
        Rx = per_joint(spatial.rot_x, al)
        Rz = per_joint(spatial.rot_z, th)
        rotation = xp.einsum("nij,njk->nik", Rx, Rz)
        translation = xp.stack([a, -xp.sin(al) * d, xp.cos(al) * d], axis=1)
        link_rotation, link_translation = eye, zeros3
    elif arm.convention == "standard":
        a, al, d, th = (asf(x) for x in (kin.a, kin.alpha, kin.d, kin.theta))
        # Ch.10: T_i = Rz(theta_i) Tz(d_i) Tx(a_i) Rx(alpha_i) after the motion about z_{i-1}.
        # Body i = frame i-1 moved by q_i; link frame i = body i * F_i.
        Rz = per_joint(spatial.rot_z, th)
        Rx = per_joint(spatial.rot_x, al)
        F_rot = xp.einsum("nij,njk->nik", Rz, Rx)
        F_trans = xp.stack([a * xp.cos(th), a * xp.sin(th), d], axis=1)
        rotation = xp.concatenate([xp.eye(3, dtype=F_rot.dtype)[None], F_rot[:-1]], axis=0)
        translation = xp.concatenate([xp.zeros((1, 3), F_trans.dtype), F_trans[:-1]], axis=0)
        link_rotation, link_translation = F_rot, F_trans
    else:  # placement: rotate each body so that its joint axis is local z
        xyz, rpy, axis = asf(kin.xyz), asf(kin.rpy), asf(kin.axis)
        R_rpy = per_joint(spatial.rpy_to_matrix, rpy)
        R_axis = per_joint(spatial.rotation_to_axis, axis)  # body frame = URDF child frame * R_axis
        R_prev = xp.concatenate([xp.eye(3, dtype=R_axis.dtype)[None], R_axis[:-1]], axis=0)
        # placement of body i in body i-1: R_prev^T (R_rpy R_axis), translation R_prev^T xyz
        rotation = xp.einsum("nji,njk,nkl->nil", R_prev, R_rpy, R_axis)
        translation = xp.einsum("nji,nj->ni", R_prev, xyz)
        # URDF child (link) frame expressed in body frame: rotation R_axis^T
        link_rotation = xp.swapaxes(R_axis, -1, -2)
        link_translation = zeros3

    # Link inertials (given in link frame i) -> body frame i.
    com_b = xp.einsum("nij,nj->ni", link_rotation, links.com) + link_translation
    inertia_b = xp.einsum("nij,njk,nlk->nil", link_rotation, links.inertia, link_rotation)
    # Tool frame in the last body frame: link frame n * tool.
    tip_rotation = link_rotation[-1] @ tool[:3, :3]
    tip_translation = link_rotation[-1] @ tool[:3, 3] + link_translation[-1]
    # Payload held at the tool: add it to the last body.
    pm = payload.mass
    pc = tip_rotation @ payload.com + tip_translation
    pI = tip_rotation @ payload.inertia @ tip_rotation.T
    mass = add_last(links.mass, pm) if n else links.mass
    first_moment = links.mass[:, None] * com_b
    first_moment = add_last(first_moment, pm * pc)
    inertia_origin = _inertia_about_origin(links.mass, com_b, inertia_b, xp)
    inertia_origin = add_last(inertia_origin, _inertia_about_origin(pm, pc, pI, xp))
    return Bodies(
        rotation=rotation,
        translation=translation,
        mass=mass,
        first_moment=first_moment,
        inertia_origin=inertia_origin,
        tip_rotation=tip_rotation,
        tip_translation=tip_translation,
        link_rotation=link_rotation,
        link_translation=link_translation,
    )
