"""Drive (gearbox + motor) terms as seen at the joint: reflected rotor inertia and friction."""

from __future__ import annotations

import jax.numpy as jnp

from .arm import Arm


def reflected_inertia(arm: Arm):
    """Rotor inertia seen at each joint, G^2 Jm (n,)."""
    G = jnp.asarray(arm.drives.gear_ratio)
    return G * G * jnp.asarray(arm.drives.rotor_inertia)


def friction_torques(arm: Arm, qd):
    """Joint torque needed to overcome drive friction at joint velocity qd (n,).

    Viscous B G^2 qd plus Coulomb |G| Tc+ for qd > 0 and |G| Tc- for qd < 0 (zero at rest);
    B and Tc are motor-side values (Corke's convention, Tc- usually negative).
    """
    dr = arm.drives
    G = jnp.asarray(dr.gear_ratio)
    viscous = jnp.asarray(dr.viscous_friction) * G * G * qd
    tc = jnp.asarray(dr.coulomb_friction)
    coulomb = jnp.abs(G) * jnp.where(qd > 0, tc[:, 0], jnp.where(qd < 0, tc[:, 1], 0.0))
    return viscous + coulomb
