"""Physically consistent identification: fit the full nonlinear torque model with every link's
inertial parameters consistent *by construction*.

Log-Cholesky parameterization (Rucker & Wensing 2022, "Smooth parameterization of rigid-body
inertia"). Each link has ten unconstrained numbers
``theta = (alpha, d1, d2, d3, s12, s13, s23, t1, t2, t3)`` and

    U = exp(alpha) [[e^d1, s12,  s13,  t1],
                    [0,    e^d2, s23,  t2],
                    [0,    0,    e^d3, t3],
                    [0,    0,    0,    1 ]]          J = U U^T = [[Sigma, h], [h^T, m]]

is the link's 4x4 pseudo-inertia about its frame origin (Wensing, Kim & Slotine 2017):
``m = exp(2 alpha)``, ``h = m c`` and ``Sigma = 0.5 tr(I_o) 1 - I_o`` (so ``I_o = tr(Sigma) 1 -
Sigma``). U is invertible for every theta, so J is positive definite: the mass is positive, the
inertia about the COM is positive definite and obeys the triangle inequalities strictly. The map
is smooth and one-to-one onto the positive-definite pseudo-inertias; ``(t1, t2, t3)`` is exactly
the centre of mass, which makes bounds on it easy to impose by construction (:class:`ComBox`,
:class:`ComSphere`).

What the data determine, and what the regularization fixes
----------------------------------------------------------
Joint torques depend on the standard parameters only through the identifiable (base)
combinations (see :mod:`jaxarm.identification`): some parameters never affect a torque (e.g. for
a first joint about the vertical, everything of link 1 except its inertia about that axis) and
others only in fixed sums.
The torque residual is flat along those directions, so without a prior they would drift. The
fit therefore adds ``regularization`` times a divergence to the prior arm: for the links the
log-det (Bregman) divergence of the pseudo-inertias,
``D(J || J0) = tr(J0^-1 J) - log det(J0^-1 J) - 4`` (Lee, Wensing & Park 2020, "Geometric robot
dynamic identification: a convex programming approach"), which is zero only at J = J0,
is invariant to the choice of units and frame, and grows without bound as J approaches the
boundary of physical consistency; for drive and friction parameters a squared difference scaled
by the data (torque / velocity / acceleration RMS). With a small weight the data decide the
identifiable combinations (the divergence barely moves them) while every direction the data
cannot see goes to the point closest to the prior in that divergence. Large weights trade data
fit for closeness to the prior (ridge-like); weight 0 leaves the invisible directions wherever
the optimizer took them.

Drive parameters per joint, joint side (the contract of :mod:`jaxarm.identification`):
``Ia`` (reflected rotor inertia) and ``fv`` (viscous) are kept >= 0 as ``scale * softplus(x)``,
``fc`` (Coulomb) as ``scale * x^2``, and the offset as ``fo = fc tanh(y)``, so that both Coulomb levels,
``fc + fo`` for positive and ``-fc + fo`` for negative velocity, oppose the motion (friction only
dissipates; a start outside this set begins from the nearest point well inside it). With ``friction="sigmoid"`` the Panda model of
Gaz et al. 2019, ``phi1 / (1 + exp(-phi2 (qd + phi3))) - phi1 / (1 + exp(-phi2 phi3))``, is
fitted jointly (``phi2 = exp(x) > 0``) together with ``Ia``, ``fv`` and ``fo``; ``fc`` then stays
at the prior's value (the sigmoid replaces the discontinuous Coulomb term).

Stribeck friction is fitted on every joint whose ``stribeck_velocity`` vs is set (> 0, e.g. chosen
per joint by :func:`jaxarm.identify.selection.select_preprocessing`): with vs fixed the model of
:func:`jaxarm.friction_torques` is linear in ``fc``, ``fo`` and the joint-side static level
``S = |G| Ts``. For a moving joint with both Coulomb levels opposing the motion it is
``(fc s + fo |s|)(1 - e) + S s e``, ``e = exp(-(qd / vs)^2)`` (Armstrong-Helouvry, Dupont & Canudas
de Wit 1994, eq. 2: friction falls from the static level S at rest to the Coulomb level with
speed), so the regressor's Coulomb columns are scaled by ``1 - e`` and S gets the column ``s e``.
``S`` is kept > 0 as ``scale * softplus(x)`` (dissipative at every speed) and regularized towards
the joint's Coulomb level ``fc`` of the prior, the neutral point where static and Coulomb friction
are equal (no Stribeck effect for a symmetric joint).

The fit minimizes, with optax's L-BFGS and a zoom line search, the mean squared, per-joint
weighted residual of ``inverse_dynamics(arm_with_parameters(arm, pi), q, qd, qdd)`` over all
samples, plus the regularization. The torques are evaluated as ``regressor @ pi + known_torques``
(:mod:`jaxarm.identification`: the regressor is the linear map in pi of the same Newton-Euler
torques, computed once), so an iteration is a batched matrix product. The
free variables are whitened with the objective's Hessian at the start of each segment of
iterations, which makes L-BFGS converge in a few hundred iterations on this badly scaled problem.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..core.tracers import strong
from ..dynamics.drives import friction_torques
from ..model.arm import Arm, make_arm
from ..model.consistency import check_link, consistency_report, pseudo_inertia
from .fit import predict_torques, torque_rmse
from .linear_model import _coulomb_direction, arm_with_parameters, linear_model_numpy, standard_parameters

__all__ = [
    "log_cholesky_to_pseudo_inertia",
    "log_cholesky_to_parameters",
    "parameters_to_log_cholesky",
    "PriorNudgedWarning",
    "ComBox",
    "ComSphere",
    "ConsistentFit",
    "fit_consistent",
    "FRICTION_MODELS",
]

FRICTION_MODELS = ("viscous-coulomb", "sigmoid")
JOINT_WEIGHTS = ("residual", "torque", "uniform")
_SIGMOID_SLOPE = 10.0  # s/rad: initial phi2 when the prior has no sigmoid friction


class PriorNudgedWarning(UserWarning):
    """A prior link was only semidefinite (or massless) and was moved slightly inside the set of
    physically consistent bodies so that its log-Cholesky factor exists."""


# --------------------------------------------------------------------------------------------
# The log-Cholesky maps


def _factor(theta):
    """U (..., 4, 4) from theta (..., 10) (Rucker & Wensing 2022, the log-Cholesky factor)."""
    theta = jnp.asarray(theta)
    alpha, d, s, t = theta[..., 0], theta[..., 1:4], theta[..., 4:7], theta[..., 7:10]
    zero = jnp.zeros_like(alpha)
    one = jnp.ones_like(alpha)
    e = jnp.exp(d)
    rows = [
        [e[..., 0], s[..., 0], s[..., 1], t[..., 0]],
        [zero, e[..., 1], s[..., 2], t[..., 1]],
        [zero, zero, e[..., 2], t[..., 2]],
        [zero, zero, zero, one],
    ]
    U = jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)
    return jnp.exp(alpha)[..., None, None] * U


def _check_theta(theta, func):
    theta = jnp.asarray(theta)
    if theta.ndim < 1 or theta.shape[-1] != 10:
        raise ValueError(f"{func}: theta: expected shape (..., 10) = (alpha, d1, d2, d3, s12, s13, s23, t1, t2, t3), got {theta.shape}")
    return theta


@jax.jit
def log_cholesky_to_pseudo_inertia(theta):
    """The pseudo-inertia J = U U^T (..., 4, 4) of log-Cholesky vectors theta (..., 10).

    Positive definite for every real theta (U is triangular with a positive diagonal; Rucker &
    Wensing 2022). Traceable.
    """
    U = _factor(_check_theta(theta, "log_cholesky_to_pseudo_inertia"))
    return U @ jnp.swapaxes(U, -1, -2)


@jax.jit
def log_cholesky_to_parameters(theta):
    """Standard parameters (..., 10) = [m, mx, my, mz, Ixx, Ixy, Ixz, Iyy, Iyz, Izz] (inertia about
    the link origin, tensor elements) of log-Cholesky vectors theta (..., 10).

    Every output is a physically consistent body: m > 0 and a positive-definite pseudo-inertia.
    Traceable (jit / vmap / grad).
    """
    J = log_cholesky_to_pseudo_inertia(theta)
    sigma, h, m = J[..., :3, :3], J[..., :3, 3], J[..., 3, 3]
    eye = jnp.eye(3, dtype=J.dtype)
    inertia_o = jnp.trace(sigma, axis1=-2, axis2=-1)[..., None, None] * eye - sigma  # Wensing, Kim & Slotine 2017, inverted
    idx = (0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)
    moments = jnp.stack([inertia_o[..., i, j] for i, j in idx], axis=-1)
    return jnp.concatenate([m[..., None], h, moments], axis=-1)


def _link_from_parameters(pi):
    """(m, c, I about the COM) from one standard 10-vector (NumPy)."""
    m = float(pi[0])
    xx, xy, xz, yy, yz, zz = pi[4:]
    inertia_o = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    c = pi[1:4] / m if m != 0 else np.zeros(3)
    inertia_c = inertia_o - m * ((c @ c) * np.eye(3) - np.outer(c, c))  # parallel axes, Ch.10 eq. 10.13
    return m, c, inertia_c


def _nudge(m, c, inertia_c, margin, scale_mass, label, repair):
    """A positive-definite (m, Sigma_c) near a consistent (or, with repair, any) link, and a note."""
    sigma_c = 0.5 * np.trace(inertia_c) * np.eye(3) - inertia_c  # second moments about the COM
    sigma_c = 0.5 * (sigma_c + sigma_c.T)
    w, V = np.linalg.eigh(sigma_c)
    floor = margin * max(w.max(), 0.0) if w.max() > 0 else margin * scale_mass * 1e-4  # (1 cm)^2 m
    notes = []
    inconsistent = m < 0 or w.min() < 0
    if m <= 0:
        m_new = margin * scale_mass
        notes.append(f"mass {m:.6g} -> {m_new:.3g}")
        m = m_new
        floor = max(floor, margin * m * 1e-4)
    if w.min() < floor:
        notes.append(f"second moments about the COM {np.array2string(w, precision=4)} raised to >= {floor:.3g}")
        w = np.maximum(w, floor)
        sigma_c = (V * w) @ V.T
    if notes:
        what = ("physically inconsistent, repaired (clipped into the consistent set)" if inconsistent and repair
                else "only semidefinite, nudged to strictly consistent")
        msg = f"{label}: {what} (a log-Cholesky factor needs a positive-definite pseudo-inertia): " + "; ".join(notes)
        warnings.warn(msg, PriorNudgedWarning, stacklevel=4)
    inertia_c = np.trace(sigma_c) * np.eye(3) - sigma_c
    return m, c, inertia_c


def parameters_to_log_cholesky(pi, *, margin=1e-6, repair=False, label="link"):
    """The log-Cholesky vector(s) theta (..., 10) of standard parameter vector(s) pi (..., 10).

    Inverse of :func:`log_cholesky_to_parameters` for initialising a fit from a prior (NumPy,
    concrete values). J must be positive definite for the factor to exist: a prior that is merely
    semidefinite (a point mass, a rod, a massless link) is first moved inside the consistent set,
    raising its second moments about the COM to ``margin`` times the largest one (and a zero
    mass to ``margin`` times the largest mass in ``pi``), with a :class:`PriorNudgedWarning`
    saying which link and by how much. An inconsistent prior (negative mass, triangle inequality
    violated) is a ValueError naming the link and the problem, unless ``repair=True``, which clips
    the offending second moments (mass) the same way and warns.

    U U^T = J with U upper triangular is a Cholesky factorisation of J with the index order
    reversed: with the exchange matrix P, P J P = L L^T and U = P L P.
    """
    pi = np.asarray(pi, dtype=np.float64)
    if pi.ndim < 1 or pi.shape[-1] != 10:
        raise ValueError(f"parameters_to_log_cholesky: pi: expected shape (..., 10) = [m, mx, my, mz, Ixx, Ixy, Ixz, Iyy, Iyz, Izz], got {pi.shape}")
    if not np.all(np.isfinite(pi)):
        raise ValueError("parameters_to_log_cholesky: pi: expected finite values")
    flat = pi.reshape(-1, 10)
    scale_mass = max(float(np.abs(flat[:, 0]).max()), 1e-12)
    out = []
    for k, row in enumerate(flat):
        where = label if flat.shape[0] == 1 else f"{label} {k + 1}"
        m, c, inertia_c = _link_from_parameters(row)
        report = check_link(m, c, inertia_c) if m != 0 else None
        if report is not None and not report.ok and not repair:
            raise ValueError(
                f"parameters_to_log_cholesky: {where}: the prior is physically inconsistent ({'; '.join(report.problems)}); "
                "no log-Cholesky factor exists (pass repair=True to clip it into the consistent set)"
            )
        m, c, inertia_c = _nudge(m, c, inertia_c, margin, scale_mass, where, repair)
        J = pseudo_inertia(m, c, inertia_c)
        P = np.eye(4)[::-1]
        U = P @ np.linalg.cholesky(P @ J @ P) @ P  # upper triangular, U U^T = J
        alpha = np.log(U[3, 3])
        D = U / U[3, 3]
        out.append([alpha, *np.log(np.diag(D)[:3]), D[0, 1], D[0, 2], D[1, 2], *D[:3, 3]])
    return np.asarray(out).reshape(pi.shape)


# --------------------------------------------------------------------------------------------
# Bounds on the centres of mass (imposed on t = c by construction)


@dataclasses.dataclass(frozen=True)
class ComBox:
    """Each link's COM (link frame) inside ``lower < c < upper`` (both (n, 3), m; +-inf = no bound
    on that coordinate). Imposed by construction: c = lower + (upper - lower) sigmoid(z)."""

    lower: np.ndarray
    upper: np.ndarray


@dataclasses.dataclass(frozen=True)
class ComSphere:
    """Each link's COM (link frame) inside the open ball |c - center| < radius (center (n, 3),
    radius (n,), m; inf = no bound). Imposed by construction: c = center + radius z / sqrt(1 + |z|^2)."""

    center: np.ndarray
    radius: np.ndarray


def _check_bounds(bounds, n):
    if bounds is None:
        return None
    if isinstance(bounds, ComBox):
        lo = np.broadcast_to(np.asarray(bounds.lower, dtype=np.float64), (n, 3)).copy()
        hi = np.broadcast_to(np.asarray(bounds.upper, dtype=np.float64), (n, 3)).copy()
        if np.any(np.isnan(lo)) or np.any(np.isnan(hi)) or np.any(~(hi > lo)):
            raise ValueError("fit_consistent: com_bounds: ComBox needs upper > lower for every link and coordinate")
        return ComBox(lo, hi)
    if isinstance(bounds, ComSphere):
        center = np.broadcast_to(np.asarray(bounds.center, dtype=np.float64), (n, 3)).copy()
        radius = np.broadcast_to(np.asarray(bounds.radius, dtype=np.float64), (n,)).copy()
        if not np.all(np.isfinite(center)) or np.any(~(radius > 0)):
            raise ValueError("fit_consistent: com_bounds: ComSphere needs finite centers and radii > 0")
        return ComSphere(center, radius)
    raise TypeError(f"fit_consistent: com_bounds: expected None, ComBox or ComSphere, got {type(bounds).__name__}")


def _bound_arrays(bounds):
    """(kind, arrays) describing the bounds for the compiled objective."""
    if isinstance(bounds, ComBox):
        finite = np.isfinite(bounds.lower) & np.isfinite(bounds.upper)
        lo = np.where(finite, bounds.lower, 0.0)
        width = np.where(finite, bounds.upper - bounds.lower, 1.0)
        return "box", {"finite": finite, "lo": lo, "width": width}
    if isinstance(bounds, ComSphere):
        finite = np.broadcast_to(np.isfinite(bounds.radius)[:, None], (len(bounds.radius), 3))
        r = np.where(finite, bounds.radius[:, None], 1.0)
        return "sphere", {"finite": finite, "center": bounds.center, "r": r}
    return "none", {}


def _com_from_free(z, kind, b):
    """COM (n, 3) from the free variables z (n, 3): identity, box or ball (traceable)."""
    if kind == "box":
        return jnp.where(b["finite"], b["lo"] + b["width"] * jax.nn.sigmoid(z), z)
    if kind == "sphere":
        squashed = b["center"] + b["r"] * z / jnp.sqrt(1.0 + jnp.sum(z * z, axis=-1, keepdims=True))
        return jnp.where(b["finite"], squashed, z)
    return z


def _free_from_com(c, bounds):
    """Inverse of _com_from_free (NumPy); a prior COM outside the bounds is an error."""
    c = np.asarray(c, dtype=np.float64)
    if isinstance(bounds, ComBox):
        finite = np.isfinite(bounds.lower) & np.isfinite(bounds.upper)
        lo = np.where(finite, bounds.lower, 0.0)
        width = np.where(finite, bounds.upper - bounds.lower, 1.0)
        u = (c - lo) / width
        bad = finite & ~((u > 0) & (u < 1))
        bad |= ~finite & ((c <= bounds.lower) | (c >= bounds.upper))
        if np.any(bad):
            i, k = np.argwhere(bad)[0]
            raise ValueError(f"fit_consistent: com_bounds: link {i + 1}: the prior COM {c[i].tolist()} is not strictly inside the box "
                             f"[{bounds.lower[i].tolist()}, {bounds.upper[i].tolist()}] (coordinate {'xyz'[k]})")
        u = np.clip(u, 1e-12, 1 - 1e-12)
        return np.where(finite, np.log(u) - np.log1p(-u), c)
    if isinstance(bounds, ComSphere):
        finite = np.isfinite(bounds.radius)
        r = np.where(finite, bounds.radius, 1.0)
        u = (c - bounds.center) / r[:, None]
        norm = np.linalg.norm(u, axis=1)
        bad = finite & (norm >= 1)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"fit_consistent: com_bounds: link {i + 1}: the prior COM {c[i].tolist()} is not strictly inside the sphere "
                             f"(center {bounds.center[i].tolist()}, radius {bounds.radius[i]:g})")
        z = u / np.sqrt(1.0 - np.minimum(norm, 1 - 1e-12) ** 2)[:, None]
        return np.where(finite[:, None], z, c)
    return c


# --------------------------------------------------------------------------------------------
# The fit


@dataclasses.dataclass(frozen=True, eq=False)
class ConsistentFit:
    """Result of :func:`fit_consistent`.

    arm: the fitted :class:`Arm` (links, drives and, with ``friction="sigmoid"``, sigmoid friction);
    parameters: its standard parameter vector (10n + 4n,) (contract of :mod:`jaxarm.identification`);
    rmse, rmse_prior: (n,) per-joint torque RMSE on the fit data of the fitted and the prior arm;
    loss_history: (iterations + 1,) objective per L-BFGS iteration (data term + regularization);
    data_loss, regularization_loss: the two parts of the final objective;
    consistency: :func:`jaxarm.consistency_report` of the fitted arm, drives included (every link
    and, with viscous-Coulomb friction, every drive ``ok``);
    converged / iterations / message / gradient_norm: how the optimizer stopped;
    joint_weights: (n,) weights w_j of the data term sum_j w_j mean_k r_kj^2 / n;
    friction, regularization, com_bounds: the options used.
    """

    arm: Arm
    parameters: np.ndarray
    rmse: np.ndarray
    rmse_prior: np.ndarray
    loss_history: np.ndarray
    data_loss: float
    regularization_loss: float
    consistency: dict
    converged: bool
    iterations: int
    message: str
    gradient_norm: float
    joint_weights: np.ndarray
    friction: str
    regularization: float
    com_bounds: object = None

    def summary(self) -> dict:
        """JSON-ready numbers (no arrays of the arm)."""
        return {
            "rmse": [float(v) for v in self.rmse],
            "rmse_prior": [float(v) for v in self.rmse_prior],
            "iterations": self.iterations,
            "converged": self.converged,
            "message": self.message,
            "loss": float(self.loss_history[-1]),
            "data_loss": self.data_loss,
            "regularization_loss": self.regularization_loss,
            "gradient_norm": self.gradient_norm,
            "friction": self.friction,
            "regularization": self.regularization,
            "consistent": all(r.ok for r in self.consistency.values()),
        }


def _samples(x, name, n, func):
    if x is None:
        raise ValueError(f"{func}: {name}: expected an array of shape (N, {n}), got None")
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != n:
        raise ValueError(f"{func}: {name}: expected shape (N, {n}) (one row per sample, one column per joint), got {x.shape}")
    if not np.all(np.isfinite(x)):
        row = int(np.argwhere(~np.isfinite(x))[0][0])
        raise ValueError(f"{func}: {name}: expected finite values, row {row} is {x[row].tolist()}")
    return x


def _same_length(func, **arrays):
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{func}: expected the same number of samples in every input, got {lengths}")


def _softplus_inverse(y):
    y = np.asarray(y, dtype=np.float64)
    return np.where(y > 30, y, np.log(np.expm1(np.minimum(y, 30))))


def _rms(x, axis=0):
    return np.sqrt(np.mean(np.square(x), axis=axis))


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static structure of a fit (hashable: one compiled step per distinct config)."""

    memory_size: int
    fit_sigmoid: bool
    bounds: str
    fit_stribeck: bool = False


