"""Motor identification: torque constant, resistance, rotor inertia and friction of DC drives from
logged voltages, currents and joint positions -- alone (link parameters known) or jointly with the
link parameters.

Two equations per joint j, with the convention of :mod:`jaxarm.motors` (gear ratio G: the motor
turns at G qd and the joint receives G times the motor torque; inductance neglected):

electrical (Swartz eq. 11 with the gearbox)::

    V_j = R_j I_j + Kt_j G_j qd_j                       -> least squares for (R_j, Kt_j)

mechanical (Swartz eq. 12: joint torque = G Kt I; standard parameters of
:mod:`jaxarm.identification`)::

    G_j Kt_j I_j = Y_links(q, qd, qdd) pi_links + Ia_j qdd_j + fv_j qd_j + fc_j s(qd_j) + fo_j |s(qd_j)|
                   + known_torques(q, qd, qdd)

with Ia = G^2 Jm, fv = G^2 B, fc, fo the symmetric Coulomb level and the offset (asymmetric Coulomb).

**The torque scale.** The mechanical equation alone is homogeneous in (Kt, pi): multiplying every
Kt, every link and drive parameter by the same factor leaves it satisfied (gravity does not help,
because the masses scale too), so currents and motions alone cannot tell a strong motor on a heavy
arm from a weak one on a light arm. The electrical equation breaks the tie: the back-EMF constant
in V s/rad *is* the torque constant in N m/A (SI power balance, Kt I qd_motor = back-EMF * I), and
V and qd are measured in absolute units. So Kt is taken from the electrical fit and fixes the
torque G Kt I; the mechanical fit then uses that torque. The uncertainty of Kt is carried into
the mechanical parameters exactly: the estimate is linear in the vector of Kt's, so its covariance
gains J cov(Kt) J^T with J the derivative of the estimate with respect to the Kt's.

Least squares: column-scaled, weighted by the inverse residual standard deviation of each joint's
rows (two passes: ordinary, then weighted; Gautier & Khalil 1990), solved by an SVD truncated at
``rcond``. Directions the data cannot see (rank deficiency, e.g. a rotor inertia about a vertical
first axis, which adds to the link's Izz, in the joint mode) keep the values of the ``arm`` passed
in (the prior): the solution is the prior plus the minimum-norm correction, and such parameters are
flagged not identifiable (standard deviation inf). Standard deviations assume white residuals;
filtered samples are correlated, so they are optimistic by roughly sqrt(sample rate / (2 cutoff)).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np

from ..model import checks
from ..model.arm import Arm
from . import linear_model
from .linear_model import IdentificationError
from .logs import Log

MOTOR_PARAMETERS = ("Kt", "R", "Jm", "B", "Tc+", "Tc-")
MODES = ("alone", "joint")


class MotorIdentificationError(IdentificationError):
    """A log that cannot identify the motors (missing channel, a joint that never moves, ...)."""


@dataclasses.dataclass(frozen=True)
class ElectricalFit:
    """Per-joint least squares of V = R I + Kt G qd: each field (n,) (std: standard deviations;
    cov: (n, 2, 2) covariance of (R, Kt); rmse: voltage residual RMS [V])."""

    torque_constant: np.ndarray
    resistance: np.ndarray
    torque_constant_std: np.ndarray
    resistance_std: np.ndarray
    cov: np.ndarray
    rmse: np.ndarray


@dataclasses.dataclass(frozen=True)
class MotorIdentification:
    """Result of :func:`identify_motors`.

    arm: the given arm with the identified drives (torque_constant, resistance, rotor_inertia,
        viscous and Coulomb friction) and, in the joint mode, the identified link parameters.
    mode: "alone" or "joint".
    names, values, std: motor-side parameters per joint, (6 n,) in the order Kt, R, Jm, B, Tc+, Tc-
        (``MOTOR_PARAMETERS``) for joint 1, then joint 2, ... (names "Kt1", "R1", ...).
    standard_names, standard_values, standard_std, identifiable: the estimated standard parameters
        (drive block [Ia, fv, fc, fo] per joint, preceded by the link block in the joint mode),
        their standard deviations (inf where not identifiable) and a bool mask.
    electrical: the :class:`ElectricalFit`.
    rmse_torque: (n,) RMS of the mechanical residual [N m or N]; rank, condition: of the
        column-scaled weighted mechanical regressor; samples: rows used per joint (n,).
    """

    arm: Arm
    mode: str
    names: tuple
    values: np.ndarray
    std: np.ndarray
    standard_names: tuple
    standard_values: np.ndarray
    standard_std: np.ndarray
    identifiable: np.ndarray
    electrical: ElectricalFit
    rmse_torque: np.ndarray
    rank: int
    condition: float
    samples: np.ndarray

    def parameter(self, name: str):
        """(value, std) of one motor-side parameter by name, e.g. "Kt2"."""
        if name not in self.names:
            raise KeyError(f"parameter: unknown name {name!r}; expected one of {list(self.names)}")
        k = self.names.index(name)
        return float(self.values[k]), float(self.std[k])

    def table(self, truth: Arm | None = None) -> str:
        """A plain-text table of the motor parameters (and relative errors against ``truth``)."""
        true = None if truth is None else motor_parameters(truth)
        head = f"{'parameter':<10}{'estimate':>14}{'std':>12}" + ("" if true is None else f"{'truth':>14}{'rel. error':>12}")
        rows = [head, "-" * len(head)]
        for k, name in enumerate(self.names):
            row = f"{name:<10}{self.values[k]:>14.6g}{self.std[k]:>12.3g}"
            if true is not None:
                rel = relative_error(self.values[k], true[k])
                row += f"{true[k]:>14.6g}{rel:>12.2%}" if np.isfinite(rel) else f"{true[k]:>14.6g}{'-':>12}"
            rows.append(row)
        return "\n".join(rows)

    def json_lines(self, truth: Arm | None = None) -> str:
        """One JSON object per motor parameter: name, joint, value, std (and truth, rel_error)."""
        true = None if truth is None else motor_parameters(truth)
        out = []
        for k, name in enumerate(self.names):
            rec = {"parameter": name, "joint": k // len(MOTOR_PARAMETERS) + 1, "value": float(self.values[k]), "std": float(self.std[k])}
            if true is not None:
                rel = relative_error(self.values[k], true[k])
                rec.update(truth=float(true[k]), rel_error=float(rel) if np.isfinite(rel) else None)
            out.append(json.dumps(rec))
        return "\n".join(out)


def relative_error(estimate, truth):
    """|estimate - truth| / |truth|, nan where the truth is zero."""
    truth = np.asarray(truth, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(truth != 0, np.abs(np.asarray(estimate, float) - truth) / np.abs(truth), np.nan)


def motor_parameter_names(arm: Arm) -> list[str]:
    """"Kt1", "R1", "Jm1", "B1", "Tc+1", "Tc-1", "Kt2", ... (1-based joints)."""
    return [f"{p}{j + 1}" for j in range(arm.n) for p in MOTOR_PARAMETERS]


def motor_parameters(arm: Arm) -> np.ndarray:
    """The arm's motor-side drive parameters (6 n,) in :func:`motor_parameter_names` order."""
    checks.check_arm(arm, "motor_parameters")
    d = arm.drives
    cols = [d.torque_constant, d.resistance, d.rotor_inertia, d.viscous_friction, np.asarray(d.coulomb_friction)[:, 0], np.asarray(d.coulomb_friction)[:, 1]]
    return np.stack([np.asarray(c, float) for c in cols], axis=1).reshape(-1)


