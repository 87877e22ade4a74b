"""Excitation trajectories for identification: periodic finite Fourier series (Swevers et al. 1997)
whose base regressor is well conditioned, designed by gradient through the regressor.

A joint trajectory with H harmonics of the fundamental pulsation w_f = 2 pi / T is
(Swevers, Ganseman, Tukel, De Schutter, Van Brussel 1997, eq. 7)

    q_j(t)   = q0_j + sum_k  a_jk / (w_f k) sin(w_f k t) - b_jk / (w_f k) cos(w_f k t)
    qd_j(t)  =        sum_k  a_jk cos(w_f k t) + b_jk sin(w_f k t)
    qdd_j(t) =        sum_k -a_jk w_f k sin(w_f k t) + b_jk w_f k cos(w_f k t)

It is periodic with period T (so a measurement can be averaged over periods and filtered without
edge effects) and its derivatives are exact. :func:`design_excitation` chooses q0, a, b so that the
column-scaled base regressor stacked over one period has a small condition number, with joint
positions, velocities and accelerations within limits for *every* t (not only on a grid).
"""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..core.xla import by_value, eager_compiled
from ..model import checks
from ..model.arm import Arm


class FourierTrajectory(NamedTuple):
    """A periodic finite-Fourier-series trajectory (a pytree: differentiate or vmap over it).

    q0: (n,) offsets; a, b: (n, H) coefficients (velocity units, rad/s or m/s); period: () T [s].
    """

    q0: jnp.ndarray
    a: jnp.ndarray
    b: jnp.ndarray
    period: jnp.ndarray


def _check_params(params, func):
    if not isinstance(params, FourierTrajectory):
        raise TypeError(f"{func}: params: expected a jaxarm.FourierTrajectory, got {type(params).__name__}")
    q0, a, b = (jnp.asarray(x) for x in (params.q0, params.a, params.b))
    if q0.ndim != 1 or a.ndim != 2 or a.shape != b.shape or a.shape[0] != q0.shape[0] or a.shape[1] < 1:
        raise ValueError(
            f"{func}: params: expected q0 (n,) and a, b (n, H) with H >= 1, got q0 {q0.shape}, a {a.shape}, b {b.shape}"
        )
    T = params.period
    if not isinstance(T, jax.core.Tracer) and not (np.ndim(T) == 0 and float(T) > 0):
        raise ValueError(f"{func}: params.period: expected a positive number of seconds, got {T!r}")
    return q0, a, b, jnp.asarray(T)


def fourier_trajectory(params: FourierTrajectory, t):
    """Positions, velocities, accelerations (q, qd, qdd) of the Fourier series at times t.

    t: () or (N,) [s]. Returns three arrays of shape (n,) or (N, n). Swevers et al. 1997 eq. 7 and
    its exact derivatives (module docstring).
    """
    q0, a, b, T = _check_params(params, "fourier_trajectory")
    t = jnp.asarray(t)
    if t.ndim > 1:
        raise ValueError(f"fourier_trajectory: t: expected a time () or times (N,), got shape {t.shape}")
    wk = (2.0 * jnp.pi / T) * jnp.arange(1, a.shape[1] + 1, dtype=jnp.result_type(a, float))  # (H,)
    phase = t[..., None] * wk  # (..., H)
    s, c = jnp.sin(phase), jnp.cos(phase)
    q = q0 + (s / wk) @ a.T - (c / wk) @ b.T  # Swevers 1997 eq. 7
    qd = c @ a.T + s @ b.T
    qdd = (-s * wk) @ a.T + (c * wk) @ b.T
    return q, qd, qdd


def _curvature_bounds(a, b, T):
    """Upper bounds (n,) on |d^2/dt^2| of q - q0, qd and qdd over all t (sum of harmonic amplitudes)."""
    wk = (2.0 * jnp.pi / T) * jnp.arange(1, a.shape[1] + 1, dtype=jnp.result_type(a, float))
    amp = jnp.sqrt(a * a + b * b)  # (n, H)
    return amp @ wk, amp @ wk**2, amp @ wk**3


def _grid_extrema(params, grid):
    """Bounds valid for every t, from samples on the uniform grid (M,) over one period.

    A smooth periodic f reaches its maximum at an interior stationary point t*, and the nearest grid
    point t_g (|t* - t_g| <= h / 2) has f(t_g) >= f(t*) - h^2 / 8 max|f''| (Taylor). So
    max_t f <= max_grid f + h^2 / 8 max|f''|: the limits hold between the samples too.
    Returns (pmin, pmax, vmax, amax), each (n,), for p = q - q0, |qd| and |qdd|.
    """
    q0, a, b, T = params
    q, qd, qdd = fourier_trajectory(params, grid)
    h = T / grid.shape[0]
    cp, cv, ca = _curvature_bounds(a, b, T)
    m = h * h / 8.0
    p = q - q0
    return (
        jnp.min(p, axis=0) - m * cp,
        jnp.max(p, axis=0) + m * cp,
        jnp.max(jnp.abs(qd), axis=0) + m * cv,
        jnp.max(jnp.abs(qdd), axis=0) + m * ca,
    )