@functools.lru_cache(maxsize=None)
def _solver(memory_size: int):
    return optax.lbfgs(memory_size=memory_size, linesearch=optax.scale_by_zoom_linesearch(max_linesearch_steps=30))


def _model(x, c, cfg: _Config):
    """(theta (n, 10), standard parameters (14 n,), sigmoid phi (n, 3), joint-side static level
    S (n,), zero on joints without Stribeck friction) of the free variables x."""
    links = x["links"]
    theta = jnp.concatenate([links[:, :7], _com_from_free(links[:, 7:], cfg.bounds, c["bounds"])], axis=1)
    raw = x["drives"]
    # Ia, fv, fc >= 0 and |fo| <= fc: both Coulomb levels (fc + fo, -fc + fo) oppose the motion
    # (fc as a square rather than a softplus: a softplus driven far below zero by one long step has
    # no gradient left to come back, a square passes through zero and back)
    positive = jnp.concatenate([jax.nn.softplus(raw[:, :2]), jnp.square(raw[:, 2:3])], axis=1)
    nonneg = jnp.where(c["drive_free"][:, :3], positive * c["scales"][:, :3], c["drives0"][:, :3])
    # (with fc held fixed -- sigmoid mode -- fo is a free offset beside the sigmoid, as in Gaz et al.)
    offset = jnp.where(c["drive_free"][:, 2:3], nonneg[:, 2:3] * jnp.tanh(raw[:, 3:4]), raw[:, 3:4] * c["scales"][:, 3:4])
    values = jnp.where(c["drive_free"], jnp.concatenate([nonneg, offset], axis=1), c["drives0"])
    pi = jnp.concatenate([log_cholesky_to_parameters(theta).reshape(-1), values.reshape(-1)])
    if cfg.fit_sigmoid:
        s = x["sigmoid"]
        phi = jnp.stack([s[:, 0] * c["s_tau"], jnp.exp(s[:, 1]), s[:, 2] * c["s_qd"]], axis=1)
    else:
        phi = c["phi0"]
    if cfg.fit_stribeck:
        S = jnp.where(c["stribeck_free"], jnp.maximum(jax.nn.softplus(x["stribeck"]), 1e-9) * c["s_tau"], 0.0)
    else:
        S = jnp.zeros_like(c["s_tau"])
    return theta, pi, phi, S