# ------------------------------------------------------------------------------------------------
# Input checks


def _channel(log, name, what, n, func):
    x = getattr(log, name, None)
    if x is None:
        source = getattr(log, "source", "") or "log"
        raise MotorIdentificationError(f"{func}: {source}: no {name} channel ({what}); {_HINTS[name]}")
    x = np.asarray(x, float)
    if x.shape != (len(log.t), n):
        raise MotorIdentificationError(f"{func}: log.{name}: expected shape ({len(log.t)}, {n}), got {x.shape}")
    if not np.all(np.isfinite(x)):
        row = int(np.argwhere(~np.isfinite(x))[0, 0])
        raise MotorIdentificationError(f"{func}: log.{name}: non-finite value at row {row}; load the log with drop_nonfinite=True")
    return x


_HINTS = {
    "V": "motor identification needs the motor voltages (columns V1..Vn)",
    "I": "motor identification needs the motor currents (columns I1..In)",
    "dq": "compute velocities with jaxarm.preprocess_log(log, cutoff=...) first",
    "ddq": "compute accelerations with jaxarm.preprocess_log(log, cutoff=...) first",
    "q": "the log has no joint positions",
}


def _check_log(log, func):
    if not isinstance(log, Log):
        raise TypeError(f"{func}: log: expected a jaxarm.Log (see jaxarm.load_log), got {type(log).__name__}")


