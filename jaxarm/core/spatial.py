"""Small 3-D geometry helpers shared by every algorithm.

All functions take one rotation / vector (no batch axis) and work unchanged on
NumPy and JAX arrays; batching is done by ``jax.vmap`` around the algorithms.
Products are written as elementwise multiply-and-sum instead of ``@`` so that
XLA fuses a vmapped batch of 3x3 products into one elementwise loop instead of
thousands of tiny matrix multiplications.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def _xp(*arrays):
    """NumPy when every argument is a NumPy value, else jax.numpy."""
    for a in arrays:
        if not isinstance(a, (np.ndarray, np.generic, float, int)):
            return jnp
    return np


def mv(R, v):
    """R @ v for R: (3, 3), v: (3,)."""
    return (R * v[None, :]).sum(-1)


def mtv(R, v):
    """R.T @ v for R: (3, 3), v: (3,)."""
    return (R * v[:, None]).sum(0)


def mm(A, B):
    """A @ B for 3x3 (or any square) matrices."""
    return (A[:, :, None] * B[None, :, :]).sum(1)


def cross(a, b):
    """a x b for 3-vectors, written out (faster than jnp.cross under vmap)."""
    xp = _xp(a, b)
    return xp.stack(
        [
            a[1] * b[2] - a[2] * b[1],
            a[2] * b[0] - a[0] * b[2],
            a[0] * b[1] - a[1] * b[0],
        ]
    )


def skew(v):
    """The 3x3 matrix [v]x with [v]x w = v x w."""
    xp = _xp(v)
    z = xp.zeros_like(v[0])
    return xp.stack(
        [
            xp.stack([z, -v[2], v[1]]),
            xp.stack([v[2], z, -v[0]]),
            xp.stack([-v[1], v[0], z]),
        ]
    )


def rot_x(angle):
    """Rotation by `angle` about x (Craig 2.74 elementary rotation)."""
    xp = _xp(angle)
    c, s = xp.cos(angle), xp.sin(angle)
    o, z = xp.ones_like(c), xp.zeros_like(c)
    return xp.stack([xp.stack([o, z, z]), xp.stack([z, c, -s]), xp.stack([z, s, c])])


def rot_y(angle):
    """Rotation by `angle` about y."""
    xp = _xp(angle)
    c, s = xp.cos(angle), xp.sin(angle)
    o, z = xp.ones_like(c), xp.zeros_like(c)
    return xp.stack([xp.stack([c, z, s]), xp.stack([z, o, z]), xp.stack([-s, z, c])])


def rot_z(angle):
    """Rotation by `angle` about z."""
    xp = _xp(angle)
    c, s = xp.cos(angle), xp.sin(angle)
    o, z = xp.ones_like(c), xp.zeros_like(c)
    return xp.stack([xp.stack([c, -s, z]), xp.stack([s, c, z]), xp.stack([z, z, o])])


def rpy_to_matrix(rpy):
    """Fixed-axis roll-pitch-yaw (URDF convention): R = Rz(yaw) Ry(pitch) Rx(roll)."""
    return mm(mm(rot_z(rpy[2]), rot_y(rpy[1])), rot_x(rpy[0]))


def matrix_to_rpy(R):
    """Fixed-axis roll, pitch, yaw of a rotation, R = Rz(y) Ry(p) Rx(r), accurate even at
    pitch = +-pi/2 (gimbal lock).

    Yaw is read from the first column; roll and pitch from Rz(y)^T R = Ry(p) Rx(r), whose
    entries (1, 1), (1, 2) are cos r, -sin r and (0, 0), (2, 0) are cos p, -sin p. In gimbal
    lock the first column is rounding noise and yaw arbitrary, but the residual Rz(y)^T R
    still reconstructs R to rounding. No branches, so it is safe in traced code.
    """
    xp = _xp(R)
    yaw = xp.arctan2(R[1, 0], R[0, 0])
    M = mm(rot_z(-yaw), R)
    return xp.stack([xp.arctan2(-M[1, 2], M[1, 1]), xp.arctan2(-M[2, 0], M[0, 0]), yaw])


def transform(R, p):
    """The 4x4 homogeneous transform [[R, p], [0, 1]]."""
    xp = _xp(R, p)
    top = xp.concatenate([R, p[:, None]], axis=1)
    bottom = xp.concatenate([xp.zeros_like(p), xp.ones_like(p[:1])])[None, :]
    return xp.concatenate([top, bottom], axis=0)


def rotation_to_axis(axis):
    """A rotation R with R @ (0, 0, 1) = axis (unit), found without branching on traced values.

    Used to turn a joint about an arbitrary axis into a joint about a local z.
    """
    xp = _xp(axis)
    axis = axis / xp.sqrt((axis * axis).sum())
    # Rodrigues rotation taking z to axis; for axis ~ -z, rotate pi about x instead.
    dtype = axis.dtype
    z = xp.asarray([0.0, 0.0, 1.0], dtype=dtype)
    c = axis[2]
    v = cross(z, axis)
    K = skew(v)
    safe = 1.0 / xp.where(1.0 + c > 1e-9, 1.0 + c, 1.0)
    R_general = xp.eye(3, dtype=dtype) + K + mm(K, K) * safe
    R_flip = rot_x(xp.asarray(np.pi, dtype=dtype))
    return xp.where(1.0 + c > 1e-9, R_general, R_flip)
