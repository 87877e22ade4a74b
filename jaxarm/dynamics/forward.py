"""Forward dynamics (Swartz's Forward Arm): joint accelerations from joint torques."""

from __future__ import annotations

import jax.numpy as jnp

from ..model import checks
from ..model.arm import Arm
from . import drives, linalg
from .algebra import _vec, vector
from .composite_body import composite_mass_matrix
from .kinematics import _bodies, joint_frames
from .newton_euler import _base_acceleration, _kernel_tip, rnea


def forward_dynamics(arm: Arm, q, qd, tau, f_ext=None):
    """Joint accelerations (n,) from applied joint torques tau (Swartz's Forward Arm).

    Solves M(q) qdd = tau - bias(q, qd) - friction(qd) with a Cholesky factorization of M
    (symmetric positive definite for a physically meaningful arm), unrolled over the joints.
    """
    q, qd, tau = checks.joint_state(arm, "forward_dynamics", q=q, qd=qd, tau=tau)
    f_ext = checks.wrench(f_ext, "f_ext", "forward_dynamics")
    return _forward_dynamics(arm, q, qd, tau, f_ext)


def _forward_dynamics(arm, q, qd, tau, f_ext=None):
    """Forward dynamics in components: the joint frames once, bias torques by the Newton-Euler
    kernel (qdd = 0), M by the composite-body kernel, and the unrolled Cholesky solve on scalars,
    so the whole of it is scalar arithmetic (one fused loop per state batch on XLA:CPU)."""
    return _forward_dynamics_factored(arm, q, qd, tau, f_ext)[0]


def _forward_dynamics_factored(arm, q, qd, tau, f_ext=None):
    """:func:`_forward_dynamics` and the lower Cholesky factor L (n, n) of M(q) (rotor inertia
    included) it solved with, for products with M^-1 (the derivatives of forward dynamics,
    Carpentier & Mansard 2018). Where L is not used it costs nothing (dead code)."""
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, tau)
    frames = joint_frames(bodies, arm.is_revolute, q)
    a0 = _vec(_base_acceleration(arm, dtype))
    bias, _, _ = rnea(bodies, arm.is_revolute, frames, qd, None, a0, _kernel_tip(bodies, f_ext))
    M = composite_mass_matrix(bodies, arm.is_revolute, frames)
    rotor = drives._reflected_inertia(arm).astype(dtype)
    friction = drives._friction_torques(arm, qd)
    n = arm.n
    M = [[M[i][j] + rotor[i] if i == j else M[i][j] for j in range(n)] for i in range(n)]
    rhs = [tau[i] - bias[i] - friction[i] for i in range(n)]
    L, inv_diag = linalg.cholesky_factor_scalars(M)
    qdd = vector(linalg.cholesky_solve_factored_scalars(L, inv_diag, rhs), dtype)
    factor = jnp.stack([vector([L[i][j] if j <= i else 0.0 for j in range(n)], dtype) for i in range(n)])
    return qdd, factor
