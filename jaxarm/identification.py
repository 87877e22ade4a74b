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

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import checks, drives as drives_mod
from .arm import Arm, Bodies, Drives, Links, _inertia_about_origin, body_model
from .dynamics import _base_acceleration, _inverse_dynamics, _rnea

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


def _coulomb_direction(arm: Arm, qd):
    """The arm's Coulomb direction s(qd): sign, or tanh(qd / scale) where a scale is set."""
    return drives_mod._direction(qd, jnp.asarray(arm.drives.coulomb_velocity_scale))


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
    """Validate (q, qd, qdd): each (n,) or each (N, n). Returns jnp arrays and whether batched."""
    checks.check_arm(arm, func)
    arrays = []
    for name, x in (("q", q), ("qd", qd), ("qdd", qdd)):
        if x is None:
            raise ValueError(f"{func}: {name}: expected an array of shape ({arm.n},) or (N, {arm.n}), got None")
        x = jnp.asarray(x)
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


@functools.partial(jax.jit, static_argnums=4)
def _linear_model_kernel(arm, q, qd, qdd, drives):
    """(Y (N, n, p), known torques (N, n)) in one compiled call: regressor and known torques
    share one compilation per arm structure."""
    return jax.vmap(lambda a, b, c: (_regressor_one(arm, a, b, c, drives), _known_one(arm, a, b, c, drives)))(q, qd, qdd)


def _is_traced(arm, *arrays) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in (*jax.tree_util.tree_leaves(arm), *arrays))


def _chunked(kernel, arm, q, qd, qdd, *static):
    """Apply a jitted batch kernel in chunks of _CHUNK samples, padding the last one (and a
    batch of at most _SMALL samples to _SMALL), so any input compiles one of two shapes and never
    holds more than one chunk's intermediates. The arm's name (static
    metadata) is dropped so that arms of the same structure share one compilation. The kernel
    returns an array or a tuple of arrays with the batch axis first."""
    arm = arm.replace(name="")
    N = q.shape[0]
    out = []
    for start in range(0, N, _CHUNK):
        parts = [x[start : start + _CHUNK] for x in (q, qd, qdd)]
        size = parts[0].shape[0]
        padded = _SMALL if N <= _SMALL else _CHUNK
        if padded > size:
            parts = [jnp.concatenate([x, jnp.repeat(x[-1:], padded - size, axis=0)]) for x in parts]
        out.append(jax.tree_util.tree_map(lambda x: x[:size], kernel(arm, *parts, *static)))
    if len(out) == 1:
        return out[0]
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *out)


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


# --------------------------------------------------------------------------------------------
# Base parameters


@dataclasses.dataclass(frozen=True, eq=False)
class BaseParameters:
    """The identifiable combinations beta = K pi of the standard parameters.

    ``independent`` (r,) column indices kept, in base order; ``dependent`` the others;
    ``K`` (r, p) with ``K[:, independent] = 1`` and ``Y = Y[:, independent] @ K`` for every
    regressor of the arm; ``descriptions`` (r,) e.g. "Izz1 + Iyy2 + 0.0625 m3";
    ``unidentifiable``: standard parameters that enter no base parameter (zero regressor column).
    ``condition_number`` of the base columns of Y; ``condition_number_scaled`` after scaling each
    column to unit norm. ``rtol``: the rank tolerance used (see :func:`base_parameters`).
    """

    rank: int
    rtol: float
    independent: tuple
    dependent: tuple
    K: np.ndarray
    standard_names: tuple
    descriptions: tuple
    unidentifiable: tuple
    condition_number: float
    condition_number_scaled: float
    method: str

    @property
    def names(self) -> tuple:
        """The standard parameter each base parameter is anchored on (its independent column)."""
        return tuple(self.standard_names[k] for k in self.independent)

    def project(self, pi) -> np.ndarray:
        """beta = K pi (r,) for a standard vector pi (p,)."""
        return self.K @ np.asarray(pi, dtype=float)

    def table(self) -> list[dict]:
        """One dict per base parameter: index, name, description."""
        return [{"index": k, "name": name, "combination": d} for k, (name, d) in enumerate(zip(self.names, self.descriptions))]