def _log_arrays(log, arm: Arm, func: str):
    _check_log(log, func)
    checks.check_arm(arm, func)
    n = arm.n
    q = _channel(log, "q", "joint positions", n, func)
    V = _channel(log, "V", "motor voltage", n, func)
    I = _channel(log, "I", "motor current", n, func)
    dq = _channel(log, "dq", "joint velocities", n, func)
    ddq = _channel(log, "ddq", "joint accelerations", n, func)
    G = np.asarray(arm.drives.gear_ratio, float)
    if np.any(G == 0):
        j = int(np.flatnonzero(G == 0)[0])
        raise MotorIdentificationError(f"{func}: arm {arm.name!r} joint {j + 1}: gear_ratio is 0; expected a nonzero gear ratio")
    return q, dq, ddq, V, I, G


# ------------------------------------------------------------------------------------------------
# Electrical equation


def preprocess_motor_log(log: Log, *, cutoff, **options) -> Log:
    """Prepare a measured log for :func:`identify_motors`: q, dq, ddq from
    :func:`jaxarm.preprocess_log` (zero-phase low-pass of the positions at ``cutoff`` Hz, central
    differences; ``options`` are passed on), V and I as measured, at the same time stamps
    (linear interpolation if the log was resampled).

    Why the motor channels stay unfiltered: their noise is white and sits in the regressand
    (torque G Kt I, voltage V), where least squares averages it out without bias. Filtering the
    current would smear the Coulomb torque's fast change at each velocity reversal over the
    filter's response time while the regressor, computed from the smooth filtered velocity, keeps
    it sharp: a bias that trades Coulomb for viscous friction (unless the regressor were filtered
    identically, Gautier's parallel filtering).
    """
    from .logs import preprocess_log

    if not isinstance(log, Log):
        raise TypeError(f"preprocess_motor_log: log: expected a jaxarm.Log, got {type(log).__name__}")
    log.require("V", "I", what="preprocess_motor_log")
    filtered = preprocess_log(log, cutoff=cutoff, **options)
    raw = {c: np.stack([np.interp(filtered.t, log.t, getattr(log, c)[:, j]) for j in range(log.n)], axis=1) for c in ("V", "I")}
    info = dict(filtered.info, motor_channels="unfiltered")
    return dataclasses.replace(filtered, info=info, **raw)


