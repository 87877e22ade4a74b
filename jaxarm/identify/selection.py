"""Choices made from the data: the low-pass cutoff and each joint's friction model, by blocked
cross-validation in time.

A log's accelerations come from differentiating filtered velocities, so the filter's cutoff decides
how much sensor noise reaches the fit: too high and the noise drowns the inertial terms, too low
and the filter removes real motion (and its phase-free smoothing blurs the friction switch at
velocity reversals). Which cutoff is right depends on the arm, the trajectory and the sensors; it
is chosen here by how well a model fitted with it predicts torques it has not seen:

1. The log is resampled to a uniform rate once; for every candidate cutoff and filter order (2 or
   4) it is filtered (zero-phase Butterworth, :func:`jaxarm.preprocess_log`) and differentiated.
2. For every candidate Coulomb shape (exact ``sign(qd)``, or ``tanh(qd / s)`` for a few velocity
   scales s, the smooth shape of real joints' friction near rest) the linear model's regressor
   (links and drives, :func:`jaxarm.regressor`, computed once per cutoff: the shapes differ only
   in each joint's Coulomb columns) is scored with every joint taking that shape. The cutoff is
   chosen for all joints; then the friction model per joint (each joint's friction only enters
   its own torque, but the link parameters are shared) by coordinate descent over the joints at
   the chosen cutoff, each joint's model by that joint's validation error, the others held.
   Every Coulomb shape is also tried with a Stribeck term (Armstrong-Helouvry, Dupont & Canudas
   de Wit 1994, eq. 2) for a few Stribeck velocities vs: friction falling from a static level at
   rest to the Coulomb level as the speed grows, ``(fc s + fo |s|)(1 - e) + S s e`` with
   ``e = exp(-(qd / vs)^2)``, linear in fc, fo and the static level S once vs is fixed (its columns
   are the Coulomb columns scaled by 1 - e, and ``s e``). The Gaz et al. (2019) sigmoid friction of
   the Panda, ``phi1 / (1 + exp(-phi2 (qd + phi3)))``, is with phi3 = 0 exactly a constant plus
   ``(phi1 / 2) tanh(phi2 qd / 2)``: the tanh Coulomb shape with scale 2 / phi2, with the offset
   ``fo`` as its constant part, so the tanh candidates are the sigmoid model in a form whose
   Coulomb levels are kept opposing the motion. A joint takes the more complex model (tanh over
   sign, Stribeck over none) only where it lowers that joint's validation error by more than
   ``tolerance`` (1 %): the simplest model that does as well.
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
from ..dynamics.drives import _direction
from .linear_model import IdentificationError, linear_model_numpy
from .logs import Log, LogError, preprocess_log

CUTOFFS = (2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0)  # Hz, candidates below the Nyquist rate / 4
COULOMB_SCALES = (0.0, 0.01, 0.03, 0.1)  # rad/s (m/s): 0 = exact sign(qd)
STRIBECK_VELOCITIES = (0.0, 0.02, 0.05, 0.15)  # rad/s (m/s): 0 = no Stribeck term


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One preprocessing candidate and its cross-validated error: ``rmse`` (n,) validation RMSE
    per joint [N m] (all folds pooled), ``score`` the mean of rmse / RMS(tau) over joints;
    ``stribeck_velocity`` 0 for none; ``order`` the filter's order."""

    cutoff: float | None
    coulomb_scale: float
    rmse: np.ndarray
    score: float
    stribeck_velocity: float = 0.0
    order: int | None = None  # the Butterworth filter's order (None: no filter)


