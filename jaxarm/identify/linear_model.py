"""Identification of models linear in the parameters: standard parameters, the regressor from the
structure of Newton-Euler, base parameters and (weighted) least squares.

Standard parameters
-------------------
Per link i, in link frame i (the frame of ``arm.links``), ten numbers
``[m, mx, my, mz, Ixx, Ixy, Ixz, Iyy, Iyz, Izz]``: the mass, the first moment ``m c`` and the
inertia tensor about the **link frame origin** ``I_o = I_c + m (|c|^2 1 - c c^T)`` (tensor
convention, so ``Ixy`` is minus the product of inertia, as in arm files). The inverse dynamics is
linear in these (Atkeson, An & Hollerbach 1986). Per joint drive, four joint-side numbers
``[Ia, fv, fc, fo]``: reflected rotor inertia ``G^2 Jm``, viscous ``fv qd``, Coulomb
``fc s(qd)`` and offset ``fo |s(qd)|`` where ``s`` is the arm's Coulomb direction (``sign(qd)``,
or ``tanh(qd / scale)`` where ``coulomb_velocity_scale`` is set). For a moving joint with the exact
sign, ``fo`` is a constant offset; at rest the arm's Coulomb model (and so ``fo``) gives zero.
These map onto :class:`jaxarm.Drives` exactly: ``rotor_inertia = Ia / G^2``,
``viscous_friction = fv / G^2``, ``coulomb_friction = [(fc + fo) / |G|, (-fc + fo) / |G|]``.

The full vector is ``[link 1 (10), ..., link n (10), drive 1 (4), ..., drive n (4)]`` (the drive
block only with ``drives=True``), named by :func:`parameter_names`.

Everything the vector does not hold is *known*: the payload, the arm's Stribeck and sigmoid
friction (and, with ``drives=False``, the arm's whole drive model), so
``tau = regressor(arm, q, qd, qdd) @ pi + known_torques(arm, q, qd, qdd)``
equals ``inverse_dynamics(arm_with_parameters(arm, pi), q, qd, qdd)``. (The Stribeck term
depends on the arm's own Coulomb levels, so with Stribeck friction set this identity holds for
``pi``'s drive block equal to the arm's; the sigmoid model is independent of ``pi``.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..core.xla import computed_once
from ..dynamics import algebra
from ..dynamics import drives as drives_mod
from ..dynamics.kinematics import _bodies, _body_model_numpy, joint_frames
from ..dynamics.newton_euler import _base_acceleration, outward_sweep, rnea
from ..model import checks
from ..model.arm import Arm, Bodies, Drives, Links, _inertia_about_origin, body_model

LINK_PARAMETERS = ("m", "mx", "my", "mz", "Ixx", "Ixy", "Ixz", "Iyy", "Iyz", "Izz")
DRIVE_PARAMETERS = ("Ia", "fv", "fc", "fo")

# Entries of the symmetric 3x3 inertia in LINK_PARAMETERS order (xx, xy, xz, yy, yz, zz).
_INERTIA_INDEX = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))


class IdentificationError(ValueError):
    """A log or regressor that cannot identify what was asked; the message says what is missing."""


# --------------------------------------------------------------------------------------------
# Standard parameters <-> Arm


def parameter_names(arm: Arm, drives: bool = True) -> list[str]:
    """Names of the standard parameters, in vector order: "m1", "mx1", ..., "Izz1", ...,
    then (with ``drives``) "Ia1", "fv1", "fc1", "fo1", ... (1-based joint numbers)."""
    checks.check_arm(arm, "parameter_names")
    names = [f"{p}{i + 1}" for i in range(arm.n) for p in LINK_PARAMETERS]
    if drives:
        names += [f"{p}{i + 1}" for i in range(arm.n) for p in DRIVE_PARAMETERS]
    return names


def num_parameters(arm: Arm, drives: bool = True) -> int:
    """Length of the standard parameter vector: 10 n (+ 4 n with drives)."""
    return arm.n * (14 if drives else 10)


def _link_block(mass, first_moment, inertia_origin, xp=jnp):
    """(n, 10) link parameters from m (n,), h (n, 3), I_o (n, 3, 3)."""
    I = xp.stack([inertia_origin[:, r, c] for r, c in _INERTIA_INDEX], axis=1)
    return xp.concatenate([mass[:, None], first_moment, I], axis=1)


def _inertia_from_block(I6, xp=jnp):
    """(n, 3, 3) symmetric inertias from (n, 6) = (xx, xy, xz, yy, yz, zz)."""
    xx, xy, xz, yy, yz, zz = (I6[:, k] for k in range(6))
    return xp.stack(
        [xp.stack([xx, xy, xz], -1), xp.stack([xy, yy, yz], -1), xp.stack([xz, yz, zz], -1)], axis=-2
    )


def standard_parameters(arm: Arm, drives: bool = True) -> jnp.ndarray:
    """The arm's standard parameter vector (10 n [+ 4 n],) in link frames (see the module text).

    I_o by the parallel-axis theorem (Ch.10 eq. 10.13); drives as G^2 Jm, G^2 B,
    |G| (Tc+ - Tc-) / 2, |G| (Tc+ + Tc-) / 2.
    """
    checks.check_arm(arm, "standard_parameters")
    # a known arm by NumPy (eagerly, jnp would compile a small program per operation and shape)
    xp = jnp if _is_traced(arm) else np
    links = arm.links
    m = xp.asarray(links.mass)
    com = xp.asarray(links.com)
    I_o = _inertia_about_origin(m, com, xp.asarray(links.inertia), xp=xp)
    pi = _link_block(m, m[:, None] * com, I_o, xp).reshape(-1)
    if drives:
        pi = xp.concatenate([pi, _drive_block(arm.drives, xp).reshape(-1)])
    return jax.device_put(pi) if xp is np else pi


def _drive_block(dr, xp=jnp):
    """(n, 4) joint-side drive parameters [Ia, fv, fc, fo] (see :func:`standard_parameters`)."""
    G = xp.asarray(dr.gear_ratio)
    tc = xp.asarray(dr.coulomb_friction)
    return xp.stack([G * G * xp.asarray(dr.rotor_inertia), G * G * xp.asarray(dr.viscous_friction),
                     xp.abs(G) * 0.5 * (tc[:, 0] - tc[:, 1]), xp.abs(G) * 0.5 * (tc[:, 0] + tc[:, 1])], axis=1)


def _check_pi(arm: Arm, pi, drives: bool, func: str):
    pi = pi if isinstance(pi, (jax.Array, jax.core.Tracer)) else np.asarray(pi)  # (jnp.asarray compiles per shape)
    p = num_parameters(arm, drives)
    if pi.shape != (p,):
        what = "10 n + 4 n (drives=True)" if drives else "10 n (drives=False)"
        raise ValueError(f"{func}: pi: expected shape ({p},) = {what} for this {arm.n}-joint arm, got {pi.shape}")
    if checks._is_concrete(pi) and not bool(np.all(np.isfinite(np.asarray(pi)))):
        bad = np.flatnonzero(~np.isfinite(np.asarray(pi)))
        raise ValueError(f"{func}: pi: expected finite values, got non-finite entries at {bad.tolist()}")
    if not jnp.issubdtype(pi.dtype, jnp.floating):
        pi = pi.astype(jnp.result_type(float))
    return pi


def arm_with_parameters(arm: Arm, pi, drives: bool = True) -> Arm:
    """The arm with its link (and drive) parameters replaced by ``pi`` (standard vector).

    Inverse of :func:`standard_parameters`: ``com = h / m`` and ``I_c = I_o - m (|c|^2 1 - c c^T)``
    (Ch.10 eq. 10.13); a link with ``m == 0`` gets ``com = 0``, ``I_c = I_o`` (a massless link cannot
    hold a first moment). Drives: ``rotor_inertia = Ia / G^2``, ``viscous = fv / G^2``,
    ``coulomb = [(fc + fo) / |G|, (-fc + fo) / |G|]``. Traceable (jit / grad through it); values
    are not validated, so least-squares estimates with negative masses or friction pass through:
    check them with :func:`jaxarm.consistency_report`.
    """
    checks.check_arm(arm, "arm_with_parameters")
    pi = _check_pi(arm, pi, drives, "arm_with_parameters")
    xp = jnp if _is_traced(arm, pi) else np  # known: by NumPy, as standard_parameters
    put = jax.device_put if xp is np else (lambda x: x)  # noqa: E731
    pi = xp.asarray(pi)
    n = arm.n
    block = pi[: 10 * n].reshape(n, 10)
    m, h = block[:, 0], block[:, 1:4]
    I_o = _inertia_from_block(block[:, 4:], xp)
    massive = m != 0
    com = xp.where(massive[:, None], h / xp.where(massive, m, 1.0)[:, None], 0.0)
    I_c = I_o - (_inertia_about_origin(m, com, xp.zeros_like(I_o), xp=xp))
    new = arm.replace(links=Links(mass=put(m), com=put(com), inertia=put(I_c)))
    if not drives:
        return new
    d = pi[10 * n :].reshape(n, 4)
    G = xp.asarray(arm.drives.gear_ratio, dtype=pi.dtype)
    G2, absG = G * G, xp.abs(G)
    fields = dict(vars(arm.drives))
    fields.update(
        rotor_inertia=put(d[:, 0] / G2),
        viscous_friction=put(d[:, 1] / G2),
        coulomb_friction=put(xp.stack([(d[:, 2] + d[:, 3]) / absG, (-d[:, 2] + d[:, 3]) / absG], axis=1)),
    )
    return new.replace(drives=Drives(**fields))


# --------------------------------------------------------------------------------------------
# Regressor


def _bodies_from_parameters(bodies: Bodies, block, xp=jnp):
    """Body-frame inertial parameters from link-frame ones (n, 10), linearly.

    Link frame i sits at (link_rotation R, link_translation p) in body frame i. With h' = R h:
    h_b = h' + m p and, moving the inertia from the link origin to the body origin,
    I_b = R I_o R^T + m (|p|^2 1 - p p^T) + 2 (p . h') 1 - (p h'^T + h' p^T)   (Ch.10 10.13, 10.18
    generalised to a reference point that is not the centre of mass).
    """
    R, p = bodies.link_rotation, bodies.link_translation
    m, h = block[:, 0], block[:, 1:4]
    I = _inertia_from_block(block[:, 4:], xp)
    hR = xp.einsum("nij,nj->ni", R, h)
    eye = xp.eye(3, dtype=block.dtype)
    pp = (p * p).sum(-1)
    ph = (p * hR).sum(-1)
    outer = p[:, :, None] * hR[:, None, :]
    I_b = (
        xp.einsum("nij,njk,nlk->nil", R, I, R)
        + m[:, None, None] * (pp[:, None, None] * eye - p[:, :, None] * p[:, None, :])
        + 2.0 * ph[:, None, None] * eye
        - outer
        - xp.swapaxes(outer, -1, -2)
    )
    return bodies._replace(mass=m, first_moment=hR + m[:, None] * p, inertia_origin=I_b)


def _coulomb_direction(arm: Arm, qd, xp=jnp):
    """The arm's Coulomb direction s(qd): sign, or tanh(qd / scale) where a scale is set
    (``xp=np``: computed by NumPy, for known samples)."""
    return drives_mod._direction(qd, arm.drives.coulomb_velocity_scale, xp=xp)


# The regressor is evaluated in one of two ways, by one implementation: by XLA where anything is
# traced (inside the user's jit or grad: the excitation design differentiates through it), and by
# NumPy for known samples of a known arm (the identification's fits and model selection), where
# the recursions' scalars are the samples' columns. NumPy has nothing to compile. The Panda's
# regressor, 2-core Intel Xeon: as an XLA program (the same function differentiated by
# jax.jacfwd, before) it compiled for 5-7 s once per process and arm structure and then took
# about 7 us per sample; by NumPy 15-25 us per sample from the first call.


def _host_sincos(x):
    return np.sin(x), np.cos(x)


def _columns(x):
    """The joint columns of known samples (N, n), as the scalars of the recursions."""
    return [x[:, i] for i in range(x.shape[1])]


def _inverse_dynamics_numpy(arm: Arm, q, qd, qdd):
    """Inverse dynamics (N, n) of known samples (N, n) of a known arm, by NumPy: Newton-Euler's
    recursion (:func:`jaxarm.dynamics.newton_euler.rnea`) with the samples' columns as its
    scalars, plus reflected rotor inertia and friction, as :func:`jaxarm.inverse_dynamics`
    composes them (no payload-free shortcut: the payload is in the last body)."""
    arm = jax.tree_util.tree_map(np.asarray, arm)
    dtype = np.result_type(q, qd, qdd, float)
    bodies = _body_model_numpy(arm)
    frames = joint_frames(bodies, arm.is_revolute, _columns(q), _host_sincos)
    taus, _, _ = rnea(bodies, arm.is_revolute, frames, _columns(qd), _columns(qdd),
                      algebra._vec(_base_acceleration(arm, dtype)))
    tau = np.stack([np.full(len(q), t.value, dtype) if isinstance(t, algebra.Known) else t for t in taus], axis=1)
    return tau + drives_mod._reflected_inertia(arm, np) * qdd + drives_mod._friction_torques(arm, qd, xp=np)


def _bmm(a, b):
    """a @ b for matrices of samples, batch last: (i, k, N) and (k, j, N) -> (i, j, N), as k
    products and sums over whole rows of samples."""
    out = a[:, 0, None] * b[None, 0]
    for k in range(1, a.shape[1]):
        out = out + a[:, k, None] * b[None, k]
    return out


def _skew(v, xp):
    """[v]x (3, 3, N), the matrix of v x . , for v (3, N)."""
    z = xp.zeros_like(v[0])
    return xp.stack([xp.stack([z, -v[2], v[1]]), xp.stack([v[2], z, -v[0]]), xp.stack([-v[1], v[0], z])])


def _inertia_map(v, xp):
    """L(v) (3, 6, N) with L(v) I6 = I v for the symmetric I given by its six entries
    (xx, xy, xz, yy, yz, zz), for v (3, N)."""
    z = xp.zeros_like(v[0])
    v0, v1, v2 = v
    return xp.stack([xp.stack([v0, v1, v2, z, z, z]), xp.stack([z, v0, z, v1, v2, z]), xp.stack([z, z, v0, z, v1, v2])])


def _motion(arm: Arm, bodies, q, qd, qdd, xp):
    """(n, 21, N) per body and state (q, qd, qdd each (N, n)): the body's pose in its parent (R
    row by row, p) and its motion (w, wd, a) from Newton-Euler's outward sweep
    (:func:`jaxarm.dynamics.newton_euler.outward_sweep`). By XLA, each body's 21 numbers are
    stored once per state (:func:`jaxarm.core.xla.computed_once`): every regressor entry reads
    them, and XLA:CPU would otherwise fuse the sweep into each entry."""
    n = arm.n
    dtype = xp.result_type(q, qd, qdd, float)
    a0 = algebra._vec(_base_acceleration(arm, dtype))
    zero = (algebra.ZERO,) * 3

    def values(q, qd, qdd, sincos):  # n lists of 21 scalars
        frames = joint_frames(bodies, arm.is_revolute, q, sincos)
        return [[*R[0], *R[1], *R[2], *p, *(w or zero), *(wd or zero), *a]
                for (R, p), (w, wd, a) in zip(frames, outward_sweep(arm.is_revolute, frames, qd, qdd, a0))]

    if xp is np:
        out = np.empty((n, 21, q.shape[0]), dtype)
        for i, body in enumerate(values(_columns(q), _columns(qd), _columns(qdd), _host_sincos)):
            for k, v in enumerate(body):
                out[i, k] = v.value if isinstance(v, algebra.Known) else v
        return out
    one = lambda q, qd, qdd: [algebra.vector(v, dtype) for v in values(q, qd, qdd, algebra.sincos)]  # noqa: E731
    return jnp.stack(computed_once(jax.vmap(one), q, qd, qdd), axis=0).transpose(0, 2, 1)


def _body_regressor(arm: Arm, motion, xp, last_only=False):
    """The blocks Y_j (j + 1, 10, N), j = 0..n-1: d tau_i / d (body j's inertial parameters
    beta_j = (m, h, I about the body origin, in the body frame)) for the joints i <= j (zero for
    i > j), at the N states whose ``motion`` (:func:`_motion`, (n, 21, N): samples last) is given,
    from the structure of Newton-Euler, which is linear in them (Atkeson, An & Hollerbach 1986).
    Body j's wrench about its origin is K_j beta_j (Craig 6.49-6.50 taken about the origin),

        f = m a + ([wd]x + [w]x [w]x) h,    n = -[a]x h + (L(wd) + [w]x L(w)) I6,

    and reaches joint i <= j through the inward sweep's wrench transforms (Craig 6.51-6.53):
    tau_i = r_ij . (f, n), the row r_ii = (0, z) for a revolute joint and (z, 0) for a prismatic
    one, carried out to body j as r <- (R^T (r_f + r_n x p), R^T r_n) for each body's pose (R, p)
    in its parent. ``last_only``: the last body's block alone (None for the others)."""
    n, _, N = motion.shape
    dtype = motion.dtype
    blocks = []
    rows = xp.zeros((0, 6, N), dtype)  # the rows of joints 0..j-1, carried out to body j-1
    for j in range(n):
        R = motion[j, :9].reshape(3, 3, N)
        p, w, wd, a = (motion[j, 9 + 3 * k: 12 + 3 * k] for k in range(4))
        if j:
            rf, rn = rows[:, :3], rows[:, 3:]
            carried = rf + xp.stack([rn[:, 1] * p[2] - rn[:, 2] * p[1], rn[:, 2] * p[0] - rn[:, 0] * p[2],
                                     rn[:, 0] * p[1] - rn[:, 1] * p[0]], axis=1)  # r_f + r_n x p
            rows = xp.concatenate([_bmm(carried, R), _bmm(rn, R)], axis=1)  # R^T of each half (rows times R)
        own = np.zeros(6)
        own[5 if arm.is_revolute[j] else 2] = 1.0
        rows = xp.concatenate([rows, xp.broadcast_to(xp.asarray(own, dtype)[None, :, None], (1, 6, N))], axis=0)
        if last_only and j < n - 1:
            blocks.append(None)
            continue
        Sw = _skew(w, xp)
        Kf = xp.concatenate([a[:, None], _skew(wd, xp) + _bmm(Sw, Sw), xp.zeros((3, 6, N), dtype)], axis=1)  # (3, 10, N)
        Kn = xp.concatenate([xp.zeros((3, 1, N), dtype), -_skew(a, xp), _inertia_map(wd, xp) + _bmm(Sw, _inertia_map(w, xp))],
                            axis=1)
        blocks.append(_bmm(rows, xp.concatenate([Kf, Kn], axis=0)))  # (j + 1, 10, N): joints 0..j
    return blocks


