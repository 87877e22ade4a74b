"""The identified arm written where users need it (URDF, MJCF), each file checked by reading it
back and comparing the torques it predicts with the identified arm's on the log's states.

URDF holds links' inertials and per-joint ``<dynamics damping friction>``; MJCF also holds the
reflected rotor inertia (``armature``). Neither holds asymmetric Coulomb friction (written as
the mean magnitude), a smooth Coulomb shape tanh(qd / s), Stribeck or sigmoid friction, so a
file can only reproduce the identified torques up to those terms; the check measures how far,
so the user sees what the format loses on their own motion before relying on the file.

* URDF is read back with :func:`jaxarm.load_urdf` (itself checked against Pinocchio's reader).
* MJCF is read back by MuJoCo when it is installed: ``mj_inverse`` gives the rigid-body,
  armature and damping torques, to which the file's ``frictionloss`` is added as the ideal
  Coulomb friction it approximates (MuJoCo enforces it as a soft constraint, not a torque law).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings

import numpy as np

from ..model.arm import Arm
from ..model.mjcf import to_mjcf
from ..model.urdf import load_urdf, to_urdf
from .fit import predict_torques

FORMATS = ("urdf", "mjcf")


@dataclasses.dataclass(frozen=True)
class ExportCheck:
    """A written model and how well it reproduces the arm's torques: ``text`` the file's content;
    ``rms`` (n,) RMS of (file's torques - arm's torques) per joint over the states [N m],
    ``worst`` the largest absolute difference; ``lost``: what the format could not hold (the
    writer's own warnings); ``checked_by``: the reader used, None when it is not installed."""

    format: str
    text: str
    rms: np.ndarray | None
    worst: float | None
    lost: tuple
    checked_by: str | None
    samples: int

    def summary(self) -> str:
        if self.checked_by is None:
            return f"{self.format.upper()} not checked (install mujoco to read it back)"
        j = int(np.argmax(self.rms))
        text = (f"{self.format.upper()} read back by {self.checked_by} reproduces the identified torques to "
                f"{float(np.sqrt(np.mean(self.rms**2))):.3g} N m RMS (joint {j + 1}: {self.rms[j]:.3g})")
        return text + ("; the format cannot hold: " + "; ".join(self.lost) if self.lost else "")

    def report(self) -> dict:
        return {"format": self.format, "checked_by": self.checked_by, "samples": self.samples,
                "torque_difference_rms": None if self.rms is None else self.rms.tolist(),
                "torque_difference_max": self.worst, "lost": list(self.lost)}


def _lost(arm: Arm) -> list[str]:
    """What no URDF/MJCF field holds, in plain words (beyond the writers' own warnings)."""
    d = arm.drives
    lost = []
    if np.any(np.asarray(d.coulomb_velocity_scale) > 0):
        lost.append("the smooth Coulomb shape tanh(qd / s) (written as the sign of qd)")
    if np.any(np.asarray(d.static_friction) > 0):
        lost.append("Stribeck friction")
    if np.any(np.asarray(d.sigmoid_friction)[:, 0] != 0):
        lost.append("sigmoid friction")
    return lost


def _urdf(arm: Arm, states):
    text = to_urdf(arm)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "arm.urdf")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        back = load_urdf(path, gravity=np.asarray(arm.gravity, dtype=float))
    return text, predict_torques(back, *states), "jaxarm.load_urdf"


def _mjcf(arm: Arm, states):
    text = to_mjcf(arm)
    try:
        import mujoco
    except ImportError:
        return text, None, None
    model = mujoco.MjModel.from_xml_string(text)
    # No constraint forces (joint limits, frictionloss) in qfrc_inverse: the log's states may sit at
    # a limit, and frictionloss is added below as the torque law it stands for.
    model.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
    data = mujoco.MjData(model)
    q, qd, qdd = states
    out = np.empty_like(q)
    for k in range(len(q)):
        data.qpos[:], data.qvel[:], data.qacc[:] = q[k], qd[k], qdd[k]
        mujoco.mj_inverse(model, data)  # M qacc + bias - passive (damping)
        out[k] = data.qfrc_inverse
    out += np.asarray(model.dof_frictionloss)[None, :] * np.sign(qd)
    return text, out, f"MuJoCo {mujoco.__version__} (mj_inverse, frictionloss as Coulomb friction)"


def check_export(arm: Arm, q, qd, qdd, fmt: str, *, samples: int = 2000) -> ExportCheck:
    """Write ``arm`` as ``fmt`` ("urdf" or "mjcf"), read it back and compare its torques with the
    arm's at up to ``samples`` of the states (q, qd, qdd) (N, n), evenly spaced. Raises
    ValueError when the arm cannot be written (e.g. an inconsistent body for MJCF)."""
    if fmt not in FORMATS:
        raise ValueError(f"check_export: fmt: expected one of {FORMATS}, got {fmt!r}")
    q, qd, qdd = (np.asarray(x, dtype=float) for x in (q, qd, qdd))
    pick = np.unique(np.linspace(0, len(q) - 1, min(samples, len(q))).round().astype(int))
    states = (q[pick], qd[pick], qdd[pick])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text, theirs, reader = (_urdf if fmt == "urdf" else _mjcf)(arm, states)
    lost = [str(w.message).split(": ", 2)[-1] for w in caught] + _lost(arm)
    if theirs is None:
        return ExportCheck(fmt, text, None, None, tuple(lost), None, 0)
    diff = np.asarray(theirs) - predict_torques(arm, *states)
    return ExportCheck(fmt, text, np.sqrt(np.mean(diff**2, axis=0)), float(np.abs(diff).max()), tuple(lost), reader, len(pick))