def grouping_order(arm: Arm, drives: bool = True) -> list[int]:
    """Column order for Gautier's sequential selection that gives the classic regrouping
    (Khalil & Bennis 1995) in any convention: all parameters in link order, except, for each
    revolute joint about the a axis of its link frame (z in modified DH, usually +-y in standard
    DH), the mass, the first moment along a and the second diagonal inertia across a (Iyy for
    a = z), which come after all others; for a prismatic joint its link's six inertia entries.
    Those are the parameters that merge into the same and the previous links' (e.g.
    "Izz1 + Iyy2 + 0.0625 m3") -- or vanish -- instead of the other way round.
    A joint axis not along a link-frame axis is treated like z."""
    checks.check_arm(arm, "grouping_order")
    names = parameter_names(arm, drives)
    axes = np.asarray(body_model(arm).link_rotation)[:, 2, :]  # joint axis (body z) in link frame i
    last = set()
    for i, rev in enumerate(arm.is_revolute):
        if not rev:
            last |= {f"{p}{i + 1}" for p in LINK_PARAMETERS[4:]}
            continue
        a = int(np.argmax(np.abs(axes[i]))) if np.max(np.abs(axes[i])) > 1 - 1e-9 else 2
        across = [c for c in range(3) if c != a][1]
        last |= {f"m{i + 1}", f"m{'xyz'[a]}{i + 1}", f"I{'xyz'[across] * 2}{i + 1}"}
    first = [k for k, name in enumerate(names) if name not in last]
    return first + [k for k, name in enumerate(names) if name in last]


def _format_coefficient(c: float, name: str) -> str:
    if abs(c - 1.0) < 1e-9:
        return f"+ {name}"
    if abs(c + 1.0) < 1e-9:
        return f"- {name}"
    return f"{'-' if c < 0 else '+'} {abs(c):.6g} {name}"


def _as_rows(Y, func: str, name: str = "Y") -> np.ndarray:
    Y = np.asarray(Y, dtype=float)
    if Y.ndim == 3:
        Y = Y.reshape(-1, Y.shape[-1])
    if Y.ndim != 2 or Y.shape[0] == 0 or Y.shape[1] == 0:
        raise ValueError(f"{func}: {name}: expected shape (N * n, p) or (N, n, p), got {np.shape(Y)}")
    if not np.all(np.isfinite(Y)):
        raise ValueError(f"{func}: {name}: expected finite values")
    return Y


