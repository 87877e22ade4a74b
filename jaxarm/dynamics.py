"""Rigid-body dynamics of serial arms: recursive Newton-Euler, composite-body mass matrix,
forward dynamics, Coriolis matrix and energies.

Every function takes a single state (q, qd, ... of shape (n,)); batch with ``jax.vmap``.
The loops run over the static joint count and unroll at trace time.

Frames: each body's frame has z on its joint axis (see :func:`jaxarm.arm.body_model`);
velocities, accelerations and wrenches are expressed in the body's own frame, about its
origin, as in Swartz's Inverse Arm and Craig 6.45-6.53.

Two implementations of the same equations live here: the readable reference
(``_reference_rnea``, ``_reference_composite_mass_matrix``, with 3-vectors and 3x3 matrices as
arrays) and the kernels of :mod:`jaxarm._kernels` (the same recursions with every vector
component a separate scalar, so that batched code becomes a few fused loops). Every public
function (inverse dynamics, joint wrenches, bias and gravity torques, the mass matrix, forward
dynamics and so the rollouts, the controllers' model terms) uses the kernels; forward dynamics
stays in components through the Cholesky solve (:func:`jaxarm.linalg.cholesky_solve_scalars`).
The references (``_reference_rnea``, ``_reference_composite_mass_matrix``,
``_reference_forward_dynamics``) are kept, and used by ``mass_matrix_by_columns``;
``tests/test_kernels.py`` checks the kernels against them, values and derivatives.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _kernels, checks, drives, linalg, spatial
from .arm import Arm, Bodies, body_model, joint_transform
from .kinematics import body_poses


def _z(like):
    return jnp.zeros(3, dtype=like.dtype).at[2].set(1.0)


def _base_acceleration(arm: Arm, dtype):
    """Gravity enters as an upward base acceleration (Swartz: vdot_0 = -g; ERRATA), in frame 0.
    A numpy array when base and gravity are concrete (the kernels then fold its zeros)."""
    xp = np if _kernels.concrete((arm.base, arm.gravity)) else jnp
    R0 = xp.asarray(arm.base, dtype=dtype)[:3, :3]
    return -(R0.T @ xp.asarray(arm.gravity, dtype=dtype))


_body_model = jax.jit(body_model)


def _bodies(arm: Arm) -> Bodies:
    """``body_model(arm)``; computed now, as numpy arrays, when the arm is concrete (closed over
    by a jit, not traced), so that the kernels see its values and fold its structural zeros
    (:class:`jaxarm._kernels.Known`). A traced arm gives the traced body model."""
    if not _kernels.concrete(arm):
        return body_model(arm)
    with jax.ensure_compile_time_eval():
        return jax.tree_util.tree_map(np.asarray, _body_model(arm))


def _tip_wrench(bodies: Bodies, f_ext):
    """External wrench (force, moment) on the tool, in tool frame -> wrench on the last body about its origin."""
    F = spatial.mv(bodies.tip_rotation, f_ext[:3])
    N = spatial.mv(bodies.tip_rotation, f_ext[3:]) + spatial.cross(bodies.tip_translation, F)
    return F, N


def _reference_rnea(arm: Arm, bodies: Bodies, q, qd, qdd, a0, f_ext=None):
    """Recursive Newton-Euler over the canonical bodies (reference implementation).
    Returns (tau (n,), wrenches (n, 6)).

    Forward pass: Craig 6.45-6.47 (revolute), 6.33-6.35 (prismatic), Swartz eqs 1-6.
    Per-body force/moment about the origin, written with first moment h = m c and the
    inertia about the origin I_o so the result is linear in (m, h, I_o) (Swartz eqs 7-8).
    Backward pass: Craig 6.51-6.52, Swartz eqs 9-10 (with the ERRATA's A_i^{i+1} and i = N..1).
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


def _rnea(arm: Arm, bodies: Bodies, q, qd, qdd, a0, f_ext=None):
    """Recursive Newton-Euler: the equations of :func:`_reference_rnea` computed by the
    component-wise kernel :func:`jaxarm._kernels.rnea`; qdd None means zero acceleration.
    Returns (tau (n,), wrenches (n, 6))."""
    frames = _kernels.joint_frames(bodies, arm.is_revolute, q)
    dtype = jnp.result_type(bodies.mass, q, qd, a0)
    taus, forces, moments = _kernels.rnea(bodies, arm.is_revolute, frames, qd, qdd, _kernels._vec(a0), _kernel_tip(bodies, f_ext))
    wrenches = _kernels.matrix([tuple(f) + tuple(m) for f, m in zip(forces, moments)], dtype)
    return _kernels.vector(taus, dtype), wrenches


def _kernel_tip(bodies, f_ext):
    """The tool wrench as the kernels take it: the environment's wrench on the tool, negated
    (what the last body must supply), in the last body's frame, about its origin."""
    if f_ext is None:
        return None
    F, N = _tip_wrench(bodies, f_ext)
    return tuple(-F[k] for k in range(3)), tuple(-N[k] for k in range(3))


def _state(arm, func, **vectors):
    checks.check_arm(arm, func)
    out = [checks.joint_vector(v, arm, k, func) for k, v in vectors.items()]
    return out


def inverse_dynamics(arm: Arm, q, qd, qdd, f_ext=None):
    """Joint torques/forces (n,) that produce acceleration qdd at state (q, qd).

    Recursive Newton-Euler (Swartz eqs 1-10; prismatic terms Craig 6.33-6.35) with gravity as
    base acceleration, plus drive terms: reflected rotor inertia G^2 Jm qdd, viscous B G^2 qd and
    Coulomb |G| Tc(+/-) by the sign of qd. ``f_ext`` (6,) = (force, moment) that the environment
    applies to the tool, expressed in the tool frame, moment about the tool origin.
    """
    q, qd, qdd = _state(arm, "inverse_dynamics", q=q, qd=qd, qdd=qdd)
    f_ext = checks.wrench(f_ext, "f_ext", "inverse_dynamics")
    return _inverse_dynamics(arm, q, qd, qdd, f_ext)


def _inverse_dynamics(arm, q, qd, qdd, f_ext=None):
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, qdd)
    tau, _ = _rnea(arm, bodies, q, qd, qdd, _base_acceleration(arm, dtype), f_ext)
    return tau + drives._reflected_inertia(arm) * qdd + drives._friction_torques(arm, qd)


