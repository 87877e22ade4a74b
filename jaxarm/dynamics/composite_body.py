"""The joint-space mass matrix: composite-body method (Walker-Orin method 3, Swartz eqs 16-26),
Walker-Orin method 1 (columns of Newton-Euler) as an independent check, and the Coriolis matrix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..model import checks
from ..model.arm import Arm, Bodies
from . import drives
from .algebra import (
    ZERO,
    _sym,
    _vec,
    add,
    cross,
    dot,
    matrix,
    mv,
    scalar,
    scale,
    sym_mv,
)
from .eager import compiled_when_eager
from .kinematics import _bodies, joint_frames
from .newton_euler import STAGED, _dtype_of, _read_per_state, _reads_grouped, _rnea


def composite_mass_matrix(bodies, is_revolute, frames):
    """Walker-Orin method 3 in components (Swartz eqs 16-26):
    returns M as a list of n rows of n scalars (symmetric, both triangles filled)."""
    n = len(is_revolute)
    m_c, h_c, I_c = [None] * n, [None] * n, [None] * n
    m_c[-1] = scalar(bodies.mass[-1])
    h_c[-1] = _vec(bodies.first_moment[-1])
    I_c[-1] = _sym(bodies.inertia_origin[-1])
    for i in range(n - 2, -1, -1):
        R, p = frames[i + 1]
        m, h, I = m_c[i + 1], h_c[i + 1], I_c[i + 1]
        Rh = mv(R, h)
        # R I R^T (Ch.10 10.18), symmetric: B = R I, then (B R^T)_{jk} = B_j . R_k for k >= j
        B = [sym_mv(I, R[j]) for j in range(3)]  # row j of R I = I R_j (I symmetric)
        RIR = [dot(B[j], R[k]) for j, k in ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))]
        # parallel axis for a body with first moment Rh at offset p (Ch.10 10.13):
        # + m (p.p 1 - p p^T) + 2 (p.Rh) 1 - p Rh^T - Rh p^T
        pp, ph = dot(p, p), dot(p, Rh)
        diag = m * pp + 2.0 * ph
        shift = []
        for j, k in ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)):
            e = -(m * p[j] * p[k] + p[j] * Rh[k] + Rh[j] * p[k])
            shift.append(e + diag if j == k else e)
        Io = _sym(bodies.inertia_origin[i])
        m_c[i] = scalar(bodies.mass[i]) + m
        h_c[i] = add(_vec(bodies.first_moment[i]), Rh, scale(m, p))
        I_c[i] = tuple(Io[k] + RIR[k] + shift[k] for k in range(6))
    M = [[None] * n for _ in range(n)]
    for i, rev in enumerate(is_revolute):
        h, I = h_c[i], I_c[i]
        # Wrench on composite i for a unit acceleration of joint i (Swartz eqs 20-22).
        zero = ZERO
        if rev:
            f = (-h[1], h[0], zero)  # z x h
            nm = (I[2], I[4], I[5])  # third column of I
        else:
            f = (zero, zero, m_c[i])
            nm = (h[1], -h[0], zero)  # h x z
        M[i][i] = nm[2] if rev else f[2]
        # Carry it down the chain, projecting on each earlier joint axis (Swartz eqs 24-26).
        for j in range(i, 0, -1):
            R, p = frames[j]
            f = mv(R, f)
            nm = add(mv(R, nm), cross(p, f))
            M[j - 1][i] = M[i][j - 1] = nm[2] if is_revolute[j - 1] else f[2]
    return M


def _composite_mass_matrix(arm: Arm, bodies: Bodies, q):
    """M(q) (n, n) of the links (no rotor inertia): :func:`composite_mass_matrix` at joint values q;
    the arm's traced parameters read in groups where Newton-Euler reads them so
    (``newton_euler._reads_grouped``: a gradient summed over a batch, or one with respect to
    traced kinematics; ``newton_euler._read_per_state``)."""
    grouped = _reads_grouped(arm, (q,))
    if grouped:
        bodies, _ = _read_per_state(bodies, None, q, staged=grouped == STAGED)
    frames = joint_frames(bodies, arm.is_revolute, q)
    dtype = jnp.result_type(_dtype_of(bodies.mass), q)
    return matrix(composite_mass_matrix(bodies, arm.is_revolute, frames), dtype)


@compiled_when_eager
def mass_matrix(arm: Arm, q):
    """Joint-space inertia matrix M(q) (n, n), including reflected rotor inertia G^2 Jm on the
    diagonal. Composite-body method (Walker-Orin method 3, Swartz eqs 16-26)."""
    (q,) = checks.joint_state(arm, "mass_matrix", q=q)
    M = _composite_mass_matrix(arm, _bodies(arm), q)
    return M + jnp.diag(drives._reflected_inertia(arm).astype(M.dtype))


def _mass_matrix(arm, bodies, q):
    """M(q) (n, n) with reflected rotor inertia, by the composite-body kernel, no argument checks."""
    M = _composite_mass_matrix(arm, bodies, q)
    return M + jnp.diag(drives._reflected_inertia(arm).astype(M.dtype))


@compiled_when_eager
def mass_matrix_by_columns(arm: Arm, q):
    """M(q) by Walker-Orin method 1: column j is inverse dynamics with qd = 0, no gravity,
    qdd = e_j (Walker & Orin 1982). Slower (n Newton-Euler passes); kept as an independent check."""
    (q,) = checks.joint_state(arm, "mass_matrix_by_columns", q=q)
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q)
    no_gravity = np.zeros(3, dtype)
    eye = jnp.eye(arm.n, dtype=dtype)
    cols = jax.vmap(lambda e: _rnea(arm, bodies, q, jnp.zeros_like(q), e, no_gravity)[0])(eye)
    return cols.T + jnp.diag(drives._reflected_inertia(arm).astype(dtype))


@compiled_when_eager
def coriolis_matrix(arm: Arm, q, qd):
    """Coriolis matrix C(q, qd) (n, n) in Christoffel form, C_ij = sum_k Gamma_ijk qd_k with
    Gamma_ijk = (dM_ij/dq_k + dM_ik/dq_j - dM_jk/dq_i) / 2, so that M-dot - 2C is skew-symmetric
    and C qd + g = bias_forces. (Not Craig's centrifugal-coefficient matrix.)"""
    q, qd = checks.joint_state(arm, "coriolis_matrix", q=q, qd=qd)
    bodies = _bodies(arm)
    dM = jax.jacfwd(lambda x: _composite_mass_matrix(arm, bodies, x))(q)  # dM[i, j, k] = dM_ij / dq_k
    gamma = 0.5 * (dM + jnp.swapaxes(dM, 1, 2) - jnp.transpose(dM, (2, 1, 0)))
    return jnp.einsum("ijk,k->ij", gamma, qd)
