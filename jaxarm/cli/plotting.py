"""Plots of a rollout: joint positions, velocities and torques against time.

matplotlib is an optional dependency (``pip install "jaxarm[plot]"``), imported only when a plot
is drawn. The figure is drawn on matplotlib's Agg canvas directly (``matplotlib.figure.Figure``,
no pyplot), so plotting never changes the backend of an interactive session.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping

import numpy as np

__all__ = ["plot_trajectory", "require_matplotlib", "load_results"]

INSTALL_HINT = 'plotting needs matplotlib: pip install "jaxarm[plot]"'

# Keys of a results file (see ``jaxarm simulate``); t: (T+1,), q/qd: ([B,] T+1, n), tau: ([B,] T, n).
REQUIRED = ("t", "q", "qd", "tau")


def require_matplotlib():
    """Import matplotlib's Figure, or raise ImportError with the install command."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return Figure


def load_results(source, *, motion_only: bool = False) -> dict:
    """A results mapping from a path to an ``.npz`` file, an open NpzFile, a dict, or a
    :class:`jaxarm.Trajectory` (anything with attributes t, q, qd, tau). With ``motion_only``,
    only t and q are needed (what a drawing of the arm uses). Raises ValueError naming what is
    missing or malformed."""
    required = ("t", "q") if motion_only else REQUIRED
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with np.load(path, allow_pickle=False) as f:
                data = {k: f[k] for k in f.files}
        except FileNotFoundError:
            raise ValueError(f"{path}: no such file") from None
        except (OSError, ValueError) as exc:
            if os.path.isfile(path) and not zipfile.is_zipfile(path):
                raise ValueError(f"{path}: not an .npz archive (jaxarm simulate --out writes one)") from None
            if "pickle" in str(exc):  # numpy's advice to load pickles unsafely is not ours to give
                raise ValueError(f"{path}: holds Python objects, not arrays; jaxarm reads only plain arrays (t, q, qd, tau) "
                                 "and never unpickles a file") from None
            raise ValueError(f"{path}: not a readable .npz results file ({exc})") from None
        where = path
    elif isinstance(source, Mapping) or hasattr(source, "files"):
        keys = source.files if hasattr(source, "files") else source.keys()
        data = {k: source[k] for k in keys}
        where = "results"
    elif all(hasattr(source, k) for k in required):
        data = {k: getattr(source, k) for k in ("t", "q", "qd", "qdd", "tau", "u") if hasattr(source, k)}
        where = "trajectory"
    else:
        raise ValueError(f"plot_trajectory: expected a results .npz path, a dict or a Trajectory, got {type(source).__name__}")
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(f"{where}: not a jaxarm results file: missing {', '.join(repr(k) for k in missing)}")
    data = {k: np.asarray(v) for k, v in data.items()}
    if motion_only:
        q, t = data["q"], data["t"]
        if t.ndim == 2:  # a batched t repeats the same times
            t = data["t"] = t[0]
        if q.ndim not in (2, 3) or t.ndim != 1 or t.shape[0] != q.shape[-2]:
            raise ValueError(f"{where}: expected t (T+1,) and q ([B,] T+1, n), got t {t.shape}, q {q.shape}")
        if not (np.issubdtype(q.dtype, np.number) and np.issubdtype(t.dtype, np.number)):
            raise ValueError(f"{where}: t and q must be numbers")
        return data
    q, qd, tau, t = data["q"], data["qd"], data["tau"], data["t"]
    if q.ndim not in (2, 3) or qd.shape != q.shape or tau.shape[:-2] != q.shape[:-2] or tau.shape[-1] != q.shape[-1]:
        raise ValueError(f"{where}: inconsistent shapes q {q.shape}, qd {qd.shape}, tau {tau.shape}")
    steps = q.shape[-2] - 1
    if t.shape[-1] != steps + 1 or tau.shape[-2] != steps:
        raise ValueError(f"{where}: inconsistent lengths: t {t.shape}, q {q.shape}, tau {tau.shape} (expected T+1, T+1, T)")
    return data


def _text(data, key, default=""):
    v = data.get(key)
    return default if v is None else str(np.asarray(v).reshape(-1)[0]) if np.size(v) else default