def identify_electrical(log, arm: Arm) -> ElectricalFit:
    """Per joint, least squares of V = R I + Kt G qd (Swartz eq. 11 with the gearbox) for (R, Kt).

    log: a :class:`jaxarm.Log` with q, dq, V, I (ddq not needed here); arm: gives the gear ratios.
    Raises :class:`MotorIdentificationError` when a channel is missing, or a joint never moves (no
    back-EMF: Kt invisible) or never draws current (R invisible).
    """
    func = "identify_electrical"
    _check_log(log, func)
    checks.check_arm(arm, func)
    n = arm.n
    V = _channel(log, "V", "motor voltage", n, func)
    I = _channel(log, "I", "motor current", n, func)
    dq = _channel(log, "dq", "joint velocities", n, func)
    G = np.asarray(arm.drives.gear_ratio, float)
    kt, r, cov, rmse = (np.zeros(n), np.zeros(n), np.zeros((n, 2, 2)), np.zeros(n))
    N = V.shape[0]
    if N < 3:
        raise MotorIdentificationError(f"{func}: log has {N} samples; expected at least 3")
    for j in range(n):
        A = np.stack([I[:, j], G[j] * dq[:, j]], axis=1)  # Swartz eq. 11: V = R I + Kt (G qd)
        norms = np.linalg.norm(A, axis=0)
        if norms[1] == 0 or np.max(np.abs(dq[:, j])) <= 1e-9 * max(1.0, np.max(np.abs(log.q[:, j]))):
            raise MotorIdentificationError(
                f"{func}: joint {j + 1} never moves (max |dq{j + 1}| = {np.max(np.abs(dq[:, j])):.3g}): the back-EMF "
                "Kt G qd is zero, so Kt cannot be identified; excite every joint"
            )
        if norms[0] == 0:
            raise MotorIdentificationError(f"{func}: joint {j + 1} draws no current (I{j + 1} is zero): R cannot be identified")
        As = A / norms
        if np.linalg.cond(As) > 1e8:
            raise MotorIdentificationError(
                f"{func}: joint {j + 1}: current and back-EMF are proportional in this log (condition "
                f"{np.linalg.cond(As):.3g}), so R and Kt cannot be separated; excite with varying load"
            )
        theta, *_ = np.linalg.lstsq(As, V[:, j], rcond=None)
        res = V[:, j] - As @ theta
        s2 = res @ res / max(N - 2, 1)
        cov_s = s2 * np.linalg.inv(As.T @ As)
        r[j], kt[j] = theta / norms
        cov[j] = cov_s / np.outer(norms, norms)
        rmse[j] = np.sqrt(np.mean(res**2))
    return ElectricalFit(
        torque_constant=kt,
        resistance=r,
        torque_constant_std=np.sqrt(cov[:, 1, 1]),
        resistance_std=np.sqrt(cov[:, 0, 0]),
        cov=cov,
        rmse=rmse,
    )


# ------------------------------------------------------------------------------------------------
# Mechanical equation


def _weighted_min_norm(Y, rhs, rows_joint, n, rcond, floor):
    """Weighted, column-scaled, truncated-SVD least squares for a correction delta (Y delta = rhs).

    Y (M, p), rhs (M,); rows_joint (M,) joint index of each row. Pass 1 ordinary, pass 2 rows
    weighted by 1 / sigma_joint, sigma_joint floored at ``floor`` (n,) (noiseless data would
    otherwise give arbitrary weights). Column scaling serves the rank decision only: among the
    least-squares solutions the one with the smallest Euclidean (SI) norm is returned, so
    directions the data cannot see stay at the prior (as in :func:`jaxarm.identify_linear`).
    Returns (delta (p,), P (p, M) the operator delta = P rhs, cov (p, p), identifiable (p,),
    rank, condition, sigma per joint (n,)).
    """
    M, p = Y.shape
    norms = np.linalg.norm(Y, axis=0)
    seen = norms > 1e-10 * np.max(norms)  # structurally zero columns carry only rounding errors
    Y = np.where(seen, Y, 0.0)
    D = np.where(seen, norms, 1.0)
    w = np.ones(M)
    for _ in range(2):
        A = (Y / D) * w[:, None]
        U, s, Vt = np.linalg.svd(A, full_matrices=False)
        rank = int(np.sum(s > rcond * s[0])) if s.size and s[0] > 0 else 0
        if rank == 0:
            raise MotorIdentificationError("identify_motors: the mechanical regressor is zero: the log does not move the arm")
        Ur, sr, Vr = U[:, :rank], s[:rank], Vt[:rank].T
        if Vt.shape[0] == p:
            null = Vt[rank:].T  # (p, p - rank)
        else:
            from scipy import (
                linalg,  # deferred, as in identification.py: keeps `import jaxarm` light
            )

            null = linalg.null_space(Vr.T)
        B = null / D[:, None]  # null directions of Y in SI coordinates
        keep_out = np.eye(p) - B @ np.linalg.pinv(B)  # minimum SI norm among the solutions
        P = keep_out @ (((Vr / sr) @ Ur.T) * w[None, :] / D[:, None])  # delta = P rhs
        delta = P @ rhs
        res = rhs - Y @ delta
        sigma = np.array([np.sqrt(np.mean(res[rows_joint == j] ** 2)) if np.any(rows_joint == j) else 1.0 for j in range(n)])
        sigma = np.maximum(sigma, floor)
        w = 1.0 / sigma[rows_joint]
    rw = res * w
    s2 = float(rw @ rw) / max(M - rank, 1)
    cov = s2 * (P / w[None, :]) @ (P / w[None, :]).T
    # A parameter is identifiable iff its unit vector lies in the row space of the scaled regressor.
    null_part = 1.0 - np.sum(Vr**2, axis=1)
    identifiable = seen & (null_part < 1e-6)
    cond = float(sr[0] / sr[-1])
    return delta, P, cov, identifiable, rank, cond, sigma


