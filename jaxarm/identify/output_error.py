"""Output-error refinement: parameters that make the *simulated* motion reproduce the measured one.

An inverse-dynamics fit (:func:`jaxarm.identify_linear`, :func:`jaxarm.fit_consistent`) matches
torques computed from measured positions and their filtered derivatives. Its errors in the
accelerations (noise, filter lag) enter the regressor, which biases the estimate; and a model that
predicts torques well may still simulate poorly. Output-error methods fit what a simulator is for:
the motion. DIDIM (Gautier, Janot & Vandanjon 2013) and closed-loop output-error methods (CLOE)
simulate the arm under the measured input and minimize the position error; the BIRDy benchmark
(Leboutet et al. 2021) compares them. Here:

1. The log is cut into short windows (``window`` seconds; a long open-loop simulation of an arm
   that was under feedback drifts away whatever the parameters). Each window starts from the
   measured (filtered) state and is driven by the logged torques, each sample period holding the
   mean of its two end samples, integrated by :func:`jaxarm.rollout` (RK3 at the log's rate).
2. The residual stacks, for every window, the position error of each sample and (``torque_weight``
   > 0) the inverse-dynamics torque error on the same samples, each joint's divided by the
   starting arm's RMS error of that kind on that joint: every joint and both kinds start at 1, so
   the fit trades relative improvements and no joint or kind is drowned by the others' units
   (DIDIM weighs its torque and position parts for the same reason).
   A small pull towards the starting parameters (``prior_weight``) keeps directions the windows
   cannot see where the inverse-dynamics fit put them.
3. The parameters stay physically consistent by construction: links by the log-Cholesky
   parameterization of the pseudo-inertia (Rucker & Wensing 2022), drives by squares (Ia, fv,
   Tc+ >= 0 >= Tc-). The arm's other friction (tanh shape, Stribeck, sigmoid) is kept as given.
4. Levenberg-Marquardt (More 1978) on the stacked residual. Its Jacobian comes from forward-mode
   differentiation through the rollouts (one tangent per parameter: about 100 for a 7-joint arm,
   against tens of thousands of residuals, which is where forward mode beats the reverse-mode
   adjoint, which would need one backward pass per residual). All windows run as one ``vmap``;
   several starting guesses run as another ``vmap``, and the one with the lowest final cost is
   kept.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..core.xla import jit
from ..dynamics.newton_euler import _inverse_dynamics
from ..model.arm import Arm
from ..simulate.rollouts import rollout
from .consistent import log_cholesky_to_parameters, parameters_to_log_cholesky
from .linear_model import IdentificationError, arm_with_parameters, standard_parameters
from .logs import Log


@dataclasses.dataclass(frozen=True)
class OutputErrorFit:
    """Result of :func:`refine_output_error`: ``arm`` the refined arm (of the best start);
    ``position_rmse`` / ``position_rmse_start`` (n,) RMS simulated-minus-measured position over
    the windows [rad or m], after and before; ``torque_rmse`` / ``torque_rmse_start`` (n,) the
    inverse-dynamics torque error on the windows' samples; ``cost`` per start (final), ``best``
    the start kept; ``iterations``; ``windows``, ``window_steps``; ``position_scale`` and
    ``torque_scale`` (n,) the errors each joint's residuals were divided by; ``message``."""

    arm: Arm
    position_rmse: np.ndarray
    position_rmse_start: np.ndarray
    torque_rmse: np.ndarray
    torque_rmse_start: np.ndarray
    cost: np.ndarray
    cost_start: np.ndarray
    best: int
    iterations: int
    windows: int
    window_steps: int
    position_scale: np.ndarray
    torque_scale: np.ndarray
    message: str

    def report(self) -> dict:
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in dataclasses.asdict(self).items() if k != "arm"}


def _pack(arm: Arm) -> np.ndarray:
    """Free variables of an arm: log-Cholesky vectors of its links (n, 10), then the square roots
    of Ia, fv, Tc+ and -Tc- (n, 4) (a start outside the physical set is pulled onto it)."""
    n = arm.n
    pi = np.asarray(standard_parameters(arm), dtype=np.float64)
    theta = parameters_to_log_cholesky(pi[: 10 * n].reshape(n, 10), repair=True)
    d = pi[10 * n:].reshape(n, 4)
    levels = np.stack([d[:, 0], d[:, 1], d[:, 2] + d[:, 3], d[:, 2] - d[:, 3]], axis=1)  # Ia, fv, Tc+, -Tc-
    # a level at 0 would have no gradient (d(s^2)/ds = 0): start just inside, at 1e-6 of the joint's largest level
    floor = 1e-6 * np.maximum(np.max(np.abs(levels), axis=1, keepdims=True), 1e-9)
    return np.concatenate([theta.reshape(-1), np.sqrt(np.maximum(levels, floor)).reshape(-1)])