@dataclasses.dataclass(frozen=True)
class PreprocessingChoice:
    """The chosen cutoff and friction model per joint (Coulomb shape, Stribeck velocity), with
    every candidate's validation error."""

    cutoff: float | None
    coulomb_scales: np.ndarray  # (n,) per joint: 0 = exact sign(qd)
    order: int
    rate: float
    folds: int
    candidates: tuple
    stribeck_velocities: np.ndarray | None = None  # (n,) per joint: 0 = no Stribeck term
    tolerance: float = 0.01
    mixed_rmse: np.ndarray | None = None  # (n,) validation RMSE with each joint's chosen model
    mixed_score: float | None = None

    def __post_init__(self):
        if self.stribeck_velocities is None:
            object.__setattr__(self, "stribeck_velocities", np.zeros(len(self.coulomb_scales)))

    def friction_models(self) -> list[str]:
        """Each joint's chosen friction model in words, e.g. "tanh(qd / 0.03) + Stribeck 0.05"."""
        out = []
        for s, v in zip(self.coulomb_scales, self.stribeck_velocities):
            shape = "sign(qd)" if s == 0 else f"tanh(qd / {s:g})"
            out.append(shape + (f" + Stribeck {v:g}" if v > 0 else ""))
        return out

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
        shapes = self.friction_models()
        shape = shapes[0] if len(set(shapes)) == 1 else "per joint " + ", ".join(shapes)
        chosen = "no filter" if best.cutoff is None else f"cutoff {best.cutoff:g} Hz (order {self.order}, zero phase)"
        # the alternatives worth naming: the lowest and highest cutoff tried, and no filter
        named = {f"at {filtered[0]:g} Hz": filtered[0], f"at {filtered[-1]:g} Hz": filtered[-1]} if filtered else {}
        if None in by_cutoff:
            named["no filter"] = None
        others = [f"{label}: {by_cutoff[c].score:.4f}" for label, c in named.items() if c != best.cutoff]
        mixed = "" if self.mixed_score is None else f"; with each joint's own model {self.mixed_score:.4f}"
        return (f"{chosen} and viscous + Coulomb friction {shape}, chosen by {self.folds}-fold blocked cross-validation in time: "
                f"relative validation error {best.score:.4f}" + (f" ({', '.join(others)})" if others else "") + mixed)

    @property
    def per_joint_rmse(self) -> np.ndarray:
        """(n,) validation RMSE per joint with each joint's chosen friction model, at the chosen cutoff."""
        if self.mixed_rmse is not None:
            return np.asarray(self.mixed_rmse)
        at = {(c.coulomb_scale, c.stribeck_velocity): c for c in self.candidates
              if c.cutoff == self.cutoff and c.order == self.best.order}
        return np.array([at[(s, v)].rmse[j] for j, (s, v) in enumerate(zip(self.coulomb_scales, self.stribeck_velocities))])

    def table(self) -> list[dict]:
        """Every candidate as a JSON-able dict (for reports); ``chosen_for_joints`` lists the joints
        (from 1) that took the candidate's friction model, at the chosen cutoff."""
        rows = []
        for c in self.candidates:
            joints = [j + 1 for j, (s, v) in enumerate(zip(self.coulomb_scales, self.stribeck_velocities))
                      if c.cutoff == self.cutoff and c.order == self.best.order and s == c.coulomb_scale
                      and v == c.stribeck_velocity]
            rows.append({"cutoff_hz": c.cutoff, "order": c.order, "coulomb_scale": c.coulomb_scale,
                         "stribeck_velocity": c.stribeck_velocity,
                         "score": c.score,
                         "validation_rmse": [float(x) for x in c.rmse], "best_score": c is self.best,
                         "chosen_for_joints": joints})
        return rows


