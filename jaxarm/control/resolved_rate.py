"""Resolved-rate (coordinated rate) control: joint velocities that produce a commanded tool twist.

Whitney (1969), NASA CR-165977 appendix D: the tool twist is J(q) qd with the geometric Jacobian
(:func:`jaxarm.jacobian`, rows (linear, angular)), so a commanded twist v is met by solving
J qd = v. Which solution depends on the shape of the commanded rows of J (m rows, n joints):

- ``"exact"``: m = n, qd = J^-1 v (appendix D section 4);
- ``"least_squares"``: m >= n (over-determined), qd = (J^T J)^-1 J^T v (appendix D7.1, eq D7.1-12);
- ``"minimum_norm"``: m <= n (redundant), qd = J^T (J J^T)^-1 v, the "least-effort" solution (D7.2);
- ``"damped"``: any shape, qd = J^T (J J^T + lambda^2 I)^-1 v, damped least squares (Wampler 1986,
  Nakamura & Hanafusa 1986): bounded near singularities, |qd| <= |v| / (2 lambda);
- ``"pseudo_inverse"``: qd = J^+ v by SVD (the report's row-reduction pseudo-inverse, D-4-10, is only
  valid for consistent systems), small singular values cut at ``rcond``.

``rows`` commands only some task directions (e.g. ``"position"`` = rows 0-2), which is how the
least-squares and minimum-norm cases arise on real 6-joint arms.

Diagnostics: manipulability (Yoshikawa 1985) sqrt(det(J J^T)), i.e. the product of the singular
values of the commanded rows; the condition number sigma_max / sigma_min; and ``singular`` when
sigma_min < ``singular_threshold`` * sigma_max. Linear (m/s) and angular (rad/s) rows have different
units, so the condition number of a full Jacobian depends on the length unit.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..dynamics.kinematics import jacobian
from ..model import checks
from ..model.arm import Arm
from ..simulate import integrators

METHODS = ("exact", "least_squares", "minimum_norm", "damped", "pseudo_inverse")
ROWS = {"all": (0, 1, 2, 3, 4, 5), "position": (0, 1, 2), "orientation": (3, 4, 5)}


class ResolvedRate(NamedTuple):
    """Joint velocities for a commanded twist and diagnostics of the commanded rows of J.

    qd: (n,); twist: (m,) the twist J qd actually produced (commanded rows);
    manipulability, condition: () (see the module doc); singular: () bool."""

    qd: jnp.ndarray
    twist: jnp.ndarray
    manipulability: jnp.ndarray
    condition: jnp.ndarray
    singular: jnp.ndarray


class ResolvedRateMotion(NamedTuple):
    """A resolved-rate motion of T steps: t (T+1,), q (T+1, n), qd (T, n) the average joint rate of
    each step, and per step manipulability (T,), condition (T,), singular (T,) at its start."""

    t: jnp.ndarray
    q: jnp.ndarray
    qd: jnp.ndarray
    manipulability: jnp.ndarray
    condition: jnp.ndarray
    singular: jnp.ndarray


def _rows(rows, func):
    if rows is None:
        return ROWS["all"]
    if isinstance(rows, str):
        if rows not in ROWS:
            raise ValueError(f"{func}: rows: expected one of {sorted(ROWS)} or a sequence of row indices 0..5, got {rows!r}")
        return ROWS[rows]
    idx = tuple(int(r) for r in rows)
    if not idx or len(set(idx)) != len(idx) or not all(0 <= r < 6 for r in idx):
        raise ValueError(f"{func}: rows: expected distinct row indices in 0..5 (0-2 linear, 3-5 angular), got {rows!r}")
    return idx


def _check_method(method, m, n, damping, func):
    if method not in METHODS:
        raise ValueError(f"{func}: method: expected one of {METHODS}, got {method!r}")
    if method == "exact" and m != n:
        raise ValueError(f"{func}: method='exact' needs a square Jacobian, but {m} commanded rows and {n} joints; "
                         "use 'least_squares' (more rows), 'minimum_norm' (more joints) or 'damped'")
    if method == "least_squares" and m < n:
        raise ValueError(f"{func}: method='least_squares' needs at least as many commanded rows as joints ({m} < {n}); use 'minimum_norm'")
    if method == "minimum_norm" and m > n:
        raise ValueError(f"{func}: method='minimum_norm' needs at most as many commanded rows as joints ({m} > {n}); use 'least_squares'")
    if method == "damped" and not isinstance(damping, jax.core.Tracer) and not float(damping) > 0:
        raise ValueError(f"{func}: damping: expected lambda > 0 for method='damped', got {damping!r}")


def _solve(J, v, method, damping, rcond, threshold):
    """qd and diagnostics for J (m, n) qd = v (m,)."""
    m, n = J.shape
    s = jnp.linalg.svd(J, compute_uv=False)  # descending, min(m, n) values
    manip = jnp.prod(s)  # = sqrt(det(J J^T)) for m <= n, sqrt(det(J^T J)) for m >= n
    cond = s[0] / s[-1]
    singular = s[-1] < threshold * s[0]
    if method == "exact":
        qd = jnp.linalg.solve(J, v)
    elif method == "least_squares":
        qd = jnp.linalg.solve(J.T @ J, J.T @ v)  # normal equations, D7.1-12
    elif method == "minimum_norm":
        qd = J.T @ jnp.linalg.solve(J @ J.T, v)  # least-effort solution, D7.2
    elif method == "damped":
        qd = J.T @ jnp.linalg.solve(J @ J.T + damping**2 * jnp.eye(m, dtype=J.dtype), v)  # Wampler 1986
    else:
        qd = jnp.linalg.pinv(J, rtol=rcond) @ v
    return ResolvedRate(qd=qd, twist=J @ qd, manipulability=manip, condition=cond, singular=singular)


def resolved_rate(
    arm: Arm, q, twist, *, frame: str = "base", method: str = "exact", rows=None, damping=0.05,
    rcond=1e-10, singular_threshold=1e-3,
) -> ResolvedRate:
    """Joint velocities qd (n,) whose tool twist J(q) qd meets the commanded ``twist``.

    twist: (6,) (linear m/s, angular rad/s) or (m,) for the commanded ``rows``, expressed in the
    world frame (``frame="base"``) or the tool frame (``frame="tool"``), as :func:`jaxarm.jacobian`;
    rows: None (all 6), "position", "orientation" or a sequence of row indices;
    method: see the module doc; damping: lambda of "damped" (same units as J's rows);
    rcond: relative cut-off of "pseudo_inverse"; singular_threshold: sigma_min / sigma_max below
    which ``singular`` is set. Returns :class:`ResolvedRate`.
    """
    func = "resolved_rate"
    checks.check_arm(arm, func)
    q = checks.joint_vector(q, arm, "q", func)
    idx = _rows(rows, func)
    twist = _twist(twist, idx, func)
    _check_method(method, len(idx), arm.n, damping, func)
    if frame not in ("base", "tool"):
        raise ValueError(f"{func}: frame: expected 'base' or 'tool', got {frame!r}")
    J = jacobian(arm, q, frame=frame)[jnp.asarray(idx)]
    return _solve(J, twist.astype(J.dtype), method, damping, rcond, singular_threshold)


def _twist(twist, idx, func):
    v = jnp.asarray(twist)
    if v.shape == (6,) and len(idx) != 6:
        v = v[jnp.asarray(idx)]
    if v.shape != (len(idx),):
        raise ValueError(f"{func}: twist: expected shape (6,) or ({len(idx)},) for the commanded rows {idx}, got {v.shape}")
    if not isinstance(v, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(v)))):
        raise ValueError(f"{func}: twist: expected finite values, got {np.asarray(v).tolist()}")
    return v


def resolved_rate_motion(
    arm: Arm, q0, twists, dt, *, steps: int | None = None, frame: str = "tool", method: str = "exact",
    rows=None, damping=0.05, rcond=1e-10, singular_threshold=1e-3, integrator: str = "euler", t0=0.0,
) -> ResolvedRateMotion:
    """Integrate resolved-rate control from q0 (n,) over T steps of dt with ``jax.lax.scan``.

    twists: (T, 6) (or (T, m) for ``rows``) commanded twists, one per step, or a function
    ``twist(t, q)`` (then ``steps`` gives T); by default in the tool frame (a tool-frame velocity
    command, as an operator's hand controller gives). integrator: a :mod:`jaxarm.integrators` method
    applied to q' = qd(t, q): "euler" holds the joint rates over the step, q_{k+1} = q_k + qd_k dt,
    like a sampled rate controller; "rk3" (Kutta) or "rk4" for accuracy. qd in the result is the
    average rate (q_{k+1} - q_k) / dt of each step.
    Other options as :func:`resolved_rate`. Returns :class:`ResolvedRateMotion`.
    """
    func = "resolved_rate_motion"
    checks.check_arm(arm, func)
    q0 = checks.joint_vector(q0, arm, "q0", func)
    idx = _rows(rows, func)
    _check_method(method, len(idx), arm.n, damping, func)
    if frame not in ("base", "tool"):
        raise ValueError(f"{func}: frame: expected 'base' or 'tool', got {frame!r}")
    if not callable(integrator) and integrator not in integrators.METHODS:
        raise ValueError(f"{func}: integrator: expected one of {sorted(integrators.METHODS)} or a step function, got {integrator!r}")
    step = integrators.get_method(integrator)
    if not isinstance(dt, jax.core.Tracer) and not float(dt) > 0:
        raise ValueError(f"{func}: dt: expected a positive time step, got {dt!r}")
    command: Callable | None = twists if callable(twists) else None
    if command is None:
        schedule = jnp.asarray(twists)
        if schedule.ndim != 2 or schedule.shape[1] not in (6, len(idx)):
            raise ValueError(f"{func}: twists: expected shape (T, 6) or (T, {len(idx)}), or a function twist(t, q), got {schedule.shape}")
        if schedule.shape[1] == 6 and len(idx) != 6:
            schedule = schedule[:, jnp.asarray(idx)]
        T = schedule.shape[0]
        if steps is not None and steps != T:
            raise ValueError(f"{func}: steps={steps} disagrees with the {T} rows of twists")
        if not isinstance(schedule, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(schedule)))):
            raise ValueError(f"{func}: twists: the schedule contains NaN or inf")
    else:
        if steps is None:
            raise ValueError(f"{func}: steps: required when twists is a function")
        T = int(steps)
        schedule = None
    dtype = jnp.result_type(q0, float)
    dt = jnp.asarray(dt, dtype)
    t0 = jnp.asarray(t0, dtype)
    rows_ix = jnp.asarray(idx)

    def rate(k, t, q):
        v = command(t, q) if command is not None else schedule[k]
        v = jnp.asarray(v, dtype)
        if command is not None and v.shape == (6,) and len(idx) != 6:
            v = v[rows_ix]
        J = jacobian(arm, q, frame=frame)[rows_ix]
        return _solve(J, v, method, damping, rcond, singular_threshold)

    def body(q, k):
        t = t0 + k * dt
        sol = rate(k, t, q)

        # q' = g(t, q) is first order: it rides in the integrator's velocity slot, whose update is
        # the method applied to y' = f(t, ., y) (Kutta's RK3: y + h/6 (k1 + 4 k2 + k3)).
        def g(ts, _, y):
            return rate(k, ts, y).qd

        _, q_next, _ = step(g, t, jnp.zeros_like(q), q, dt)
        return q_next, (q_next, (q_next - q) / dt, sol.manipulability, sol.condition, sol.singular)

    _, (qs, qds, manip, cond, sing) = jax.lax.scan(body, q0.astype(dtype), jnp.arange(T, dtype=jnp.int32))
    return ResolvedRateMotion(
        t=t0 + dt * jnp.arange(T + 1, dtype=dtype),
        q=jnp.concatenate([q0[None].astype(dtype), qs]),
        qd=qds, manipulability=manip, condition=cond, singular=sing,
    )
