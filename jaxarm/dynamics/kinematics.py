"""Forward kinematics and the geometric Jacobian."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..core import spatial
from ..model import checks
from ..model.arm import Arm, Bodies, body_model
from . import algebra
from .eager import compiled_when_eager


def joint_transform(bodies: Bodies, i: int, revolute: bool, qi):
    """Pose (R, p) of body i in body i-1 at joint value qi: placement, then motion about z.

    Revolute: R = R0 Rz(qi) (Craig 2.74), i.e. R0's first two columns mixed by cos qi and sin qi;
    the sine and cosine are the vectorizable polynomials of :func:`jaxarm.algebra.sincos`
    (XLA:CPU evaluates ``jnp.sin``/``jnp.cos`` in float64 by a scalar library call per value).
    """
    R0, p0 = bodies.rotation[i], bodies.translation[i]
    if revolute:
        s, c = algebra.sincos(qi)
        x, y = R0[:, 0], R0[:, 1]
        return jnp.stack([x * c + y * s, y * c - x * s, R0[:, 2]], axis=1), p0
    return R0, p0 + R0[:, 2] * qi


# --------------------------------------------------------------------------------------
# Joint transforms


def joint_frames(bodies, is_revolute, q, sincos=algebra.sincos):
    """Pose (R, p) of every body in its parent at joint values q: a list of n pairs, R a
    tuple of rows, p a 3-tuple (see :func:`joint_transform`).

    Revolute: R = R0 Rz(q) (Craig 2.74), so R's first two columns mix R0's by cos q and sin q
    and its third is R0's; prismatic: R = R0, p = p0 + q R0 z. ``sincos``: how the joint angles'
    sines and cosines are evaluated (NumPy's, where q is a list of NumPy columns evaluated on
    the host: :mod:`jaxarm.identify.linear_model`).

    The joint angles are read whole on a CPU (the batched loop stays vectorized), and where the
    bodies' placements are traced their cotangents are stored before they are put together
    (:func:`jaxarm.dynamics.algebra.entries`): with the whole arm differentiated, each angle's
    cotangent is the reverse sweep through every body's traced parameters (with the kinematics
    known, the stored form measured slower: it is left out there).
    """
    frames = []
    traced = _STORED_ANGLE_COTANGENTS and any(isinstance(x, jax.core.Tracer) for x in (bodies.rotation, bodies.translation))
    q = algebra.entries(q, whole=True, stored=traced)
    for i, rev in enumerate(is_revolute):
        R0, p0 = bodies.rotation[i], bodies.translation[i]
        rows = algebra._mat(R0)
        p = algebra._vec(p0)
        if rev:
            s, c = sincos(q[i])
            R = tuple((algebra.plus(algebra.mul(r[0], c), algebra.mul(r[1], s)), algebra.minus(algebra.mul(r[1], c), algebra.mul(r[0], s)), r[2]) for r in rows)
        else:
            R = rows
            p = tuple(algebra.plus(p[k], algebra.mul(rows[k][2], q[i])) for k in range(3))
        frames.append((R, p))
    return frames


# False: the joint angles' cotangents are put together as they are computed (for before/after
# measurements: experiments/arm_rollout_gradient_jits.py --unstored)
_STORED_ANGLE_COTANGENTS = True


def _body_model_numpy(arm):
    """``body_model`` of a concrete arm, computed in NumPy: milliseconds, where a jitted body model
    compiled for 0.8 s at the first call of every solver, rollout or gradient."""
    return body_model(jax.tree_util.tree_map(np.asarray, arm), xp=np)


def _bodies(arm: Arm) -> Bodies:
    """``body_model(arm)``; computed now, as numpy arrays, when the arm is concrete (closed over
    by a jit, not traced), so that the recursions see its values and fold its structural zeros
    (:class:`jaxarm.dynamics.algebra.Known`). A traced arm gives the traced body model."""
    if checks.concrete(arm):
        return _body_model_numpy(arm)
    bodies = body_model(arm)
    if checks.concrete((arm.kinematics, arm.tool)):
        # Only the inertial parameters are traced (identification of masses and inertias, a batch
        # of arms that differ in their masses, COMs, payloads or friction): the placements and the
        # tool frame depend on the kinematics and the tool alone, so they are computed now, as
        # numpy arrays, and their structural zeros fold as for a constant arm.
        shape_only = jax.tree_util.tree_map(lambda x: np.zeros(np.shape(x), x.dtype) if isinstance(x, jax.core.Tracer) else x, arm)
        known = _body_model_numpy(shape_only)
        bodies = bodies._replace(**{k: getattr(known, k) for k in _KINEMATIC_FIELDS})
    return bodies


# The fields of the body model that depend on the arm's kinematics and tool frame only.
_KINEMATIC_FIELDS = ("rotation", "translation", "tip_rotation", "tip_translation", "link_rotation", "link_translation")


def body_poses(arm: Arm, bodies, q):
    """World rotation (n, 3, 3) and origin (n, 3) of every body frame (z = joint axis).

    The world frame is the one ``arm.base`` is expressed in.
    """
    base = jnp.asarray(arm.base)
    R, p = base[:3, :3], base[:3, 3]
    rots, origins = [], []
    for i, rev in enumerate(arm.is_revolute):
        Ri, pi = joint_transform(bodies, i, rev, q[i])
        p = p + spatial.mv(R, pi)
        R = spatial.mm(R, Ri)
        rots.append(R)
        origins.append(p)
    return jnp.stack(rots), jnp.stack(origins)


def _tool_pose(bodies, R_last, p_last):
    R = spatial.mm(R_last, bodies.tip_rotation)
    p = p_last + spatial.mv(R_last, bodies.tip_translation)
    return R, p


@compiled_when_eager
def forward_kinematics(arm: Arm, q):
    """All link frames and the tool pose, in the world frame.

    q: (n,). Returns ``(frames, tool)``: frames (n+1, 4, 4) with frames[0] = base (frame 0)
    and frames[i] = DH link frame i (Craig 3.6 / Ch.10 A-matrices chained); tool (4, 4).
    For 'placement' arms frames[i] is the URDF child link frame of joint i.
    """
    return _forward_kinematics(arm, q, "forward_kinematics")


def _forward_kinematics(arm: Arm, q, func: str):
    checks.check_arm(arm, func)
    q = checks.joint_vector(q, arm, "q", func)
    bodies = body_model(arm)
    rots, origins = body_poses(arm, bodies, q)
    link_R = jnp.einsum("nij,njk->nik", rots, bodies.link_rotation)
    link_p = origins + jnp.einsum("nij,nj->ni", rots, bodies.link_translation)
    base = jnp.asarray(arm.base, dtype=link_R.dtype)
    frames = jnp.concatenate([base[None], jnp.stack([spatial.transform(link_R[i], link_p[i]) for i in range(arm.n)])])
    tool = spatial.transform(*_tool_pose(bodies, rots[-1], origins[-1]))
    return frames, tool


@compiled_when_eager
def tool_pose(arm: Arm, q):
    """The tool frame (4, 4) in the world frame."""
    return _forward_kinematics(arm, q, "tool_pose")[1]


@compiled_when_eager(static=("frame",))
def jacobian(arm: Arm, q, frame: str = "base"):
    """Geometric Jacobian (6, n) of the tool frame: rows (linear velocity, angular velocity).

    Column i is z_i x (p_tool - o_i) over z_i for a revolute joint and z_i over 0 for a
    prismatic one (Craig 5.110-5.111, with z_i and o_i of joint i's axis). ``frame="base"``
    expresses both in the world frame; ``frame="tool"`` in the tool frame (Craig 5.71).
    """
    if frame not in ("base", "tool"):
        raise ValueError(f"jacobian: frame: expected 'base' or 'tool', got {frame!r}")
    return _jacobian(arm, q, "jacobian", frame)


def _jacobian(arm: Arm, q, func: str, frame: str):
    checks.check_arm(arm, func)
    q = checks.joint_vector(q, arm, "q", func)
    bodies = body_model(arm)
    rots, origins = body_poses(arm, bodies, q)
    R_tool, p_tool = _tool_pose(bodies, rots[-1], origins[-1])
    z = rots[:, :, 2]
    lin = jnp.where(
        jnp.asarray(arm.is_revolute)[:, None],
        jnp.cross(z, p_tool[None, :] - origins),  # Craig 5.110
        z,
    )
    ang = jnp.where(jnp.asarray(arm.is_revolute)[:, None], z, jnp.zeros_like(z))  # Craig 5.111
    J = jnp.concatenate([lin.T, ang.T], axis=0)
    if frame == "tool":
        J = jnp.concatenate([R_tool.T @ J[:3], R_tool.T @ J[3:]], axis=0)  # Craig 5.71
    return J
