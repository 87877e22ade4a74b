"""External joint torques from measured motion and torques: the generalized-momentum observer.

With generalized momentum p = M(q) qd, the arm's dynamics M qdd + C qd + g + tau_f = tau + tau_ext
and M-dot = C + C^T give dp/dt = tau + tau_ext - beta(q, qd), beta = g + tau_f - C^T qd. The
observer (De Luca & Mattone 2003; Haddadin, De Luca & Albu-Schaeffer 2017)

    r(t) = K ( p(t) - p(0) - integral_0^t (tau - beta + r) ds )

needs no acceleration and obeys dr/dt = K (tau_ext - r): each joint's residual follows the external
joint torque through a first-order lag of time constant 1 / K_j. Here beta is computed without
forming C: inverse dynamics at zero acceleration gives C qd + g + tau_f (friction included), and
M-dot qd is the derivative of M along qd (one forward-mode derivative of the composite-body mass
matrix), so beta = ID(q, qd, 0) - M-dot(q, qd) qd. The integral is a trapezoid rule over the log's
samples with r held from the previous sample (the discrete observer of Haddadin et al. 2017); it
runs in one ``lax.scan`` and batches with ``vmap`` over logs or gains.

Contact detection compares |r_j| with a threshold per joint. :func:`detection_threshold` chooses
it from contact-free data: a multiple of the residual's largest excursion there, so the
contact-free log itself raises no alarm.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..core.xla import jit
from ..dynamics.composite_body import mass_matrix
from ..dynamics.newton_euler import _inverse_dynamics
from ..model import checks
from ..model.arm import Arm


def _momentum_and_beta(arm: Arm, q, qd):
    """p = M qd and beta = ID(q, qd, 0) - M-dot qd at one state."""
    M, Mdot = jax.jvp(lambda x: mass_matrix(arm, x), (q,), (qd,))
    beta = _inverse_dynamics(arm, q, qd, jnp.zeros_like(qd)) - Mdot @ qd
    return M @ qd, beta


@jit
def _observe(arm, t, q, qd, tau, gain):
    p, beta = jax.vmap(lambda a, b: _momentum_and_beta(arm, a, b))(q, qd)
    drive = tau - beta  # dp/dt without the external torque
    dt = jnp.diff(t)

    def step(carry, xs):
        integral, r = carry
        p_next, f0, f1, h = xs
        integral = integral + 0.5 * h * (f0 + f1) + h * r
        r = gain * (p_next - p[0] - integral)
        return (integral, r), r

    zero = jnp.zeros_like(p[0])
    _, rs = jax.lax.scan(step, (zero, zero), (p[1:], drive[:-1], drive[1:], dt))
    return jnp.concatenate([zero[None], rs]), p


@dataclasses.dataclass(frozen=True)
class MomentumObserver:
    """Result of :func:`momentum_observer`: ``t`` (N,), ``residual`` (N, n) the estimate of the
    external joint torques [N m or N], ``momentum`` (N, n) p = M qd, ``gain`` (n,) K [1/s]."""

    t: np.ndarray
    residual: np.ndarray
    momentum: np.ndarray
    gain: np.ndarray


def momentum_observer(arm: Arm, t, q, qd, tau, *, gain=50.0) -> MomentumObserver:
    """External joint torques (N, n) estimated by the generalized-momentum observer (module
    docstring) from samples ``t`` (N,) and ``q``, ``qd``, ``tau`` (N, n): measured positions,
    velocities and the joint torques the drives applied (link side). ``gain`` K (scalar or (n,),
    1/s): the residual follows the external torque with time constant 1 / K; a higher gain reacts
    faster and passes more sensor noise. Friction, payload and rotor inertia are those of ``arm``;
    whatever the arm's model misses shows up in the residual, so identify the arm first."""
    checks.check_arm(arm, "momentum_observer")
    t = np.asarray(t, dtype=float)
    q, qd, tau = (np.asarray(x, dtype=float) for x in (q, qd, tau))
    N, n = len(t), arm.n
    for name, x in (("q", q), ("qd", qd), ("tau", tau)):
        if x.shape != (N, n):
            raise ValueError(f"momentum_observer: {name}: expected shape ({N}, {n}) like t and the arm's joints, got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"momentum_observer: {name}: expected finite values")
    if t.ndim != 1 or N < 2 or not np.all(np.diff(t) > 0):
        raise ValueError("momentum_observer: t: expected at least 2 strictly increasing sample times")
    gain = np.broadcast_to(np.asarray(gain, dtype=float), (n,)).copy()
    if not np.all(np.isfinite(gain) & (gain > 0)):
        raise ValueError(f"momentum_observer: gain: expected positive numbers [1/s], got {gain}")
    if np.any(gain * np.max(np.diff(t)) >= 1.0):
        raise ValueError(f"momentum_observer: gain: K dt = {float(np.max(gain) * np.max(np.diff(t))):.3g} >= 1 makes the discrete "
                         "observer oscillate or diverge; lower the gain below 1 / dt")
    r, p = _observe(arm, jnp.asarray(t), jnp.asarray(q), jnp.asarray(qd), jnp.asarray(tau), jnp.asarray(gain))
    return MomentumObserver(t=t, residual=np.asarray(r), momentum=np.asarray(p), gain=gain)


def detection_threshold(residual_free, *, factor: float = 1.5, settle: int = 0) -> np.ndarray:
    """Per-joint contact-detection thresholds (n,) from the observer's residual (N, n) on
    contact-free data: ``factor`` times its largest excursion, after the first ``settle`` samples
    (the observer's start-up). A contact is declared where |r_j| exceeds the threshold."""
    r = np.abs(np.asarray(residual_free, dtype=float)[settle:])
    if r.ndim != 2 or r.shape[0] == 0:
        raise ValueError("detection_threshold: residual_free: expected (N, n) residuals of contact-free data")
    if not factor > 1:
        raise ValueError(f"detection_threshold: factor: expected a number > 1, got {factor!r}")
    return factor * np.max(r, axis=0)


def detect_contact(residual, threshold) -> np.ndarray:
    """(N,) True where any joint's |residual| exceeds its threshold; ``np.flatnonzero`` gives the
    samples, and the joints that see the contact are ``np.abs(residual) > threshold``."""
    return np.any(np.abs(np.asarray(residual)) > np.asarray(threshold)[None, :], axis=1)


def contact_link(residual, threshold) -> np.ndarray:
    """(N,) the link (1..n) in contact at each sample, 0 where no joint's residual exceeds its
    threshold. An external wrench w on link k reaches the joints as J_k(q)^T w, on joints 1..k only
    (the links beyond k do not move with it), so the contact is on the most distal joint's link
    whose |residual| exceeds its threshold (contact isolation, Haddadin, De Luca & Albu-Schaeffer
    2017, sec. 5). Where that wrench happens to have no moment about joint k's axis, the link is
    further out than reported: the answer is the nearest link the contact can be on."""
    r = np.abs(np.asarray(residual, dtype=float))
    if r.ndim != 2:
        raise ValueError(f"contact_link: residual: expected (N, n) residuals, got shape {r.shape}")
    above = r > np.asarray(threshold, dtype=float)[None, :]
    n = r.shape[1]
    last = n - np.argmax(above[:, ::-1], axis=1)
    return np.where(above.any(axis=1), last, 0)