def rigid_body_torques(arm: Arm, q, qd, qdd, f_ext=None):
    """Inverse dynamics of the links alone: no rotor inertia, no friction (n,)."""
    q, qd, qdd = _state(arm, "rigid_body_torques", q=q, qd=qd, qdd=qdd)
    f_ext = checks.wrench(f_ext, "f_ext", "rigid_body_torques")
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, qdd)
    return _rnea(arm, bodies, q, qd, qdd, _base_acceleration(arm, dtype), f_ext)[0]


def joint_wrenches(arm: Arm, q, qd, qdd, f_ext=None):
    """The wrench (n, 6) = (force, moment about the joint origin) that each joint transmits from
    body i-1 to body i, in body i's frame (z along joint i's axis): the structural loads of the NASA
    report's appendix B. Rigid links only; the joint torque is component 5 (revolute) or 2 (prismatic).
    """
    q, qd, qdd = _state(arm, "joint_wrenches", q=q, qd=qd, qdd=qdd)
    f_ext = checks.wrench(f_ext, "f_ext", "joint_wrenches")
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, qdd)
    return _rnea(arm, bodies, q, qd, qdd, _base_acceleration(arm, dtype), f_ext)[1]


def bias_forces(arm: Arm, q, qd, f_ext=None):
    """Coriolis, centrifugal and gravity torques C(q, qd) qd + g(q) (n,): Newton-Euler with
    qdd = 0 (Swartz's bias vector; ERRATA: theta-double-dot = 0). No friction."""
    q, qd = _state(arm, "bias_forces", q=q, qd=qd)
    f_ext = checks.wrench(f_ext, "f_ext", "bias_forces")
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd)
    return _rnea(arm, bodies, q, qd, None, _base_acceleration(arm, dtype), f_ext)[0]