def _link_to_body_maps(bodies, dtype, xp):
    """T (n, 10, 10): body i's parameters beta_i (the entries Newton-Euler reads, in body frame i)
    as the linear map of link i's standard parameters that :func:`_bodies_from_parameters` is,
    column by column."""
    n = bodies.rotation.shape[0]
    columns = []
    for k in range(10):
        unit = xp.zeros((n, 10), dtype) + xp.asarray(np.eye(10)[k], dtype)
        b = _bodies_from_parameters(bodies, unit, xp)
        columns.append(xp.concatenate([b.mass[:, None], b.first_moment, _sym6(b.inertia_origin, xp)], axis=1))
    return xp.stack(columns, axis=-1)


def _sym6(I, xp):
    """(..., 6): the six entries (xx, xy, xz, yy, yz, zz) of (..., 3, 3), off-diagonals averaged
    over both triangles (as Newton-Euler reads an inertia: :func:`jaxarm.dynamics.algebra._sym`)."""
    return xp.stack([0.5 * (I[..., r, c] + I[..., c, r]) for r, c in _INERTIA_INDEX], axis=-1)


def _linear_model_batch(arm: Arm, q, qd, qdd, drives: bool, xp=jnp, Y=None, with_regressor=True):
    """(Y (N, n, p), known torques (N, n)) at the states q, qd, qdd (N, n): the regressor from the
    structure of Newton-Euler (:func:`_body_regressor`), its link columns mapped from the bodies'
    parameters to the links' (:func:`_link_to_body_maps`); the payload's torques are the last
    body's columns applied to the payload's parameters (a rigid body fixed to it). ``xp``:
    ``jnp`` (traced) or ``np`` (known samples, known arm). With NumPy, ``Y``: a zeroed array
    (N, n, p) to write the regressor into; ``with_regressor=False``: the known torques alone
    (Y None)."""
    n = arm.n
    N = q.shape[0]
    host = xp is np
    if host:
        arm = jax.tree_util.tree_map(np.asarray, arm)
    bodies = _body_model_numpy(arm) if host else _bodies(arm)
    motion = _motion(arm, bodies, q, qd, qdd, xp)
    dtype = motion.dtype
    blocks = _body_regressor(arm, motion, xp, last_only=not with_regressor)
    massless = Links(mass=xp.zeros(n, dtype), com=xp.zeros((n, 3), dtype), inertia=xp.zeros((n, 3, 3), dtype))
    payload = body_model(arm.replace(links=massless), xp=xp)  # the payload alone, in the last body
    beta = xp.concatenate([payload.mass[-1:], payload.first_moment[-1], _sym6(payload.inertia_origin[-1], xp)]).astype(dtype)
    known = xp.einsum("ibN,b->Ni", blocks[-1], beta) + drives_mod._friction_torques(arm, qd, xp=xp)
    if drives:
        # viscous and Coulomb friction (fc s + fo |s|, exact for the asymmetric model) are in pi:
        # taken out of the known part
        s = _coulomb_direction(arm, qd, xp)
        std = _drive_block(arm.drives, xp)
        known = known - (std[:, 1] * qd + std[:, 2] * s + std[:, 3] * xp.abs(s))
        features = xp.stack([qdd, qd, s, xp.abs(s)], axis=1).astype(dtype)  # (N, 4, n): the columns of Ia, fv, fc, fo
    else:
        known = known + drives_mod._reflected_inertia(arm, xp) * qdd
    if not with_regressor:
        return None, known
    # each body's columns through its own map from the link's parameters; samples last
    T = _link_to_body_maps(bodies, dtype, xp)
    link = [xp.einsum("ibN,bl->ilN", block, T[j]) for j, block in enumerate(blocks)]
    if host:  # written into place (every copy of Y costs: 5.5 kB per sample for 7 joints)
        Y = np.zeros((N, n, 14 * n if drives else 10 * n), dtype) if Y is None else Y
        for j, block in enumerate(link):
            Y[:, : j + 1, 10 * j: 10 * j + 10] = block.transpose(2, 0, 1)
        if drives:
            for i in range(n):
                Y[:, i, 10 * n + 4 * i: 10 * n + 4 * i + 4] = features[:, :, i]
        return Y, known
    parts = [jnp.concatenate([block, jnp.zeros((n - j - 1, 10, N), dtype)], axis=0) for j, block in enumerate(link)]
    if drives:  # joint i's four columns: its own features, zero for the other joints
        parts.append((jnp.transpose(features, (2, 1, 0))[:, None] * jnp.eye(n, dtype=dtype)[:, :, None, None]).reshape(n, 4 * n, N))
    return jnp.transpose(jnp.concatenate(parts, axis=1), (2, 0, 1)), known