def _unpack(x, template: Arm) -> Arm:
    """The arm of free variables x (traceable): every link consistent, every drive dissipative."""
    n = template.n
    links = log_cholesky_to_parameters(x[: 10 * n].reshape(n, 10)).reshape(-1)
    s = jnp.square(x[10 * n:].reshape(n, 4))
    drives = jnp.stack([s[:, 0], s[:, 1], 0.5 * (s[:, 2] + s[:, 3]), 0.5 * (s[:, 2] - s[:, 3])], axis=1)
    return arm_with_parameters(template, jnp.concatenate([links, drives.reshape(-1)]))


def _windows(log: Log, steps: int, stride: int) -> np.ndarray:
    """Start indices of windows of ``steps`` + 1 samples that lie within one segment of the log."""
    N = len(log)
    starts = list(log.info.get("segment_starts", [0]))
    out = []
    for a, b in zip(starts, starts[1:] + [N]):
        out.extend(range(a, b - steps, stride))
    return np.asarray(out, dtype=int)


def _residual(x, x_prior, template, data, cfg):
    """Stacked residual of one parameter vector: positions (windows, steps, n) / q_scale (n,),
    torques (windows, steps, n) / tau_scale (n,) * sqrt(torque_weight), prior pull."""
    arm = _unpack(x, template)
    q0, qd0, u, q_meas, qd_meas, qdd_meas, tau_meas = data["q0"], data["qd0"], data["u"], data["q"], data["qd"], data["qdd"], data["tau"]

    q_sim = jax.vmap(lambda a, b, c: rollout(arm, a, b, c, cfg["dt"], method="rk3", saturate=False, on_divergence="flag").q[1:])(q0, qd0, u)
    e_q = (q_sim - q_meas) / data["q_scale"]
    tau = jax.vmap(jax.vmap(lambda a, b, c: _inverse_dynamics(arm, a, b, c)))(q_meas, qd_meas, qdd_meas)
    e_tau = (tau - tau_meas) / data["tau_scale"] * jnp.sqrt(cfg["torque_weight"])
    e_prior = (x - x_prior) * jnp.sqrt(cfg["prior_weight"])
    return jnp.concatenate([e_q.reshape(-1), e_tau.reshape(-1), e_prior])


def _split(r, shape):
    """(position part, torque part) of a residual vector, each (windows, steps, n)."""
    size = int(np.prod(shape))
    return r[:size].reshape(shape), r[size:2 * size].reshape(shape)


@jit
def _residuals(xs, priors, template, data, cfg):
    """The residual of every start (S, M)."""
    return jax.vmap(lambda x, p: _residual(x, p, template, data, cfg))(xs, priors)


@jit
def _jacobians(xs, priors, template, data, cfg):
    """Residuals (S, M) and Jacobians (S, M, P) of every start, one forward-mode derivative per
    parameter in sequence (``lax.map`` of ``jvp``): the same numbers as ``jax.jacfwd``, which
    would push all P tangents through the rollouts at once and takes about 5x longer to compile."""

    def one(x, prior):
        f = functools.partial(_residual, x_prior=prior, template=template, data=data, cfg=cfg)
        eye = jnp.eye(x.shape[0], dtype=x.dtype)
        return f(x), jax.lax.map(lambda v: jax.jvp(f, (x,), (v,))[1], eye).T

    return jax.vmap(one)(xs, priors)