def base_parameters(Y, *, rtol: float = 1e-8, names=None, order=None) -> BaseParameters:
    """The base parameters of a regressor Y ((N * n, p) stacked or (N, n, p)).

    Each column is scaled to unit norm; columns with norm <= rtol * (largest norm) are zero
    (unidentifiable). The rest are reduced to their triangular factor R (Y_scaled = Q R, Q
    orthogonal, same column relations) and selected

    * ``order="pivoted"``: by QR with column pivoting (``scipy.linalg.qr(pivoting=True)``),
      rank = #{|R_kk| > rtol |R_00|};
    * otherwise (a sequence of column indices, e.g. :func:`grouping_order`, or by default the
      natural order): sequentially in that order, keeping a
      column when its distance to the span of the kept ones exceeds ``rtol`` (Gautier 1990's QR
      in a chosen order, done with re-orthogonalised Gram-Schmidt so a rejected column cannot
      perturb later decisions).

    The dependent columns are expressed in the independent ones by least squares,
    ``Y_dep = Y_ind K_dep``, coefficients below 1e-9 (relative to the column norms) set to 0, so
    beta = pi_ind + K_dep pi_dep (Gautier & Khalil 1990). The default ``rtol`` = 1e-8 separates
    structural dependencies (distance ~1e-13 on random samples) from real but poorly excited
    directions; run it on random states for the arm's structure, on a log's regressor to see
    what that log identifies.
    """
    from scipy import linalg

    Yr = _as_rows(Y, "base_parameters")
    p = Yr.shape[1]
    if not (np.isfinite(rtol) and 0 < rtol < 1):
        raise ValueError(f"base_parameters: rtol: expected 0 < rtol < 1, got {rtol!r}")
    names = tuple(str(x) for x in names) if names is not None else tuple(f"p{k}" for k in range(p))
    if len(names) != p:
        raise ValueError(f"base_parameters: names: expected {p} names (one per column of Y), got {len(names)}")
    norms = np.linalg.norm(Yr, axis=0)
    nonzero = norms > rtol * norms.max() if norms.max() > 0 else np.zeros(p, dtype=bool)
    if not nonzero.any():
        raise IdentificationError("base_parameters: Y is zero: no parameter is identifiable")
    scale = np.where(nonzero, norms, 1.0)
    R0 = linalg.qr(Yr / scale, mode="r", check_finite=False)[0][:p]  # (<= p, p): same Gram matrix

    candidates = [k for k in range(p) if nonzero[k]]
    if isinstance(order, str) and order == "pivoted":
        method = "pivoted QR"
        sub = R0[:, candidates]
        _, Rp, piv = linalg.qr(sub, mode="economic", pivoting=True, check_finite=False)
        diag = np.abs(np.diag(Rp))
        rank = int(np.sum(diag > rtol * diag[0]))
        independent = [candidates[k] for k in piv[:rank]]
    else:
        if order is None:
            seq, method = list(range(p)), "sequential (column order)"
        else:
            seq = [int(k) for k in order]
            if sorted(seq) != list(range(p)):
                raise ValueError(f"base_parameters: order: expected a permutation of 0..{p - 1} or 'pivoted'")
            method = "sequential (given order)"
        basis = np.zeros((R0.shape[0], 0))
        independent = []
        for k in seq:
            if not nonzero[k]:
                continue
            v = R0[:, k].copy()
            for _ in range(2):  # Gram-Schmidt twice is enough (Giraud et al. 2005)
                v -= basis @ (basis.T @ v)
            dist = np.linalg.norm(v)
            if dist > rtol:
                independent.append(k)
                basis = np.column_stack([basis, v / dist])
    rank = len(independent)
    dependent = [k for k in range(p) if k not in independent]
    R_ind = R0[:, independent]
    Ks = np.zeros((rank, p))
    Ks[:, independent] = np.eye(rank)
    dep_nz = [k for k in dependent if nonzero[k]]
    if dep_nz:
        coef = linalg.lstsq(R_ind, R0[:, dep_nz], check_finite=False)[0]
        coef[np.abs(coef) < 1e-9] = 0.0
        Ks[:, dep_nz] = coef
    K = Ks * scale[None, :] / scale[independent][:, None]  # undo the column scaling
    descriptions = []
    for row, k in enumerate(independent):
        terms = [names[k]] + [_format_coefficient(K[row, j], names[j]) for j in dependent if K[row, j] != 0.0]
        descriptions.append(" ".join(terms))
    unidentifiable = tuple(names[j] for j in dependent if not np.any(K[:, j]))
    s_scaled = np.linalg.svd(R_ind, compute_uv=False)
    s = np.linalg.svd(R_ind * scale[independent][None, :], compute_uv=False)
    return BaseParameters(
        rank=rank,
        rtol=float(rtol),
        independent=tuple(independent),
        dependent=tuple(dependent),
        K=K,
        standard_names=names,
        descriptions=tuple(descriptions),
        unidentifiable=unidentifiable,
        condition_number=float(s[0] / s[-1]),
        condition_number_scaled=float(s_scaled[0] / s_scaled[-1]),
        method=method,
    )


# --------------------------------------------------------------------------------------------
# Least squares


