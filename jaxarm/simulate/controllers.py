"""Feedback controllers as policies ``u = policy(t, q, qd)`` for :func:`jaxarm.rollout`."""

from __future__ import annotations

import jax.numpy as jnp

from ..dynamics import drives
from ..dynamics.composite_body import _mass_matrix
from ..dynamics.newton_euler import _bias
from ..model.arm import Arm, body_model


def _target(x, t):
    return x(t) if callable(x) else jnp.asarray(x)


def pd_controller(kp, kd, q_target, qd_target=0.0, *, gravity_compensation: Arm | None = None):
    """Joint-space PD: tau = Kp (q* - q) + Kd (qd* - qd) [+ g(q) of the given arm model].

    kp, kd: scalars or (n,) gains; q_target, qd_target: arrays or functions of t.
    """
    kp, kd = jnp.asarray(kp), jnp.asarray(kd)

    def policy(t, q, qd):
        tau = kp * (_target(q_target, t) - q) + kd * (_target(qd_target, t) - qd)
        if gravity_compensation is not None:
            model = gravity_compensation
            tau = tau + _bias(model, body_model(model), q, jnp.zeros_like(qd))
        return tau

    return policy


def computed_torque_controller(model: Arm, kp, kd, q_target, qd_target=0.0, qdd_target=0.0):
    """Computed torque (Craig 10.4 / inverse-dynamics control) with the controller's own arm
    model: tau = M(q) (qdd* + Kd (qd* - qd) + Kp (q* - q)) + bias(q, qd) + friction(qd).

    Targets may be arrays or functions of t. A model that differs from the simulated arm
    (e.g. a wrong payload) shows up as tracking error.
    """
    kp, kd = jnp.asarray(kp), jnp.asarray(kd)

    def policy(t, q, qd):
        e = _target(q_target, t) - q
        ed = _target(qd_target, t) - qd
        v = _target(qdd_target, t) + kd * ed + kp * e
        bodies = body_model(model)
        return _mass_matrix(model, bodies, q) @ v + _bias(model, bodies, q, qd) + drives._friction_torques(model, qd)

    return policy