def _parts(x, c, cfg: _Config):
    """(data term, regularization term) of the objective."""
    theta, pi, phi, S = _model(x, c, cfg)
    if cfg.fit_sigmoid:
        # tau = Y pi + known (exactly inverse_dynamics(arm_with_parameters(arm, pi)); jaxarm.identification)
        tau_model = jnp.einsum("knp,p->kn", c["Y"], pi) + c["known"]
        friction_arm = c["friction_arm"]
        friction_arm = friction_arm.replace(drives=dataclasses.replace(friction_arm.drives, sigmoid_friction=phi))
        tau_model = tau_model + jax.vmap(friction_torques, (None, 0))(friction_arm, c["qd"])  # Gaz et al. 2019 sigmoid
        r = tau_model - c["tau"]
        data = jnp.sum(c["w"] * jnp.mean(r * r, axis=0)) / r.shape[1]
    else:
        # The torques are linear in z = (pi, S): the data term ||Z z - t||^2 is ||R z - q||^2 + floor
        # with [Z t] = Q [[R q], [0 rho]] (fit_consistent), the same number at a (15 n)^2 cost per
        # evaluation instead of N n 15 n.
        e = c["R"] @ jnp.concatenate([pi, S]) - c["Qt"]
        data = jnp.sum(e * e) + c["floor"]

    J = log_cholesky_to_pseudo_inertia(theta)
    logdet = 2.0 * (4.0 * theta[:, 0] + jnp.sum(theta[:, 1:4], axis=1))  # log det(U U^T), U triangular
    divergence = jnp.sum(jnp.einsum("kij,kji->k", c["J_prior_inv"], J) - logdet + c["logdet_prior"] - 4.0)  # Lee, Wensing & Park 2020
    d = jnp.where(c["drive_free"], x["drives"] - c["drives_prior_raw"], 0.0)
    divergence = divergence + jnp.sum(d * d)
    if cfg.fit_sigmoid:
        e = x["sigmoid"] - c["sigmoid_prior_raw"]
        divergence = divergence + jnp.sum(e * e)
    if cfg.fit_stribeck:
        e = jnp.where(c["stribeck_free"], x["stribeck"] - c["stribeck_prior_raw"], 0.0)
        divergence = divergence + jnp.sum(e * e)
    return data, c["lam"] * divergence


