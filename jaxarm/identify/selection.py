"""Choices made from the data: the low-pass cutoff and the Coulomb friction shape, by blocked
cross-validation in time.

A log's accelerations come from differentiating filtered velocities, so the filter's cutoff decides
how much sensor noise reaches the fit: too high and the noise drowns the inertial terms, too low
and the filter removes real motion (and its phase-free smoothing blurs the friction switch at
velocity reversals). Which cutoff is right depends on the arm, the trajectory and the sensors; it
is chosen here by how well a model fitted with it predicts torques it has not seen:

1. The log is resampled to a uniform rate once; for every candidate cutoff it is filtered
   (zero-phase Butterworth, :func:`jaxarm.preprocess_log`) and differentiated.
2. For every candidate Coulomb shape (exact ``sign(qd)``, or ``tanh(qd / s)`` for a few velocity
   scales s, the smooth shape of real joints' friction near rest) the regressor of the linear
   model (links and drives, :func:`jaxarm.regressor`) is computed. The cutoff is chosen for all
   joints; the Coulomb shape per joint (each joint's Coulomb term only enters its own torque),
   by that joint's validation error at the chosen cutoff.
   A log with gaps in time is handled segment by segment (:func:`jaxarm.preprocess_log`), and
   the samples within the filter's transient of any segment's ends are left out.
3. Blocked cross-validation in time (Bergmeir & Benitez 2012; Racine 2000's hv-block): the samples
   are cut into ``folds`` contiguous blocks; each block in turn is predicted by a least-squares fit
   on the others, with a gap of ``order / cutoff`` seconds (the filter's memory) left out on both
   sides of the block so no filtered sample that saw the block reaches the fit. The fit uses the
   filtered torques, each joint scaled by its torque's RMS; the prediction is compared with the
   *measured, unfiltered* torques of the block.
4. The score is the mean over joints of the validation RMSE relative to each joint's RMS torque;
   the candidate with the lowest score wins. Every candidate's numbers are kept for the report.

Random splits of a time series would leak neighbouring, nearly equal samples into the validation
set and favour noise-fitting; contiguous blocks with gaps do not.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..model.arm import Arm
from .linear_model import IdentificationError, known_torques, regressor
from .logs import Log, LogError, preprocess_log

CUTOFFS = (2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0)  # Hz, candidates below the Nyquist rate / 4
COULOMB_SCALES = (0.0, 0.01, 0.03, 0.1)  # rad/s (m/s): 0 = exact sign(qd)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One preprocessing candidate and its cross-validated error: ``rmse`` (n,) validation RMSE
    per joint [N m] (all folds pooled), ``score`` the mean of rmse / RMS(tau) over joints."""

    cutoff: float | None
    coulomb_scale: float
    rmse: np.ndarray
    score: float