class _CrossValidation:
    """Blocked cross-validation of the linear model at one cutoff, for any friction model per
    joint: ``rmse(models)`` with ``models`` a (Coulomb scale, Stribeck velocity) per joint.

    The fits solve the normal equations with equilibrated columns, assembled from blocks: the
    columns no friction model changes (links, rotor inertia, viscous friction) give one Gram
    matrix, computed once; each joint's Coulomb (and Stribeck) columns are nonzero only in that
    joint's torque, so they couple to the fixed columns through that joint's row alone and not at
    all to other joints' friction columns. Each (joint, model) block is computed once, and a
    model per joint costs a solve of a few hundred unknowns per fold. Each fold's Gram matrix is
    the whole log's minus that of the samples it leaves out."""

    def __init__(self, Y0, dq, target, tau_measured, known, scale_tau, keep, folds, gap, models):
        K, n, _ = Y0.shape
        self.n, self.scale_tau, self.known, self.tau_m = n, scale_tau, known, tau_measured
        fixed = list(range(10 * n)) + [10 * n + 4 * j + k for j in range(n) for k in (0, 1)]
        self.X = np.ascontiguousarray(Y0[:, :, fixed])  # (K, n, p0)
        # Every set of samples below is a contiguous run (``keep`` is increasing), so it is taken
        # as a slice, a view: indexing by masks copied the regressor (K x n x p0) for every fold of
        # every candidate (the Panda log's selection, its regressor compiled: 21.5-22.3 s with
        # masks, 12.6-15.9 s with slices, the same choices).
        self.blocks = [slice(int(b[0]), int(b[-1]) + 1) for b in np.array_split(np.arange(K), folds)]
        # all samples, then the samples each fold leaves out of its fit: its block and the filter's
        # memory either side
        runs = [slice(0, K)]
        for b in self.blocks:
            lo, hi = keep[b.start] - gap, keep[b.stop - 1] + gap
            runs.append(slice(int(np.searchsorted(keep, lo, side="left")), int(np.searchsorted(keep, hi, side="right"))))

        def gram(rows):
            A = self.X[rows].reshape(-1, self.X.shape[-1])
            return A.T @ A, A.T @ target[rows].reshape(-1)

        self.fixed = [gram(r) for r in runs]
        self.features = {}  # (joint, model) -> (F (K, f), [(C (p0, f), D (f, f), h (f,)) for each run])
        directions = {}
        for scale, _ in models:
            if scale not in directions:
                directions[scale] = _direction(np.asarray(dq), scale, xp=np)
        for j in range(n):
            # every model's columns side by side, so that each run takes one product per joint
            cols, where = [], []
            for scale, vs in models:
                d = directions[scale][:, j]
                e = np.exp(-((dq[:, j] / vs) ** 2)) if vs > 0 else np.zeros(K)
                these = [d * (1.0 - e), np.abs(d) * (1.0 - e)] + ([d * e] if vs > 0 else [])
                where.append((len(cols), len(these)))
                cols += these
            F_all = np.stack(cols, axis=1) / scale_tau[j]  # (K, all models' columns)
            Xj, tj = np.ascontiguousarray(self.X[:, j]), np.ascontiguousarray(target[:, j])
            products = [(Xj[r].T @ F_all[r], F_all[r].T @ F_all[r], F_all[r].T @ tj[r]) for r in runs]
            for (scale, vs), (a, f) in zip(models, where):
                parts = [(C[:, a:a + f], D[a:a + f, a:a + f], h[a:a + f]) for C, D, h in products]
                self.features[(j, (scale, vs))] = (F_all[:, a:a + f], parts)

    def rmse(self, models) -> np.ndarray:
        """(n,) validation RMSE per joint [N m], every fold's block pooled."""
        feats = [self.features[(j, (float(s), float(v)))] for j, (s, v) in enumerate(models)]
        sizes = [F.shape[1] for F, _ in feats]
        p0 = self.X.shape[-1]
        P = p0 + sum(sizes)
        starts = np.cumsum([p0] + sizes)[:-1]

        def assemble(i):
            G = np.zeros((P, P))
            g = np.zeros(P)
            G[:p0, :p0], g[:p0] = self.fixed[i]
            for a, (F, parts) in zip(starts, feats):
                C, D, h = parts[i]
                f = F.shape[1]
                G[:p0, a:a + f] = C
                G[a:a + f, :p0] = C.T
                G[a:a + f, a:a + f] = D
                g[a:a + f] = h
            return G, g

        G, g = assemble(0)
        norm = np.sqrt(np.diag(G))
        # a column at the level of round-off (a parameter the torques do not see, computed as
        # 1e-14 rather than 0) is zero, as in base_parameters: scaled to unit norm it would be a
        # column of noise in every fit (an infinite scale drops it: its eigenvalue is then 0)
        norm = np.where(norm > 1e-8 * norm.max(), norm, np.inf)
        sq = np.zeros(self.n)
        for i, b in enumerate(self.blocks, start=1):
            Go, go = assemble(i)
            # minimum-norm least squares of the symmetric system: its eigenvalues below 1e-13 of the largest are zero
            w, V = np.linalg.eigh((G - Go) / np.outer(norm, norm))
            inv = np.where(w > 1e-13 * w[-1], 1.0 / np.where(w > 0, w, 1.0), 0.0)
            x = V @ (inv * (V.T @ ((g - go) / norm)))
            pi = x / norm
            pred = self.X[b] @ pi[:p0]
            for j, (a, (F, _)) in enumerate(zip(starts, feats)):
                pred[:, j] += F[b] @ pi[a:a + F.shape[1]]
            pred = pred * self.scale_tau + self.known[b]
            sq += np.sum((pred - self.tau_m[b]) ** 2, axis=0)
        return np.sqrt(sq / sum(b.stop - b.start for b in self.blocks))