def _states(arm: Arm, q, qd, qdd, func: str):
    """Validate (q, qd, qdd): each (n,) or each (N, n). Returns the arrays (traced ones as they
    are, known ones as NumPy arrays: no device copy, whose program is compiled per shape) and
    whether batched."""
    checks.check_arm(arm, func)
    arrays = []
    for name, x in (("q", q), ("qd", qd), ("qdd", qdd)):
        if x is None:
            raise ValueError(f"{func}: {name}: expected an array of shape ({arm.n},) or (N, {arm.n}), got None")
        x = x if isinstance(x, jax.core.Tracer) else np.asarray(x)
        if x.ndim not in (1, 2) or x.shape[-1] != arm.n:
            raise ValueError(f"{func}: {name}: expected shape ({arm.n},) or (N, {arm.n}) for this {arm.n}-joint arm, got {x.shape}")
        if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
            raise TypeError(f"{func}: {name}: expected real numbers, got dtype {x.dtype}")
        if jnp.issubdtype(x.dtype, jnp.integer):
            x = x.astype(jnp.result_type(float))
        if checks._is_concrete(x) and not bool(np.all(np.isfinite(np.asarray(x)))):
            rows = np.unique(np.argwhere(~np.isfinite(np.asarray(x)))[:, 0]).tolist()
            where = f"row(s) {rows[:10]}" if x.ndim == 2 else f"joint(s) {[r + 1 for r in rows]}"
            raise ValueError(f"{func}: {name}: expected finite values, got non-finite entries at {where}")
        arrays.append(x)
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"{func}: q, qd, qdd: expected equal shapes, got {[a.shape for a in arrays]}")
    return arrays, arrays[0].ndim == 2