@dataclasses.dataclass(frozen=True, eq=False)
class LeastSquaresResult:
    """Solution of min || W^(1/2) (Y x - tau) ||.

    ``estimate`` (p,), ``covariance`` (p, p) = sigma^2 (Y^T W Y)^-1 with
    ``sigma2`` = r^T W r / (N n - p), ``std`` (p,), ``relative_std`` (p,) in % of |estimate|,
    ``residual`` (N, n) = tau - Y x, ``rmse`` (n,) per joint (unweighted), ``weights`` (N, n) used,
    ``dof`` = N n - p, ``condition_number`` of W^(1/2) Y.
    """

    estimate: np.ndarray
    covariance: np.ndarray
    std: np.ndarray
    relative_std: np.ndarray
    sigma2: float
    dof: int
    residual: np.ndarray
    rmse: np.ndarray
    weights: np.ndarray
    condition_number: float
    names: tuple


def _as_joint_rows(Y, tau, func: str):
    """Y -> (N, n, p), tau -> (N, n): (N, n, p) with (N, n), or (M, p) with (M,) (n = 1)."""
    Y = np.asarray(Y, dtype=float)
    tau = np.asarray(tau, dtype=float)
    if Y.ndim == 2 and tau.ndim == 1:
        Y, tau = Y[:, None, :], tau[:, None]
    if Y.ndim == 2 and tau.ndim == 2 and Y.shape[0] == tau.size:  # stacked rows, sample-major
        Y = Y.reshape(tau.shape[0], tau.shape[1], -1)
    if Y.ndim != 3 or tau.shape != Y.shape[:2]:
        raise ValueError(f"{func}: Y, tau: expected Y (N, n, p) with tau (N, n), or Y (N * n, p) with tau (N * n,) or (N, n); got {np.shape(Y)} and {np.shape(tau)}")
    if not np.all(np.isfinite(Y)):
        raise ValueError(f"{func}: Y: expected finite values")
    if not np.all(np.isfinite(tau)):
        rows = np.unique(np.argwhere(~np.isfinite(tau))[:, 0])
        raise ValueError(f"{func}: tau: expected finite values, got NaN/inf at sample(s) {rows[:10].tolist()}")
    return Y, tau


def _weighted_solve(Y, tau, w, names, func):
    from scipy import linalg

    N, n, p = Y.shape
    M = N * n
    if M <= p:
        raise IdentificationError(f"{func}: {N} samples x {n} joints = {M} equations for {p} parameters; need more than {p} (more samples)")
    sw = np.sqrt(w).reshape(M)
    A = Y.reshape(M, p) * sw[:, None]
    b = tau.reshape(M) * sw
    Q, R = linalg.qr(A, mode="economic", check_finite=False)
    U, s, Vt = np.linalg.svd(R)
    if s[-1] <= 1e-12 * s[0]:
        weak = names[int(np.argmax(np.abs(Vt[-1])))] if names else str(int(np.argmax(np.abs(Vt[-1]))))
        raise IdentificationError(
            f"{func}: the regressor is rank deficient (condition number {s[0] / max(s[-1], 1e-300):.3g}); "
            f"parameter {weak} is (nearly) a combination of the others: reduce to base parameters first"
        )
    x = Vt.T @ ((U.T @ (Q.T @ b)) / s)
    residual = tau - Y @ x
    rw = residual.reshape(M) * sw
    dof = M - p
    sigma2 = float(rw @ rw / dof)
    cov = sigma2 * (Vt.T / s**2) @ Vt  # sigma^2 (A^T A)^-1 = sigma^2 V S^-2 V^T
    std = np.sqrt(np.diag(cov))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(x != 0, 100.0 * std / np.abs(x), np.inf)
    rmse = np.sqrt(np.mean(residual**2, axis=0))
    return LeastSquaresResult(
        estimate=x,
        covariance=cov,
        std=std,
        relative_std=rel,
        sigma2=sigma2,
        dof=dof,
        residual=residual,
        rmse=rmse,
        weights=w,
        condition_number=float(s[0] / s[-1]),
        names=tuple(names) if names else tuple(f"p{k}" for k in range(p)),
    )


