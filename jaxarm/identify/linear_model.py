"""Identification of models linear in the parameters: standard parameters, the regressor by
automatic differentiation, base parameters and (weighted) least squares.

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

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..dynamics import drives as drives_mod
from ..dynamics.newton_euler import _base_acceleration, _rnea
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


def _link_block(mass, first_moment, inertia_origin):
    """(n, 10) link parameters from m (n,), h (n, 3), I_o (n, 3, 3)."""
    I = jnp.stack([inertia_origin[:, r, c] for r, c in _INERTIA_INDEX], axis=1)
    return jnp.concatenate([mass[:, None], first_moment, I], axis=1)


def _inertia_from_block(I6):
    """(n, 3, 3) symmetric inertias from (n, 6) = (xx, xy, xz, yy, yz, zz)."""
    xx, xy, xz, yy, yz, zz = (I6[:, k] for k in range(6))
    return jnp.stack(
        [jnp.stack([xx, xy, xz], -1), jnp.stack([xy, yy, yz], -1), jnp.stack([xz, yz, zz], -1)], axis=-2
    )


def standard_parameters(arm: Arm, drives: bool = True) -> jnp.ndarray:
    """The arm's standard parameter vector (10 n [+ 4 n],) in link frames (see the module text).

    I_o by the parallel-axis theorem (Ch.10 eq. 10.13); drives as G^2 Jm, G^2 B,
    |G| (Tc+ - Tc-) / 2, |G| (Tc+ + Tc-) / 2.
    """
    checks.check_arm(arm, "standard_parameters")
    links = arm.links
    m = jnp.asarray(links.mass)
    com = jnp.asarray(links.com)
    I_o = _inertia_about_origin(m, com, jnp.asarray(links.inertia))
    pi = _link_block(m, m[:, None] * com, I_o).reshape(-1)
    if not drives:
        return pi
    dr = arm.drives
    G = jnp.asarray(dr.gear_ratio)
    tc = jnp.asarray(dr.coulomb_friction)
    block = jnp.stack(
        [
            G * G * jnp.asarray(dr.rotor_inertia),
            G * G * jnp.asarray(dr.viscous_friction),
            jnp.abs(G) * 0.5 * (tc[:, 0] - tc[:, 1]),
            jnp.abs(G) * 0.5 * (tc[:, 0] + tc[:, 1]),
        ],
        axis=1,
    )
    return jnp.concatenate([pi, block.reshape(-1)])


def _check_pi(arm: Arm, pi, drives: bool, func: str):
    pi = jnp.asarray(pi)
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
    n = arm.n
    block = pi[: 10 * n].reshape(n, 10)
    m, h = block[:, 0], block[:, 1:4]
    I_o = _inertia_from_block(block[:, 4:])
    massive = m != 0
    com = jnp.where(massive[:, None], h / jnp.where(massive, m, 1.0)[:, None], 0.0)
    I_c = I_o - (_inertia_about_origin(m, com, jnp.zeros_like(I_o)))
    new = arm.replace(links=Links(mass=m, com=com, inertia=I_c))
    if not drives:
        return new
    d = pi[10 * n :].reshape(n, 4)
    G = jnp.asarray(arm.drives.gear_ratio, dtype=pi.dtype)
    G2, absG = G * G, jnp.abs(G)
    fields = dict(vars(arm.drives))
    fields.update(
        rotor_inertia=d[:, 0] / G2,
        viscous_friction=d[:, 1] / G2,
        coulomb_friction=jnp.stack([(d[:, 2] + d[:, 3]) / absG, (-d[:, 2] + d[:, 3]) / absG], axis=1),
    )
    return new.replace(drives=Drives(**fields))


# --------------------------------------------------------------------------------------------
# Regressor


def _bodies_from_parameters(bodies: Bodies, block):
    """Body-frame inertial parameters from link-frame ones (n, 10), linearly.

    Link frame i sits at (link_rotation R, link_translation p) in body frame i. With h' = R h:
    h_b = h' + m p and, moving the inertia from the link origin to the body origin,
    I_b = R I_o R^T + m (|p|^2 1 - p p^T) + 2 (p . h') 1 - (p h'^T + h' p^T)   (Ch.10 10.13, 10.18
    generalised to a reference point that is not the centre of mass).
    """
    R, p = bodies.link_rotation, bodies.link_translation
    m, h = block[:, 0], block[:, 1:4]
    I = _inertia_from_block(block[:, 4:])
    hR = jnp.einsum("nij,nj->ni", R, h)
    eye = jnp.eye(3, dtype=block.dtype)
    pp = (p * p).sum(-1)
    ph = (p * hR).sum(-1)
    outer = p[:, :, None] * hR[:, None, :]
    I_b = (
        jnp.einsum("nij,njk,nlk->nil", R, I, R)
        + m[:, None, None] * (pp[:, None, None] * eye - p[:, :, None] * p[:, None, :])
        + 2.0 * ph[:, None, None] * eye
        - outer
        - jnp.swapaxes(outer, -1, -2)
    )
    return bodies._replace(mass=m, first_moment=hR + m[:, None] * p, inertia_origin=I_b)


def _coulomb_direction(arm: Arm, qd, xp=jnp):
    """The arm's Coulomb direction s(qd): sign, or tanh(qd / scale) where a scale is set
    (``xp=np``: computed by NumPy, for known samples)."""
    return drives_mod._direction(qd, arm.drives.coulomb_velocity_scale, xp=xp)


def _linear_torques(arm: Arm, q, qd, qdd, pi, drives: bool):
    """Torques (n,) that are linear in pi: link RNEA without payload + drive terms."""
    n = arm.n
    bodies = _bodies_from_parameters(body_model(arm), pi[: 10 * n].reshape(n, 10))
    dtype = jnp.result_type(pi, q, qd, qdd)
    tau = _rnea(arm, bodies, q, qd, qdd, _base_acceleration(arm, dtype))[0]
    if drives:
        d = pi[10 * n :].reshape(n, 4)
        s = _coulomb_direction(arm, qd)
        tau = tau + d[:, 0] * qdd + d[:, 1] * qd + d[:, 2] * s + d[:, 3] * jnp.abs(s)
    return tau


def _regressor_one(arm: Arm, q, qd, qdd, drives: bool):
    """d tau / d pi (n, p) of a function exactly linear in pi; evaluated at pi = 0."""
    p = num_parameters(arm, drives)
    zero = jnp.zeros(p, dtype=jnp.result_type(q, qd, qdd, float))
    return jax.jacfwd(lambda pi: _linear_torques(arm, q, qd, qdd, pi, drives))(zero)


def _known_one(arm: Arm, q, qd, qdd, drives: bool):
    """Payload RNEA + friction outside pi (Stribeck, sigmoid; with drives=False all drive terms)."""
    n = arm.n
    links = arm.links
    dtype = jnp.result_type(jnp.asarray(links.mass), q, qd, qdd)
    massless = Links(mass=jnp.zeros(n, dtype), com=jnp.zeros((n, 3), dtype), inertia=jnp.zeros((n, 3, 3), dtype))
    payload_only = body_model(arm.replace(links=massless))  # body_model adds the payload to the last body
    tau = _rnea(arm, payload_only, q, qd, qdd, _base_acceleration(arm, dtype))[0]
    friction = drives_mod._friction_torques(arm, qd)
    if not drives:
        return tau + friction + drives_mod._reflected_inertia(arm) * qdd
    # Viscous and Coulomb (fc s + fo |s|, exact for the asymmetric model) are in pi: remove them.
    std = standard_parameters(arm, drives=True)[10 * n :].reshape(n, 4)
    s = _coulomb_direction(arm, qd)
    return tau + friction - (std[:, 1] * qd + std[:, 2] * s + std[:, 3] * jnp.abs(s))


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


_CHUNK = 2048  # samples per compiled call on concrete batches (bounds the memory of jacfwd)
_SMALL = 256  # batches up to this size (and single states) are padded to it
# (kernel, arm structure, settings) whose _CHUNK-sample program is compiled: a small batch of
# the same structure is then padded to _CHUNK too, so that it reuses that program rather than
# compile a second one (the Panda's regressor: 2.6-3.7 s) for a few milliseconds saved per call
_FULL_CHUNK = set()


@functools.partial(jax.jit, static_argnums=4)
def _linear_model_kernel(arm, q, qd, qdd, drives):
    """(Y (N, n, p), known torques (N, n)) in one compiled call: regressor and known torques
    share one compilation per arm structure."""
    return jax.vmap(lambda a, b, c: (_regressor_one(arm, a, b, c, drives), _known_one(arm, a, b, c, drives)))(q, qd, qdd)


def _is_traced(arm, *arrays) -> bool:
    return not checks.concrete((arm, *arrays))


def _chunked(kernel, arm, q, qd, qdd, *static):
    """Apply a jitted batch kernel in chunks of _CHUNK samples, padding the last one (and a
    batch of at most _SMALL samples to _SMALL, unless the _CHUNK-sample program of this arm
    structure is compiled already and the batch holds more than one state), so any input
    compiles one of two shapes and never holds more than one chunk's intermediates. The arm's
    name (static metadata) is dropped so that arms of the same structure share one compilation.
    The kernel returns an array or a tuple of arrays with the batch axis first."""
    arm = arm.replace(name="")
    N = q.shape[0]
    # The chunks are cut and padded on the host: slicing a device array at each start would
    # dispatch (and compile) one small slicing program per distinct start.
    q, qd, qdd = (np.asarray(x) for x in (q, qd, qdd))
    leaves, tree = jax.tree_util.tree_flatten(arm)
    key = (kernel, tree, tuple((np.shape(x), np.result_type(x)) for x in leaves), static, q.dtype)
    small = _SMALL if N == 1 or key not in _FULL_CHUNK else _CHUNK
    out = []
    for start in range(0, N, _CHUNK):
        parts = [x[start : start + _CHUNK] for x in (q, qd, qdd)]
        size = parts[0].shape[0]
        padded = small if N <= _SMALL else _CHUNK
        if padded > size:
            parts = [np.concatenate([x, np.repeat(x[-1:], padded - size, axis=0)]) for x in parts]
        result = kernel(arm, *parts, *static)
        if padded == _CHUNK:
            _FULL_CHUNK.add(key)
        if size == padded and N <= _CHUNK:
            return result  # one whole chunk: the kernel's arrays as they are
        # the padding cut off and the chunks joined on the host, too (a device array cut at each
        # length, or joined from each number of chunks, is one more small program per count)
        out.append(jax.tree_util.tree_map(lambda x: np.asarray(x)[:size], result))
    return jax.tree_util.tree_map(lambda *xs: jax.device_put(np.concatenate(xs)), *out)


def _linear_model(arm, q, qd, qdd, drives: bool, func: str):
    """(Y, known) for one state ((n, p), (n,)) or a batch ((N, n, p), (N, n))."""
    (q, qd, qdd), batched = _states(arm, q, qd, qdd, func)
    if _is_traced(arm, q, qd, qdd):
        one = lambda a, b, c: (_regressor_one(arm, a, b, c, drives), _known_one(arm, a, b, c, drives))  # noqa: E731
        return jax.vmap(one)(q, qd, qdd) if batched else one(q, qd, qdd)
    if not batched:
        Y, known = _chunked(_linear_model_kernel, arm, q[None], qd[None], qdd[None], drives)
        return Y[0], known[0]
    return _chunked(_linear_model_kernel, arm, q, qd, qdd, drives)


def regressor(arm: Arm, q, qd, qdd, drives: bool = True) -> jnp.ndarray:
    """The regressor Y with ``tau = Y @ pi + known_torques(arm, q, qd, qdd)`` (Atkeson 1986).

    q, qd, qdd: (n,) -> Y (n, p), or (N, n) -> Y (N, n, p); p = 10 n (+ 4 n with ``drives``).
    Obtained by forward-mode autodiff of the Newton-Euler torques written as a function that is
    exactly linear in the standard parameters pi (so Y does not depend on the point of
    evaluation, and nothing is derived by hand). Y depends on the arm's kinematics, gravity,
    base and the Coulomb smoothing scale only, not on its inertial or friction values.
    Concrete input is evaluated by one compiled kernel per arm structure (shared with
    :func:`known_torques`), in chunks of at most 2048 samples; inside ``jit`` it is traced as is.
    """
    return _linear_model(arm, q, qd, qdd, drives, "regressor")[0]


def known_torques(arm: Arm, q, qd, qdd, drives: bool = True) -> jnp.ndarray:
    """Torques not covered by the standard parameters: (n,) or (N, n) like q.

    The payload's Newton-Euler torques, the arm's Stribeck and sigmoid friction and, with
    ``drives=False``, its whole drive model (reflected inertia, viscous and Coulomb friction).
    ``drives`` must match the one given to :func:`regressor`.
    """
    return _linear_model(arm, q, qd, qdd, drives, "known_torques")[1]
