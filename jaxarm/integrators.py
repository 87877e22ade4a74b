"""Fixed-step integrators for second-order systems qdd = f(t, q, qd).

Each integrator is a step function ``step(f, t, q, qd, dt) -> (q_next, qd_next, qdd)``, where
``qdd`` is the acceleration at the start of the step. Pass one to :func:`jaxarm.rollout` by name
(``method="rk3"``) or as the function itself.
"""

from __future__ import annotations


def rk3(f, t, q, qd, dt):
    """Kutta's third-order method (the seed's Runge-Kutta, with the ERRATA's coefficients):
    k1 = F(x), k2 = F(x + h/2 k1), k3 = F(x + h (2 k2 - k1)), x+ = x + h/6 (k1 + 4 k2 + k3),
    applied to x = (q, qd), F = (qd, qdd)."""
    a1 = f(t, q, qd)
    q2, qd2 = q + 0.5 * dt * qd, qd + 0.5 * dt * a1
    a2 = f(t + 0.5 * dt, q2, qd2)
    q3, qd3 = q + dt * (2.0 * qd2 - qd), qd + dt * (2.0 * a2 - a1)  # ERRATA: c3 = qd + h (2 k2 - k1)
    a3 = f(t + dt, q3, qd3)
    q_next = q + dt / 6.0 * (qd + 4.0 * qd2 + qd3)
    qd_next = qd + dt / 6.0 * (a1 + 4.0 * a2 + a3)
    return q_next, qd_next, a1


def rk4(f, t, q, qd, dt):
    """Classical fourth-order Runge-Kutta."""
    a1 = f(t, q, qd)
    q2, qd2 = q + 0.5 * dt * qd, qd + 0.5 * dt * a1
    a2 = f(t + 0.5 * dt, q2, qd2)
    q3, qd3 = q + 0.5 * dt * qd2, qd + 0.5 * dt * a2
    a3 = f(t + 0.5 * dt, q3, qd3)
    q4, qd4 = q + dt * qd3, qd + dt * a3
    a4 = f(t + dt, q4, qd4)
    q_next = q + dt / 6.0 * (qd + 2.0 * qd2 + 2.0 * qd3 + qd4)
    qd_next = qd + dt / 6.0 * (a1 + 2.0 * a2 + 2.0 * a3 + a4)
    return q_next, qd_next, a1


def euler(f, t, q, qd, dt):
    """Explicit Euler as in Craig 6.117: qd+ = qd + qdd dt, q+ = q + qd dt + qdd dt^2 / 2,
    both from values at time t."""
    a = f(t, q, qd)
    return q + qd * dt + 0.5 * a * dt * dt, qd + a * dt, a


def semi_implicit_euler(f, t, q, qd, dt):
    """Symplectic (semi-implicit) Euler: qd+ = qd + qdd dt, then q+ = q + qd+ dt."""
    a = f(t, q, qd)
    qd_next = qd + a * dt
    return q + qd_next * dt, qd_next, a


METHODS = {"rk3": rk3, "rk4": rk4, "euler": euler, "semi_implicit_euler": semi_implicit_euler}
ORDER = {"rk3": 3, "rk4": 4, "euler": 1, "semi_implicit_euler": 1}


def get_method(method):
    """An integrator step by name, or the callable itself."""
    if callable(method):
        return method
    try:
        return METHODS[method]
    except KeyError:
        raise ValueError(f"method: expected one of {sorted(METHODS)} or a step function, got {method!r}") from None