def _levenberg_marquardt(x0s, template, data, cfg, iterations: int):
    """``iterations`` Levenberg-Marquardt steps from each row of x0s, all starts evaluated
    together; Marquardt's diagonal scaling (floored, so directions the data barely sees stay
    damped) and Nielsen's (1999) damping update from the gain ratio of actual to predicted
    decrease. Returns (x, final cost, starting cost) per start."""
    xs = np.array(x0s, dtype=np.float64)
    priors = jnp.asarray(x0s)
    mu = np.full(len(xs), 1e-3)
    nu = np.full(len(xs), 2.0)
    r, J = (np.asarray(v) for v in _jacobians(jnp.asarray(xs), priors, template, data, cfg))
    cost0 = np.einsum("sm,sm->s", r, r)
    cost = cost0.copy()
    for _ in range(iterations):
        A = np.einsum("smp,smq->spq", J, J)
        g = np.einsum("smp,sm->sp", J, r)
        diag = np.einsum("spp->sp", A)
        D = np.maximum(diag, 1e-6 * np.max(diag, axis=1, keepdims=True))
        dx = -np.linalg.solve(A + mu[:, None, None] * (D[:, :, None] * np.eye(A.shape[1])), g[..., None])[..., 0]
        predicted = -(2.0 * np.einsum("sp,sp->s", dx, g) + np.einsum("sp,spq,sq->s", dx, A, dx))
        trial = xs + dx
        r_new = np.asarray(_residuals(jnp.asarray(trial), priors, template, data, cfg))
        cost_new = np.einsum("sm,sm->s", r_new, r_new)
        rho = np.where(predicted > 0, (cost - cost_new) / np.maximum(predicted, 1e-300), -1.0)
        good = np.isfinite(cost_new) & (rho > 0)
        mu = np.where(good, mu * np.maximum(1.0 / 3.0, 1.0 - (2.0 * np.clip(rho, 0, 1) - 1.0) ** 3), mu * nu)
        nu = np.where(good, 2.0, nu * 2.0)
        if good.any():
            xs = np.where(good[:, None], trial, xs)
            cost = np.where(good, cost_new, cost)
            r, J = (np.asarray(v) for v in _jacobians(jnp.asarray(xs), priors, template, data, cfg))
    return xs, cost, cost0


@functools.partial(jit, static_argnames=("steps",))
def _simulated_positions(arm, q0, qd0, u, dt, steps: int):
    def one(q0, qd0, u):
        return rollout(arm, q0, qd0, u, dt, method="rk3", saturate=False, on_divergence="flag").q[1:]

    return jax.vmap(one)(q0, qd0, u)


def _window_data(log: Log, window: float, stride, max_windows):
    """(dt, steps per window, window starts (K,), sample indices (K, steps), held inputs
    (K, steps, n)) of a log."""
    dt = float(np.median(np.diff(log.t)))
    steps = max(1, int(round(window / dt)))
    hop = steps if stride is None else max(1, int(round(stride / dt)))
    first = _windows(log, steps, hop)
    if first.size == 0:
        raise IdentificationError(f"the log ({log.duration:.3g} s) is shorter than one window ({window:g} s)")
    if max_windows is not None and first.size > max_windows:
        first = first[np.unique(np.linspace(0, first.size - 1, max_windows).round().astype(int))]
    idx = first[:, None] + np.arange(1, steps + 1)[None, :]
    # the torque held over each step: the mean of its two end samples, exact to second order
    # for a smoothly varying torque (holding the first sample would cost an O(dt) error)
    u = 0.5 * (log.tau[first[:, None] + np.arange(steps)[None, :]] + log.tau[idx])
    return dt, steps, first, idx, u


def simulation_error(arm: Arm, log: Log, *, window: float = 0.1, stride=None, max_windows=None) -> np.ndarray:
    """(n,) RMS position error [rad or m] of open-loop simulations of ``arm``: windows of
    ``window`` seconds, each from the log's measured (filtered) state, driven by its torques as in
    :func:`refine_output_error`. ``log``: preprocessed (q, dq, tau at a uniform rate)."""
    if not isinstance(log, Log) or log.tau is None or log.dq is None:
        raise IdentificationError("simulation_error: log: expected a preprocessed jaxarm Log with q, dq and tau")
    dt, steps, first, idx, u = _window_data(log, window, stride, max_windows)
    q = np.asarray(_simulated_positions(arm, jnp.asarray(log.q[first]), jnp.asarray(log.dq[first]), jnp.asarray(u), dt, steps))
    return np.sqrt(np.mean((q - log.q[idx]) ** 2, axis=(0, 1)))