@dataclasses.dataclass(frozen=True)
class PreprocessingChoice:
    """The chosen cutoff and Coulomb shape, with every candidate's validation error."""

    cutoff: float | None
    coulomb_scales: np.ndarray  # (n,) per joint: 0 = exact sign(qd)
    order: int
    rate: float
    folds: int
    candidates: tuple

    @property
    def best(self) -> Candidate:
        return min(self.candidates, key=lambda c: c.score)

    def reason(self) -> str:
        """One sentence: what was chosen and by how much it beat the alternatives."""
        best = self.best
        by_cutoff = {}
        for c in self.candidates:
            if c.cutoff not in by_cutoff or c.score < by_cutoff[c.cutoff].score:
                by_cutoff[c.cutoff] = c
        filtered = sorted(c for c in by_cutoff if c is not None)
        shapes = ["sign(qd)" if s == 0 else f"tanh(qd / {s:g})" for s in self.coulomb_scales]
        shape = shapes[0] if len(set(shapes)) == 1 else "per joint " + ", ".join(shapes)
        chosen = "no filter" if best.cutoff is None else f"cutoff {best.cutoff:g} Hz (order {self.order}, zero phase)"
        # the alternatives worth naming: the lowest and highest cutoff tried, and no filter
        named = {f"at {filtered[0]:g} Hz": filtered[0], f"at {filtered[-1]:g} Hz": filtered[-1]} if filtered else {}
        if None in by_cutoff:
            named["no filter"] = None
        others = [f"{label}: {by_cutoff[c].score:.4f}" for label, c in named.items() if c != best.cutoff]
        return (f"{chosen} and Coulomb shape {shape}, chosen by {self.folds}-fold blocked cross-validation in time: "
                f"relative validation error {best.score:.4f}" + (f" ({', '.join(others)})" if others else ""))

    @property
    def per_joint_rmse(self) -> np.ndarray:
        """(n,) validation RMSE per joint with each joint's chosen Coulomb shape, at the chosen cutoff."""
        at = {c.coulomb_scale: c for c in self.candidates if c.cutoff == self.cutoff}
        return np.array([at[s].rmse[j] for j, s in enumerate(self.coulomb_scales)])

    def table(self) -> list[dict]:
        """Every candidate as a JSON-able dict (for reports); ``chosen_for_joints`` lists the joints
        (from 1) that took the candidate's Coulomb shape, at the chosen cutoff."""
        rows = []
        for c in self.candidates:
            joints = [j + 1 for j, s in enumerate(self.coulomb_scales) if c.cutoff == self.cutoff and s == c.coulomb_scale]
            rows.append({"cutoff_hz": c.cutoff, "coulomb_scale": c.coulomb_scale, "score": c.score,
                         "validation_rmse": [float(x) for x in c.rmse], "best_score": c is self.best,
                         "chosen_for_joints": joints})
        return rows


def with_coulomb_scale(arm: Arm, scale) -> Arm:
    """``arm`` with its Coulomb friction shaped by tanh(qd / scale) (0: exact sign); ``scale`` one
    value for every joint or (n,) per joint."""
    drives = dataclasses.replace(arm.drives, coulomb_velocity_scale=np.broadcast_to(np.asarray(scale, float), (arm.n,)).copy())
    return arm.replace(drives=drives)