def _is_traced(arm, *arrays) -> bool:
    return not checks.concrete((arm, *arrays))


_HOST_CHUNK = 4096  # samples per NumPy evaluation (bounds its intermediates: about 60 MB for 7 joints)


def _linear_model(arm, q, qd, qdd, drives: bool, func: str, *, numpy=False, with_regressor=True):
    """(Y, known) for one state ((n, p), (n,)) or a batch ((N, n, p), (N, n)); Y None without
    ``with_regressor``. Known samples of a known arm are evaluated by NumPy, in chunks of
    _HOST_CHUNK samples written into place, and returned as jax arrays, or with ``numpy`` as
    NumPy arrays (no copy: the identification's own fits)."""
    (q, qd, qdd), batched = _states(arm, q, qd, qdd, func)
    one = (lambda x: x[None]) if not batched else (lambda x: x)  # noqa: E731
    if _is_traced(arm, q, qd, qdd):
        if numpy:
            raise ValueError(f"{func}: expected known samples and a known arm, not traced ones")
        Y, known = _linear_model_batch(arm, one(q), one(qd), one(qdd), drives, jnp, with_regressor=with_regressor)
    else:
        q, qd, qdd = (np.asarray(one(x)) for x in (q, qd, qdd))
        N, n = q.shape
        dtype = np.result_type(q, qd, qdd, float)
        Y = np.zeros((N, n, 14 * n if drives else 10 * n), dtype) if with_regressor else None
        known = np.empty((N, n), dtype)
        for s in range(0, N, _HOST_CHUNK):
            part = slice(s, s + _HOST_CHUNK)
            known[part] = _linear_model_batch(arm, q[part], qd[part], qdd[part], drives, np,
                                              None if Y is None else Y[part], with_regressor)[1]
        if not batched:  # cut on the host (indexing a device array compiles a program per shape)
            Y, known = (None if Y is None else Y[0]), known[0]
        if not numpy:  # device_put: jnp.asarray would compile a small program for every new shape
            Y, known = (None if Y is None else jax.device_put(Y)), jax.device_put(known)
        return Y, known
    return (Y, known) if batched else (None if Y is None else Y[0], known[0])


