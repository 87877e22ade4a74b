"""Logged arm data: loading with validation, and preprocessing for identification.

A log is a table of samples: time ``t``, joint positions ``q1..qn`` and optional velocities
``dq*``, accelerations ``ddq*``, link-side joint torques ``tau*``, motor voltages ``V*`` and motor
currents ``I*`` (SI units). :func:`load_log` reads CSV (one header row naming the columns) or NPZ;
:func:`preprocess_log` resamples to a uniform rate, low-pass filters without phase lag (Butterworth
forward-backward, ``scipy.signal.sosfiltfilt``), differentiates, trims the filter's edge effects and
decimates. A :class:`Log` is immutable; its arrays are NumPy float64.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from pathlib import Path

import numpy as np

from ..core.io import write_text_atomic

CHANNELS = ("q", "dq", "ddq", "tau", "V", "I")  # per-joint channels, in column order
_OPTIONAL = CHANNELS[1:]
_COLUMN = re.compile(r"^(q|dq|ddq|tau|V|I)([1-9][0-9]*)$")


class LogError(ValueError):
    """A log file or Log that cannot be used as asked; one line naming file, column/row and what was expected."""


@dataclasses.dataclass(frozen=True, eq=False)
class Log:
    """Samples of one experiment. ``t`` (N,) strictly increasing [s]; ``q`` (N, n) [rad or m];
    optional (N, n) channels ``dq``, ``ddq``, ``tau`` (link-side joint torque [N m or N]),
    ``V`` (motor voltage [V]), ``I`` (motor current [A]) -- None when absent. ``source`` names
    the file; ``info`` records the preprocessing (rate, cutoff, trim, ...)."""

    t: np.ndarray
    q: np.ndarray
    dq: np.ndarray | None = None
    ddq: np.ndarray | None = None
    tau: np.ndarray | None = None
    V: np.ndarray | None = None
    I: np.ndarray | None = None
    source: str = ""
    info: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        t = np.asarray(self.t, dtype=float)
        q = np.asarray(self.q, dtype=float)
        where = self.source or "Log"
        if t.ndim != 1:
            raise LogError(f"{where}: t: expected shape (N,), got {t.shape}")
        if q.ndim != 2 or q.shape[0] != t.shape[0] or q.shape[1] < 1:
            raise LogError(f"{where}: q: expected shape ({t.shape[0]}, n), got {q.shape}")
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "q", q)
        for name in _OPTIONAL:
            x = getattr(self, name)
            if x is None:
                continue
            x = np.asarray(x, dtype=float)
            if x.shape != q.shape:
                raise LogError(f"{where}: {name}: expected shape {q.shape} like q, got {x.shape}")
            object.__setattr__(self, name, x)
        object.__setattr__(self, "info", dict(self.info))

    @property
    def n(self) -> int:
        """Number of joints."""
        return self.q.shape[1]

    def __len__(self) -> int:
        return self.t.shape[0]

    @property
    def duration(self) -> float:
        """``t[-1] - t[0]``, in seconds."""
        return float(self.t[-1] - self.t[0]) if len(self) else 0.0

    @property
    def sample_rate(self) -> float:
        """1 / median time step [Hz]."""
        if len(self) < 2:
            raise LogError(f"{self.source or 'Log'}: sample_rate: needs at least 2 samples, got {len(self)}")
        return float(1.0 / np.median(np.diff(self.t)))

    @property
    def channels(self) -> tuple[str, ...]:
        """The per-joint channels present, e.g. ("q", "dq", "tau")."""
        return tuple(c for c in CHANNELS if getattr(self, c) is not None)

    def _take(self, index) -> "Log":
        fields = {c: (None if getattr(self, c) is None else getattr(self, c)[index]) for c in CHANNELS}
        return Log(t=self.t[index], source=self.source, info=dict(self.info), **fields)

    def slice(self, t_start=None, t_stop=None) -> "Log":
        """The samples with t_start <= t < t_stop (None = unbounded)."""
        keep = np.ones(len(self), dtype=bool)
        if t_start is not None:
            keep &= self.t >= t_start
        if t_stop is not None:
            keep &= self.t < t_stop
        return self._take(keep)

    def gaps(self, max_gap=None) -> np.ndarray:
        """Indices i where the time step t[i+1] - t[i] exceeds ``max_gap`` seconds (default
        :func:`default_max_gap`): dropped samples or concatenated runs, across which nothing may be
        interpolated, filtered or differentiated."""
        if len(self) < 2:
            return np.zeros(0, dtype=int)
        limit = default_max_gap(self) if max_gap is None else float(max_gap)
        return np.flatnonzero(np.diff(self.t) > limit)

    def segments(self, max_gap=None) -> list["Log"]:
        """The log cut at its gaps (:meth:`gaps`) into contiguous parts, in time order."""
        edges = [0, *(self.gaps(max_gap) + 1).tolist(), len(self)]
        return [self._take(slice(a, b)) for a, b in zip(edges[:-1], edges[1:])]

    @staticmethod
    def concatenate(logs, *, gap: float = 1.0) -> "Log":
        """Several logs of one arm (different experiments) as one: each later log's time is shifted
        to start ``gap`` seconds after the previous one ends, so the joins are gaps (:meth:`gaps`)
        and every experiment is preprocessed on its own. The logs need the same joints and channels."""
        logs = list(logs)
        if not logs:
            raise LogError("Log.concatenate: expected at least one log")
        first = logs[0]
        for log in logs[1:]:
            if log.n != first.n or log.channels != first.channels:
                raise LogError(f"{log.source or 'Log'}: has {log.n} joints and channels {', '.join(log.channels)}; "
                               f"{first.source or 'the first log'} has {first.n} and {', '.join(first.channels)}")
        if len(logs) == 1:
            return first
        limit = max(default_max_gap(log) for log in logs if len(log) > 1)
        gap = max(float(gap), 2.0 * limit)
        times, end = [], None
        for log in logs:
            t = log.t - log.t[0] + (0.0 if end is None else end + gap)
            times.append(t)
            end = t[-1]
        fields = {c: np.concatenate([getattr(log, c) for log in logs]) for c in first.channels}
        info = {"logs": [log.source for log in logs], "log_starts": np.cumsum([0] + [len(log) for log in logs[:-1]]).tolist()}
        return Log(t=np.concatenate(times), source=" + ".join(log.source or "Log" for log in logs), info=info, **fields)

    def split(self, t) -> tuple["Log", "Log"]:
        """(samples with time < t, samples with time >= t): e.g. fit and held-out parts."""
        return self.slice(None, t), self.slice(t, None)

    def require(self, *channels: str, what: str = "this operation") -> None:
        """Raise LogError naming the missing channels (e.g. ``log.require("ddq", "tau")``)."""
        missing = [c for c in channels if getattr(self, c) is None]
        if missing:
            hint = " (run jaxarm.preprocess_log to compute dq/ddq)" if {"dq", "ddq"} & set(missing) else ""
            raise LogError(f"{self.source or 'Log'}: {what} needs channel(s) {', '.join(missing)}, which the log lacks{hint}")


# --------------------------------------------------------------------------------------------
# Loading


def _rows_text(rows, line_offset, limit=10) -> str:
    shown = ", ".join(str(r + line_offset) for r in rows[:limit])
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"{shown}{more}"


def _assemble(columns: dict, where: str, arm, unit: str, offset: int, drop_nonfinite: bool) -> Log:
    """Validate named 1-D columns (name -> (N,) array) and build a Log.

    ``unit``/``offset`` describe rows in messages ("line", 2 for CSV: the header is line 1)."""
    if "t" not in columns:
        raise LogError(f"{where}: missing column 't' (time [s])")
    per = {c: {} for c in CHANNELS}
    for name in columns:
        if name == "t":
            continue
        m = _COLUMN.match(name)
        if not m:
            raise LogError(
                f"{where}: column {name!r}: unknown; expected t, q1..qn and optionally dq*, ddq*, tau*, V*, I* (1-based joint numbers)"
            )
        per[m.group(1)][int(m.group(2))] = columns[name]
    if not per["q"]:
        raise LogError(f"{where}: missing columns q1..qn (joint positions)")
    n = max(per["q"])
    if arm is not None and n != arm.n:
        raise LogError(f"{where}: joint count: the log has {n} joints (q1..q{n}), the arm {arm.name!r} has {arm.n}")
    arrays = {}
    for ch in CHANNELS:
        got = per[ch]
        if not got:
            continue
        missing = [f"{ch}{j}" for j in range(1, n + 1) if j not in got]
        extra = [f"{ch}{j}" for j in sorted(got) if j > n]
        if extra:
            raise LogError(f"{where}: column {extra[0]}: joint {extra[0][len(ch):]} beyond the {n} joints given by q1..q{n}")
        if missing:
            raise LogError(f"{where}: missing column {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") + f": channel {ch} needs {ch}1..{ch}{n}")
        arrays[ch] = np.stack([np.asarray(got[j], dtype=float) for j in range(1, n + 1)], axis=1)
    t = np.asarray(columns["t"], dtype=float)
    if t.shape[0] == 0:
        raise LogError(f"{where}: no samples")
    table = np.column_stack([t] + [arrays[c] for c in CHANNELS if c in arrays])
    bad = np.flatnonzero(~np.all(np.isfinite(table), axis=1))
    info = {"samples_read": int(t.shape[0])}
    if bad.size:
        if not drop_nonfinite:
            raise LogError(
                f"{where}: {bad.size} {unit}(s) with NaN/inf values: {unit} {_rows_text(bad.tolist(), offset)}; "
                "pass drop_nonfinite=True to drop them"
            )
        keep = np.ones(t.shape[0], dtype=bool)
        keep[bad] = False
        t = t[keep]
        arrays = {c: a[keep] for c, a in arrays.items()}
        info["dropped_nonfinite"] = [int(r + offset) for r in bad]
        info["dropped_unit"] = unit
        if t.shape[0] == 0:
            raise LogError(f"{where}: every {unit} has NaN/inf values")
    dt = np.diff(t)
    bad_t = np.flatnonzero(~(dt > 0))
    if bad_t.size:
        # Report by original row number when rows were dropped.
        original = np.flatnonzero(np.all(np.isfinite(table), axis=1)) if bad.size else np.arange(t.shape[0])
        rows = [int(original[k + 1]) for k in bad_t]
        raise LogError(
            f"{where}: column t: expected strictly increasing time, but it does not increase at {unit} "
            f"{_rows_text(rows, offset)} (t = {t[bad_t[0] + 1]!r} after {t[bad_t[0]]!r})"
        )
    return Log(t=t, source=where, info=info, **arrays)


def _read_csv(path: Path) -> dict:
    where = str(path)
    with open(path, newline="") as f:
        header = f.readline()
    if not header.strip():
        raise LogError(f"{where}: line 1: expected a header row naming the columns (t, q1, ...), got an empty line")
    names = [h.strip() for h in header.strip().split(",")]
    try:
        float(names[0])
        raise LogError(f"{where}: line 1: expected a header row naming the columns (t, q1, ...), got numbers")
    except ValueError as exc:
        if isinstance(exc, LogError):
            raise
    seen = {}
    for k, name in enumerate(names):
        if not name:
            raise LogError(f"{where}: line 1: column {k + 1} has an empty name")
        if name in seen:
            raise LogError(f"{where}: line 1: duplicated column {name!r} (columns {seen[name] + 1} and {k + 1})")
        seen[name] = k
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an empty file body
        try:
            data = np.genfromtxt(path, delimiter=",", skip_header=1, dtype=float, ndmin=2, invalid_raise=True)
        except ValueError as exc:  # wrong number of fields in some row
            detail = str(exc).strip().splitlines()
            raise LogError(f"{where}: {detail[-1].strip() if detail else exc}: every row needs {len(names)} comma-separated values") from None
    if data.size == 0:
        raise LogError(f"{where}: no data rows after the header")
    if data.shape[1] != len(names):
        raise LogError(f"{where}: rows have {data.shape[1]} values but the header names {len(names)} columns")
    columns = {name: data[:, k] for k, name in enumerate(names)}
    text = [k for k in range(len(names)) if np.all(np.isnan(data[:, k]))]
    if text:  # columns of words (a ROS export's joint names, frame ids): kept as text
        import csv

        with open(path, newline="") as f:
            rows = list(csv.reader(f))[1:]
        for k in text:
            words = np.array([row[k].strip() if k < len(row) else "" for row in rows if row], dtype=str)
            if not all(_number_or_empty(w) for w in words):  # an all-NaN numeric column stays numeric
                columns[names[k]] = words
    return columns


def _number_or_empty(word: str) -> bool:
    try:
        float(word or "nan")
    except ValueError:
        return False
    return True


def _read_npz(path: Path) -> dict:
    where = str(path)
    with np.load(path, allow_pickle=False) as z:
        keys = list(z.keys())
        arrays = {k: np.asarray(z[k]) for k in keys}
    columns = {}
    for key, value in arrays.items():
        if key in CHANNELS:  # one (N, n) array per channel
            if value.ndim != 2:
                raise LogError(f"{where}: array {key!r}: expected shape (N, n), got {value.shape}")
            for j in range(value.shape[1]):
                name = f"{key}{j + 1}"
                if name in arrays:
                    raise LogError(f"{where}: duplicated column {name!r} (given as its own array and inside array {key!r})")
                columns[name] = value[:, j]
        else:
            if value.ndim != 1:
                raise LogError(f"{where}: array {key!r}: expected one column, shape (N,), got {value.shape}")
            columns[key] = value
    lengths = {k: v.shape[0] for k, v in columns.items()}
    if len(set(lengths.values())) > 1:
        ref = lengths.get("t", next(iter(lengths.values())))
        odd = next(k for k, v in lengths.items() if v != ref)
        raise LogError(f"{where}: column {odd!r}: has {lengths[odd]} samples, expected {ref} like t")
    return columns


_TIME_COLUMNS = (("t", 1.0), ("time", 1.0), ("%time", 1e-9), ("field.header.stamp", 1e-9))  # ROS stamps in ns
_BY_NAME = {"q": ("position", "pos", "q"), "dq": ("velocity", "vel", "dq"), "tau": ("effort", "torque", "tau")}
_ROS_FIELDS = {"q": "position", "dq": "velocity", "tau": "effort"}


def _text(x) -> bool:
    return np.asarray(x).dtype.kind in "US"


def _by_joint_name(raw: dict, joint_names, where: str):
    """Columns found by the arm's joint names: a ROS ``joint_states`` export (``<prefix>name<k>``
    text columns with ``<prefix>position<k>``, ``velocity<k>``, ``effort<k>``; matched row by
    row, so the message's joint order may change) or one column per joint and quantity
    (``<joint>`` or ``<joint>_position``, ``_velocity``, ``_effort``; separators ``_ . /``).
    Returns (t, q1.., dq1.., tau1.. columns, a sentence saying what was matched)."""
    names = [str(x) for x in joint_names]
    time = next(((c, f) for c, f in _TIME_COLUMNS if c in raw and not _text(raw[c])), None)
    if time is None:
        raise LogError(f"{where}: no time column (expected one of {', '.join(c for c, _ in _TIME_COLUMNS)})")
    stamp = np.asarray(raw[time[0]], dtype=float)
    if time[1] != 1.0:  # ROS stamps (ns since 1970): seconds from the first message
        stamp = stamp - stamp[0]
    out = {"t": stamp * time[1]}
    said = f"t from {time[0]!r}" + (" (ns, counted from the first message)" if time[1] != 1.0 else "")
    lists = {}
    for col, value in raw.items():
        m = re.match(r"^(.*)name(\d+)$", col)
        if m and _text(value):
            lists.setdefault(m.group(1), {})[int(m.group(2))] = value
    for prefix, found in lists.items():
        slots = sorted(found)
        table = np.stack([found[k] for k in slots], axis=1)  # (N, m) joint names per message
        if not any(name in table[0] for name in names):
            continue
        for j, name in enumerate(names):
            hit = table == name
            rows = np.flatnonzero(~hit.any(axis=1))
            if rows.size:
                raise LogError(f"{where}: joint {name!r} is missing from the {prefix}name* columns of {rows.size} message(s), "
                               f"first at data row {rows[0] + 1}")
            slot = np.asarray(slots)[np.argmax(hit, axis=1)]
            for channel, field in _ROS_FIELDS.items():
                cols = [f"{prefix}{field}{k}" for k in slots]
                if not all(c in raw and not _text(raw[c]) for c in cols):
                    continue
                values = np.stack([np.asarray(raw[c], dtype=float) for c in cols], axis=1)
                out[f"{channel}{j + 1}"] = values[np.arange(len(slot)), np.searchsorted(slots, slot)]
        if "q1" not in out:
            raise LogError(f"{where}: the {prefix}name* columns name the joints but there are no {prefix}position* columns")
        got = sorted({c.rstrip("0123456789") for c in out if c != "t"})
        return out, f"{said}; {', '.join(got)} matched by joint name in the {prefix}name* columns (ROS joint_states)"
    for j, name in enumerate(names):
        for channel, words in _BY_NAME.items():
            choices = ([name] if channel == "q" else []) + [f"{name}{sep}{w}" for w in words for sep in "_./"]
            hit = next((c for c in choices if c in raw and not _text(raw[c])), None)
            if hit is not None:
                out[f"{channel}{j + 1}"] = np.asarray(raw[hit], dtype=float)
        if f"q{j + 1}" not in out:
            raise LogError(f"{where}: no position column for joint {name!r} (expected a column {name!r} or {name}_position, "
                           "or ROS joint_states name*/position* columns); map other names with columns=")
    got = sorted({c.rstrip("0123456789") for c in out if c != "t"})
    return out, f"{said}; {', '.join(got)} matched by joint name ({names[0]}, ...)"


ANGLES = ("radians", "degrees")
_TARGET = re.compile(r"^(t|(?:q|dq|ddq|tau|V|I)(?:\{j\}|[1-9][0-9]*))$")


def _column_map(spec, names, n, where):
    """Parse ``--columns``: ``target=source[*factor]`` pairs separated by commas. A target is ``t``
    or a channel column (``q3``) or pattern (``q{j}``, every joint); in a pattern's source ``{j}``
    is the joint number from 1 and ``{j0}`` from 0 (ROS's ``field.position0``). Returns
    {target column: (source column, factor)}."""
    pairs = spec.items() if isinstance(spec, dict) else [p.split("=", 1) if "=" in p else (p, None) for p in str(spec).split(",") if p.strip()]
    out = {}
    for target, source in pairs:
        target = str(target).strip()
        if source is None or not str(source).strip():
            raise LogError(f"{where}: columns: {target!r}: expected target=source (e.g. q{{j}}=field.position{{j0}})")
        if not _TARGET.match(target):
            raise LogError(f"{where}: columns: {target!r}: expected t or a channel column (q3, dq{{j}}, tau{{j}}, ...)")
        source, _, factor = str(source).strip().partition("*")
        try:
            scale = float(factor) if factor else 1.0
        except ValueError:
            raise LogError(f"{where}: columns: {target}={source}*{factor}: the factor must be a number") from None
        if "{j}" in target:
            count = n if n is not None else 0
            if n is None:
                while source.format(j=count + 1, j0=count) in names:
                    count += 1
            for j in range(1, count + 1):
                out[target.replace("{j}", str(j))] = (source.format(j=j, j0=j - 1), scale)
        else:
            out[target] = (source, scale)
    for target, (source, _) in out.items():
        if source not in names:
            raise LogError(f"{where}: columns: {target} is mapped to column {source!r}, which the log does not have "
                           f"(it has {', '.join(list(names)[:8])}{', ...' if len(names) > 8 else ''})")
    return out


def _angles(log: Log, arm, angles: str) -> Log:
    """Convert a log in degrees to radians (revolute joints' q, dq, ddq), or refuse a log that
    claims radians but looks like degrees: a revolute joint beyond 1.5 times its position limit
    (two turns where it has none)."""
    revolute = np.array([jt == "revolute" for jt in arm.joint_types])
    if angles == "degrees":
        factor = np.where(revolute, np.pi / 180.0, 1.0)
        fields = {c: (getattr(log, c) * factor if c in ("q", "dq", "ddq") and getattr(log, c) is not None else getattr(log, c))
                  for c in CHANNELS}
        return Log(t=log.t, source=log.source, info={**log.info, "angles": "degrees converted to radians"}, **fields)
    limits = np.abs(np.asarray(arm.limits.position, dtype=float))
    bound = np.where(np.all(np.isfinite(limits), axis=1), 1.5 * np.max(limits, axis=1), 4 * np.pi)
    peak = np.max(np.abs(log.q), axis=0)
    for j in np.flatnonzero(revolute & (peak > bound)):
        raise LogError(f"{log.source or 'Log'}: q{j + 1}: values up to {peak[j]:.4g} for a revolute joint "
                       + (f"limited to {np.max(limits[j]):.4g} rad" if np.isfinite(limits[j]).all() else "without limits")
                       + ": the log looks like degrees; convert it to radians, or say angles='degrees' "
                       "(jaxarm identify --angles degrees)")
    return log


def load_log(path, arm=None, *, drop_nonfinite: bool = False, angles: str = "radians", columns=None, joint_names=None) -> Log:
    """Read a log from CSV or NPZ and validate it.

    CSV: a header row naming the columns ``t, q1..qn`` and optionally ``dq*, ddq*, tau*, V*, I*``
    (any order), then one comma-separated row per sample. NPZ: the same names, either one key per
    column ("q1", ...) or one (N, n) array per channel ("q", "tau", ...). Checks: known, unique
    column names; every channel complete for joints 1..n; n equal to ``arm.n`` when an arm is
    given; finite values (NaN/inf rows are listed by line, or dropped with ``drop_nonfinite=True``);
    strictly increasing time. ``angles``: the unit of the revolute joints' q, dq, ddq columns,
    "radians" (checked against the arm's position limits when an arm is given: a log in degrees
    is refused with a message saying so) or "degrees" (converted to radians). ``columns``: for
    logs with other column names, a mapping ``"t=time,q{j}=pos_{j},tau{j}=effort_{j}"`` (or a dict):
    ``{j}`` runs over the joints from 1, ``{j0}`` from 0, and ``*factor`` scales a column (a ROS
    ``rostopic echo -p`` export: ``"t=%time*1e-9,q{j}=field.position{j0},dq{j}=field.velocity{j0},
    tau{j}=field.effort{j0}"``); the other columns are ignored. ``joint_names``: the arm's joint
    names in joint order (:func:`jaxarm.model.urdf.urdf_joint_names` for a URDF arm); a log without
    q1..qn columns is then read by name, from a ROS ``joint_states`` export (``field.name0``, ...
    with ``field.position0``, ... matched message by message) or from one column per joint named
    ``<joint>`` / ``<joint>_position``, ``<joint>_velocity``, ``<joint>_effort``; ``info["columns"]``
    says what was matched. Raises :class:`LogError`.
    """
    if angles not in ANGLES:
        raise ValueError(f"load_log: angles: expected one of {ANGLES}, got {angles!r}")
    log = _load(path, arm, drop_nonfinite, columns, joint_names)
    return log if arm is None else _angles(log, arm, angles)


def _load(path, arm, drop_nonfinite: bool, columns, joint_names=None) -> Log:
    path = Path(path)
    if not path.is_file():
        raise LogError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        raw, unit, offset = _read_npz(path), "sample", 0
    elif suffix in (".csv", ".txt"):
        raw, unit, offset = _read_csv(path), "line", 2
    else:
        raise LogError(f"{path}: unknown log format {suffix!r}; expected .csv or .npz")
    note = None
    if columns is not None:
        mapping = _column_map(columns, raw, None if arm is None else arm.n, str(path))
        raw = {target: raw[source] * scale for target, (source, scale) in mapping.items()}
    elif joint_names is not None and "q1" not in raw:
        if arm is not None and len(joint_names) != arm.n:
            raise LogError(f"{path}: joint_names: {len(joint_names)} names for the {arm.n} joints of arm {arm.name!r}")
        raw, note = _by_joint_name(raw, joint_names, str(path))
    else:
        text = sorted((c for c, v in raw.items() if _text(v)), key=lambda c: "name" not in c)  # a name column first
        if text:
            raise LogError(f"{path}: column {text[0]!r} holds text, not numbers" + (
                "; a ROS joint_states export is read by joint name: give the arm's joint names (joint_names=, "
                "jaxarm identify --joint-names, or --arm FILE.urdf)" if "name" in text[0] else ""))
    log = _assemble(raw, str(path), arm, unit, offset, drop_nonfinite)
    if note:
        log.info["columns"] = note
    return log


def save_log(log: Log, path) -> Path:
    """Write a log as CSV (header t, q1..qn, ...) or NPZ (one (N, n) array per channel), atomically."""

    path = Path(path)
    if path.suffix.lower() == ".npz":
        tmp = path.with_name(f".{path.name}.tmp.npz")
        np.savez(tmp, t=log.t, **{c: getattr(log, c) for c in log.channels})
        tmp.replace(path)
        return path
    names = ["t"] + [f"{c}{j + 1}" for c in log.channels for j in range(log.n)]
    table = np.column_stack([log.t] + [getattr(log, c) for c in log.channels])
    rows = "\n".join(",".join(repr(float(x)) for x in row) for row in table)
    return write_text_atomic(path, ",".join(names) + "\n" + rows + "\n")


# --------------------------------------------------------------------------------------------
# Preprocessing


GAP_STEPS = 20  # a time step longer than this many median steps ...
GAP_SECONDS = 0.02  # ... and than this is a gap, not jitter


def default_max_gap(log: Log) -> float:
    """The longest time step [s] that is still jitter, not a gap: ``GAP_STEPS`` median steps, and
    at least ``GAP_SECONDS`` (interpolating over 20 ms changes nothing below 10 Hz)."""
    return max(GAP_STEPS / log.sample_rate, GAP_SECONDS)


def default_trim(cutoff, order: int = 4, rate=None) -> float:
    """Seconds removed at each end by default: ``order / cutoff`` with a filter -- by then the
    forward-backward Butterworth's edge error on a pass-band signal with non-zero value and slope
    at the ends is below 1e-3 of the amplitude of q, dq and ddq alike (the derivatives settle
    last; checked in the tests) -- else two samples, the one-sided differences at the ends."""
    if cutoff is not None:
        return order / cutoff
    return 2.0 / rate if rate else 0.0


def _resample(log: Log, rate: float) -> Log:
    """Linear interpolation of every channel onto t0 + k / rate."""
    count = int(math.floor(log.duration * rate + 1e-9)) + 1
    t = log.t[0] + np.arange(count) / rate
    fields = {}
    for c in log.channels:
        x = getattr(log, c)
        fields[c] = np.stack([np.interp(t, log.t, x[:, j]) for j in range(log.n)], axis=1)
    return Log(t=t, source=log.source, info=dict(log.info), **fields)


def preprocess_log(
    log: Log,
    *,
    rate=None,
    cutoff=None,
    order: int = 4,
    velocity: str = "auto",
    trim=None,
    decimate: int = 1,
    filter_torque: bool = True,
    max_gap=None,
) -> Log:
    """Uniform rate, zero-phase low-pass, velocities and accelerations, trimmed ends, decimation.

    rate: resample every channel by linear interpolation onto a uniform grid [Hz] (default: the
        log's median rate, 1 / median dt; the grid starts at t[0]).
    cutoff: low-pass every channel (torque only if ``filter_torque``) with a Butterworth filter of
        ``order`` run forwards and backwards (``scipy.signal.sosfiltfilt``): no phase lag, gain
        1/sqrt(2)^2 = 0.5 at the cutoff, effective order 2 * order. None = no filtering.
    velocity: "logged" = the (filtered) logged dq; "differentiate" = central differences of the
        filtered q; "auto" = logged if the log has dq. ddq = central differences of the filtered
        velocity (a logged ddq is replaced, as are logged dq when differentiating).
    trim: seconds dropped at both ends (default :func:`default_trim`: order / cutoff with a
        filter, else two samples for the one-sided end differences).
    decimate: keep every k-th sample after filtering and differentiating (the cutoff should be
        below the new Nyquist rate, rate / (2 k); a warning says when it is not).
    max_gap: a log with gaps in time longer than this [s] (default :func:`default_max_gap`;
        dropped samples, concatenated runs) is cut there into segments, each resampled, filtered,
        differentiated and trimmed on its own, and the results are concatenated: nothing is
        interpolated or filtered across a gap. Segments too short for the filter and the trim are
        left out with a warning. ``info["segments"]`` counts them, ``info["segment_starts"]``
        gives the index where each begins in the result.
    Everything is recorded in the returned log's ``info``.
    """
    from scipy import signal

    where = log.source or "Log"
    if not isinstance(log, Log):
        raise TypeError(f"preprocess_log: log: expected a jaxarm Log (see jaxarm.load_log), got {type(log).__name__}")
    if velocity not in ("auto", "logged", "differentiate"):
        raise ValueError(f"preprocess_log: velocity: expected 'auto', 'logged' or 'differentiate', got {velocity!r}")
    if not isinstance(decimate, (int, np.integer)) or decimate < 1:
        raise ValueError(f"preprocess_log: decimate: expected an integer >= 1, got {decimate!r}")
    if not isinstance(order, (int, np.integer)) or order < 1:
        raise ValueError(f"preprocess_log: order: expected an integer >= 1, got {order!r}")
    if len(log) < 3:
        raise LogError(f"{where}: preprocess_log: needs at least 3 samples, got {len(log)}")
    if rate is None:
        rate = log.sample_rate
    gaps = log.gaps(max_gap)
    if gaps.size:
        options = dict(rate=rate, cutoff=cutoff, order=order, velocity=velocity, trim=trim, decimate=decimate,
                       filter_torque=filter_torque, max_gap=np.inf)
        parts, dropped = [], []
        for segment in log.segments(max_gap):
            try:
                parts.append(preprocess_log(segment, **options))
            except LogError:
                dropped.append((float(segment.t[0]), float(segment.t[-1])))
        if dropped:
            warnings.warn(f"{where}: preprocess_log: {len(dropped)} segment(s) between gaps too short to filter and trim, "
                          f"left out: " + ", ".join(f"t = {a:g}..{b:g} s" for a, b in dropped[:5]), stacklevel=2)
        if not parts:
            raise LogError(f"{where}: preprocess_log: every segment between the log's {gaps.size} gap(s) is too short to "
                           "filter and trim; log longer contiguous runs")
        starts = np.cumsum([0] + [len(p) for p in parts[:-1]]).tolist()
        info = dict(parts[0].info)
        info.update(samples_in=len(log), samples_out=int(sum(len(p) for p in parts)), segments=len(parts),
                    segment_starts=starts, gaps_at=[float(log.t[i]) for i in gaps], segments_left_out=len(dropped))
        joined = {c: np.concatenate([getattr(p, c) for p in parts]) for c in parts[0].channels}
        return Log(t=np.concatenate([p.t for p in parts]), source=log.source, info=info, **joined)
    if not (np.isfinite(rate) and rate > 0):
        raise ValueError(f"preprocess_log: rate: expected a positive sample rate [Hz], got {rate!r}")
    rate = float(rate)
    if cutoff is not None and not (np.isfinite(cutoff) and 0 < cutoff < rate / 2):
        raise ValueError(f"preprocess_log: cutoff: expected 0 < cutoff < rate / 2 = {rate / 2:g} Hz, got {cutoff!r}")
    source = "logged" if velocity == "logged" or (velocity == "auto" and log.dq is not None) else "differentiate"
    if source == "logged" and log.dq is None:
        raise LogError(f"{where}: preprocess_log: velocity='logged' but the log has no dq columns; use velocity='differentiate'")

    steps = np.diff(log.t)
    uniform = np.allclose(steps, 1.0 / rate, rtol=1e-6, atol=0.0)
    out = log if uniform else _resample(log, rate)

    def smooth(x):
        if cutoff is None:
            return x
        sos = signal.butter(order, cutoff, btype="low", fs=rate, output="sos")
        if x.shape[0] <= 3 * (2 * len(sos) + 1):
            raise LogError(f"{where}: preprocess_log: {x.shape[0]} samples are too few for an order-{order} filter; give a longer log")
        return signal.sosfiltfilt(sos, x, axis=0)

    dt = 1.0 / rate
    fields = {}
    fields["q"] = smooth(out.q)
    dq = smooth(out.dq) if source == "logged" else np.gradient(fields["q"], dt, axis=0)
    fields["dq"] = dq
    fields["ddq"] = np.gradient(dq, dt, axis=0)  # central differences (one-sided at the ends)
    if out.tau is not None:
        fields["tau"] = smooth(out.tau) if filter_torque else out.tau
    for c in ("V", "I"):
        if getattr(out, c) is not None:
            fields[c] = smooth(getattr(out, c))

    trim_s = default_trim(cutoff, order, rate) if trim is None else float(trim)
    if not (np.isfinite(trim_s) and trim_s >= 0):
        raise ValueError(f"preprocess_log: trim: expected seconds >= 0, got {trim!r}")
    t = out.t
    keep = (t >= t[0] + trim_s - 1e-12 * dt) & (t <= t[-1] - trim_s + 1e-12 * dt)
    index = np.flatnonzero(keep)[::decimate]
    if index.size < 2:
        raise LogError(f"{where}: preprocess_log: trimming {trim_s:g} s at both ends of a {log.duration:g} s log leaves {index.size} sample(s)")
    if decimate > 1 and (cutoff is None or cutoff >= rate / (2 * decimate)):
        warnings.warn(
            f"preprocess_log: decimate={decimate} at {rate:g} Hz aliases content above {rate / (2 * decimate):g} Hz; "
            f"set cutoff below that (got {cutoff})",
            stacklevel=2,
        )
    info = dict(log.info)
    info.update(
        rate=rate / decimate,
        filter_rate=rate,
        resampled=not uniform,
        cutoff=cutoff,
        order=order,
        velocity=source,
        trim=trim_s,
        decimate=int(decimate),
        filter_torque=bool(filter_torque),
        samples_in=len(log),
        samples_out=int(index.size),
        segments=1,
        segment_starts=[0],
    )
    return Log(t=t[index], source=log.source, info=info, **{c: x[index] for c, x in fields.items()})
