"""Weighted least squares on the base parameters, and the whole linear pipeline on a log:
regressor, base parameters, fit, predicted torques and their errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..dynamics.newton_euler import _inverse_dynamics
from ..model import checks
from ..model.arm import Arm
from .base_params import BaseParameters, base_parameters, grouping_order
from .linear_model import (
    IdentificationError,
    _inverse_dynamics_numpy,
    _is_traced,
    _linear_model,
    _states,
    arm_with_parameters,
    parameter_names,
    regressor,
    standard_parameters,
)


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
    log's base regressor; ``samples`` used; ``drives`` whether drive parameters were fitted;
    ``active_bounds``: the drive parameters the physical bounds held at their limit (e.g.
    "fv3 >= 0"), empty when the unconstrained least squares was already physical.
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
    active_bounds: tuple = ()

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
            "active_bounds": list(self.active_bounds),
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


def structural_base_parameters(arm: Arm, drives: bool = True, *, rtol: float = 1e-8, samples: int = 2048, seed: int = 0) -> BaseParameters:
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


def _drive_index(n: int, j: int, k: int) -> int:
    """Index in the standard vector of joint j's drive parameter k (0 Ia, 1 fv, 2 fc, 3 fo)."""
    return 10 * n + 4 * j + k


def _drive_constraints(n: int):
    """Rows c with c . pi >= 0 for a physical drive: Ia >= 0, fv >= 0, and Coulomb levels in
    the sense of motion, Tc+ = fc + fo >= 0 and -Tc- = fc - fo >= 0; with their labels."""
    rows, labels = [], []
    for j in range(n):
        for coef, label in (({0: 1.0}, f"Ia{j + 1} >= 0"), ({1: 1.0}, f"fv{j + 1} >= 0"),
                            ({2: 1.0, 3: 1.0}, f"Tc+{j + 1} = fc{j + 1} + fo{j + 1} >= 0"),
                            ({2: 1.0, 3: -1.0}, f"Tc-{j + 1} = fo{j + 1} - fc{j + 1} <= 0")):
            c = np.zeros(14 * n)
            for k, v in coef.items():
                c[_drive_index(n, j, k)] = v
            rows.append(c)
            labels.append(label)
    return np.array(rows), labels