def linear_model_numpy(arm: Arm, q, qd, qdd, drives: bool = True):
    """(:func:`regressor`, :func:`known_torques`) of known samples (N, n) as NumPy arrays, in one
    evaluation (the identification's fits and model selection)."""
    return _linear_model(arm, q, qd, qdd, drives, "regressor", numpy=True)


def regressor(arm: Arm, q, qd, qdd, drives: bool = True) -> jnp.ndarray:
    """The regressor Y with ``tau = Y @ pi + known_torques(arm, q, qd, qdd)`` (Atkeson 1986).

    q, qd, qdd: (n,) -> Y (n, p), or (N, n) -> Y (N, n, p); p = 10 n (+ 4 n with ``drives``).
    Built from the structure of Newton-Euler, which is linear in every body's inertial
    parameters (:func:`_body_regressor`: the bodies' motion from the same outward sweep as the
    inverse dynamics, each body's wrench as a matrix of it, carried to the joints by the inward
    sweep's transforms), and a fixed linear map per link from body-frame to link-frame
    parameters. Y depends on the arm's kinematics, gravity, base and the Coulomb smoothing scale
    only, not on its inertial or friction values. Known samples of a known arm are evaluated by
    NumPy (nothing to compile); inside ``jit`` or ``grad`` it is traced as is.
    """
    return _linear_model(arm, q, qd, qdd, drives, "regressor")[0]


def known_torques(arm: Arm, q, qd, qdd, drives: bool = True) -> jnp.ndarray:
    """Torques not covered by the standard parameters: (n,) or (N, n) like q.

    The payload's Newton-Euler torques, the arm's Stribeck and sigmoid friction and, with
    ``drives=False``, its whole drive model (reflected inertia, viscous and Coulomb friction).
    ``drives`` must match the one given to :func:`regressor`.
    """
    return _linear_model(arm, q, qd, qdd, drives, "known_torques", with_regressor=False)[1]