def _fit_to_limits(params, grid, lower, upper, vel, acc):
    """Scale each joint's harmonics and shift its offset so that position, velocity and acceleration
    stay within limits for all t (bounds of :func:`_grid_extrema`). Differentiable almost everywhere.

    Returns (params, scale (n,)); scale < 1 where a joint had to be slowed down.
    """
    pmin, pmax, vmax, amax = _grid_extrema(params, grid)
    tiny = jnp.finfo(pmin.dtype).tiny
    s = jnp.minimum(1.0, vel / jnp.maximum(vmax, tiny))
    s = jnp.minimum(s, acc / jnp.maximum(amax, tiny))
    s = jnp.minimum(s, (upper - lower) / jnp.maximum(pmax - pmin, tiny))
    # Scaling p by s scales its bounds by s; then q0 must lie in [lower - s pmin, upper - s pmax].
    q0 = jnp.clip(params.q0, lower - s * pmin, upper - s * pmax)
    return params._replace(q0=q0, a=params.a * s[:, None], b=params.b * s[:, None]), s


def limit_ratios(params: FourierTrajectory, position, velocity, acceleration=None, *, grid: int = 4096):
    """How much of each limit a trajectory uses, max over t (estimated on ``grid`` points per period).

    position: (n, 2) [lower, upper]; velocity: (n,); acceleration: (n,) or None.
    Returns dict of (n,) numpy arrays: "position" = max |q - mid| / half-range (<= 1 inside the
    range), "velocity" = max |qd| / limit, "acceleration" = max |qdd| / limit (0 for infinite limits).
    """
    q0, a, b, T = _check_params(params, "limit_ratios")
    ts = jnp.linspace(0.0, T, grid, endpoint=False)
    q, qd, qdd = (np.asarray(x) for x in fourier_trajectory(params, ts))
    pos = np.asarray(position, float)
    mid, half = pos.mean(axis=1), (pos[:, 1] - pos[:, 0]) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        rp = np.where(np.isfinite(half), np.max(np.abs(q - np.where(np.isfinite(mid), mid, 0.0)), 0) / half, 0.0)
        rv = np.max(np.abs(qd), 0) / np.asarray(velocity, float)
        ra = np.zeros(q.shape[1]) if acceleration is None else np.max(np.abs(qdd), 0) / np.asarray(acceleration, float)
    return {"position": rp, "velocity": rv, "acceleration": ra}


class ExcitationDesign(NamedTuple):
    """Result of :func:`design_excitation`.

    params: the designed trajectory; params_initial: the random start, fitted to the same limits.
    condition_initial / condition: 2-norm condition numbers of the column-scaled base regressor
    (samples x joints rows, base columns) of the initial and designed trajectories.
    base_columns: (r,) indices into the standard parameter vector: the independent columns of
        ``jaxarm.structural_base_parameters`` (their span is the regressor's).
    ratios: max |q - mid| / half-range, |qd| / limit, |qdd| / limit per joint (dict of (n,)), <= 1.
    history: (steps,) log condition number during the optimization.
    """

    params: FourierTrajectory
    params_initial: FourierTrajectory
    condition_initial: float
    condition: float
    base_columns: np.ndarray
    ratios: dict
    history: np.ndarray


def _limits(arm: Arm, acceleration_limit, func):
    n = arm.n
    pos = np.asarray(arm.limits.position, float)
    vel = np.asarray(arm.limits.velocity, float)
    if acceleration_limit is None:
        acc = np.full(n, np.inf)
    else:
        acc = np.broadcast_to(np.asarray(acceleration_limit, float), (n,)) if np.ndim(acceleration_limit) == 0 else np.asarray(acceleration_limit, float)
        if acc.shape != (n,) or not np.all(acc > 0):
            raise ValueError(f"{func}: acceleration_limit: expected a positive number or ({n},) positive numbers, got {acceleration_limit!r}")
    free = np.flatnonzero(~np.isfinite(vel) & ~np.isfinite(acc))
    if free.size:
        raise ValueError(
            f"{func}: joint {free[0] + 1} has neither a velocity limit (arm.limits.velocity) nor an "
            "acceleration_limit: the excitation amplitude would be unbounded; pass acceleration_limit="
        )
    return pos[:, 0], pos[:, 1], vel, acc