def refine_output_error(
    arm: Arm,
    log: Log,
    *,
    window: float = 0.1,
    stride: float | None = None,
    starts=(),
    max_windows: int = 64,
    iterations: int = 15,
    torque_weight: float = 1.0,
    prior_weight: float = 1e-4,
    position_scale: float | None = None,
) -> OutputErrorFit:
    """Refine ``arm`` so that simulations driven by the logged torques reproduce the logged
    positions (module docstring).

    log: a preprocessed log (uniform rate; q, dq, ddq, tau, e.g. from :func:`jaxarm.preprocess_log`),
        usually the one the inverse-dynamics fit used.
    window: seconds simulated from each measured start; ``stride`` seconds between window starts
        (default: ``window``, windows end to end); at most ``max_windows`` windows, evenly spread.
    starts: other starting arms besides ``arm`` (e.g. the nominal model, perturbed copies); all
        are refined at once (one ``vmap``) and the lowest final cost wins.
    iterations: Levenberg-Marquardt steps. torque_weight: weight of the torque error relative to
        the position error (0: pure output error). prior_weight: pull towards each start's own
        free variables. position_scale: the position error [rad or m] that counts as much as the
        starting arm's RMS torque error on each joint (default: the starting arm's RMS position
        error on each joint; module docstring).
    """
    func = "refine_output_error"
    if not isinstance(log, Log) or log.tau is None or log.dq is None or log.ddq is None:
        raise IdentificationError(f"{func}: log: expected a preprocessed jaxarm Log with q, dq, ddq and tau (jaxarm.preprocess_log)")
    if log.n != arm.n:
        raise IdentificationError(f"{func}: log has {log.n} joints, the arm {arm.name!r} has {arm.n}")
    for name, value in (("window", window), ("position_scale", 1.0 if position_scale is None else position_scale)):
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"{func}: {name}: expected a positive number, got {value!r}")
    for name, value in (("torque_weight", torque_weight), ("prior_weight", prior_weight)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{func}: {name}: expected a number >= 0, got {value!r}")
    try:
        dt, steps, first, idx, u = _window_data(log, window, stride, max_windows)
    except IdentificationError as exc:
        raise IdentificationError(f"{func}: {exc}") from None
    data = {"q0": log.q[first], "qd0": log.dq[first], "u": u,
            "q": log.q[idx], "qd": log.dq[idx], "qdd": log.ddq[idx], "tau": log.tau[idx],
            "q_scale": np.ones(arm.n), "tau_scale": np.ones(arm.n)}
    unit = {"dt": np.float64(dt), "torque_weight": np.float64(1.0), "prior_weight": np.float64(0.0)}
    template = jax.tree_util.tree_map(np.asarray, arm)
    x_arm = _pack(arm)
    shape = (len(first), steps, arm.n)
    d = jax.tree_util.tree_map(jnp.asarray, data)
    e_q, e_tau = _split(np.asarray(_residuals(jnp.asarray(x_arm[None]), jnp.asarray(x_arm[None]), template, d, unit))[0], shape)
    q_rms, tau_rms = (np.sqrt(np.mean(e**2, axis=(0, 1))) for e in (e_q, e_tau))
    if position_scale is None:  # each joint's position error relative to the starting arm's
        q_scale = np.maximum(q_rms, 1e-9 * max(float(np.max(q_rms)), 1e-300))
    else:
        q_scale = np.full(arm.n, float(position_scale))
    data["q_scale"] = q_scale
    data["tau_scale"] = np.maximum(tau_rms, 1e-9 * max(float(np.max(tau_rms)), 1e-300))
    cfg = {"dt": np.float64(dt), "torque_weight": np.float64(torque_weight), "prior_weight": np.float64(prior_weight)}
    candidates = [arm, *starts]
    for k, other in enumerate(candidates[1:]):
        if not isinstance(other, Arm) or other.n != arm.n or other.joint_types != arm.joint_types:
            raise ValueError(f"{func}: starts[{k}]: expected an Arm like {arm.name!r}")
    x0s = np.stack([x_arm] + [_pack(a) for a in candidates[1:]])
    d = jax.tree_util.tree_map(jnp.asarray, data)
    xs, cost, cost_start = _levenberg_marquardt(x0s, template, d, cfg, int(iterations))
    if not np.any(np.isfinite(cost)):
        raise IdentificationError(f"{func}: every simulation diverged; shorten the window")
    best = int(np.nanargmin(cost))
    fitted = jax.tree_util.tree_map(lambda v: np.asarray(v, dtype=np.float64), _unpack(jnp.asarray(xs[best]), template))
    cfg_plain = {**cfg, "torque_weight": np.float64(1.0), "prior_weight": np.float64(0.0)}
    after, before = (_split(r, shape) for r in np.asarray(_residuals(jnp.asarray(np.stack([xs[best], x0s[0]])),
                                                                        jnp.asarray(np.stack([x0s[best], x0s[0]])), template, d, cfg_plain)))

    def rms(e, scale):
        return np.sqrt(np.mean(np.square(e * scale), axis=(0, 1)))

    improved = cost[best] < cost_start[best]
    return OutputErrorFit(
        arm=fitted,
        position_rmse=rms(after[0], q_scale), position_rmse_start=rms(before[0], q_scale),
        torque_rmse=rms(after[1], data["tau_scale"]), torque_rmse_start=rms(before[1], data["tau_scale"]),
        cost=cost, cost_start=cost_start, best=best, iterations=int(iterations),
        windows=len(first), window_steps=steps, position_scale=q_scale, torque_scale=data["tau_scale"],
        message=(f"start {best} kept: cost {cost_start[best]:.4g} -> {cost[best]:.4g}" if improved
                 else "no start improved on its cost; the arm is returned unchanged"),
    )
