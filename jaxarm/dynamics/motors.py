"""DC motors behind gearboxes, and the DAC that drives them.

Armature inductance is neglected (Swartz eqs 11-12). With gear ratio G the motor turns at
G qd and the joint receives G times the motor torque.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..model import checks
from ..model.arm import Arm
from . import algebra


def _require_motor_model(arm: Arm, func: str) -> None:
    checks.check_arm(arm, func)
    kt, r = arm.drives.torque_constant, arm.drives.resistance
    if isinstance(kt, jax.core.Tracer) or isinstance(r, jax.core.Tracer):
        return
    kt, r = np.asarray(kt), np.asarray(r)
    bad = np.flatnonzero(~((kt > 0) & (r > 0)).reshape(-1, kt.shape[-1]).all(0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{func}: arm {arm.name!r} joint {i + 1}: torque_constant and resistance must be > 0 for a "
            f"voltage-driven joint (got Kt={kt.reshape(-1, kt.shape[-1])[0, i]}, R={r.reshape(-1, r.shape[-1])[0, i]}); "
            "set them in the joint's [joint.motor] table"
        )


def saturate_voltage(arm: Arm, V):
    """Clip each motor voltage to +/- its drive's voltage_limit."""
    checks.check_arm(arm, "saturate_voltage")
    V = checks.joint_vector(V, arm, "V", "saturate_voltage")
    return _saturate(arm, V)


def _saturate(arm: Arm, V):
    """V clipped at +/- the drives' voltage limits, in the dtype jnp.clip would give; the clip
    differentiates by :func:`jaxarm.dynamics.algebra.saturated` (one stored array in reverse mode)."""
    lim = jnp.asarray(arm.drives.voltage_limit)
    V = jnp.asarray(V)
    dtype = jnp.result_type(V, lim)
    V = jnp.broadcast_to(V.astype(dtype), jnp.broadcast_shapes(V.shape, lim.shape))
    return algebra.saturated(V, lim.astype(dtype))


def motor_torque(arm: Arm, V, qd, *, saturate: bool = True):
    """Joint torque from motor voltage V at joint velocity qd: G Kt (V - Kt G qd) / R (Swartz eq 12).

    V is first clipped at the drive's voltage limit unless ``saturate=False``.
    """
    _require_motor_model(arm, "motor_torque")
    V = checks.joint_vector(V, arm, "V", "motor_torque")
    qd = checks.joint_vector(qd, arm, "qd", "motor_torque")
    return _motor_torque(arm, V, qd, saturate)


def _motor_torque(arm: Arm, V, qd, saturate: bool = True):
    dr = arm.drives
    G, Kt, R = (jnp.asarray(x) for x in (dr.gear_ratio, dr.torque_constant, dr.resistance))
    if saturate:
        V = _saturate(arm, V)
    return G * Kt * (V - Kt * G * qd) / R


def motor_current(arm: Arm, V, qd, *, saturate: bool = True):
    """Armature current (V - Kt G qd) / R (Swartz eq 11 solved for the current)."""
    _require_motor_model(arm, "motor_current")
    V = checks.joint_vector(V, arm, "V", "motor_current")
    qd = checks.joint_vector(qd, arm, "qd", "motor_current")
    return _motor_current(arm, V, qd, saturate)


def _motor_current(arm: Arm, V, qd, saturate: bool = True):
    dr = arm.drives
    G, Kt, R = (jnp.asarray(x) for x in (dr.gear_ratio, dr.torque_constant, dr.resistance))
    if saturate:
        V = _saturate(arm, V)
    return (V - Kt * G * qd) / R


def _input_torque(arm: Arm, u, qd, input: str):
    """The joint torque the drives produce from an input u at joint velocity qd: a joint torque
    as it is (``input="torque"``), a motor current through G Kt (``"current"``), or a motor voltage
    through Swartz eq 12, clipped at the voltage limit (``"voltage"``)."""
    if input == "current":
        return jnp.asarray(arm.drives.gear_ratio) * jnp.asarray(arm.drives.torque_constant) * u
    if input == "voltage":
        return _motor_torque(arm, u, qd)
    return u


def motor_voltage(arm: Arm, tau, qd):
    """Voltage that produces joint torque tau at joint velocity qd: R tau / (G Kt) + Kt G qd
    (Swartz eq 11 with the gearbox). Not saturated: compare with arm.drives.voltage_limit."""
    _require_motor_model(arm, "motor_voltage")
    tau = checks.joint_vector(tau, arm, "tau", "motor_voltage")
    qd = checks.joint_vector(qd, arm, "qd", "motor_voltage")
    dr = arm.drives
    G, Kt, R = (jnp.asarray(x) for x in (dr.gear_ratio, dr.torque_constant, dr.resistance))
    return R * tau / (G * Kt) + Kt * G * qd


class DAC(NamedTuple):
    """A digital-to-analogue converter: ``bits`` of resolution over [-full_scale, +full_scale]
    (Swartz's DACOut). ``bits=None`` means no quantization, only clipping."""

    full_scale: float
    bits: int | None = None

    def __call__(self, V):
        fs = self.full_scale
        V = jnp.clip(V, -fs, fs)
        if self.bits is None:
            return V
        step = 2.0 * fs / (2**self.bits)
        # Round to the nearest level; the top code is full_scale - step (two's-complement DAC).
        return jnp.clip(jnp.round(V / step) * step, -fs, fs - step)