def plot_trajectory(traj, path, *, title: str | None = None, format: str | None = None):
    """Draw joint positions, velocities and torques against time into an image file.

    traj: a results ``.npz`` path (``jaxarm simulate --out``), its loaded mapping, or a
        :class:`jaxarm.Trajectory`; arrays may carry a leading batch axis (every element is drawn,
        one colour per joint). path: output file name or binary file object; the image format is
        ``format``, else the file name's suffix (.png, .pdf, .svg), else PNG.
    Returns ``path``. Raises ImportError if matplotlib is missing, ValueError for malformed data.
    """
    data = load_results(traj)
    Figure = require_matplotlib()

    t = data["t"]
    q, qd, tau = data["q"], data["qd"], data["tau"]
    if q.ndim == 2:  # one rollout -> a batch of one
        q, qd, tau = q[None], qd[None], tau[None]
    t = t.reshape(-1, t.shape[-1])[0]  # a batched t repeats the same times
    B, _, n = q.shape
    types = [str(x) for x in np.asarray(data.get("joint_types", ["revolute"] * n)).reshape(-1)]
    units = {"revolute": ("rad", "rad/s", "N m"), "prismatic": ("m", "m/s", "N")}
    kinds = set(types)
    label_units = units[kinds.pop()] if len(kinds) == 1 and kinds <= set(units) else ("rad or m", "rad/s or m/s", "N m or N")

    fig = Figure(figsize=(9.0, 8.0), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    colors = [f"C{j % 10}" for j in range(n)]
    alpha = 1.0 if B == 1 else max(0.15, 1.0 / np.sqrt(B))
    for b in range(B):
        for j in range(n):
            label = f"joint {j + 1}" if b == 0 else None
            axes[0].plot(t, q[b, :, j], color=colors[j], alpha=alpha, lw=1.2, label=label)
            axes[1].plot(t, qd[b, :, j], color=colors[j], alpha=alpha, lw=1.2)
            # tau[k] is held over [t_k, t_k+1): draw it as a zero-order hold.
            axes[2].stairs(tau[b, :, j], t, color=colors[j], alpha=alpha, lw=1.2, baseline=None)
    # PD targets (dashed) and the joints' position and torque limits (dotted), each in its joint's
    # colour; a limit far outside the motion is left out rather than squashing the curves.
    lines = [(0, data.get("target"), "--", "target"), (0, data.get("position_limits"), ":", "limit"),
             (2, data.get("torque_limits"), ":", "limit")]
    spans = [ax.get_ylim() for ax in axes]
    for row, values, style, _ in lines:
        if values is None or np.size(values) % n or not np.issubdtype(np.asarray(values).dtype, np.number):
            continue
        values = np.asarray(values, dtype=float).reshape(n, -1)
        lo, hi = spans[row]
        reach = 0.25 * (hi - lo) + 1e-12
        for j in range(n):
            for v in values[j]:
                for level in ((-v, v) if row == 2 else (v,)):
                    if np.isfinite(level) and lo - reach <= level <= hi + reach:
                        axes[row].axhline(level, color=colors[j], ls=style, lw=0.9, alpha=0.8)
    axes[0].set_ylabel(f"position q [{label_units[0]}]")
    axes[1].set_ylabel(f"velocity qd [{label_units[1]}]")
    axes[2].set_ylabel(f"torque tau [{label_units[2]}]")
    axes[2].set_xlabel("time t [s]")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="best", fontsize="small", ncols=min(n, 4))
    if title is None:
        arm = _text(data, "arm", "arm")
        method = _text(data, "method")
        dt = data.get("dt")
        parts = [arm]
        if method:
            parts.append(method)
        if dt is not None and np.size(dt):
            parts.append(f"dt = {float(np.asarray(dt).reshape(-1)[0]):g} s")
        if B > 1:
            parts.append(f"batch of {B}")
        title = ", ".join(parts)
    fig.suptitle(title)
    if format is None:
        suffix = os.path.splitext(os.fspath(path))[1].lstrip(".").lower() if isinstance(path, (str, os.PathLike)) else ""
        format = suffix or "png"
    fig.savefig(path, dpi=110, format=format)
    return path