_STEPS = collections.OrderedDict()  # design_excitation's compiled steps, most recently used last


def _unpack(theta, design):
    """The trajectory of the optimizer's variables theta {q0 (n,), a, b (n, H)} (offsets relative
    to the range's middle, coefficients relative to ``design["scale"]``), fitted to the limits:
    (params, per-joint scale)."""
    q0 = design["mid"] + design["half"] * theta["q0"]
    scale = design["scale"][:, None]
    params = FourierTrajectory(q0, theta["a"] * scale, theta["b"] * scale, design["period"])
    return _fit_to_limits(params, design["dense"], design["lower"], design["upper"], design["vel"], design["acc"])


def _design_step(arm, drives, columns, theta, state, design):
    """One Adam step of :func:`design_excitation` on theta; returns (theta, state, objective and
    log condition number at the old theta). ``arm``, ``drives`` and the base ``columns`` are
    constants of the compiled step; everything else is an argument."""
    from .linear_model import regressor

    cols = np.asarray(columns)
    samples = design["ts"].shape[0]

    def objective(theta):
        params, s = _unpack(theta, design)
        q, qd, qdd = fourier_trajectory(params, design["ts"])
        W = regressor(arm, q, qd, qdd, drives=drives)[..., cols].reshape(samples * arm.n, -1)
        W = W / jnp.linalg.norm(W, axis=0)
        sv = jnp.linalg.svd(W, compute_uv=False)
        logc = jnp.log(sv[0] / sv[-1])
        return logc + 0.1 * jnp.sum(jnp.log(s) ** 2), logc

    opt = optax.adam(design["learning_rate"])
    (value, logc), grad = jax.value_and_grad(objective, has_aux=True)(theta)
    updates, state = opt.update(grad, state, theta)
    return optax.apply_updates(theta, updates), state, value, logc