def _unflatten(v, n):
    """The free variables {links (n, 10), drives (n, 4), sigmoid (n, 3), stribeck (n,)} from a flat
    (18 n,) vector."""
    return {"links": v[: 10 * n].reshape(n, 10), "drives": v[10 * n : 14 * n].reshape(n, 4),
            "sigmoid": v[14 * n : 17 * n].reshape(n, 3), "stribeck": v[17 * n :]}


def _objective_flat(v, c, cfg: _Config):
    data, reg = _parts(_unflatten(v, c["scales"].shape[0]), c, cfg)
    return data + reg


@functools.partial(jax.jit, static_argnames="cfg")
def _preconditioner(v, c, cfg: _Config):
    """T with T^T H T ~ 1 for the objective's Hessian H at v (eigenvalues made positive and floored
    at 1e-9 of the largest): L-BFGS then runs on y, v = v0 + T y, where the problem is well scaled."""
    H = jax.hessian(_objective_flat)(v, c, cfg)
    w, V = jnp.linalg.eigh(0.5 * (H + H.T))
    w = jnp.maximum(jnp.abs(w), 1e-9 * jnp.max(jnp.abs(w)) + 1e-300)
    return V / jnp.sqrt(w)


@functools.partial(jax.jit, static_argnames="cfg")
def _step(y, state, v0, T, c, cfg: _Config):
    """One L-BFGS iteration (zoom line search) on y; returns (y, state, objective at the old y, |grad|)."""
    solver = _solver(cfg.memory_size)

    def objective(y):
        return _objective_flat(v0 + T @ y, c, cfg)

    value, grad = optax.value_and_grad_from_state(objective)(y, state=state)
    updates, state = solver.update(grad, state, y, value=value, grad=grad, value_fn=objective)
    return optax.apply_updates(y, updates), state, value, optax.tree.norm(grad)