def _bias(arm, bodies, q, qd, f_ext=None):
    """Bias torques C(q, qd) qd + g(q) (n,) by the Newton-Euler kernel, no argument checks."""
    dtype = jnp.result_type(bodies.mass, q, qd)
    return _rnea(arm, bodies, q, qd, None, _base_acceleration(arm, dtype), f_ext)[0]


def gravity_torques(arm: Arm, q):
    """Torques (n,) that hold the arm still against gravity, g(q)."""
    (q,) = _state(arm, "gravity_torques", q=q)
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q)
    return _rnea(arm, bodies, q, jnp.zeros_like(q), None, _base_acceleration(arm, dtype))[0]


def _reference_composite_mass_matrix(arm: Arm, bodies: Bodies, q):
    """Walker-Orin method 3 (composite rigid bodies), Swartz eqs 16-26 with the ERRATA's
    A_i^{i-1} Z0 in eq 26 and j = N..1 in eq 23 (reference implementation)."""
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


def _composite_mass_matrix(arm: Arm, bodies: Bodies, q):
    """M(q) (n, n) of the links: the equations of :func:`_reference_composite_mass_matrix`
    computed by the component-wise kernel :func:`jaxarm._kernels.composite_mass_matrix`."""
    frames = _kernels.joint_frames(bodies, arm.is_revolute, q)
    dtype = jnp.result_type(bodies.mass, q)
    return _kernels.matrix(_kernels.composite_mass_matrix(bodies, arm.is_revolute, frames), dtype)


def mass_matrix(arm: Arm, q):
    """Joint-space inertia matrix M(q) (n, n), including reflected rotor inertia G^2 Jm on the
    diagonal. Composite-body method (Walker-Orin method 3, Swartz eqs 16-26)."""
    (q,) = _state(arm, "mass_matrix", q=q)
    M = _composite_mass_matrix(arm, _bodies(arm), q)
    return M + jnp.diag(drives._reflected_inertia(arm).astype(M.dtype))


def _mass_matrix(arm, bodies, q):
    """M(q) (n, n) with reflected rotor inertia, by the composite-body kernel, no argument checks."""
    M = _composite_mass_matrix(arm, bodies, q)
    return M + jnp.diag(drives._reflected_inertia(arm).astype(M.dtype))


def mass_matrix_by_columns(arm: Arm, q):
    """M(q) by Walker-Orin method 1: column j is inverse dynamics with qd = 0, no gravity,
    qdd = e_j (ERRATA). Slower (n Newton-Euler passes); kept as an independent check."""
    (q,) = _state(arm, "mass_matrix_by_columns", q=q)
    bodies = _bodies(arm)
    zero = jnp.zeros(3, jnp.result_type(bodies.mass, q))
    eye = jnp.eye(arm.n, dtype=zero.dtype)
    cols = jax.vmap(lambda e: _reference_rnea(arm, bodies, q, jnp.zeros_like(q), e, zero)[0])(eye)
    return cols.T + jnp.diag(drives._reflected_inertia(arm).astype(zero.dtype))


def forward_dynamics(arm: Arm, q, qd, tau, f_ext=None):
    """Joint accelerations (n,) from applied joint torques tau (Swartz's Forward Arm).

    Solves M(q) qdd = tau - bias(q, qd) - friction(qd) with a Cholesky factorization of M
    (symmetric positive definite for a physically meaningful arm), unrolled over the joints.
    """
    q, qd, tau = _state(arm, "forward_dynamics", q=q, qd=qd, tau=tau)
    f_ext = checks.wrench(f_ext, "f_ext", "forward_dynamics")
    return _forward_dynamics(arm, q, qd, tau, f_ext)