def design_excitation(
    arm: Arm,
    *,
    harmonics: int = 5,
    period: float = 10.0,
    samples: int = 100,
    acceleration_limit=None,
    steps: int = 300,
    learning_rate: float = 0.05,
    seed: int = 0,
    drives: bool = True,
    grid: int = 2048,
) -> ExcitationDesign:
    """Design a Fourier excitation (Swevers et al. 1997) minimizing the condition number of the
    column-scaled base regressor, by gradient (optax Adam) through ``jaxarm.regressor``.

    harmonics: H; period: T [s]; samples: time points per period stacked into the regressor
    (``samples * n >= r`` rows, r = the arm's number of base parameters);
    acceleration_limit: () or (n,) [rad/s^2 or m/s^2], or None for none (then every joint needs a
    velocity limit). Position and velocity limits come from ``arm.limits``.
    steps: optimizer iterations; drives: include the drive columns (rotor inertia, friction, offset).

    Feasibility is exact by construction: every candidate is mapped through a per-joint scaling of
    its harmonics and a shift of its offset (:func:`_fit_to_limits`) that bounds |q|, |qd|, |qdd| for
    all t using ``grid`` samples per period plus a curvature bound between samples; the optimizer
    sees the condition number of the mapped trajectory plus a small penalty (log scale)^2 that keeps
    the raw coefficients near the feasible set. The start is random (``seed``) and is fitted to the
    limits the same way; the best iterate is returned.

    Objective: log(sigma_max / sigma_min) of W D^-1 with W (samples n, r) the base regressor and D
    its column norms (column scaling removes the dependence on units).

    The optimizer's step is compiled once per arm (by value), ``drives`` and base columns, and kept
    (the four most recent): a later call on the same arm with the same harmonics, samples and grid
    compiles nothing, whatever its seed, period, limits or learning rate (the Puma 560 design of
    the identification guide: a second call 1.0-1.3 s, against 16-25 s when every call compiled
    its own step).
    """
    from .fit import structural_base_parameters
    from .linear_model import regressor

    checks.check_arm(arm, "design_excitation")
    for name, v, lo in (("harmonics", harmonics, 1), ("samples", samples, 2), ("steps", steps, 0), ("grid", grid, 8)):
        if not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"design_excitation: {name}: expected a whole number >= {lo}, got {v!r}")
    if not (np.ndim(period) == 0 and float(period) > 0):
        raise ValueError(f"design_excitation: period: expected a positive number of seconds, got {period!r}")
    if (isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float, np.integer, np.floating))
            or not (np.isfinite(learning_rate) and learning_rate > 0)):
        raise ValueError(f"design_excitation: learning_rate: expected a positive number, got {learning_rate!r}")
    n = arm.n
    lower, upper, vel, acc = _limits(arm, acceleration_limit, "design_excitation")
    idx = np.asarray(structural_base_parameters(arm, drives=drives, seed=seed).independent)
    if samples * n < idx.size:
        raise ValueError(
            f"design_excitation: samples: {samples} samples x {n} joints give fewer rows than the "
            f"{idx.size} base parameters; use samples >= {-(-idx.size // n)}"
        )

    T = float(period)
    wk = 2.0 * np.pi / T * np.arange(1, harmonics + 1)
    # Natural scale of a coefficient: a joint using its velocity and acceleration limits equally
    # over the harmonics (finite one of the two; both finite -> the smaller).
    scale = np.minimum(vel, acc / wk[-1]) / harmonics
    mid = np.where(np.isfinite(lower) & np.isfinite(upper), (lower + upper) / 2.0, 0.0)
    half = np.where(np.isfinite(upper - lower), (upper - lower) / 2.0, np.pi)
    design = {"ts": jnp.linspace(0.0, T, samples, endpoint=False), "dense": jnp.linspace(0.0, T, grid, endpoint=False),
              "lower": lower, "upper": upper, "vel": vel, "acc": acc, "scale": scale, "mid": mid, "half": half,
              "period": np.float64(T), "learning_rate": np.float64(learning_rate)}
    design = jax.tree_util.tree_map(jnp.asarray, design)

    def condition(params):  # outside the optimizer: numpy SVD of the same column-scaled matrix
        q, qd, qdd = fourier_trajectory(params, design["ts"])
        W = np.asarray(regressor(arm, q, qd, qdd, drives=drives))[..., idx].reshape(samples * n, -1)
        return float(np.linalg.cond(W / np.linalg.norm(W, axis=0)))

    rng = np.random.default_rng(seed)
    theta = {
        "q0": jnp.asarray(rng.uniform(-0.3, 0.3, n)),
        "a": jnp.asarray(rng.normal(size=(n, harmonics))),
        "b": jnp.asarray(rng.normal(size=(n, harmonics))),
    }
    state = optax.adam(learning_rate).init(theta)
    # one compiled step per arm (its values: compiled in as constants), drives and base columns,
    # kept for the next call: another seed, period, limits or learning rate compiles nothing new
    columns = tuple(int(i) for i in idx)
    step = eager_compiled(("design_excitation", by_value(arm), bool(drives), columns),
                          lambda: jax.jit(functools.partial(_design_step, arm, bool(drives), columns)), store=_STEPS, size=4)
    unpack = functools.partial(_unpack, design=design)

    initial, _ = unpack(theta)
    best, best_value = theta, np.inf
    history = []
    for _ in range(steps):
        new_theta, state, value, logc = step(theta, state, design)
        value = float(value)
        history.append(float(logc))
        if value < best_value:  # value and logc belong to `theta`, the iterate before the update
            best, best_value = theta, value
        theta = new_theta
    final, _ = unpack(best)
    params = jax.tree_util.tree_map(np.asarray, final)
    initial = jax.tree_util.tree_map(np.asarray, initial)
    ratios = limit_ratios(params, np.stack([lower, upper], 1), vel, acc)
    return ExcitationDesign(
        params=params,
        params_initial=initial,
        condition_initial=condition(initial),
        condition=condition(params),
        base_columns=idx,
        ratios=ratios,
        history=np.asarray(history),
    )


def voltage_tracking_policy(model: Arm, params: FourierTrajectory, kp, kd):
    """A voltage policy ``V = policy(t, q, qd)`` for :func:`jaxarm.rollout` (``input="voltage"``) that
    tracks the Fourier trajectory: computed torque with the model's inverse dynamics,
    tau = ID(q*, qd*, qdd*) + Kp (q* - q) + Kd (qd* - qd), turned into the motor voltage
    V = R tau / (G Kt) + Kt G qd (Swartz eq. 11 with the gearbox). kp, kd: () or (n,).
    """
    from ..dynamics.motors import _require_motor_model
    from ..dynamics.newton_euler import _inverse_dynamics

    _require_motor_model(model, "voltage_tracking_policy")
    _check_params(params, "voltage_tracking_policy")
    kp, kd = jnp.asarray(kp), jnp.asarray(kd)
    dr = model.drives
    G, Kt, R = (jnp.asarray(x) for x in (dr.gear_ratio, dr.torque_constant, dr.resistance))

    def policy(t, q, qd):
        qs, qds, qdds = fourier_trajectory(params, t)
        tau = _inverse_dynamics(model, qs, qds, qdds) + kp * (qs - q) + kd * (qds - qd)
        return R * tau / (G * Kt) + Kt * G * qd  # Swartz eq. 11

    return policy