@functools.partial(jax.jit, static_argnames="cfg")
def _finish(v, c, cfg: _Config):
    x = _unflatten(v, c["scales"].shape[0])
    data, reg = _parts(x, c, cfg)
    _, pi, phi, S = _model(x, c, cfg)
    return data, reg, pi, phi, S


def fit_consistent(
    arm: Arm,
    q,
    qd,
    qdd,
    tau,
    *,
    prior: Arm | None = None,
    regularization: float = 1e-3,
    friction: str = "viscous-coulomb",
    fit_drives: bool = True,
    com_bounds: ComBox | ComSphere | None = None,
    joint_weights="residual",
    max_steps: int = 500,
    tol: float = 1e-10,
    memory_size: int = 20,
    restart_every: int = 100,
    verbose: bool = False,
    repair: bool = False,
) -> ConsistentFit:
    """Fit ``arm``'s link, drive (and sigmoid friction) parameters to measured joint torques.

    q, qd, qdd, tau: (N, n) samples (filtered positions, velocities, accelerations and the joint
    torques to explain). The fit starts at ``arm`` and regularizes towards ``prior`` (default:
    ``arm``) with weight ``regularization`` (see the module docstring: it fixes the directions the
    data cannot see; 0 = pure least squares). Objective:

        sum_j w_j mean_k (tau_model_kj - tau_kj)^2 / n + regularization * divergence(fit, prior)

    with ``tau_model = inverse_dynamics(arm_with_parameters(arm, pi), q, qd, qdd)``, evaluated as
    ``regressor @ pi + known_torques`` (:mod:`jaxarm.identification`; the same numbers, but the
    regressor is computed once and each iteration is a matrix product; without the sigmoid
    model the torques are linear in the parameters, and one QR factorization of the weighted
    regressor reduces that product to one of (15 n)^2 entries, whatever N). The returned
    RMSE are recomputed with :func:`jaxarm.inverse_dynamics` of the fitted arm.

    ``joint_weights``: "residual" (default) w_j = 1 / RMSE_j^2 of the starting arm (each joint's
    error counts relative to where it started; floored at 1e-3 RMS(tau_j)), "torque" w_j =
    1 / mean(tau_j^2), "uniform" one weight for all, or an array (n,) of your own.
    ``friction``: "viscous-coulomb" fits Ia, fv, fc, fo per joint (the arm's sigmoid friction, if
    any, stays as it is); "sigmoid" fits Ia, fv, fo and the sigmoid (phi1, phi2 > 0, phi3) per
    joint, keeping fc at the prior's value. With viscous-Coulomb friction, every joint whose
    ``stribeck_velocity`` is set also gets its Stribeck static level fitted (``static_friction``,
    module docstring; the velocity stays as given). ``fit_drives=False`` keeps every drive and
    friction parameter of ``arm`` (links only).
    ``com_bounds``: :class:`ComBox` or :class:`ComSphere`, imposed by construction (the starting
    COMs must lie strictly inside).
    ``repair``: a physically inconsistent ``arm`` or ``prior`` (a published model can be, e.g. the
    literature Puma 560) is a ValueError naming the link; with ``repair=True`` its links are first
    clipped into the consistent set (:func:`parameters_to_log_cholesky`), with a
    :class:`PriorNudgedWarning` per link saying what changed.
    Optimizer: optax L-BFGS (``memory_size``) with a zoom line search, at most ``max_steps``
    iterations, on variables whitened by the objective's Hessian (eigenvalues made positive and
    floored) at the start of each segment of ``restart_every`` iterations; converged when the
    objective decreases by less than ``tol`` (relative) over five iterations or the whitened
    gradient norm falls below ``tol``.
    """
    return _fit_consistent_weights(
        arm, q, qd, qdd, tau, (regularization,), prior=prior, friction=friction, fit_drives=fit_drives,
        com_bounds=com_bounds, joint_weights=joint_weights, max_steps=max_steps, tol=tol, memory_size=memory_size,
        restart_every=restart_every, verbose=verbose, repair=repair)[0]