def with_coulomb_scale(arm: Arm, scale) -> Arm:
    """``arm`` with its Coulomb friction shaped by tanh(qd / scale) (0: exact sign); ``scale`` one
    value for every joint or (n,) per joint."""
    drives = dataclasses.replace(arm.drives, coulomb_velocity_scale=np.broadcast_to(np.asarray(scale, float), (arm.n,)).copy())
    return arm.replace(drives=drives)


def with_friction_model(arm: Arm, coulomb_scale, stribeck_velocity) -> Arm:
    """``arm`` set up for fitting the friction models of a :class:`PreprocessingChoice`: Coulomb
    shaped by tanh(qd / coulomb_scale) (0: sign), and a Stribeck term where ``stribeck_velocity``
    > 0 (its static level, kept from ``arm`` where set, is what :func:`jaxarm.fit_consistent` then
    fits; removed on joints without one). Each one value or (n,) per joint."""
    arm = with_coulomb_scale(arm, coulomb_scale)
    vs = np.broadcast_to(np.asarray(stribeck_velocity, float), (arm.n,)).copy()
    static = np.where(vs > 0, np.asarray(arm.drives.static_friction, float), 0.0)
    return arm.replace(drives=dataclasses.replace(arm.drives, stribeck_velocity=vs, static_friction=static))