def _dissipative_drives(fit: LeastSquaresResult, Yb, target, structure: BaseParameters, n: int):
    """The least-squares base parameters with every drive parameter that is a base parameter of
    its own (a row of K that is one standard parameter: fv, fc, fo and usually Ia) kept physical:
    Ia, fv >= 0 and fc >= |fo|. With fc, fo as a = fc + fo and b = fc - fo the bounds are a box,
    solved exactly by bounded-variable least squares (Stark & Parker 1995) on the same weighted
    equations. Unchanged (and no bound active) when the plain fit is already physical."""
    from scipy.optimize import lsq_linear

    K = structure.K
    r = K.shape[0]
    alone = {}  # standard index -> base index, for base parameters that are one standard parameter
    for row in range(r):
        nz = np.flatnonzero(K[row])
        if nz.size == 1 and abs(K[row, nz[0]] - 1.0) < 1e-12 and nz[0] >= 10 * n:
            alone[int(nz[0])] = row
    T = np.eye(r)  # beta = T gamma
    lower = np.full(r, -np.inf)
    labels = {}
    for j in range(n):
        ia, fv, fc, fo = (_drive_index(n, j, k) for k in range(4))
        for idx, label in ((ia, f"Ia{j + 1} >= 0"), (fv, f"fv{j + 1} >= 0")):
            if idx in alone:
                lower[alone[idx]] = 0.0
                labels[alone[idx]] = label
        if fc in alone and fo in alone:  # gamma holds a = fc + fo at fc's place, b = fc - fo at fo's
            kc, ko = alone[fc], alone[fo]
            T[kc, kc], T[kc, ko], T[ko, kc], T[ko, ko] = 0.5, 0.5, 0.5, -0.5
            lower[kc] = lower[ko] = 0.0
            labels[kc], labels[ko] = f"Tc+{j + 1} >= 0", f"Tc-{j + 1} <= 0"
        elif fc in alone:
            lower[alone[fc]] = 0.0
            labels[alone[fc]] = f"fc{j + 1} >= 0"
    gamma = np.linalg.solve(T, fit.estimate)
    if np.all(gamma >= lower - 1e-12 * np.maximum(np.abs(gamma), 1.0)):
        return fit, ()
    N, nj, _ = Yb.shape
    sw = np.sqrt(fit.weights).reshape(-1)
    A = (Yb.reshape(N * nj, r) @ T) * sw[:, None]
    norms = np.linalg.norm(A, axis=0)
    norms = np.where(norms > 0, norms, 1.0)
    solved = lsq_linear(A / norms, target.reshape(-1) * sw, bounds=(lower * norms, np.full(r, np.inf)), method="bvls")
    gamma = solved.x / norms
    beta = T @ gamma
    residual = target - Yb @ beta
    active = tuple(labels[k] for k in sorted(labels) if gamma[k] <= 1e-12 * max(np.max(np.abs(gamma)), 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(beta != 0, 100.0 * fit.std / np.abs(beta), np.inf)
    fit = dataclasses.replace(fit, estimate=beta, residual=residual, rmse=np.sqrt(np.mean(residual**2, axis=0)), relative_std=rel)
    return fit, active


def _drives_within_bounds(pi, K, n: int):
    """The standard vector closest to ``pi`` with the same base parameters (K pi unchanged) whose
    drives are physical (:func:`_drive_constraints`), for drive parameters merged with link
    parameters (e.g. Ia1 with Izz1): pi + N z with N spanning K's null space and the least-distance
    z (Lawson & Hanson 1974, Ch. 23, by non-negative least squares). Unchanged if already physical;
    left as it is if the base parameters themselves forbid it."""
    from scipy import linalg
    from scipy.optimize import nnls

    C, _ = _drive_constraints(n)
    if np.all(C @ pi >= -1e-12):
        return pi
    Nk = linalg.null_space(K)
    if Nk.shape[1] == 0:
        return pi
    G, h = C @ Nk, -(C @ pi)  # G z >= h
    E = np.vstack([G.T, h[None, :]])
    f = np.zeros(E.shape[0])
    f[-1] = 1.0
    u, _ = nnls(E, f, maxiter=50 * E.shape[1])
    res = E @ u - f
    if abs(res[-1]) < 1e-12:  # infeasible within the null space
        return pi
    pi = pi + Nk @ (-res[:-1] / res[-1])
    # The solution sits on the bounds up to round-off (1e-20 below zero is still "negative" to an
    # arm file's check): put it on them, which moves K pi by no more than that round-off.
    d = pi[10 * n:].reshape(n, 4).copy()
    tol = 1e-9 * max(1.0, float(np.max(np.abs(d))))
    for k in (0, 1):
        d[:, k] = np.where((d[:, k] < 0) & (d[:, k] > -tol), 0.0, d[:, k])
    short = (d[:, 2] < np.abs(d[:, 3])) & (d[:, 2] > np.abs(d[:, 3]) - tol)
    d[:, 2] = np.where(short, np.abs(d[:, 3]), d[:, 2])
    pi[10 * n:] = d.reshape(-1)
    return pi


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
    3. (W)LS of beta on tau - known torques (:func:`least_squares`, ``weighting`` passed on);
       with ``drives``, the drive parameters are kept physical (Ia, fv >= 0, Tc+ >= 0 >= Tc-) by
       bounded least squares where the plain solution is not, and the bounds that hold a
       parameter at its limit are listed in ``active_bounds``.
    4. A full standard vector with K pi = beta: pi = prior + K^+ (beta - K prior), the Euclidean
       closest to ``prior`` (default: ``standard_parameters(arm)``) -- moved within K's null
       space where a drive parameter merged with link parameters (e.g. Ia1 with Izz1) would
       otherwise come out unphysical -- and the fitted arm.
    """
    func = "identify_linear"
    _check_log(arm, log, func)
    names = parameter_names(arm, drives)
    p = len(names)
    N, n = len(log), arm.n
    count = 256 if N <= 256 else 2048  # random states for the structural rank (as many as before)
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
    pi0 = np.asarray(standard_parameters(arm, drives) if prior is None else prior, dtype=float)
    if pi0.shape != (p,):
        raise ValueError(f"{func}: prior: expected shape ({p},), got {pi0.shape}")
    K = structure.K
    active = ()
    if drives:  # friction only dissipates and rotor inertia is >= 0, whatever the noise says
        fit, active = _dissipative_drives(fit, Yb, target, structure, n)
    beta = fit.estimate
    correction = np.linalg.lstsq(K, beta - K @ pi0, rcond=None)[0]  # minimum-norm
    pi = pi0 + correction
    if drives:
        pi = _drives_within_bounds(pi, K, n)
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
        active_bounds=active,
    )


def predict_torques(arm: Arm, q, qd=None, qdd=None) -> np.ndarray:
    """Inverse-dynamics torques (N, n) over a batch of states, or over a log
    (``predict_torques(arm, log)`` uses its q, dq, ddq), as NumPy arrays: evaluated by NumPy like
    the regressor of known samples (nothing to compile), or traced inside ``jit``."""
    from .logs import Log

    if isinstance(q, Log):
        _check_log(arm, q, "predict_torques", ("dq", "ddq"))
        q, qd, qdd = q.q, q.dq, q.ddq
    (q, qd, qdd), batched = _states(arm, q, qd, qdd, "predict_torques")
    one = (lambda x: x) if batched else (lambda x: x[None])  # noqa: E731
    if _is_traced(arm, q, qd, qdd):
        tau = jax.vmap(lambda a, b, c: _inverse_dynamics(arm, a, b, c))(one(q), one(qd), one(qdd))
    else:
        tau = _inverse_dynamics_numpy(arm, *(np.asarray(one(x)) for x in (q, qd, qdd)))
    return tau if batched else tau[0]


def torque_rmse(tau, tau_predicted) -> np.ndarray:
    """Root-mean-square error per joint (n,) between (N, n) torque arrays."""
    tau, tau_predicted = np.asarray(tau, dtype=float), np.asarray(tau_predicted, dtype=float)
    if tau.shape != tau_predicted.shape or tau.ndim != 2:
        raise ValueError(f"torque_rmse: expected two (N, n) arrays of equal shape, got {tau.shape} and {tau_predicted.shape}")
    return np.sqrt(np.mean((tau - tau_predicted) ** 2, axis=0))
