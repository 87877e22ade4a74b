"""What a log cannot support: plain-language warnings before anything is fitted.

Each check looks at the raw log (and, when given, the linear fit's conditioning) and, when it
fails, says what is wrong and what to record instead:

- a joint that barely moves (range of motion, peak speed): its friction and the inertia it carries
  are poorly determined;
- a channel stuck at its extreme value for a run of samples: a clipped sensor or a saturated drive,
  whose samples bias the fit;
- gaps in time (dropped samples, concatenated runs): each segment is preprocessed on its own;
- a poorly conditioned base regressor (Gautier & Khalil 1992 use the condition number of the
  observation matrix as the excitation criterion): the trajectory excites some parameter
  combinations too little for the data to pin them down.
"""

from __future__ import annotations

import numpy as np

from .logs import Log

MIN_RANGE = 0.2  # rad (or m) of motion below which a joint "barely moves"
MIN_SPEED = 0.1  # rad/s (or m/s) peak speed below which a joint "barely moves"
CLIPPED_FRACTION = 0.01  # samples at a channel's extreme value, as a fraction of the log
MAX_CONDITION = 1e3  # condition number of the (column-scaled) base regressor


def _clipped(x: np.ndarray) -> list[tuple[int, float, float]]:
    """(joint, value, fraction) for columns that sit at their min or max in many samples."""
    out = []
    for j in range(x.shape[1]):
        col = x[:, j]
        span = float(np.ptp(col))
        if span == 0.0:
            continue
        for value in (col.min(), col.max()):
            fraction = float(np.mean(np.abs(col - value) <= 1e-9 * span))
            if fraction >= CLIPPED_FRACTION:
                out.append((j, float(value), fraction))
    return out


def log_warnings(log: Log, *, condition_number: float | None = None) -> list[str]:
    """The warnings for ``log`` (raw, as loaded), one sentence each, with what to record instead.
    ``condition_number``: of the linear fit's column-scaled base regressor, when known."""
    notes = []
    q = log.q
    speed = np.abs(log.dq) if log.dq is not None else np.abs(np.gradient(q, log.t, axis=0))
    for j in range(log.n):
        span, peak = float(np.ptp(q[:, j])), float(speed[:, j].max())
        if span < MIN_RANGE or peak < MIN_SPEED:
            notes.append(f"joint {j + 1} barely moves (range {span:.3g}, peak speed {peak:.3g}): its friction and the "
                         f"inertia it carries are poorly determined; record a trajectory that moves it over at least "
                         f"{MIN_RANGE:g} rad at speeds above {MIN_SPEED:g} rad/s, in both directions")
    for name in ("q", "dq", "tau"):
        x = getattr(log, name)
        if x is None:
            continue
        for j, value, fraction in _clipped(x):
            notes.append(f"{name}{j + 1} sits at its extreme value {value:.6g} in {fraction:.1%} of the samples: a clipped "
                         f"sensor or a saturated drive; those samples bias the fit; record within the sensor's range "
                         f"and the drive's limits, or cut them out")
    gaps = log.gaps()
    if gaps.size:
        steps = np.diff(log.t)[gaps]
        notes.append(f"{gaps.size} gap(s) in time (longest {steps.max():.3g} s, first at t = {log.t[gaps[0]]:.6g} s): "
                     f"each contiguous segment is filtered and differentiated on its own; nothing is interpolated "
                     f"across a gap")
    conditioning = conditioning_warning(condition_number)
    return notes + ([conditioning] if conditioning else [])


def conditioning_warning(condition_number: float | None) -> str | None:
    """The warning for a poorly conditioned (column-scaled) base regressor, or None."""
    if condition_number is None or not condition_number > MAX_CONDITION:
        return None
    return (f"the base regressor is poorly conditioned (condition number {condition_number:.3g} > {MAX_CONDITION:g}): "
            "the motion excites some parameter combinations too little; record a richer trajectory "
            "(jaxarm.design_excitation designs one within the arm's limits)")


WELL_DETERMINED = 5.0  # % relative standard deviation of a base parameter
LOOSELY_DETERMINED = 30.0  # %


def identifiability(linear) -> dict:
    """What the log determines, from the linear fit (:class:`jaxarm.LinearIdentification`): how
    many combinations of the standard parameters (rank), how many standard parameters have no
    effect on the torques at all, and which combinations are well or only loosely determined
    (relative standard deviation, Gautier & Khalil 1990). ``summary`` says it in one sentence."""
    rel = np.asarray(linear.beta_relative_std, dtype=float)
    names = list(linear.base.descriptions)
    finite = np.isfinite(rel)
    good = int(np.sum(finite & (rel <= WELL_DETERMINED)))
    loose = [(names[i], float(rel[i])) for i in np.argsort(-np.where(finite, rel, np.inf)) if not finite[i] or rel[i] > LOOSELY_DETERMINED]
    total = len(linear.base.standard_names)
    summary = (f"the log determines {linear.rank} combinations of the {total} standard parameters "
               f"({len(linear.base.unidentifiable)} standard parameters do not affect the torques and keep the arm file's values); "
               f"{good} of them to within {WELL_DETERMINED:g} % (relative standard deviation)")
    if loose:
        shown = "; ".join(f"{name} ({r:.0f} %)" if np.isfinite(r) else name for name, r in loose[:3])
        summary += (f", {len(loose)} only loosely (above {LOOSELY_DETERMINED:g} %), the loosest: {shown}; "
                    "a motion that moves these more (faster, over a wider range) would pin them down")
    return {"rank": int(linear.rank), "standard_parameters": total, "unidentifiable": list(linear.base.unidentifiable),
            "well_determined": good, "well_threshold_percent": WELL_DETERMINED,
            "loosely_determined": [{"combination": n, "relative_std_percent": r if np.isfinite(r) else None} for n, r in loose],
            "loose_threshold_percent": LOOSELY_DETERMINED, "summary": summary}