def _triangular_factor(Z, rows: int = 8192):
    """R of Z = QR for a tall Z (m, k), by the tall-skinny QR of Demmel, Grigori, Hoemmen &
    Langou (2012): the R of each block of ``rows`` rows, then the R of those stacked. The same R
    up to the signs of its rows (which the fit's ||R z - q||^2 does not see), and as backward
    stable as one Householder QR; LAPACK's QR of the whole matrix took 1.7-2x as long (the Panda
    fit's 10^5 x 106: 0.66 against 0.38 s on two idle cores, 1.2 against 0.57 s on one), its panels
    streaming through memory instead of staying in the cache."""
    if Z.shape[0] <= 2 * rows:
        return np.linalg.qr(Z, mode="r")
    return np.linalg.qr(np.concatenate([np.linalg.qr(Z[s:s + rows], mode="r") for s in range(0, Z.shape[0], rows)]), mode="r")


def _fit_consistent_weights(arm, q, qd, qdd, tau, regularizations, *, prior, friction, fit_drives, com_bounds, joint_weights,
                            max_steps, tol, memory_size, restart_every, verbose, repair) -> list:
    """:func:`fit_consistent` at each weight of ``regularizations`` (same data, same start): the
    data are reduced once (regressor, QR) for all of them. Returns one ConsistentFit per weight.
    Every option is required here; its default is fit_consistent's (``fit_consistent.__kwdefaults__``)."""
    if not isinstance(arm, Arm):
        raise TypeError(f"fit_consistent: arm: expected a jaxarm.Arm, got {type(arm).__name__}")
    prior = arm if prior is None else prior
    if not isinstance(prior, Arm) or prior.n != arm.n or prior.joint_types != arm.joint_types:
        raise ValueError("fit_consistent: prior: expected an Arm with the same joints as arm")
    n = arm.n
    q, qd, qdd, tau = (_samples(x, name, n, "fit_consistent") for x, name in ((q, "q"), (qd, "qd"), (qdd, "qdd"), (tau, "tau")))
    _same_length("fit_consistent", q=q, qd=qd, qdd=qdd, tau=tau)
    if len(q) < 2:
        raise ValueError(f"fit_consistent: expected at least 2 samples, got {len(q)}")
    if friction not in FRICTION_MODELS:
        raise ValueError(f"fit_consistent: friction: expected one of {FRICTION_MODELS}, got {friction!r}")
    for regularization in regularizations:
        if not (np.isfinite(regularization) and regularization >= 0):
            raise ValueError(f"fit_consistent: regularization: expected a number >= 0, got {regularization!r}")
    if int(max_steps) < 0:
        raise ValueError(f"fit_consistent: max_steps: expected >= 0, got {max_steps}")
    if int(restart_every) < 1 or int(memory_size) < 1:
        raise ValueError(f"fit_consistent: restart_every, memory_size: expected >= 1, got {restart_every}, {memory_size}")
    gear = np.asarray(arm.drives.gear_ratio)
    if fit_drives and np.any(gear == 0):
        raise ValueError(f"fit_consistent: arm: gear_ratio must be nonzero to fit drive parameters (joint {int(np.flatnonzero(gear == 0)[0]) + 1})")
    stribeck_velocity = np.asarray(arm.drives.stribeck_velocity, dtype=np.float64)
    stribeck_free = np.asarray(fit_drives and friction != "sigmoid", bool) & (stribeck_velocity > 0)
    if fit_drives and np.any((np.asarray(arm.drives.static_friction) > 0) & ~stribeck_free):
        raise ValueError("fit_consistent: arm: Stribeck friction (static_friction) depends on the Coulomb levels being fitted, "
                         "which the sigmoid model holds fixed; remove it or pass fit_drives=False")
    bounds = _check_bounds(com_bounds, n)
    if isinstance(joint_weights, str):
        if joint_weights not in JOINT_WEIGHTS:
            raise ValueError(f"fit_consistent: joint_weights: expected one of {JOINT_WEIGHTS} or an array ({n},), got {joint_weights!r}")
    else:
        w = np.asarray(joint_weights, dtype=np.float64)
        if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
            raise ValueError(f"fit_consistent: joint_weights: expected ({n},) finite weights >= 0, not all zero, got {np.ravel(w).tolist()}")

    # Data scales: make every free variable O(1) and the regularization dimensionless.
    s_tau = np.maximum(_rms(tau), 1e-6)
    s_qd = np.maximum(_rms(qd), 1e-6)
    s_qdd = np.maximum(_rms(qdd), 1e-6)
    scales = np.stack([s_tau / s_qdd, s_tau / s_qd, s_tau, s_tau], axis=1)  # Ia, fv, fc, fo

    pi_arm = np.asarray(standard_parameters(arm), dtype=np.float64)
    pi_prior = np.asarray(standard_parameters(prior), dtype=np.float64)
    theta0 = parameters_to_log_cholesky(pi_arm[: 10 * n].reshape(n, 10), repair=repair, label="arm: link")
    theta_prior = theta0 if prior is arm else parameters_to_log_cholesky(pi_prior[: 10 * n].reshape(n, 10), repair=repair,
                                                                         label="prior: link")
    com_free = _free_from_com(theta0[:, 7:], bounds)  # checks that the starting COMs are inside the bounds
    drives0 = pi_arm[10 * n:].reshape(n, 4)
    drives_prior = pi_prior[10 * n:].reshape(n, 4)
    phi_arm = np.asarray(arm.drives.sigmoid_friction, dtype=np.float64)
    phi_prior = np.asarray(prior.drives.sigmoid_friction, dtype=np.float64)

    drive_free = np.zeros((n, 4), dtype=bool)  # Ia, fv, fc, fo
    if fit_drives:
        drive_free[:] = True
        drive_free[:, 2] = friction != "sigmoid"
    cfg = _Config(memory_size=int(memory_size), fit_sigmoid=bool(fit_drives and friction == "sigmoid"),
                  bounds=_bound_arrays(bounds)[0], fit_stribeck=bool(np.any(stribeck_free)))

    def drive_raw(values):
        """Free variables of drive values (Ia, fv, fc, fo); values outside the physical set
        (negative Ia, fv or fc, |fo| > fc) map to the nearest point inside it."""
        fc = np.maximum(values[:, 2], 1e-6 * scales[:, 2])
        nonneg = np.concatenate([_softplus_inverse(np.maximum(values[:, :2], 1e-6 * scales[:, :2]) / scales[:, :2]),
                                 np.sqrt(fc / scales[:, 2])[:, None]], axis=1)
        ratio = np.clip(values[:, 3] / fc, -0.9, 0.9)  # a start outside: well inside, where tanh has slope
        offset = np.where(drive_free[:, 2], np.arctanh(ratio), values[:, 3] / scales[:, 3])
        return np.concatenate([nonneg, offset[:, None]], axis=1)

    def sigmoid_raw(phi):
        slope = np.where(phi[:, 1] > 0, phi[:, 1], _SIGMOID_SLOPE)
        return np.stack([phi[:, 0] / s_tau, np.log(slope), phi[:, 2] / s_qd], axis=1)

    # The model pieces: regressor (Newton-Euler's linear map) and the torques outside pi.
    base_arm = arm
    if cfg.fit_sigmoid:  # the sigmoid is fitted: keep it out of the known torques
        base_arm = arm.replace(drives=dataclasses.replace(arm.drives, sigmoid_friction=np.zeros((n, 3))))
    if cfg.fit_stribeck:  # Stribeck fitted: out of the known torques, into the columns below
        base_arm = base_arm.replace(drives=dataclasses.replace(base_arm.drives, static_friction=np.zeros(n)))
    Y, known = linear_model_numpy(base_arm, q, qd, qdd)
    stribeck_column = np.zeros_like(qd)
    S_start = S_prior = np.log(2.0) * s_tau  # raw 0 where no joint has Stribeck friction (unused)
    if cfg.fit_stribeck:
        vs = np.where(stribeck_free, stribeck_velocity, 1.0)
        e = np.where(stribeck_free, np.exp(-((qd / vs) ** 2)), 0.0)
        direction = _coulomb_direction(base_arm, qd, xp=np)
        for j in np.flatnonzero(stribeck_free):
            Y[:, :, 10 * n + 4 * j + 2] *= (1.0 - e[:, j])[:, None]  # fc s (1 - e)
            Y[:, :, 10 * n + 4 * j + 3] *= (1.0 - e[:, j])[:, None]  # fo |s| (1 - e)
        stribeck_column = direction * e  # S s e
        absG = np.abs(gear)

        def static_level(a, d):  # joint side S = |G| Ts; without one, the Coulomb level fc (neutral)
            return np.where(np.asarray(a.drives.static_friction) > 0, absG * np.asarray(a.drives.static_friction), d[:, 2])

        S_start = np.maximum(static_level(arm, drives0), 1e-3 * s_tau)
        S_prior = np.maximum(static_level(prior, drives_prior), 1e-3 * s_tau)
    friction_arm = make_arm(arm.joint_types, convention=arm.convention, name="friction")
    friction_arm = friction_arm.replace(kinematics=arm.kinematics)

    # Per-joint weights of the data term.
    rmse_start = torque_rmse(tau, predict_torques(arm, q, qd, qdd))
    if isinstance(joint_weights, str) and joint_weights == "residual":
        w = 1.0 / np.maximum(rmse_start, 1e-3 * s_tau) ** 2
    elif isinstance(joint_weights, str) and joint_weights == "torque":
        w = 1.0 / s_tau**2
    elif isinstance(joint_weights, str):  # "uniform"
        w = np.full(n, 1.0 / np.mean(s_tau**2))

    if cfg.fit_sigmoid:
        data_consts = {"Y": Y, "known": known, "tau": tau, "qd": qd, "w": w}
    else:
        # Without the sigmoid, tau_model = Y pi + known + S * stribeck_column is linear in
        # z = (pi, S): the data term sum_kj (w_j / (N n)) r_kj^2 = ||Z z - t||^2 with rows scaled by
        # sqrt(w_j / (N n)). One QR of the augmented matrix [Z t] = Q [[R q], [0 rho]] (Golub & Van
        # Loan, Matrix Computations, 4th ed., sec. 5.3.3) turns it into ||R z - q||^2 + rho^2 exactly
        # (no normal equations, so no squared condition number), and every L-BFGS evaluation then
        # costs a (15 n)^2 product instead of one over all N n samples.
        N = len(q)
        p = Y.shape[2]
        Z = np.zeros((N, n, p + n + 1))
        Z[:, :, :p] = Y
        Z[:, np.arange(n), p + np.arange(n)] = stribeck_column
        Z[:, :, -1] = tau - known
        Z *= np.sqrt(w / (N * n))[None, :, None]
        R_aug = _triangular_factor(Z.reshape(N * n, p + n + 1))
        del Z
        data_consts = {"R": R_aug[: p + n, : p + n], "Qt": R_aug[: p + n, -1],
                       "floor": np.float64(R_aug[-1, -1] ** 2) if R_aug.shape[0] > p + n else np.float64(0.0)}
    consts = {
        **data_consts, "scales": scales, "s_tau": s_tau, "s_qd": s_qd,
        "drive_free": drive_free, "drives0": drives0, "phi0": phi_arm, "friction_arm": friction_arm,
        "J_prior_inv": np.linalg.inv(np.asarray(log_cholesky_to_pseudo_inertia(theta_prior))),
        "logdet_prior": 2.0 * (4.0 * theta_prior[:, 0] + theta_prior[:, 1:4].sum(axis=1)),
        "drives_prior_raw": drive_raw(drives_prior), "sigmoid_prior_raw": sigmoid_raw(phi_prior),
        "stribeck_free": stribeck_free,
        "stribeck_prior_raw": _softplus_inverse(S_prior / s_tau),
        "bounds": _bound_arrays(bounds)[1],
    }
    # put on the device as they are (jnp.asarray of a host array compiles a small program per shape)
    shared = jax.device_put(consts)
    fits = []
    for regularization in regularizations:  # each weight from the same start, on the same reduced data
        consts = {**shared, "lam": jax.device_put(np.float64(regularization))}
        start = [np.concatenate([theta0[:, :7], com_free], axis=1), drive_raw(drives0), sigmoid_raw(phi_arm),
                 _softplus_inverse(S_start / s_tau)]  # the order _unflatten reads
        v = jax.device_put(np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in start]))
        history, converged, gnorm = [], False, float("nan")
        message = f"stopped after max_steps = {max_steps} iterations"
        k = 0
        while k < int(max_steps) and not converged:
            # A segment: precondition with the Hessian at v, then L-BFGS from y = 0 (restarted every
            # restart_every iterations, so the scaling follows the nonlinear map).
            T = _preconditioner(v, consts, cfg)
            y = jax.device_put(np.zeros(v.shape, v.dtype))
            # optax's fresh state has weakly typed scalars, its updated state strong ones: made
            # strong here, every segment reuses the one compiled step
            state = jax.tree_util.tree_map(strong, _solver(cfg.memory_size).init(y))
            for _ in range(min(int(restart_every), int(max_steps) - k)):
                y_new, state_new, value, g = _step(y, state, v, T, consts, cfg)
                value, g = float(value), float(g)
                if not np.isfinite(value):
                    message = f"the objective became {value} at iteration {k}; stopped at the last finite point"
                    k = int(max_steps)
                    break
                history.append(value)
                gnorm = g
                if verbose and k % 50 == 0:
                    print(f"fit_consistent: iteration {k}: objective {value:.6g}, |grad| {gnorm:.3g}")
                if g <= tol:
                    converged, message = True, f"preconditioned gradient norm {g:.3g} <= tol after {k} iterations"
                    break
                y, state, k = y_new, state_new, k + 1
                if len(history) > 5 and history[-6] - history[-1] <= tol * max(abs(history[-1]), 1e-300):
                    converged = True
                    message = f"objective decreased by less than tol = {tol:g} (relative) over 5 iterations ({k} iterations)"
                    break
            v = v + T @ y
        data_loss, reg_loss, pi, phi, S = _finish(v, consts, cfg)
        data_loss, reg_loss = float(data_loss), float(reg_loss)
        history.append(data_loss + reg_loss)
        fitted = arm_with_parameters(arm, pi)
        fitted = fitted.replace(drives=dataclasses.replace(fitted.drives, sigmoid_friction=phi))
        if cfg.fit_stribeck:
            static = np.where(stribeck_free, np.asarray(S) / np.abs(gear), np.asarray(arm.drives.static_friction))
            fitted = fitted.replace(drives=dataclasses.replace(fitted.drives, static_friction=static))
        fitted = jax.tree_util.tree_map(lambda v: np.asarray(v, dtype=np.float64), fitted)
        fits.append(ConsistentFit(
            arm=fitted,
            parameters=np.asarray(standard_parameters(fitted), dtype=np.float64),
            rmse=torque_rmse(tau, predict_torques(fitted, q, qd, qdd)),
            rmse_prior=torque_rmse(tau, predict_torques(prior, q, qd, qdd)),
            loss_history=np.asarray(history),
            data_loss=data_loss,
            regularization_loss=reg_loss,
            consistency=consistency_report(fitted, drives=True),
            converged=converged,
            iterations=len(history) - 1,
            message=message,
            gradient_norm=gnorm,
            joint_weights=w,
            friction=friction,
            regularization=float(regularization),
            com_bounds=bounds,
        ))
    return fits
