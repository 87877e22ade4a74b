"""Extended and unscented Kalman filters on the arm's discrete dynamics (NASA simulation report,
appendix E: estimation beside identification and control; Simon 2006, Ch. 13-14).

State x = (q, qd) (2n), optionally augmented with external joint torques e (n), with the drives'
torque errors d (n) (when joint torque sensors are measured) and with chosen physical parameters
theta (joint state-parameter estimation, e.g. a payload's mass), all following random walks.
Between samples the state moves by one integrator step of :func:`jaxarm.rollout` under the joint
torque tau = tau_drive(u, qd) + d + e + w. The input u is what the log records: joint torques
(``input="torque"``), motor currents (``"current"``: tau_drive = G Kt i) or motor voltages
(``"voltage"``: tau_drive = G Kt (V - Kt G qd) / R, Swartz eq 12). The white torque noise w ~ N(0,
diag(torque_std^2)) is the dominant process noise of a real arm (unmodelled friction, torque
ripple, model error), mapped into the state by the step's Jacobian G = dx+/dw.

Measurements, in the order ``measure`` names them (n values each):

- ``"q"``: joint positions (encoders; quantization of step D adds D^2 / 12 to the variance);
- ``"qd"``: joint velocities;
- ``"tau"``: link-side joint torque sensors (as on the Franka Panda and the KUKA LWR: between the
  drive and the link, after the drive's friction and rotor): the torque the drive passes to the
  link, tau_J = tau_drive(u, qd) + d - tau_friction(qd) - G^2 Jm qdd, with qdd the acceleration of
  the state under tau. The sensor sees the drive's error d but not the external torque e (which
  acts on the link side) nor the link model's error w: with both d and e in the state, a torque
  that shows in the motion but not in the sensor is told apart from one the drive produced;
- ``"current"``: motor currents under voltage input, i = (V - Kt G qd) / R (Swartz eq 11): the
  back-EMF makes them a measurement of the joint velocity.

One ``lax.scan`` per log; a batch of logs (a leading axis on ``u`` and ``z``) runs as
one ``vmap``-ed call. Offline, the Rauch-Tung-Striebel smoother (Rauch, Tung & Striebel 1965) runs
a second scan backwards.

Extended filter (``variant="extended"``): Jacobians F, G of the step by forward-mode autodiff (the
step's primal pass computed once and read by every direction: :func:`jaxarm.core.xla.jacobians_once`),

    predict: x- = f(x, u), P- = F P F^T + G W G^T (+ e's random walk)
             (f: the step, then the joints' end stops as in :func:`jaxarm.rollout`; F, G: of the
             step alone, see ``stops`` in :func:`kalman_filter`)
    update:  K = P- H^T (H P- H^T + R)^-1, x = x- + K (z - h(x-)), P = (I - K H) P- (I - K H)^T + K R K^T

with H = dh/dx at the prediction (the positions and velocities are linear, H a selection; the
torque-sensor and current models are linearized by forward-mode autodiff).

Unscented filter (``variant="unscented"``; Julier & Uhlmann 2004, Wan & van der Merwe 2000): the
state and the torque noise, (x, w) ~ N((x, 0), diag(P, W)), are represented by the 2(d + n) points
(x, 0) +- sqrt(d + n) L_i (L the Cholesky factor, the spherical set with no centre weight, all
weights 1 / (2(d + n)), which keeps the covariance positive); each moves by one step under the
torque noise w of its point, and the predicted mean and covariance are those of the moved points.
No derivatives are taken, and the prediction is exact to second order in the spread (first order
for the extended filter). Measurements that are nonlinear in the state (torque sensors, currents)
go through the same transform: the points of the prediction N(x-, P-) give the predicted
measurement, its covariance S and the cross-covariance C, and K = C S^-1. The smoother uses
the points' cross-covariance D = cov(x, x-) as the statistically linearized F = D^T P^-1
(Saerkkae 2008).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import jax.scipy.linalg  # noqa: F401  (jax.scipy.linalg.block_diag)
import numpy as np

from ..core.xla import jacobians_once, jit
from ..dynamics import drives, linalg, motors
from ..dynamics.forward import _forward_dynamics
from ..model import checks
from ..model.arm import Arm
from ..simulate import integrators
from ..simulate.batch import _ConstantArm
from ..simulate.rollouts import end_stops

SENSORS = ("q", "qd", "tau", "current")
INPUTS = ("torque", "current", "voltage")


def _blocks(n: int, external: bool, actuator: bool):
    """Start of e, start of d and start of theta in the state (q, qd[, e][, d][, theta])."""
    e0 = 2 * n
    d0 = e0 + (n if external else 0)
    return e0, d0, d0 + (n if actuator else 0)


def _split(arm: Arm, x, external: bool, actuator: bool, parameters):
    """(q, qd, e, d, the arm the state's theta gives); e, d zero where not estimated."""
    n = arm.n
    e0, d0, p0 = _blocks(n, external, actuator)
    zero = jnp.zeros(n, x.dtype)
    e = x[e0:e0 + n] if external else zero
    d = x[d0:d0 + n] if actuator else zero
    if parameters is not None:
        arm = parameters(arm, x[p0:])
    return x[:n], x[n:2 * n], e, d, arm


def _transition(arm: Arm, x, u, dt, method, external: bool, parameters=None, *, input: str = "torque",
                actuator: bool = False, w=None):
    """x_{k+1} of x_k under the input u held over the step: x = (q, qd[, e][, d][, theta]); the joint
    torque is the drives' torque from u plus the drive error d, the external torque e and the
    torque noise w (the process noise, default zero); ``parameters(arm, theta)`` gives the arm the
    step uses; e, d and theta are carried over unchanged (random walks)."""
    n = arm.n
    q, qd, e, d, arm = _split(arm, x, external, actuator, parameters)
    extra = e + d + (0.0 if w is None else w)

    def accel(t, a, b):
        return _forward_dynamics(arm, a, b, motors._input_torque(arm, u, b, input) + extra)

    q1, qd1, _ = integrators.get_method(method)(accel, 0.0, q, qd, dt)
    return jnp.concatenate([q1, qd1, x[2 * n:]])


def _measurement(arm: Arm, x, u, measure, input: str, external: bool, actuator: bool, parameters):
    """h(x, u): the sensors ``measure`` of the state x under the input u held from this sample on
    (module docstring)."""
    q, qd, e, d, arm = _split(arm, x, external, actuator, parameters)
    out = []
    for name in measure:
        if name == "q":
            out.append(q)
        elif name == "qd":
            out.append(qd)
        elif name == "tau":  # link side of the drive: its torque less its friction and rotor inertia
            drive = motors._input_torque(arm, u, qd, input) + d
            qdd = _forward_dynamics(arm, q, qd, drive + e)
            out.append(drive - drives._friction_torques(arm, qd) - drives._reflected_inertia(arm) * qdd)
        else:  # "current" under voltage input (Swartz eq 11)
            out.append(motors._motor_current(arm, u, qd))
    return jnp.concatenate(out)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Config:
    method: str
    external: bool
    measure: tuple
    parameters: object = None  # parameters(arm, theta) -> arm, or None
    smooth: bool = False
    variant: str = "extended"
    input: str = "torque"
    stops: bool = True  # the joints' end stops act on the predicted state (as in jaxarm.rollout)

    @property
    def actuator(self) -> bool:  # the drives' torque errors d are states when torque sensors are read
        return "tau" in self.measure

    @property
    def linear(self) -> bool:  # positions and velocities only: h(x) = H x
        return all(name in ("q", "qd") for name in self.measure)


VARIANTS = ("extended", "unscented")


def _at_end_stops(arm, x, stops: bool):
    """The state x with its (q, qd) put through the arm's end stops (:func:`jaxarm.simulate.rollouts.end_stops`,
    as :func:`jaxarm.rollout` applies them after every step); x itself when ``stops`` is False."""
    if not stops:
        return x
    n = arm.n
    lims = jnp.asarray(arm.limits.position, x.dtype)
    q, qd, _ = end_stops(x[:n], x[n:2 * n], lims[:, 0], lims[:, 1])
    return jnp.concatenate([q, qd, x[2 * n:]])


def _sigma_offsets(P):
    """The 2d offsets +- sqrt(d) L_i of the spherical sigma-point set of N(0, P) (weights 1 / (2d))."""
    d = P.shape[0]
    dx = jnp.sqrt(jnp.asarray(d, P.dtype)) * linalg.cholesky_factor_columns(P).T
    return jnp.concatenate([dx, -dx])


def _unscented_predict(f, x, P, torque_var):
    """Mean and covariance of f(x, w) for x ~ N(x, P), w ~ N(0, diag(torque_var)) by the
    unscented transform (module docstring), and the statistically linearized F = cov(x, x-)^T P^-1."""
    d, n = x.shape[0], torque_var.shape[0]
    D = d + n
    offsets = _sigma_offsets(jax.scipy.linalg.block_diag(P, jnp.diag(torque_var)))  # 2D points, weights 1 / (2D)
    dx, dw = offsets[:, :d], offsets[:, d:]
    Y = jax.vmap(lambda a, b: f(x + a, b))(dx, dw)
    mean = jnp.mean(Y, axis=0)
    dY = Y - mean
    P_pred = dY.T @ dY / (2 * D)
    cross = dx.T @ dY / (2 * D)  # cov(x, x-) (d, d)
    F = linalg.spd_solve(P, cross).T  # cross = P F^T
    return mean, 0.5 * (P_pred + P_pred.T), F


def _filter_body(arm, u, z, x0, P0, dt, torque_var, walk_var, R, cfg: _Config):
    """Forward pass (and, with cfg.smooth, the Rauch-Tung-Striebel backward pass)."""
    d = x0.shape[0]
    n = arm.n
    k0 = d - walk_var.shape[0]  # e, d and theta: random walks of intensity walk_var
    Qe = jnp.zeros((d, d), x0.dtype).at[k0:, k0:].set(jnp.diag(walk_var * dt))
    u_at = jnp.concatenate([u, u[-1:]])  # the input held from each sample on (the last: the last input)

    def h(x, uk):
        return _measurement(arm, x, uk, cfg.measure, cfg.input, cfg.external, cfg.actuator, cfg.parameters)

    # the innovation covariance S and the predicted covariance P_pred are symmetric positive
    # definite: solved by a Cholesky factorization one column per trip of a loop
    # (jaxarm.dynamics.linalg.spd_solve), not by the library's LU, whose calls kept XLA:CPU from
    # compiling the loop over the samples as one kernel (Panda, encoders, 1 kHz, 2-core CPU,
    # `python experiments/estimation_panda.py --only speed --batch 16`: the extended filter 70 -> 31
    # us a step, 16 at once 78 -> 49 us a step each; the unscented one, whose sigma points dominate,
    # 42 -> 38 us; first calls 6.4 -> 7.4 s in that pair of runs)
    def update(x, P, zk, uk):
        if cfg.linear or cfg.variant == "extended":
            if cfg.linear:  # a selection of q and qd
                eye = jnp.eye(d, dtype=x.dtype)
                H = jnp.concatenate([eye[:n] if name == "q" else eye[n:2 * n] for name in cfg.measure])
                predicted = H @ x
            else:
                # (torque sensors: their model's forward dynamics once, as the step's below; the
                # filter with torque sensors, first calls: 16 logs 43-44 -> 26.5-27.7 s, one 21 -> 10 s)
                predicted, (H,) = jacobians_once(lambda xx: h(xx, uk), x)
            S = H @ P @ H.T + R
            L = linalg.cholesky_factor_columns(S)
            K = linalg.cholesky_solve_columns(L, H @ P).T  # P H^T S^-1 (S, P symmetric)
            A = jnp.eye(d, dtype=x.dtype) - K @ H
            P_new = A @ P @ A.T + K @ R @ K.T  # Joseph form
        else:  # the unscented transform of the prediction through h
            offsets = _sigma_offsets(P)
            Z = jax.vmap(lambda a: h(x + a, uk))(offsets)
            predicted = jnp.mean(Z, axis=0)
            dZ = Z - predicted
            S = dZ.T @ dZ / offsets.shape[0] + R
            C = offsets.T @ dZ / offsets.shape[0]  # cov(x, z) (d, m)
            L = linalg.cholesky_factor_columns(S)
            K = linalg.cholesky_solve_columns(L, C.T).T
            P_new = P - K @ S @ K.T
        innovation = zk - predicted
        x = x + K @ innovation
        nis = innovation @ linalg.cholesky_solve_columns(L, innovation)
        return x, 0.5 * (P_new + P_new.T), nis

    # the first sample's update runs inside the time loop as every other's (its prediction computed
    # and not used): a nonlinear measurement model (torque sensors, currents) is then compiled once
    # rather than twice
    def step(carry, inputs):
        x, P = carry
        k, uk, zk, uk_next = inputs
        f = lambda xx, ww: _transition(arm, xx, uk, dt, cfg.method, cfg.external, cfg.parameters,  # noqa: E731
                                       input=cfg.input, actuator=cfg.actuator, w=ww)
        w0 = jnp.zeros(n, x.dtype)
        if cfg.variant == "unscented":
            x_pred, P_pred, F = _unscented_predict(f, x, P, torque_var)
            P_pred = P_pred + Qe
        else:
            # forward mode with the step's primal pass and the values its tangents read computed
            # once (jaxarm.core.xla.jacobians_once): with jax.jacfwd in one piece, XLA:CPU fused
            # the step's dynamics into each Jacobian entry, worst under vmap (Panda, encoders,
            # 16 filters x 200 steps, 2-core Intel Xeon: first call 14.6-14.9 -> 6.0-6.1 s,
            # warm 90 -> 55-59 ms; one filter 3.8-3.9 -> 3.5-3.6 s and 5.4-5.8 -> 4.4 ms)
            x_pred, (F, G) = jacobians_once(f, x, w0)
            P_pred = F @ P @ F.T + G @ jnp.diag(torque_var) @ G.T + Qe
        # the end stops: the predicted mean is projected onto them (estimate projection: Simon 2010,
        # IET CTA 4(8)), its covariance that of the step without them: differentiated through the
        # stop, a joint on it would get zero variance and stop reading its measurements
        x_pred = _at_end_stops(arm, x_pred, cfg.stops)
        first = k == 0  # the first sample: no step before it
        x_pred, P_pred = jnp.where(first, x, x_pred), jnp.where(first, P, P_pred)
        x, P, nis = update(x_pred, P_pred, zk, uk_next)
        return (x, P), (x, P, nis, x_pred, P_pred, F)

    ks = jnp.arange(z.shape[0])
    _, (xs, Ps, nis, x_preds, P_preds, Fs) = jax.lax.scan(step, (x0, P0), (ks, jnp.concatenate([u[:1], u]), z, u_at))
    x_preds, P_preds, Fs = x_preds[1:], P_preds[1:], Fs[1:]  # the predictions of samples 1 .. N-1
    if not cfg.smooth:
        return xs, Ps, nis

    def back(carry, inputs):
        # Rauch, Tung & Striebel 1965: C = P F^T P_pred^-1, x_s = x + C (x_s' - x_pred'), P_s = P + C (P_s' - P_pred') C^T
        xs_next, Ps_next = carry
        x, P, x_pred, P_pred, F = inputs
        C = linalg.spd_solve(P_pred, F @ P).T
        x_s = x + C @ (xs_next - x_pred)
        P_s = P + C @ (Ps_next - P_pred) @ C.T
        P_s = 0.5 * (P_s + P_s.T)
        return (x_s, P_s), (x_s, P_s)

    _, (x_s, P_s) = jax.lax.scan(back, (xs[-1], Ps[-1]), (xs[:-1], Ps[:-1], x_preds, P_preds, Fs), reverse=True)
    return jnp.concatenate([x_s, xs[-1:]]), jnp.concatenate([P_s, Ps[-1:]]), nis


_filter = jit(_filter_body)  # the arm as data: one compiled program per arm structure


@functools.partial(jit, static_argnames=("constant", "batched", "per_filter"))
def _filter_folded(u, z, x0, P0, dt, torque_var, walk_var, R, cfg: _Config, *, constant, batched: bool,
                   per_filter: bool = False):
    """The filter with a known arm compiled in (``constant``: :class:`jaxarm.simulate.batch._ConstantArm`),
    so that the dynamics fold its structural zeros, as ``rollout_batch`` does: the Panda's filter
    compiles in about half the time and runs about 3x faster than with the arm as data. A batch of
    logs is vmapped over u, z and x0."""

    def run(uu, zz, xx, P0, torque_var, walk_var, R):
        return _filter_body(constant.arm, uu, zz, xx, P0, dt, torque_var, walk_var, R, cfg)

    if not batched:
        return run(u, z, x0, P0, torque_var, walk_var, R)
    s_ax = 0 if per_filter else None  # settings per filter, or shared
    return jax.vmap(run, in_axes=(0, 0, 0, s_ax, s_ax, s_ax, s_ax))(u, z, x0, P0, torque_var, walk_var, R)


@dataclasses.dataclass(frozen=True)
class KalmanEstimate:
    """Result of :func:`kalman_filter`: ``q``, ``qd`` (N, n) filtered states,
    ``external`` (N, n) external joint torques (None unless estimated), ``actuator`` (N, n) the
    drives' torque errors d (None unless joint torque sensors are read), ``covariance`` (N, d, d)
    of the state ``(q, qd[, e][, d][, theta])``, ``std`` (N, d) its square-rooted diagonal, ``nis`` (N,)
    normalized innovation squared of the forward pass (chi-square with as many degrees of freedom
    as measurements when the noise model is right), ``parameters`` (N, p) the estimated physical
    parameters theta (None unless estimated); ``smoothed``: the states are the RTS smoother's."""

    q: np.ndarray
    qd: np.ndarray
    external: np.ndarray | None
    covariance: np.ndarray
    std: np.ndarray
    nis: np.ndarray
    parameters: np.ndarray | None = None
    smoothed: bool = False
    variant: str = "extended"
    actuator: np.ndarray | None = None


def extended_kalman_filter(arm: Arm, u, z, **options) -> KalmanEstimate:
    """:func:`kalman_filter` with ``variant="extended"`` (Jacobians by autodiff)."""
    return kalman_filter(arm, u, z, variant="extended", **options)


def unscented_kalman_filter(arm: Arm, u, z, **options) -> KalmanEstimate:
    """:func:`kalman_filter` with ``variant="unscented"`` (sigma points, no derivatives)."""
    return kalman_filter(arm, u, z, variant="unscented", **options)


def kalman_filter(
    arm: Arm,
    u,
    z,
    *,
    dt: float,
    q0,
    qd0=None,
    torque_std=0.1,
    position_std=1e-4,
    velocity_std=None,
    quantization=0.0,
    measure=("q",),
    input: str = "torque",
    torque_sensor_std=None,
    current_std=None,
    actuator_std=None,
    external_std=None,
    initial_std=None,
    method: str = "rk3",
    parameters=None,
    theta0=None,
    theta_std=None,
    theta_walk=None,
    smooth: bool = False,
    stops: bool = True,
    variant: str = "extended",
    dtype=None,
) -> KalmanEstimate:
    """Filter the states of ``arm`` (module docstring) from the logged inputs ``u`` (N - 1, n),
    held over each step of ``dt`` seconds, and measurements ``z`` (N, m) at the N sample times, n
    columns per sensor in the order of ``measure``: any of "q" (encoders), "qd" (velocities),
    "tau" (link-side joint torque sensors), "current" (motor currents, voltage input), "q" first
    (e.g. ``("q",)``, m = n; ``("q", "tau")``, m = 2n).
    input: what ``u`` is: "torque" (joint torques [N m]), "current" (motor currents [A], joint
    torque G Kt i) or "voltage" (motor voltages [V], Swartz eq 12); the last two need the arm's
    motor constants.
    A batch of B logs of the same length: ``u`` (B, N - 1, n), ``z`` (B, N, m) and ``q0``, ``qd0``
    (n,) or (B, n); they are filtered in one ``vmap``-ed call.

    variant: "extended" (Jacobians by autodiff) or "unscented" (sigma points; module docstring).
    dtype: the filter's floating type (default: JAX's default float, float64 with x64 enabled);
    ``jnp.float32`` runs it in single precision.

    Any noise setting below may instead be a (B, size) array, one row per filter: B filters with
    different settings run in one ``vmap``-ed call, on one log (repeated) or on B logs (one each).
    torque_std (scalar or (n,)): the standard deviation of the torque the arm feels around ``u``
    [N m] (for every input kind: the link model's error); position_std, velocity_std,
    torque_sensor_std [N m], current_std [A]: sensor noise; quantization: the encoders' step
    [rad] (adds step^2 / 12). With "tau" measured, the drives' torque errors d are estimated as a
    random walk of intensity ``actuator_std`` (scalar or (n,), N m / sqrt(s); default 1), the
    sensors' view of the drive (``KalmanEstimate.actuator``), apart from the external torques e. external_std (scalar or (n,), N m / sqrt(s)): estimate external joint
    torques as a random walk of this intensity. q0, qd0 (default 0): the starting estimate, with
    standard deviations ``initial_std`` (2n, plus n for e and n for d where estimated) (default:
    10 x position_std for q, 1 rad/s for qd, 10 x torque_std for e and d).
    Joint state-parameter estimation (online identification): ``parameters(arm, theta) -> arm``, a
    traceable function giving the arm for a parameter vector theta (p,) (e.g. ``lambda arm, th:
    arm.replace(payload=jaxarm.Payload(th[0], com, inertia))`` for a payload's mass), starting at
    ``theta0`` with standard deviations
    ``theta_std`` and following a random walk of intensity ``theta_walk`` (default 1e-6 theta_std
    per sqrt(s): nearly constant).
    smooth: run the Rauch-Tung-Striebel smoother backwards after the filter (offline use: every
    estimate then uses the whole log).
    stops: the joints' position limits (``arm.limits.position``) act as the rigid end stops
        :func:`jaxarm.rollout` simulates (its default): the predicted positions and velocities are
        put through them (the estimate projected onto the stops, Simon 2010; the covariance is the
        step's without them, so a joint on its stop still reads its measurements). Without them a
        joint that reaches a stop is predicted to go on moving: on a simulated 1 s Panda log in
        which five joints ran into their stops, encoders read to 1e-4 rad, the filter drifted up
        to 0.17 rad from the true positions (mean NIS 5.6e5 for 7 measurements); with them
        2.7e-4 rad (mean NIS 6.1). False leaves them out (a log of an arm whose stops are not
        those of ``arm.limits.position``).
    """
    func = f"{variant}_kalman_filter" if variant in VARIANTS else "kalman_filter"
    if variant not in VARIANTS:
        raise ValueError(f"{func}: variant: expected one of {VARIANTS}, got {variant!r}")
    checks.check_arm(arm, func)
    measure = (measure,) if isinstance(measure, str) else tuple(measure)
    if not measure or any(name not in SENSORS for name in measure) or len(set(measure)) != len(measure) \
            or "q" not in measure:
        raise ValueError(f"{func}: measure: expected distinct sensor names from {SENSORS}, the encoders 'q' among "
                         f"them (e.g. ('q',) or ('q', 'tau')), got {measure!r}")
    if input not in INPUTS:
        raise ValueError(f"{func}: input: expected one of {INPUTS} (what u is), got {input!r}")
    if "current" in measure and input != "voltage":
        raise ValueError(f"{func}: measure: motor currents are a measurement under voltage input (input='voltage'); "
                         f"with input={input!r} they are {'the input itself' if input == 'current' else 'not modelled'}")
    if input != "torque" or "current" in measure:
        motors._require_motor_model(arm, func)
    n = arm.n
    u = np.asarray(u, dtype=float)
    z = np.asarray(z, dtype=float)
    m = n * len(measure)
    batched = z.ndim == 3
    lead = z.shape[:1] if batched else ()
    if z.ndim not in (2, 3) or z.shape[-1] != m or z.shape[-2] < 2:
        raise ValueError(f"{func}: z: expected shape (N, {m}) ({' and '.join(measure)} of {n} joints), or (B, N, {m}) "
                         f"for a batch of logs, got {z.shape}")
    if u.shape != lead + (z.shape[-2] - 1, n):
        want = ", ".join(str(v) for v in lead + (z.shape[-2] - 1, n))
        raise ValueError(f"{func}: u: expected shape ({want}), one torque per step between the samples, got {u.shape}")
    for name, x in (("u", u), ("z", z)):
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{func}: {name}: expected finite values")
    if not (np.isfinite(dt) and dt > 0):
        raise ValueError(f"{func}: dt: expected a positive time step, got {dt!r}")

    # filter settings per filter: a noise setting given as a (B, size) array runs B filters, one per row
    # (on one log, or on B logs), in the same vmap-ed call
    settings = {"torque_std": torque_std, "position_std": position_std, "velocity_std": velocity_std,
                "torque_sensor_std": torque_sensor_std, "current_std": current_std, "external_std": external_std,
                "actuator_std": actuator_std, "initial_std": initial_std}
    rows = {name: np.shape(v)[0] for name, v in settings.items() if v is not None and np.ndim(v) == 2}
    if len(set(rows.values())) > 1 or (rows and batched and set(rows.values()) != {lead[0]}):
        raise ValueError(f"{func}: settings given per filter (2-D: {', '.join(rows)}) must all have the same number of rows"
                         f"{f', the number of logs {lead[0]}' if batched else ''}, got {rows}")
    per_filter = bool(rows)
    if per_filter and not batched:  # one log, B settings
        lead = (next(iter(rows.values())),)
        u = np.broadcast_to(u, lead + u.shape)
        z = np.broadcast_to(z, lead + z.shape)
        batched = True

    def positive(value, name, size):
        a = np.asarray(value, dtype=float)
        shape = lead + (size,) if per_filter and a.ndim == 2 else (size,)
        try:
            v = np.broadcast_to(a, shape).copy()
        except ValueError:
            raise ValueError(f"{func}: {name}: expected a number, shape ({size},) or, one row per filter, "
                             f"({lead[0] if batched else 'B'}, {size}); got shape {a.shape}") from None
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(f"{func}: {name}: expected positive numbers, got {value!r}")
        return v

    def each(a):  # a setting (size,) or (B, size) as (B, size) when settings are per filter
        return np.broadcast_to(a, lead + a.shape[-1:]) if per_filter else a

    torque_var = positive(torque_std, "torque_std", n) ** 2
    pos_var = positive(position_std, "position_std", n) ** 2 + float(quantization) ** 2 / 12.0
    sensor_var = {"q": pos_var}
    for name, std, what in (("qd", velocity_std, "velocity_std"), ("tau", torque_sensor_std, "torque_sensor_std"),
                            ("current", current_std, "current_std")):
        if name in measure:
            if std is None:
                raise ValueError(f"{func}: {what}: required when {name!r} is measured")
            sensor_var[name] = positive(std, what, n) ** 2
    R_diag = np.concatenate([each(sensor_var[name]) for name in measure], axis=-1)
    R = R_diag[..., :, None] * np.eye(R_diag.shape[-1])
    external = external_std is not None
    ext_var = positive(external_std, "external_std", n) ** 2 if external else np.zeros(0)
    actuator = "tau" in measure
    if actuator_std is not None and not actuator:
        raise ValueError(f"{func}: actuator_std: the drives' torque errors are estimated only where joint torque "
                         f"sensors are read (measure with 'tau')")
    act_var = positive(1.0 if actuator_std is None else actuator_std, "actuator_std", n) ** 2 if actuator else np.zeros(0)
    p = 0
    if parameters is not None:
        if not callable(parameters) or theta0 is None or theta_std is None:
            raise ValueError(f"{func}: parameters: expected a function parameters(arm, theta) -> arm with theta0 and theta_std")
        theta0 = np.atleast_1d(np.asarray(theta0, dtype=float))
        p = theta0.size
        theta_std = positive(theta_std, "theta_std", p)
        walk = positive(1e-6 * theta_std if theta_walk is None else theta_walk, "theta_walk", p) ** 2
        try:
            probe = parameters(arm, jnp.asarray(theta0))
        except Exception as exc:  # a user function: say which input broke it
            raise ValueError(f"{func}: parameters(arm, theta0) failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(probe, Arm) or probe.n != n:
            raise ValueError(f"{func}: parameters: expected parameters(arm, theta) to return an Arm with {n} joints")
    else:
        walk = np.zeros(0)
    def start(value, name):
        v = np.asarray(value, dtype=float)
        if v.shape not in ((n,),) + ((lead + (n,),) if batched else ()):
            raise ValueError(f"{func}: {name}: expected shape ({n},){f' or ({lead[0]}, {n})' if batched else ''}, got {v.shape}")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{func}: {name}: expected finite values")
        return np.broadcast_to(v, lead + (n,))

    q0 = start(q0, "q0")
    qd0 = start(np.zeros(n) if qd0 is None else qd0, "qd0")
    e0, d0, k = _blocks(n, external, actuator)
    x0 = np.concatenate([q0, qd0] + [np.zeros(lead + (n,))] * (external + actuator)
                        + ([np.broadcast_to(theta0, lead + (p,))] if p else []), axis=-1)
    if initial_std is None:
        std0 = np.concatenate([each(10 * np.sqrt(pos_var)), each(np.ones(n))]
                              + [each(10 * np.sqrt(torque_var))] * (external + actuator), axis=-1)
    else:
        std0 = each(positive(initial_std, "initial_std", k))
    if p:
        std0 = np.concatenate([std0, each(theta_std)], axis=-1)
    if not isinstance(stops, (bool, np.bool_)):
        raise ValueError(f"{func}: stops: expected True or False, got {stops!r}")
    cfg = _Config(method=str(method), external=external, measure=measure, parameters=parameters, smooth=bool(smooth),
                  variant=variant, input=input, stops=bool(stops))
    integrators.get_method(method)
    dtype = jnp.zeros(0).dtype if dtype is None else jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{func}: dtype: expected a floating type such as jnp.float32, got {dtype}")

    def cast(a):
        return jnp.asarray(a, dtype)

    walk_var = np.concatenate([each(ext_var), each(act_var), each(walk)], axis=-1)
    data = (cast(u), cast(z), cast(x0), cast(std0[..., :, None] ** 2 * np.eye(std0.shape[-1])), cast(float(dt)),
            cast(each(torque_var)), cast(walk_var), cast(R))
    if checks.concrete(arm):  # compiled in (folded), once per arm value
        arm_np = jax.tree_util.tree_map(
            lambda a: np.asarray(a, dtype) if np.issubdtype(np.asarray(a).dtype, np.floating) else np.asarray(a), arm)
        xs, Ps, nis = _filter_folded(*data, cfg, constant=_ConstantArm(arm_np), batched=batched, per_filter=per_filter)
    else:
        arm_d = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a, arm)
        run = _filter
        if batched:
            s_ax = 0 if per_filter else None
            run = jax.vmap(_filter, in_axes=(None, 0, 0, 0, s_ax, None, s_ax, s_ax, s_ax, None))
        xs, Ps, nis = run(arm_d, *data, cfg)
    xs, Ps = np.asarray(xs), np.asarray(Ps)
    return KalmanEstimate(q=xs[..., :n], qd=xs[..., n:2 * n], external=xs[..., e0:e0 + n] if external else None,
                          covariance=Ps, std=np.sqrt(np.einsum("...kii->...ki", Ps)), nis=np.asarray(nis),
                          parameters=xs[..., k:] if p else None, smoothed=bool(smooth), variant=variant,
                          actuator=xs[..., d0:d0 + n] if actuator else None)