def _forward_dynamics(arm, q, qd, tau, f_ext=None):
    """Forward dynamics in components: the joint frames once, bias torques by the Newton-Euler
    kernel (qdd = 0), M by the composite-body kernel, and the unrolled Cholesky solve on scalars,
    so the whole of it is scalar arithmetic (one fused loop per state batch on XLA:CPU)."""
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, tau)
    frames = _kernels.joint_frames(bodies, arm.is_revolute, q)
    a0 = _kernels._vec(_base_acceleration(arm, dtype))
    bias, _, _ = _kernels.rnea(bodies, arm.is_revolute, frames, qd, None, a0, _kernel_tip(bodies, f_ext))
    M = _kernels.composite_mass_matrix(bodies, arm.is_revolute, frames)
    rotor = drives._reflected_inertia(arm).astype(dtype)
    friction = drives._friction_torques(arm, qd)
    n = arm.n
    M = [[M[i][j] + rotor[i] if i == j else M[i][j] for j in range(n)] for i in range(n)]
    rhs = [tau[i] - bias[i] - friction[i] for i in range(n)]
    return _kernels.vector(linalg.cholesky_solve_scalars(M, rhs), dtype)


def _reference_forward_dynamics(arm, q, qd, tau, f_ext=None):
    """Forward dynamics by the reference code: M and the bias torques from
    :func:`_reference_composite_mass_matrix` and :func:`_reference_rnea`, solved by
    :func:`jaxarm.linalg.cholesky_solve` (checked against :func:`_forward_dynamics` in the tests)."""
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, tau)
    M = _reference_composite_mass_matrix(arm, bodies, q)
    M = M + jnp.diag(drives._reflected_inertia(arm).astype(M.dtype))
    bias = _reference_rnea(arm, bodies, q, qd, jnp.zeros_like(qd), _base_acceleration(arm, dtype), f_ext)[0]
    return linalg.cholesky_solve(M, tau - bias - drives._friction_torques(arm, qd))


def coriolis_matrix(arm: Arm, q, qd):
    """Coriolis matrix C(q, qd) (n, n) in Christoffel form, C_ij = sum_k Gamma_ijk qd_k with
    Gamma_ijk = (dM_ij/dq_k + dM_ik/dq_j - dM_jk/dq_i) / 2, so that M-dot - 2C is skew-symmetric
    and C qd + g = bias_forces. (Not Craig's centrifugal-coefficient matrix.)"""
    q, qd = _state(arm, "coriolis_matrix", q=q, qd=qd)
    bodies = _bodies(arm)
    dM = jax.jacfwd(lambda x: _composite_mass_matrix(arm, bodies, x))(q)  # dM[i, j, k] = dM_ij / dq_k
    gamma = 0.5 * (dM + jnp.swapaxes(dM, 1, 2) - jnp.transpose(dM, (2, 1, 0)))
    return jnp.einsum("ijk,k->ij", gamma, qd)


def kinetic_energy(arm: Arm, q, qd):
    """Kinetic energy 1/2 qd^T M(q) qd of links and rotors."""
    q, qd = _state(arm, "kinetic_energy", q=q, qd=qd)
    M = _mass_matrix(arm, _bodies(arm), q)
    return 0.5 * qd @ M @ qd


def potential_energy(arm: Arm, q):
    """Gravitational potential energy -sum_i m_i g . c_i (world frame), zero at the world origin."""
    (q,) = _state(arm, "potential_energy", q=q)
    bodies = _bodies(arm)
    rots, origins = body_poses(arm, bodies, q)
    # world position of each body's first moment: m p_origin + R h
    moments = bodies.mass[:, None] * origins + jnp.einsum("nij,nj->ni", rots, bodies.first_moment)
    return -jnp.sum(moments @ jnp.asarray(arm.gravity, dtype=moments.dtype))