def select_preprocessing(
    arm: Arm,
    log: Log,
    *,
    rate=None,
    cutoffs=CUTOFFS,
    coulomb_scales=COULOMB_SCALES,
    folds: int = 5,
    order: int = 4,
    samples_per_second: float = 500.0,
) -> PreprocessingChoice:
    """Choose the low-pass cutoff and the Coulomb shape for identifying ``arm`` from ``log`` (which
    needs ``tau``) by blocked cross-validation (module docstring). ``rate``: the uniform rate to
    resample to (default the log's median rate); cutoffs at or above rate / 4 are skipped.
    ``samples_per_second``: the fits use every k-th sample, k = rate / samples_per_second (the
    filtered signals hold nothing above the cutoff, so this loses no information).
    """
    if not isinstance(log, Log) or log.tau is None:
        raise IdentificationError("select_preprocessing: log: expected a jaxarm Log with torques (tau1..taun)")
    if not isinstance(folds, int) or folds < 2:
        raise ValueError(f"select_preprocessing: folds: expected an integer >= 2, got {folds!r}")
    rate = float(log.sample_rate if rate is None else rate)
    usable = [float(c) for c in cutoffs if c is not None and 0 < c < rate / 4]
    usable.append(None)  # no filter at all: right for clean logs (simulated, or exact velocities)
    measured = preprocess_log(log, rate=rate, cutoff=None, trim=0.0, filter_torque=False)
    N = len(measured)
    step = max(1, int(round(rate / samples_per_second)))
    scale_tau = np.sqrt(np.mean(measured.tau**2, axis=0))
    scale_tau = np.where(scale_tau > 0, scale_tau, 1.0)
    candidates = []
    for cutoff in usable:
        try:
            filtered = preprocess_log(log, rate=rate, cutoff=cutoff, order=order, trim=0.0)
        except LogError:
            continue  # too few samples for this filter
        if len(filtered) != N:  # a segment between gaps too short for this filter was left out
            continue
        memory = 2.0 / rate if cutoff is None else order / cutoff  # seconds a sample's value depends on around it
        edge = int(np.ceil(memory * rate))  # the filter's start-up transient at both ends of every segment
        starts = list(filtered.info.get("segment_starts", [0]))
        inside = np.ones(N, dtype=bool)
        for a, b in zip(starts, starts[1:] + [N]):
            inside[a:min(a + edge, b)] = False
            inside[max(b - edge, a):b] = False
        keep = np.flatnonzero(inside)[::step]
        if keep.size < 20 * folds:  # too short for this cutoff's transients (low cutoffs have long ones)
            continue
        gap = memory * rate  # samples of filter memory on either side of a validation block
        blocks = np.array_split(np.arange(keep.size), folds)
        q, dq, ddq, tau_f = (x[keep] for x in (filtered.q, filtered.dq, filtered.ddq, filtered.tau))
        tau_m = measured.tau[keep]
        for s in coulomb_scales:
            arm_s = with_coulomb_scale(arm, s)
            Y = np.asarray(regressor(arm_s, q, dq, ddq)) / scale_tau[None, :, None]
            known = np.asarray(known_torques(arm_s, q, dq, ddq))
            target = (tau_f - known) / scale_tau
            sq = np.zeros(arm.n)
            for b in blocks:
                lo, hi = keep[b[0]] - gap, keep[b[-1]] + gap
                train = (keep < lo) | (keep > hi)
                A = Y[train].reshape(-1, Y.shape[-1])
                pi, *_ = np.linalg.lstsq(A, target[train].reshape(-1), rcond=1e-10)
                pred = np.einsum("kjp,p->kj", Y[b], pi) * scale_tau + known[b]
                sq += np.sum((pred - tau_m[b]) ** 2, axis=0)
            rmse = np.sqrt(sq / keep.size)
            candidates.append(Candidate(cutoff, float(s), rmse, float(np.mean(rmse / scale_tau))))
    if not candidates:
        raise IdentificationError(f"select_preprocessing: the log ({log.duration:.3g} s) is too short for {folds}-fold "
                                  f"cross-validation at any cutoff of {tuple(usable)} Hz")
    best = min(candidates, key=lambda c: c.score)
    # Each joint's Coulomb term only enters that joint's torque: its shape is chosen per joint, by
    # that joint's validation error at the chosen cutoff.
    at_cutoff = [c for c in candidates if c.cutoff == best.cutoff]
    scales = np.array([min(at_cutoff, key=lambda c: c.rmse[j]).coulomb_scale for j in range(arm.n)])
    return PreprocessingChoice(best.cutoff, scales, order, rate, folds, tuple(candidates))


REGULARIZATION_WEIGHTS = (1e-4, 1e-3, 1e-2, 1e-1)  # below 1e-4 the Panda fit needs > 1500 L-BFGS steps


@dataclasses.dataclass(frozen=True)
class RegularizationChoice:
    """The chosen friction model and weight of the consistent fit's pull towards the prior, with
    every candidate's validation error: ``rows`` of {"friction", "weight", "score",
    "validation_rmse"} (score: mean over joints of RMSE / RMS torque on the validation block)."""

    weight: float
    rows: tuple
    validation_seconds: float
    tolerance: float = 0.01
    friction: str = "viscous-coulomb"

    def reason(self) -> str:
        frictions = list(dict.fromkeys(r["friction"] for r in self.rows))
        label = (lambda r: f"{r['friction']} {r['weight']:g}") if len(frictions) > 1 else (lambda r: f"{r['weight']:g}")
        best = next(r for r in self.rows if r["weight"] == self.weight and r["friction"] == self.friction)
        others = ", ".join(f"{label(r)}: {r['score']:.4f}" for r in self.rows if r is not best)
        what = (f"{self.friction} friction and regularization weight {self.weight:g}" if len(frictions) > 1
                else f"regularization weight {self.weight:g}")
        return (f"{what} chosen by validation on the last {self.validation_seconds:.3g} s of the fitted part (of the "
                f"candidates within {100 * self.tolerance:g} % of the lowest error, the simplest friction model and the "
                f"largest weight): relative validation error {best['score']:.4f} ({others})")