def least_squares(Y, tau, *, weights=None, weighting=None, names=None) -> LeastSquaresResult:
    """Ordinary or weighted least squares with parameter standard deviations.

    Y (N, n, p) with tau (N, n), or stacked Y (N * n, p) with tau (N * n,) (one joint) or (N, n).
    ``weights``: (n,) per joint or (N, n) per equation, positive (W = diag(weights)).
    ``weighting="joint-variance"``: Gautier's two-step WLS -- OLS, then each joint's equations
    weighted by 1 / sigma_j^2 with sigma_j^2 = ||r_j||^2 / (N - p) from its OLS residual
    (Gautier & Poignet 2001), then WLS. Covariance sigma^2 (Y^T W Y)^-1 with
    sigma^2 = r^T W r / (N n - p) (Gautier 1997); solved by QR + SVD, never normal equations.
    """
    func = "least_squares"
    Y, tau = _as_joint_rows(Y, tau, func)
    N, n, p = Y.shape
    if names is not None and len(names) != p:
        raise ValueError(f"{func}: names: expected {p} names, got {len(names)}")
    if weighting not in (None, "joint-variance"):
        raise ValueError(f"{func}: weighting: expected None or 'joint-variance', got {weighting!r}")
    if weights is not None and weighting is not None:
        raise ValueError(f"{func}: give either weights or weighting, not both")
    if weights is None:
        w = np.ones((N, n))
    else:
        w = np.asarray(weights, dtype=float)
        if w.shape == (n,):
            w = np.broadcast_to(w, (N, n)).copy()
        elif w.shape == (N * n,):
            w = w.reshape(N, n)
        if w.shape != (N, n) or not np.all(np.isfinite(w)) or not np.all(w > 0):
            raise ValueError(f"{func}: weights: expected positive finite numbers of shape ({n},) or ({N}, {n}), got shape {np.shape(weights)}")
    fit = _weighted_solve(Y, tau, w, names, func)
    if weighting == "joint-variance":
        if N <= p:
            raise IdentificationError(f"{func}: joint-variance weighting needs more samples than parameters per joint ({N} <= {p})")
        var = np.sum(fit.residual**2, axis=0) / (N - p)
        if np.any(var <= 0):
            j = int(np.argmin(var))
            raise IdentificationError(f"{func}: joint {j + 1} fits exactly (zero residual variance): joint-variance weights are undefined; use OLS")
        fit = _weighted_solve(Y, tau, np.broadcast_to(1.0 / var, (N, n)).copy(), names, func)
    return fit


# --------------------------------------------------------------------------------------------
# The whole pipeline on a log


@dataclasses.dataclass(frozen=True, eq=False)
class LinearIdentification:
    """Result of :func:`identify_linear`.

    ``arm``: the fitted arm (``arm_with_parameters(arm, parameters)``); ``parameters`` (p,): a full
    standard vector consistent with the base solution (K pi = beta), the one closest to the prior;
    ``names`` (p,); ``base``: :class:`BaseParameters` (structure); ``beta``, ``beta_std``,
    ``beta_relative_std`` (r,); ``fit``: the :class:`LeastSquaresResult` on the base regressor;
    ``rmse`` (n,) per joint on the fitted samples; ``condition_number`` (and ``_scaled``) of the
    log's base regressor; ``samples`` used; ``drives`` whether drive parameters were fitted.
    """

    arm: Arm
    parameters: np.ndarray
    names: tuple
    base: BaseParameters
    beta: np.ndarray
    beta_std: np.ndarray
    beta_relative_std: np.ndarray
    fit: LeastSquaresResult
    rmse: np.ndarray
    condition_number: float
    condition_number_scaled: float
    samples: int
    drives: bool
    prior: np.ndarray

    @property
    def rank(self) -> int:
        return self.base.rank

    def report(self) -> dict:
        """A JSON-ready summary: rank, condition numbers, RMSE per joint, base parameters with std."""
        return {
            "samples": self.samples,
            "rank": self.rank,
            "rank_tolerance": self.base.rtol,
            "condition_number": self.condition_number,
            "condition_number_scaled": self.condition_number_scaled,
            "rmse": self.rmse.tolist(),
            "sigma2": self.fit.sigma2,
            "unidentifiable": list(self.base.unidentifiable),
            "base_parameters": [
                {"combination": d, "value": float(v), "std": float(s), "relative_std_percent": float(r) if np.isfinite(r) else None}
                for d, v, s, r in zip(self.base.descriptions, self.beta, self.beta_std, self.beta_relative_std)
            ],
        }