def select_preprocessing(
    arm: Arm,
    log: Log,
    *,
    rate=None,
    cutoffs=CUTOFFS,
    coulomb_scales=COULOMB_SCALES,
    stribeck_velocities=STRIBECK_VELOCITIES,
    folds: int = 5,
    order=(2, 4),
    samples_per_second: float = 500.0,
    tolerance: float = 0.01,
) -> PreprocessingChoice:
    """Choose the low-pass cutoff and each joint's friction model (Coulomb shape, Stribeck term)
    for identifying ``arm`` from ``log`` (which needs ``tau``) by blocked cross-validation (module
    docstring). ``rate``: the uniform rate to resample to (default the log's median rate); cutoffs
    at or above rate / 4 are skipped. ``order``: the zero-phase Butterworth filter's order, or
    several to choose from with the cutoff (default 2 and 4: a gentler or a sharper roll-off).
    ``stribeck_velocities``: include 0 (no Stribeck term); pass ``(0.0,)`` for none.
    ``samples_per_second``: the fits use every k-th sample, k = rate / samples_per_second (the
    filtered signals hold nothing above the cutoff, so this loses no information).
    """
    if not isinstance(log, Log) or log.tau is None:
        raise IdentificationError("select_preprocessing: log: expected a jaxarm Log with torques (tau1..taun)")
    if not isinstance(folds, int) or folds < 2:
        raise ValueError(f"select_preprocessing: folds: expected an integer >= 2, got {folds!r}")
    orders = tuple(np.atleast_1d(order).tolist())
    if not orders or any(not isinstance(o, int) or o < 1 for o in orders):
        raise ValueError(f"select_preprocessing: order: expected a filter order >= 1 or several, got {order!r}")
    stribeck_velocities = tuple(float(v) for v in stribeck_velocities)
    coulomb_scales = tuple(float(c) for c in coulomb_scales)
    if 0.0 not in stribeck_velocities or any(not (np.isfinite(v) and v >= 0) for v in stribeck_velocities):
        raise ValueError(f"select_preprocessing: stribeck_velocities: expected velocities >= 0 including 0 (none), "
                         f"got {stribeck_velocities!r}")
    # the friction the candidates fit is theirs alone: the arm's own Stribeck term is left out
    arm = arm.replace(drives=dataclasses.replace(arm.drives, static_friction=np.zeros(arm.n)))
    n = arm.n
    arm_sign = with_coulomb_scale(arm, 0.0)
    problems = {}
    rate = float(log.sample_rate if rate is None else rate)
    usable = [float(c) for c in cutoffs if c is not None and 0 < c < rate / 4]
    usable.append(None)  # no filter at all: right for clean logs (simulated, or exact velocities)
    measured = preprocess_log(log, rate=rate, cutoff=None, trim=0.0, filter_torque=False)
    N = len(measured)
    step = max(1, int(round(rate / samples_per_second)))
    scale_tau = np.sqrt(np.mean(measured.tau**2, axis=0))
    scale_tau = np.where(scale_tau > 0, scale_tau, 1.0)
    candidates = []
    for cutoff, order in [(c, o) for c in usable if c is not None for o in orders] + [(None, None)]:
        try:
            filtered = preprocess_log(log, rate=rate, cutoff=cutoff, order=order or 4, trim=0.0)
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
        q, dq, ddq, tau_f = (x[keep] for x in (filtered.q, filtered.dq, filtered.ddq, filtered.tau))
        # One regressor per cutoff: the friction models differ only in each joint's Coulomb columns.
        Y0, known = linear_model_numpy(arm_sign, q, dq, ddq)
        Y0 /= scale_tau[None, :, None]
        problem = _CrossValidation(Y0, dq, (tau_f - known) / scale_tau, measured.tau[keep], known, scale_tau, keep, folds,
                                   memory * rate,  # samples of filter memory on either side of a validation block
                                   [(c, v) for v in stribeck_velocities for c in coulomb_scales])
        problems[(cutoff, order)] = problem
        for vs in stribeck_velocities:
            for s in coulomb_scales:
                rmse = problem.rmse([(s, vs)] * n)
                candidates.append(Candidate(cutoff, float(s), rmse, float(np.mean(rmse / scale_tau)), float(vs), order))
    if not candidates:
        raise IdentificationError(f"select_preprocessing: the log ({log.duration:.3g} s) is too short for {folds}-fold "
                                  f"cross-validation at any cutoff of {tuple(usable)} Hz")
    best = min(candidates, key=lambda c: c.score)
    # Each joint's friction only enters that joint's torque, but the link parameters are shared: a
    # joint whose friction is wrong distorts them and so every joint's error. So the models are
    # chosen per joint by coordinate descent at the chosen cutoff, from the best common model: each
    # joint in turn takes, with the other joints' models held, the simplest model whose validation
    # error on that joint is within ``tolerance`` of the lowest (no Stribeck term before one, sign
    # before tanh, then the order the candidates are listed in), until no joint changes.
    problem = problems[(best.cutoff, best.order)]
    order_of = {(s, v): (v > 0, s > 0, i) for i, (v, s) in enumerate((v, s) for v in stribeck_velocities for s in coulomb_scales)}
    models = [(best.coulomb_scale, best.stribeck_velocity)] * n
    for _ in range(3):
        changed = False
        for j in range(n):
            trials = {}
            for m in order_of:
                trial = list(models)
                trial[j] = m
                trials[m] = problem.rmse(trial)
            lowest = min(r[j] for r in trials.values())
            pick = min((m for m, r in trials.items() if r[j] <= (1 + tolerance) * lowest), key=order_of.get)
            changed |= pick != models[j]
            models[j] = pick
        if not changed:
            break
    mixed = problem.rmse(models)
    scales = np.array([m[0] for m in models])
    stribeck = np.array([m[1] for m in models])
    return PreprocessingChoice(best.cutoff, scales, best.order or orders[-1], rate, folds, tuple(candidates), stribeck,
                               float(tolerance),
                               mixed, float(np.mean(mixed / scale_tau)))


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
    folds: int = 1

    def reason(self) -> str:
        frictions = list(dict.fromkeys(r["friction"] for r in self.rows))
        label = (lambda r: f"{r['friction']} {r['weight']:g}") if len(frictions) > 1 else (lambda r: f"{r['weight']:g}")
        best = next(r for r in self.rows if r["weight"] == self.weight and r["friction"] == self.friction)
        others = ", ".join(f"{label(r)}: {r['score']:.4f}" for r in self.rows if r is not best)
        what = (f"{self.friction} friction and regularization weight {self.weight:g}" if len(frictions) > 1
                else f"regularization weight {self.weight:g}")
        how = (f"validation on the last {self.validation_seconds:.3g} s of the fitted part" if self.folds == 1 else
               f"{self.folds}-fold blocked cross-validation in time over the {self.validation_seconds:.3g} s fitted part")
        return (f"{what} chosen by {how} (of the "
                f"candidates within {100 * self.tolerance:g} % of the lowest error, the simplest friction model and the "
                f"largest weight): relative validation error {best['score']:.4f} ({others})")