def select_regularization(arm: Arm, log: Log, *, weights=REGULARIZATION_WEIGHTS, frictions=("viscous-coulomb",),
                          holdout: float = 0.2, max_steps: int = 200, tolerance: float = 0.01) -> RegularizationChoice:
    """Choose the consistent fit's friction model and regularization weight
    (:func:`jaxarm.fit_consistent`) by the error on held-out data: every (friction, weight) pair is
    fitted on the first ``1 - holdout`` of the preprocessed ``log`` and scored on its last
    ``holdout``, a gap of the filter's memory (order / cutoff seconds, from ``log.info``) left out
    between them so no filtered sample that saw the validation block reaches the fit. Too small a
    weight lets noise move the directions the data barely sees; too large a one keeps the prior's
    errors. Of the candidates whose validation error is within ``tolerance`` (relative) of the
    lowest, the one with the friction model listed first in ``frictions`` (list the simplest
    first) and then the largest weight is chosen: the simplest model that does as well (the
    "one-standard-error" rule, Hastie, Tibshirani & Friedman 2009, Sec. 7.10)."""
    import warnings

    from .consistent import FRICTION_MODELS, PriorNudgedWarning, fit_consistent
    from .fit import predict_torques

    if not isinstance(log, Log) or log.tau is None or log.ddq is None:
        raise IdentificationError("select_regularization: log: expected a preprocessed jaxarm Log with q, dq, ddq and tau")
    if not 0 < holdout < 1:
        raise ValueError(f"select_regularization: holdout: expected a fraction in (0, 1), got {holdout!r}")
    frictions = tuple(frictions)
    if not frictions or any(f not in FRICTION_MODELS for f in frictions):
        raise ValueError(f"select_regularization: frictions: expected some of {FRICTION_MODELS}, got {frictions!r}")
    cutoff, order = log.info.get("cutoff"), int(log.info.get("order", 4) or 4)
    memory = order / cutoff if cutoff else 0.0
    split = log.t[0] + (1 - holdout) * log.duration
    fit_part, rest = log.split(split)
    held = rest.slice(split + memory, None)
    if len(fit_part) < 3 or len(held) < 3:
        raise IdentificationError("select_regularization: the log is too short to hold out a validation block")
    scale = np.sqrt(np.mean(held.tau**2, axis=0))
    scale = np.where(scale > 0, scale, 1.0)
    rows = []
    for friction in frictions:
        for w in weights:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PriorNudgedWarning)  # said once by the final fit
                fit = fit_consistent(arm, fit_part.q, fit_part.dq, fit_part.ddq, fit_part.tau, friction=friction,
                                     regularization=float(w), max_steps=max_steps, repair=True)
            rmse = np.sqrt(np.mean((predict_torques(fit.arm, held.q, held.dq, held.ddq) - held.tau) ** 2, axis=0))
            rows.append({"friction": friction, "weight": float(w), "score": float(np.mean(rmse / scale)),
                         "validation_rmse": rmse.tolist()})
    lowest = min(r["score"] for r in rows)
    close = [r for r in rows if r["score"] <= (1 + tolerance) * lowest]
    best = min(close, key=lambda r: (frictions.index(r["friction"]), -r["weight"]))
    return RegularizationChoice(best["weight"], tuple(rows), float(held.duration), float(tolerance), best["friction"])
