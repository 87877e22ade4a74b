"""Test oracles: the recursions of :mod:`jaxarm.dynamics` written a second time, independently, in
the plainest form -- 3-vectors and 3x3 matrices as arrays, ``jnp.sin``/``jnp.cos``, a LAPACK solve.

jaxarm's own code is written once, in the component algebra of :mod:`jaxarm.dynamics.algebra`
(with constant folding and polynomial sine/cosine); these oracles check it, values and
derivatives, beside Pinocchio, the closed forms and the identities.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxarm import drives
from jaxarm.core import spatial
from jaxarm.dynamics.kinematics import _bodies
from jaxarm.dynamics.newton_euler import _base_acceleration
from jaxarm.model.arm import Arm, Bodies


def _z(like):
    return jnp.zeros(3, dtype=like.dtype).at[2].set(1.0)


def joint_transform(bodies: Bodies, i: int, revolute: bool, qi):
    """Pose (R, p) of body i in body i-1: R = R0 Rz(qi) (Craig 2.74), or p = p0 + qi R0 z."""
    R0, p0 = bodies.rotation[i], bodies.translation[i]
    if revolute:
        c, s = jnp.cos(qi), jnp.sin(qi)
        Rz = jnp.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=R0.dtype)
        return R0 @ Rz, p0
    return R0, p0 + qi * R0[:, 2]


def _tip_wrench(bodies: Bodies, f_ext):
    """External wrench (force, moment) on the tool, in tool frame -> wrench on the last body about its origin."""
    F = spatial.mv(bodies.tip_rotation, f_ext[:3])
    N = spatial.mv(bodies.tip_rotation, f_ext[3:]) + spatial.cross(bodies.tip_translation, F)
    return F, N


def rnea(arm: Arm, bodies: Bodies, q, qd, qdd, a0, f_ext=None):
    """Recursive Newton-Euler over the canonical bodies (oracle).
    Returns (tau (n,), wrenches (n, 6)).

    Forward pass: Craig 6.45-6.47 (revolute), 6.33-6.35 (prismatic), Swartz eqs 1-6.
    Per-body force/moment about the origin, written with first moment h = m c and the
    inertia about the origin I_o so the result is linear in (m, h, I_o) (Swartz eqs 7-8).
    Backward pass: Craig 6.51-6.52, Swartz eqs 9-10 (with A_i^{i+1}, and i running N..1).
    """
    n = arm.n
    z = _z(a0)
    w = jnp.zeros(3, a0.dtype)
    wd = jnp.zeros(3, a0.dtype)
    a = a0
    transforms, body_f, body_n = [], [], []
    for i, rev in enumerate(arm.is_revolute):
        R, p = joint_transform(bodies, i, rev, q[i])
        transforms.append((R, p))
        # Origin acceleration of body i in body i-1's frame, then rotated into body i (Craig 6.47).
        a = spatial.mtv(R, a + spatial.cross(wd, p) + spatial.cross(w, spatial.cross(w, p)))
        w_rot, wd_rot = spatial.mtv(R, w), spatial.mtv(R, wd)
        if rev:
            w = w_rot + qd[i] * z  # Craig 6.45
            wd = wd_rot + spatial.cross(w_rot, qd[i] * z) + qdd[i] * z  # Craig 6.46
        else:
            w, wd = w_rot, wd_rot  # Craig 6.33-6.34
            a = a + 2.0 * spatial.cross(w, qd[i] * z) + qdd[i] * z  # Craig 6.35
        m, h, I = bodies.mass[i], bodies.first_moment[i], bodies.inertia_origin[i]
        # Newton: m * (acceleration of the COM) = m a + wd x h + w x (w x h)   (Craig 6.48-6.49)
        f = m * a + spatial.cross(wd, h) + spatial.cross(w, spatial.cross(w, h))
        # Euler about the origin: I_o wd + w x I_o w + h x a   (Craig 6.50 moved to the origin)
        nm = spatial.mv(I, wd) + spatial.cross(w, spatial.mv(I, w)) + spatial.cross(h, a)
        body_f.append(f)
        body_n.append(nm)

    if f_ext is None:
        f_child = jnp.zeros(3, a0.dtype)
        n_child = jnp.zeros(3, a0.dtype)
    else:
        F, N = _tip_wrench(bodies, f_ext)
        f_child, n_child = -F, -N  # the environment pushes the tool; the joints need less
    R_child = jnp.eye(3, dtype=a0.dtype)
    p_child = jnp.zeros(3, a0.dtype)
    taus = [None] * n
    wrenches = [None] * n
    for i in reversed(range(n)):
        f_in = spatial.mv(R_child, f_child)
        f_tot = body_f[i] + f_in  # Craig 6.51
        n_tot = body_n[i] + spatial.mv(R_child, n_child) + spatial.cross(p_child, f_in)  # Craig 6.52
        taus[i] = n_tot[2] if arm.is_revolute[i] else f_tot[2]  # Craig 6.53
        wrenches[i] = jnp.concatenate([f_tot, n_tot])
        f_child, n_child = f_tot, n_tot
        R_child, p_child = transforms[i]
    return jnp.stack(taus), jnp.stack(wrenches)


def composite_mass_matrix(arm: Arm, bodies: Bodies, q):
    """Walker-Orin method 3 (composite rigid bodies), Swartz eqs 16-26 with
    A_i^{i-1} Z0 in eq 26 and j = N..1 in eq 23 (oracle)."""
    n = arm.n
    transforms = [joint_transform(bodies, i, rev, q[i]) for i, rev in enumerate(arm.is_revolute)]
    # Composite inertia of bodies i..n about body i's origin, in body i's frame (Swartz eqs 16-19).
    m_c = [None] * n
    h_c = [None] * n
    I_c = [None] * n
    m_c[-1], h_c[-1], I_c[-1] = bodies.mass[-1], bodies.first_moment[-1], bodies.inertia_origin[-1]
    for i in range(n - 2, -1, -1):
        R, p = transforms[i + 1]
        m, h, I = m_c[i + 1], h_c[i + 1], I_c[i + 1]
        Rh = spatial.mv(R, h)
        P, H = spatial.skew(p), spatial.skew(Rh)
        # Move the child's composite (m, h, I_o) to the parent origin: rotation (Ch.10 10.18) then
        # the parallel-axis theorem for a body whose COM is not at the old origin (Ch.10 10.13).
        I_moved = spatial.mm(spatial.mm(R, I), R.T) - m * spatial.mm(P, P) - spatial.mm(P, H) - spatial.mm(H, P)
        m_c[i] = bodies.mass[i] + m
        h_c[i] = bodies.first_moment[i] + Rh + m * p
        I_c[i] = bodies.inertia_origin[i] + I_moved
    z = _z(bodies.mass)
    cols = []
    for i, rev in enumerate(arm.is_revolute):
        # Wrench on composite i for a unit acceleration of joint i (Swartz eqs 20-22).
        if rev:
            f = spatial.cross(z, h_c[i])
            nm = I_c[i][:, 2]
        else:
            f = m_c[i] * z
            nm = spatial.cross(h_c[i], z)
        col = [None] * n
        col[i] = nm[2] if rev else f[2]
        # Carry it down the chain, projecting on each earlier joint axis (Swartz eqs 24-26).
        for j in range(i, 0, -1):
            R, p = transforms[j]
            f = spatial.mv(R, f)
            nm = spatial.mv(R, nm) + spatial.cross(p, f)
            col[j - 1] = nm[2] if arm.is_revolute[j - 1] else f[2]
        cols.append(jnp.stack([c if c is not None else jnp.zeros((), z.dtype) for c in col]))
    Mfull = jnp.stack(cols, axis=1)
    # Only the upper triangle (rows j <= column i) was computed; mirror it.
    upper = jnp.triu(Mfull)
    return upper + jnp.triu(Mfull, 1).T


def forward_dynamics(arm, q, qd, tau, f_ext=None):
    """Forward dynamics by the reference code: M and the bias torques from
    :func:`composite_mass_matrix` and :func:`rnea`, solved by LAPACK."""
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, tau)
    M = composite_mass_matrix(arm, bodies, q)
    M = M + jnp.diag(drives._reflected_inertia(arm).astype(M.dtype))
    bias = rnea(arm, bodies, q, qd, jnp.zeros_like(qd), _base_acceleration(arm, dtype), f_ext)[0]
    return jnp.linalg.solve(M, tau - bias - drives._friction_torques(arm, qd))