def random_states(arm: Arm, count: int, seed: int = 0):
    """``count`` random states (q, qd, qdd), each (count, n): q uniform in the joint limits
    (or [-pi, pi] / [-1, 1] m where unlimited), |qd| in [0.1, 2] with random sign, qdd in [-3, 3].
    Generic for the arm's structure: used to find its base parameters."""
    checks.check_arm(arm, "random_states")
    rng = np.random.default_rng(seed)
    n = arm.n
    lim = np.asarray(arm.limits.position, dtype=float)
    span = np.array([np.pi if rev else 1.0 for rev in arm.is_revolute])
    lo = np.where(np.isfinite(lim[:, 0]), lim[:, 0], -span)
    hi = np.where(np.isfinite(lim[:, 1]), lim[:, 1], span)
    q = rng.uniform(lo, hi, (count, n))
    qd = rng.choice([-1.0, 1.0], (count, n)) * rng.uniform(0.1, 2.0, (count, n))
    qdd = rng.uniform(-3.0, 3.0, (count, n))
    return q, qd, qdd


def structural_base_parameters(arm: Arm, drives: bool = True, *, rtol: float = 1e-8, samples: int = _CHUNK, seed: int = 0) -> BaseParameters:
    """The arm's base parameters from its regressor on ``samples`` random states
    (:func:`random_states`), selected in :func:`grouping_order`: what any sufficiently
    exciting log can identify."""
    Y = regressor(arm, *random_states(arm, samples, seed), drives=drives)
    return base_parameters(Y, rtol=rtol, names=parameter_names(arm, drives), order=grouping_order(arm, drives))


def _check_log(arm: Arm, log, func: str, channels=("dq", "ddq", "tau")):
    """The log is a Log of this arm's joint count with the channels the operation needs."""
    from .logs import Log

    checks.check_arm(arm, func)
    if not isinstance(log, Log):
        raise TypeError(f"{func}: log: expected a jaxarm Log (see jaxarm.load_log / preprocess_log), got {type(log).__name__}")
    where = log.source or "log"
    for channel in channels:
        if getattr(log, channel) is None:
            hint = "; run jaxarm.preprocess_log(log, ...) to compute velocities and accelerations" if channel != "tau" else ": torques are what the parameters are fitted to"
            raise IdentificationError(f"{func}: {where}: no {channel} columns{hint}")
    if log.n != arm.n:
        raise IdentificationError(f"{func}: {where}: the log has {log.n} joints, the arm {arm.name!r} has {arm.n}")


