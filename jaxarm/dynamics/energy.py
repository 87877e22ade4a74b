"""Kinetic and potential energy of an arm (links and rotors)."""

from __future__ import annotations

import jax.numpy as jnp

from ..model import checks
from ..model.arm import Arm
from .composite_body import _mass_matrix
from .eager import compiled_when_eager
from .kinematics import _bodies, body_poses


@compiled_when_eager
def kinetic_energy(arm: Arm, q, qd):
    """Kinetic energy 1/2 qd^T M(q) qd of links and rotors."""
    q, qd = checks.joint_state(arm, "kinetic_energy", q=q, qd=qd)
    M = _mass_matrix(arm, _bodies(arm), q)
    return 0.5 * qd @ M @ qd


@compiled_when_eager
def potential_energy(arm: Arm, q):
    """Gravitational potential energy -sum_i m_i g . c_i (world frame), zero at the world origin."""
    (q,) = checks.joint_state(arm, "potential_energy", q=q)
    bodies = _bodies(arm)
    rots, origins = body_poses(arm, bodies, q)
    # world position of each body's first moment: m p_origin + R h
    moments = bodies.mass[:, None] * origins + jnp.einsum("nij,nj->ni", rots, bodies.first_moment)
    return -jnp.sum(moments @ jnp.asarray(arm.gravity, dtype=moments.dtype))
