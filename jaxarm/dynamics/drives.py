"""Drive (gearbox + motor) terms as seen at the joint: reflected rotor inertia and friction."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..model import checks
from ..model.arm import Arm
from .eager import compiled_when_eager


def reflected_inertia(arm: Arm):
    """Rotor inertia seen at each joint, G^2 Jm (n,)."""
    checks.check_arm(arm, "reflected_inertia")
    return _reflected_inertia(arm)


def _reflected_inertia(arm: Arm, xp=jnp):
    G = xp.asarray(arm.drives.gear_ratio)
    return G * G * xp.asarray(arm.drives.rotor_inertia)


def _direction(qd, scale, xp=jnp):
    """sign(qd), or tanh(qd / scale) where a smoothing velocity scale is set (> 0); where the
    scales are known, only the form they choose is computed. ``xp=np`` computes it with NumPy
    (known samples on the host, as the identification's model selection has: no program per
    sample count)."""
    if checks.concrete(scale) and _MODELS_BY_FIELD:
        smooth = np.asarray(scale) > 0
        if not np.any(smooth):
            return xp.sign(qd)
        if np.all(smooth):
            return xp.tanh(qd / xp.asarray(scale))
    scale = xp.asarray(scale)
    safe = xp.where(scale > 0, scale, 1.0)
    return xp.where(scale > 0, xp.tanh(qd / safe), xp.sign(qd))


@compiled_when_eager
def friction_torques(arm: Arm, qd):
    """Joint torque (n,) needed to overcome drive friction at joint velocity qd.

    Sum of the models whose parameters a joint sets (all zero by default):
    - viscous: B G^2 qd (B motor side; Craig 6.110);
    - Coulomb: |G| Tc+ for qd > 0, |G| Tc- for qd < 0, zero at rest (Craig 6.111), with the sign
      smoothed to tanh(qd / s) when ``coulomb_velocity_scale`` s > 0;
    - Stribeck: |G| (Ts - |Tc|) exp(-(qd / vs)^2) in the direction of motion, where the static
      friction Ts (motor side) is set (Craig 6.113's static-friction peak);
    - sigmoid (Gaz et al. 2019, the Panda model): phi1 / (1 + exp(-phi2 (qd + phi3)))
      - phi1 / (1 + exp(-phi2 phi3)), joint side.
    """
    checks.check_arm(arm, "friction_torques")
    qd = checks.joint_vector(qd, arm, "qd", "friction_torques")
    return _friction_torques(arm, qd)


def _friction_torques(arm: Arm, qd, xp=jnp):
    """Joint friction torques at velocities qd (n,) or (N, n). ``xp=np``: computed by NumPy (a concrete
    arm and known samples on the host, as the identification's fits have)."""
    dr = arm.drives
    # Friction models that are off (parameters known, all zero) are left out of the program: the
    # exponentials and tanh of the Coulomb, Stribeck and sigmoid models are the dearest operations
    # of a dynamics evaluation, and in reverse mode they sit in the loop that gathers the
    # joint-velocity cotangent. Decided per parameter field, so that an arm whose Coulomb and
    # viscous coefficients are traced (identification: jaxarm.identify.linear_model's
    # arm_with_parameters) keeps its Stribeck and sigmoid models out where they are zero.

    def on(field, test=lambda p: p != 0):
        """Whether a model can contribute: where ``field`` is traced, else where ``test`` holds."""
        if not _MODELS_BY_FIELD and not checks.concrete(dr):
            return True
        return not checks.concrete(field) or bool(np.any(test(np.asarray(field))))

    G = xp.asarray(dr.gear_ratio)
    absG = xp.abs(G)
    total = xp.zeros_like(qd)
    if on(dr.viscous_friction):
        total = total + xp.asarray(dr.viscous_friction) * G * G * qd
    tc = xp.asarray(dr.coulomb_friction)
    Ts = xp.asarray(dr.static_friction)
    coulomb_on, stribeck_on = on(dr.coulomb_friction), on(dr.static_friction, lambda p: p > 0)
    if coulomb_on or stribeck_on:
        s = _direction(qd, dr.coulomb_velocity_scale, xp=xp)
        forward = qd >= 0  # which Coulomb level applies; s carries the (smoothed) direction
        if coulomb_on:
            total = total + absG * xp.where(forward, tc[:, 0], -tc[:, 1]) * s
        if stribeck_on:
            vs = xp.asarray(dr.stribeck_velocity)
            vs_safe = xp.where(vs > 0, vs, 1.0)
            tc_mag = xp.where(forward, xp.abs(tc[:, 0]), xp.abs(tc[:, 1]))  # |Tc| in the direction of motion
            total = total + xp.where(Ts > 0, absG * (Ts - tc_mag) * xp.exp(-((qd / vs_safe) ** 2)) * s, 0.0)
    if on(dr.sigmoid_friction, lambda p: p[:, 0] != 0):  # phi1 = 0: no sigmoid friction
        phi = xp.asarray(dr.sigmoid_friction)
        p1, p2, p3 = phi[:, 0], phi[:, 1], phi[:, 2]
        total = total + p1 * (xp.reciprocal(1.0 + xp.exp(-p2 * (qd + p3))) - xp.reciprocal(1.0 + xp.exp(-p2 * p3)))
    return total


# False: every friction model of a partly traced drive model is evaluated, and both forms of the
# Coulomb direction (for before/after measurements: experiments/arm_gradient_batches.py)
_MODELS_BY_FIELD = True
