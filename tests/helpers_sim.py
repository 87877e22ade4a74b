"""Shared arms and jitted rollouts for the simulation tests.

Compiling a rollout costs seconds while running one costs milliseconds, so the simulation tests
use two arm *structures* (the static part of an Arm: joint types, convention, name) -- a 3-R arm
(:func:`sim_arm`) and a 1-R pendulum (:func:`pendulum`) -- and a few module-level jitted functions
whose static options (method, input, ...) are fixed. Arms that differ only in values (masses,
friction, motors, gravity) and time steps that differ only in value reuse one compiled program.
Rollouts have ``BLOCK`` steps; longer horizons chain blocks (:func:`free_motion`), so the step
count never changes the shapes either.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jaxarm
from tests.helpers import random_arm

BLOCK = 50  # steps per jitted rollout call
NAME = "sim"  # the Arm's name is static metadata: keep it equal so that compilations are shared


def sim_arm(seed=0, **kw) -> jaxarm.Arm:
    """A random physically consistent 3-R arm (placement convention) with the shared structure."""
    return random_arm(seed, "RRR", "placement", name=NAME, **kw)


def pendulum(mass=1.5, viscous=0.02) -> jaxarm.Arm:
    """A one-joint arm swinging about a horizontal axis under gravity (placement convention)."""
    return jaxarm.make_arm(
        "R", convention="placement", xyz=[[0.0, 0.0, 0.3]], axis=[[0.0, 1.0, 0.0]], mass=mass,
        com=[[0.3, 0.02, -0.05]], inertia=[[0.01, 0.02, 0.015]], viscous_friction=viscous, name="pendulum",
    )


def with_drives(arm: jaxarm.Arm, **fields) -> jaxarm.Arm:
    """The arm with some drive parameters replaced (each broadcast to the field's shape)."""
    d = arm.drives
    new = {k: np.broadcast_to(np.asarray(v, dtype=float), np.shape(getattr(d, k))).copy() for k, v in fields.items()}
    return arm.replace(drives=dataclasses.replace(d, **new))


def with_masses(arm: jaxarm.Arm, mass) -> jaxarm.Arm:
    """The arm with its link masses replaced (COMs and inertias about the COM kept)."""
    return arm.replace(links=dataclasses.replace(arm.links, mass=np.asarray(mass, dtype=float)))


def motor_arm() -> jaxarm.Arm:
    """sim_arm(2) with DC drives (joint 1 saturating inside a +-10 V DAC's range) and a tool frame."""
    arm = with_drives(
        sim_arm(2),
        gear_ratio=[20.0, -15.0, 10.0],
        torque_constant=[0.05, 0.04, 0.06],
        resistance=[1.0, 1.5, 2.0],
        voltage_limit=[6.0, 24.0, 24.0],  # joint 1 saturates inside the DAC's range
        rotor_inertia=[1e-5, 2e-5, 3e-5],
        viscous_friction=[1e-4, 1e-4, 1e-4],
    )
    return arm.replace(tool=np.array([[0, -1, 0, 0.1], [1, 0, 0, 0.0], [0, 0, 1, 0.2], [0, 0, 0, 1.0]]))


@functools.partial(jax.jit, static_argnames=("method", "input", "hold", "dac"))
def _roll(arm, q0, qd0, u, dt, t0, f_ext, *, method, input, hold, dac):
    return jaxarm.rollout(arm, q0, qd0, u, dt, t0=t0, f_ext=f_ext, method=method, input=input, hold=hold, dac=dac,
                          on_divergence="flag")


def roll(arm, q0, qd0, u, dt, t0=0.0, *, f_ext=None, method="rk3", input="torque", hold=1, dac=None):
    """jit(rollout) with on_divergence="flag"; q0's dtype (float64 unless given) sets every argument's."""
    dtype = jnp.asarray(q0).dtype if jnp.issubdtype(jnp.asarray(q0).dtype, jnp.floating) else jnp.float64
    # fixed dtypes: Python and NumPy floats must not trace (and compile) twice
    c = lambda x: None if x is None else jnp.asarray(x, dtype)  # noqa: E731
    return _roll(arm, c(q0), c(qd0), c(u), c(dt), c(t0), c(f_ext), method=method, input=input, hold=hold, dac=dac)


def free_motion(arm, q0, qd0, dt, blocks, method="rk3"):
    """Unforced motion for blocks * BLOCK steps of dt, chaining jitted blocks: (q, qd), each (T+1, n)."""
    n = arm.n
    qs, qds = [np.asarray(q0, float)[None]], [np.asarray(qd0, float)[None]]
    q, qd = jnp.asarray(q0, float), jnp.asarray(qd0, float)
    zeros = np.zeros((BLOCK, n))
    for b in range(blocks):
        tr = roll(arm, q, qd, zeros, dt, b * BLOCK * dt, method=method)
        assert int(tr.diverged_step) < 0, f"free motion diverged in block {b}"
        q, qd = tr.q[-1], tr.qd[-1]
        qs.append(np.asarray(tr.q[1:]))
        qds.append(np.asarray(tr.qd[1:]))
    return np.concatenate(qs), np.concatenate(qds)


@jax.jit
def forward_dynamics(arm, q, qd, tau, f_ext):
    """jit(jaxarm.forward_dynamics) for hand-written integration loops (pass f_ext = zeros for none)."""
    return jaxarm.forward_dynamics(arm, q, qd, tau, f_ext)


@jax.jit
def energies(arm, q, qd):
    """Kinetic and potential energy along a trajectory q, qd: (T, n) -> ((T,), (T,))."""
    ke = jax.vmap(lambda a, b: jaxarm.kinetic_energy(arm, a, b))(q, qd)
    pe = jax.vmap(lambda a: jaxarm.potential_energy(arm, a))(q)
    return ke, pe


def kutta_rk3_step(f, t, q, qd, h):
    """One step of Kutta's third-order method written out as in the ERRATA, for x = (q, qd):
    c1 = qd, k1 = F(q, c1); c2 = qd + h/2 k1, k2 = F(q + h/2 c1, c2);
    c3 = qd + h (2 k2 - k1), k3 = F(q + h (2 c2 - c1), c3);
    q+ = q + h/6 (c1 + 4 c2 + c3), qd+ = qd + h/6 (k1 + 4 k2 + k3)."""
    c1 = qd
    k1 = f(t, q, c1)
    c2 = qd + 0.5 * h * k1
    k2 = f(t + 0.5 * h, q + 0.5 * h * c1, c2)
    c3 = qd + h * (2.0 * k2 - k1)
    k3 = f(t + h, q + h * (2.0 * c2 - c1), c3)
    return q + h / 6.0 * (c1 + 4.0 * c2 + c3), qd + h / 6.0 * (k1 + 4.0 * k2 + k3)