def identify_linear(
    arm: Arm,
    log,
    *,
    drives: bool = True,
    weighting=None,
    rtol: float = 1e-8,
    prior=None,
    min_velocity: float = 1e-3,
) -> LinearIdentification:
    """Identify the base parameters of ``arm`` from a preprocessed log (q, dq, ddq, tau).

    1. Structure: base parameters of the arm from random states (:func:`structural_base_parameters`).
    2. Excitation: every joint must move (max |dq_j| > ``min_velocity``) and the log's base
       regressor must have full rank (same ``rtol``); otherwise :class:`IdentificationError` names
       the joint or base parameters the log does not excite.
    3. (W)LS of beta on tau - known torques (:func:`least_squares`, ``weighting`` passed on).
    4. A full standard vector with K pi = beta: pi = prior + K^+ (beta - K prior), the Euclidean
       closest to ``prior`` (default: ``standard_parameters(arm)``), and the fitted arm.
    """
    func = "identify_linear"
    _check_log(arm, log, func)
    names = parameter_names(arm, drives)
    p = len(names)
    N, n = len(log), arm.n
    # Random states in the same padded batch shape as the log's chunks: one compilation for both.
    count = _SMALL if N <= _SMALL else _CHUNK
    structure = structural_base_parameters(arm, drives, rtol=rtol, samples=count)
    r = structure.rank
    where = log.source or "log"
    if N * n <= r:
        raise IdentificationError(
            f"{func}: {where}: {N} samples x {n} joints = {N * n} equations for {r} base parameters; the log is too short"
        )
    still = [j + 1 for j in range(n) if not np.max(np.abs(log.dq[:, j])) > min_velocity]
    if still:
        raise IdentificationError(
            f"{func}: {where}: joint(s) {still} do not move (max |dq| <= {min_velocity:g}): their friction and the inertia "
            "they carry cannot be identified; log motion of every joint"
        )
    Y, known = (np.asarray(x) for x in _linear_model(arm, log.q, log.dq, log.ddq, drives, func))
    target = log.tau - known
    Yb = Y[:, :, list(structure.independent)]
    excited = base_parameters(Yb, rtol=rtol, names=structure.descriptions, order=list(range(r)))
    if excited.rank < r:
        missing = [structure.descriptions[k] for k in excited.dependent]
        raise IdentificationError(
            f"{func}: {where}: the log excites only {excited.rank} of the arm's {r} base parameters; "
            f"not identifiable from it: {'; '.join(missing[:8])}{' ...' if len(missing) > 8 else ''} "
            "(excite more joint motion, or fit fewer parameters)"
        )
    fit = least_squares(Yb, target, weighting=weighting, names=structure.descriptions)
    beta = fit.estimate
    pi0 = np.asarray(standard_parameters(arm, drives) if prior is None else prior, dtype=float)
    if pi0.shape != (p,):
        raise ValueError(f"{func}: prior: expected shape ({p},), got {pi0.shape}")
    K = structure.K
    correction = np.linalg.lstsq(K, beta - K @ pi0, rcond=None)[0]  # minimum-norm
    pi = pi0 + correction
    return LinearIdentification(
        arm=arm_with_parameters(arm, jnp.asarray(pi), drives),
        parameters=pi,
        names=tuple(names),
        base=structure,
        beta=beta,
        beta_std=fit.std,
        beta_relative_std=fit.relative_std,
        fit=fit,
        rmse=fit.rmse,
        condition_number=excited.condition_number,
        condition_number_scaled=excited.condition_number_scaled,
        samples=N,
        drives=drives,
        prior=pi0,
    )


@jax.jit
def _inverse_dynamics_kernel(arm, q, qd, qdd):
    return jax.vmap(lambda a, b, c: _inverse_dynamics(arm, a, b, c))(q, qd, qdd)


def predict_torques(arm: Arm, q, qd=None, qdd=None) -> np.ndarray:
    """Inverse-dynamics torques (N, n) over a batch of states, or over a log
    (``predict_torques(arm, log)`` uses its q, dq, ddq); compiled and chunked like the regressor."""
    from .logs import Log

    if isinstance(q, Log):
        _check_log(arm, q, "predict_torques", ("dq", "ddq"))
        q, qd, qdd = q.q, q.dq, q.ddq
    (q, qd, qdd), batched = _states(arm, q, qd, qdd, "predict_torques")
    if not batched:
        return np.asarray(_chunked(_inverse_dynamics_kernel, arm, q[None], qd[None], qdd[None])[0])
    return np.asarray(_chunked(_inverse_dynamics_kernel, arm, q, qd, qdd))


def torque_rmse(tau, tau_predicted) -> np.ndarray:
    """Root-mean-square error per joint (n,) between (N, n) torque arrays."""
    tau, tau_predicted = np.asarray(tau, dtype=float), np.asarray(tau_predicted, dtype=float)
    if tau.shape != tau_predicted.shape or tau.ndim != 2:
        raise ValueError(f"torque_rmse: expected two (N, n) arrays of equal shape, got {tau.shape} and {tau_predicted.shape}")
    return np.sqrt(np.mean((tau - tau_predicted) ** 2, axis=0))