def select_regularization(arm: Arm, log: Log, *, weights=REGULARIZATION_WEIGHTS, frictions=("viscous-coulomb",),
                          folds: int = 3, holdout: float = 0.2, max_steps: int = 200,
                          tolerance: float = 0.01) -> RegularizationChoice:
    """Choose the consistent fit's friction model and regularization weight
    (:func:`jaxarm.fit_consistent`) by blocked cross-validation in time on the preprocessed
    ``log``: it is cut into ``folds`` contiguous blocks; each (friction, weight) pair is fitted on
    all but one block and scored on that block, a gap of the filter's memory (order / cutoff
    seconds, from ``log.info``) left out on both sides of it so no filtered sample that saw the
    validation block reaches the fit; the score is the mean over joints of the pooled validation
    RMSE relative to each joint's RMS torque. ``folds=1`` instead fits on the first
    ``1 - holdout`` and scores on the last ``holdout`` (one block, cheaper). Too small a
    weight lets noise move the directions the data barely sees; too large a one keeps the prior's
    errors. Of the candidates whose validation error is within ``tolerance`` (relative) of the
    lowest, the one with the friction model listed first in ``frictions`` (list the simplest
    first) and then the largest weight is chosen: the simplest model that does as well (the
    "one-standard-error" rule, Hastie, Tibshirani & Friedman 2009, Sec. 7.10)."""
    import warnings

    from .consistent import FRICTION_MODELS, PriorNudgedWarning, _fit_consistent_weights, fit_consistent
    from .fit import predict_torques

    if not isinstance(log, Log) or log.tau is None or log.ddq is None:
        raise IdentificationError("select_regularization: log: expected a preprocessed jaxarm Log with q, dq, ddq and tau")
    if not 0 < holdout < 1:
        raise ValueError(f"select_regularization: holdout: expected a fraction in (0, 1), got {holdout!r}")
    if not isinstance(folds, int) or folds < 1:
        raise ValueError(f"select_regularization: folds: expected an integer >= 1, got {folds!r}")
    frictions = tuple(frictions)
    if not frictions or any(f not in FRICTION_MODELS for f in frictions):
        raise ValueError(f"select_regularization: frictions: expected some of {FRICTION_MODELS}, got {frictions!r}")
    cutoff, order = log.info.get("cutoff"), int(log.info.get("order", 4) or 4)
    memory = order / cutoff if cutoff else 0.0
    t = np.asarray(log.t)
    if folds == 1:
        edges = [t[0] + (1 - holdout) * log.duration, t[-1] + 1.0]
    else:
        edges = list(t[0] + np.arange(folds + 1) * log.duration / folds)
        edges[-1] = t[-1] + 1.0
    splits = []  # (fit samples, validation samples)
    for lo, hi in zip(edges[:-1], edges[1:]):
        held = (t >= lo) & (t < hi)
        fit = (t < lo - memory) | (t >= hi + memory)
        if folds == 1:
            held &= t >= lo + memory
            fit = t < lo
        if fit.sum() < 3 or held.sum() < 3:
            raise IdentificationError("select_regularization: the log is too short to hold out a validation block")
        splits.append((np.flatnonzero(fit), np.flatnonzero(held)))
    validated = np.concatenate([h for _, h in splits])
    scale = np.sqrt(np.mean(log.tau[validated] ** 2, axis=0))
    scale = np.where(scale > 0, scale, 1.0)
    rows = []
    weights = [float(w) for w in weights]
    options = {k: v for k, v in fit_consistent.__kwdefaults__.items() if k != "regularization"}
    options.update(max_steps=max_steps, repair=True)
    for friction in frictions:
        sq = np.zeros((len(weights), arm.n))
        for fit_rows, held_rows in splits:
            # every weight on this fold's data, reduced once (regressor and QR)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PriorNudgedWarning)  # said once by the final fit
                fits = _fit_consistent_weights(arm, log.q[fit_rows], log.dq[fit_rows], log.ddq[fit_rows], log.tau[fit_rows],
                                               weights, **{**options, "friction": friction})
            for i, fit in enumerate(fits):
                pred = predict_torques(fit.arm, log.q[held_rows], log.dq[held_rows], log.ddq[held_rows])
                sq[i] += np.sum((np.asarray(pred) - log.tau[held_rows]) ** 2, axis=0)
        for w, sq_w in zip(weights, sq):
            rmse = np.sqrt(sq_w / validated.size)
            rows.append({"friction": friction, "weight": w, "score": float(np.mean(rmse / scale)),
                         "validation_rmse": rmse.tolist()})
    lowest = min(r["score"] for r in rows)
    close = [r for r in rows if r["score"] <= (1 + tolerance) * lowest]
    best = min(close, key=lambda r: (frictions.index(r["friction"]), -r["weight"]))
    return RegularizationChoice(best["weight"], tuple(rows), float(np.ptp(t[validated])) if folds == 1 else float(log.duration),
                                float(tolerance), best["friction"], folds)