def identify_motors(
    log,
    arm: Arm,
    *,
    mode: str = "alone",
    min_speed: float = 0.0,
    rcond: float = 1e-8,
) -> MotorIdentification:
    """Identify every joint's DC drive (Kt, R, rotor inertia, viscous and Coulomb friction) from a
    log with positions, velocities, accelerations, motor voltages and currents.

    log: a :class:`jaxarm.Log` with q, dq, ddq, V and I, each (N, n); from measurements, use
        :func:`preprocess_motor_log` (filtered positions, unfiltered V and I: see there why).
    arm: the kinematics, gear ratios and (mode "alone") the known link parameters; also the prior
        for whatever the data cannot identify.
    mode: "alone" -- links known, fit [Ia, fv, fc, fo] per joint to G Kt I minus the link torques;
        "joint" -- fit the link standard parameters together with the drive parameters.
    min_speed: rows where |qd_j| < min_speed are left out of joint j's mechanical equation (the
        Coulomb sign is unreliable there); the electrical fit uses every sample.
    rcond: relative singular-value cut-off of the column-scaled mechanical regressor.

    Kt and R come from the electrical equation (module docstring: they fix the torque scale).
    Returns a :class:`MotorIdentification` with an :class:`Arm` that predicts torques with
    ``jaxarm.inverse_dynamics`` and voltages with ``jaxarm.motor_voltage``.
    """
    func = "identify_motors"
    if mode not in MODES:
        raise ValueError(f"{func}: mode: expected one of {MODES}, got {mode!r}")
    if not (np.ndim(min_speed) == 0 and float(min_speed) >= 0):
        raise ValueError(f"{func}: min_speed: expected a non-negative number, got {min_speed!r}")
    q, dq, ddq, V, I, G = _log_arrays(log, arm, func)
    n = arm.n
    elec = identify_electrical(log, arm)
    kt = elec.torque_constant

    Y, known = linear_model.linear_model_numpy(arm, q, dq, ddq, drives=True)  # (N, n, 14 n), (N, n)
    prior = np.asarray(linear_model.standard_parameters(arm, drives=True), float)
    free = np.arange(10 * n, 14 * n) if mode == "alone" else np.arange(14 * n)

    keep = np.abs(dq) >= min_speed  # (N, n) rows used
    counts = keep.sum(axis=0)
    if np.any(counts < 4):
        j = int(np.argmin(counts))
        raise MotorIdentificationError(
            f"{func}: joint {j + 1}: only {counts[j]} samples with |dq{j + 1}| >= min_speed={min_speed}; "
            "expected at least 4 for rotor inertia and friction"
        )
    rows = np.nonzero(keep)
    rows_joint = rows[1]
    Yk = Y[rows]  # (M, 14 n)
    GI = (G * I)[rows]  # torque per unit Kt
    tau = kt[rows_joint] * GI  # Swartz eq. 12: joint torque G Kt I
    rhs = tau - known[rows] - Yk @ prior  # correction relative to the prior
    scale = np.array([np.sqrt(np.mean(tau[rows_joint == j] ** 2)) for j in range(n)])
    floor = 1e-9 * np.where(scale > 0, scale, 1.0)  # relative noise floor of each joint's torque
    delta, P, cov, ident, rank, cond, sigma = _weighted_min_norm(Yk[:, free], rhs, rows_joint, n, rcond, floor)
    # d estimate / d Kt_j: the right-hand side's column G_j I_j on joint j's rows.
    E = np.zeros((rhs.shape[0], n))
    E[np.arange(rhs.shape[0]), rows_joint] = GI
    J = P @ E
    cov = cov + J @ (elec.cov[:, 1, 1][:, None] * J.T)
    est = prior.copy()
    est[free] = prior[free] + delta
    std = np.where(ident, np.sqrt(np.maximum(np.diag(cov), 0.0)), np.inf)

    new = linear_model.arm_with_parameters(arm, jnp.asarray(est), drives=True)
    drives = dataclasses.replace(
        new.drives,
        torque_constant=jnp.asarray(kt),
        resistance=jnp.asarray(elec.resistance),
    )
    new = jax.tree_util.tree_map(np.asarray, new.replace(drives=drives))

    # Motor-side values and their standard deviations (linear maps of [Ia, fv, fc, fo]).
    ident_full = np.zeros(14 * n, bool)
    ident_full[free] = ident
    drive_est = est[10 * n :].reshape(n, 4)
    full_cov = np.full((14 * n, 14 * n), np.nan)
    full_cov[np.ix_(free, free)] = cov
    values, stds = [], []
    absG = np.abs(G)
    for j in range(n):
        k = 10 * n + 4 * j
        c = full_cov[k : k + 4, k : k + 4]
        ok = ident_full[k : k + 4]
        Ia, fv, fc, fo = drive_est[j]
        # rows: Jm = Ia / G^2, B = fv / G^2, Tc+ = (fc + fo) / |G|, Tc- = (-fc + fo) / |G|
        maps = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1], [0, 0, -1, 1]]) / np.array([G[j] ** 2, G[j] ** 2, absG[j], absG[j]])[:, None]
        seen = np.array([ok[0], ok[1], ok[2] and ok[3], ok[2] and ok[3]])
        motor_std = np.where(seen, np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", maps, np.nan_to_num(c), maps), 0.0)), np.inf)
        values += [kt[j], elec.resistance[j], *(maps @ np.array([Ia, fv, fc, fo]))]
        stds += [elec.torque_constant_std[j], elec.resistance_std[j], *motor_std]
    names_all = linear_model.parameter_names(arm, drives=True)
    return MotorIdentification(
        arm=new,
        mode=mode,
        names=tuple(motor_parameter_names(arm)),
        values=np.asarray(values, float),
        std=np.asarray(stds, float),
        standard_names=tuple(names_all[k] for k in free),
        standard_values=est[free],
        standard_std=std,
        identifiable=ident,
        electrical=elec,
        rmse_torque=sigma,
        rank=rank,
        condition=cond,
        samples=counts,
    )


# ------------------------------------------------------------------------------------------------
# Simulated logs (for experiments and tests)


def simulated_motor_log(arm: Arm, traj, *, sampling: str = "start", source: str = "simulation") -> Log:
    """The noiseless log of a voltage-driven rollout (``jaxarm.rollout(..., input="voltage")``),
    T rows for a T-step rollout; V is the voltage applied over each step, clipped at the voltage
    limit as the motor model does; I the armature current (Swartz eq. 11), tau = G Kt I.

    sampling="start": row k holds the instantaneous values at the start of step k -- state, current
        (V_k - Kt G qd_k) / R and the rollout's acceleration there: every row satisfies the model
        exactly (for exact-recovery checks).
    sampling="average": row k holds step k's averages, stamped at its midpoint t_k + dt / 2: mean
        velocity (q_{k+1} - q_k) / dt, mean acceleration (qd_{k+1} - qd_k) / dt, mean current
        (V_k - Kt G mean velocity) / R (exact: I is linear in qd), q at the midpoint (mean of the
        ends, error qdd dt^2 / 8). This is what anti-aliased sensors see. Within a step the back-EMF
        changes the current (time constant R J / (G Kt)^2, here a few tens of ms), so start-of-step
        currents paired with the smooth accelerations of filtered positions look like an extra
        inertia (G Kt)^2 / R * dt / 2 (about 10 % of a geared rotor's at 1 ms steps).
    """
    from ..dynamics.motors import _require_motor_model

    _require_motor_model(arm, "simulated_motor_log")
    if sampling not in ("start", "average"):
        raise ValueError(f"simulated_motor_log: sampling: expected 'start' or 'average', got {sampling!r}")
    d = arm.drives
    G, Kt, R, lim = (np.asarray(x, float) for x in (d.gear_ratio, d.torque_constant, d.resistance, d.voltage_limit))
    t, q, qd = (np.asarray(x, float) for x in (traj.t, traj.q, traj.qd))
    V = np.clip(np.asarray(traj.u, float), -lim, lim)
    if sampling == "start":
        t, q, dq, ddq = t[:-1], q[:-1], qd[:-1], np.asarray(traj.qdd, float)
    else:
        dt = np.diff(t)[:, None]
        t, q, dq, ddq = (t[:-1] + t[1:]) / 2, (q[:-1] + q[1:]) / 2, np.diff(q, axis=0) / dt, np.diff(qd, axis=0) / dt
    I = (V - Kt * G * dq) / R  # Swartz eq. 11
    return Log(t=t, q=q, dq=dq, ddq=ddq, tau=G * Kt * I, V=V, I=I, source=source)  # tau: Swartz eq. 12


def _quantize(x, step, limit=None):
    if limit is not None:
        x = np.clip(x, -limit, limit)
    return x if step is None else np.round(x / step) * step


def add_sensor_noise(
    log: Log,
    *,
    relative: float = 0.01,
    encoder_resolution=None,
    voltage_range=None,
    current_range=None,
    adc_bits: int | None = None,
    seed: int = 0,
) -> Log:
    """What sensors would have recorded: positions, voltages and currents with noise and
    quantization; velocities, accelerations and torques dropped (compute them with
    :func:`jaxarm.preprocess_log`).

    Noise model: independent white Gaussian noise per channel and joint with standard deviation
    ``relative`` times the channel's RMS -- about its mean for q (an encoder's zero is arbitrary),
    plain RMS for V and I. Then quantization: q to multiples of ``encoder_resolution`` (() or (n,),
    joint side, e.g. 2 pi / (counts per motor turn |G|)); V and I by an ``adc_bits`` converter over
    [-range, +range] (``voltage_range``, ``current_range``: () or (n,)), clipped at the range.
    """
    if not isinstance(log, Log):
        raise TypeError(f"add_sensor_noise: log: expected a jaxarm.Log, got {type(log).__name__}")
    log.require("V", "I", what="add_sensor_noise")
    if not (np.ndim(relative) == 0 and relative >= 0):
        raise ValueError(f"add_sensor_noise: relative: expected a non-negative number, got {relative!r}")
    rng = np.random.default_rng(seed)

    def noisy(x, scale):
        return x + relative * scale * rng.standard_normal(x.shape)

    def adc_step(rng_):
        if adc_bits is None or rng_ is None:
            return None
        return 2.0 * np.asarray(rng_, float) / 2**adc_bits

    q = _quantize(noisy(log.q, np.std(log.q, axis=0)), None if encoder_resolution is None else np.asarray(encoder_resolution, float))
    V = _quantize(noisy(log.V, np.sqrt(np.mean(log.V**2, axis=0))), adc_step(voltage_range), voltage_range)
    I = _quantize(noisy(log.I, np.sqrt(np.mean(log.I**2, axis=0))), adc_step(current_range), current_range)
    info = dict(log.info)
    info.update(noise_relative=relative, encoder_resolution=encoder_resolution, adc_bits=adc_bits, noise_seed=seed)
    return Log(t=log.t, q=q, V=V, I=I, source=log.source + " + sensor noise", info=info)
