"""Extended and unscented Kalman filters on the arm's discrete dynamics (NASA simulation report,
appendix E: estimation beside identification and control; Simon 2006, Ch. 13-14).

State x = (q, qd) (2n), optionally augmented with external joint torques e (n) and with chosen
physical parameters theta (joint state-parameter estimation, e.g. a payload's mass), both
following random walks. Between samples the state moves by one integrator step of :func:`jaxarm.rollout`
under the applied joint torque u (plus e), and the torque is uncertain: u + w with w ~ N(0,
diag(torque_std^2)), the dominant process noise of a real arm (unmodelled friction, torque ripple,
model error), mapped into the state by the step's input Jacobian G. Measurements are joint
positions (encoders; quantization of step D adds D^2 / 12 to the variance) and optionally joint
velocities. One ``lax.scan`` per log; a batch of logs (a leading axis on ``u`` and ``z``) runs as
one ``vmap``-ed call. Offline, the Rauch-Tung-Striebel smoother (Rauch, Tung & Striebel 1965) runs
a second scan backwards.

Extended filter (``variant="extended"``): Jacobians F, G of the step by forward-mode autodiff,

    predict: x- = f(x, u), P- = F P F^T + G W G^T (+ e's random walk)
    update:  K = P- H^T (H P- H^T + R)^-1, x = x- + K (z - H x-), P = (I - K H) P- (I - K H)^T + K R K^T

Unscented filter (``variant="unscented"``; Julier & Uhlmann 2004, Wan & van der Merwe 2000): the
state and the torque noise, (x, w) ~ N((x, 0), diag(P, W)), are represented by the 2(d + n) points
(x, 0) +- sqrt(d + n) L_i (L the Cholesky factor, the spherical set with no centre weight, all
weights 1 / (2(d + n)), which keeps the covariance positive); each moves by one step under u + w,
and the predicted mean and covariance are those of the moved points. No derivatives are taken, and
the prediction is exact to second order in the spread (first order for the extended filter). The
measurements are linear in the state, so both filters share the update above. The smoother uses
the points' cross-covariance D = cov(x, x-) as the statistically linearized F = D^T P^-1
(Saerkkae 2008).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..core.xla import jit
from ..dynamics.forward import _forward_dynamics
from ..model import checks
from ..model.arm import Arm
from ..simulate import integrators
from ..simulate.batch import _ConstantArm

MEASUREMENTS = (("q",), ("q", "qd"))


def _transition(arm: Arm, x, u, dt, method, external: bool, parameters=None):
    """x_{k+1} of x_k under the torque u held over the step: x = (q, qd[, e][, theta]); external
    torques e are added to u, and ``parameters(arm, theta)`` gives the arm the step uses; e and
    theta are carried over unchanged (random walks)."""
    n = arm.n
    q, qd = x[:n], x[n:2 * n]
    tau = u + x[2 * n:3 * n] if external else u
    if parameters is not None:
        arm = parameters(arm, x[(3 if external else 2) * n:])
    q1, qd1, _ = integrators.get_method(method)(lambda t, a, b: _forward_dynamics(arm, a, b, tau), 0.0, q, qd, dt)
    return jnp.concatenate([q1, qd1, x[2 * n:]])


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Config:
    method: str
    external: bool
    measure: tuple
    parameters: object = None  # parameters(arm, theta) -> arm, or None
    smooth: bool = False
    variant: str = "extended"


VARIANTS = ("extended", "unscented")


def _unscented_predict(f, x, P, u, torque_var):
    """Mean and covariance of f(x, u + w) for x ~ N(x, P), w ~ N(0, diag(torque_var)) by the
    unscented transform (module docstring), and the statistically linearized F = cov(x, x-)^T P^-1."""
    d, n = x.shape[0], u.shape[0]
    D = d + n
    L = jnp.linalg.cholesky(P)
    scale = jnp.sqrt(jnp.asarray(D, x.dtype))
    dx = scale * jnp.concatenate([L.T, jnp.zeros((n, d), x.dtype)])  # rows: the offsets of the D directions
    dw = scale * jnp.concatenate([jnp.zeros((d, n), x.dtype), jnp.diag(jnp.sqrt(torque_var))])
    dx, dw = jnp.concatenate([dx, -dx]), jnp.concatenate([dw, -dw])  # 2D points, weights 1 / (2D)
    Y = jax.vmap(lambda a, b: f(x + a, u + b))(dx, dw)
    mean = jnp.mean(Y, axis=0)
    dY = Y - mean
    P_pred = dY.T @ dY / (2 * D)
    cross = dx.T @ dY / (2 * D)  # cov(x, x-) (d, d)
    F = jnp.linalg.solve(P, cross).T  # cross = P F^T
    return mean, 0.5 * (P_pred + P_pred.T), F


def _filter_body(arm, u, z, x0, P0, dt, torque_var, walk_var, R, cfg: _Config):
    """Forward pass (and, with cfg.smooth, the Rauch-Tung-Striebel backward pass)."""
    d = x0.shape[0]
    m = z.shape[1]
    H = jnp.eye(m, d, dtype=x0.dtype)  # measured: the first m state components (q, or q and qd)
    k0 = d - walk_var.shape[0]  # e and theta: random walks of intensity walk_var
    Qe = jnp.zeros((d, d), x0.dtype).at[k0:, k0:].set(jnp.diag(walk_var * dt))

    def update(x, P, zk):
        S = H @ P @ H.T + R
        K = jnp.linalg.solve(S, H @ P).T  # P H^T S^-1 (S, P symmetric)
        innovation = zk - H @ x
        x = x + K @ innovation
        A = jnp.eye(d, dtype=x.dtype) - K @ H
        P = A @ P @ A.T + K @ R @ K.T
        nis = innovation @ jnp.linalg.solve(S, innovation)
        return x, 0.5 * (P + P.T), nis

    x, P, nis0 = update(x0, P0, z[0])

    def step(carry, inputs):
        x, P = carry
        uk, zk = inputs
        f = lambda xx, uu: _transition(arm, xx, uu, dt, cfg.method, cfg.external, cfg.parameters)  # noqa: E731
        if cfg.variant == "unscented":
            x_pred, P_pred, F = _unscented_predict(f, x, P, uk, torque_var)
            P_pred = P_pred + Qe
        else:
            F, G = jax.jacfwd(f, argnums=(0, 1))(x, uk)
            x_pred = f(x, uk)
            P_pred = F @ P @ F.T + G @ jnp.diag(torque_var) @ G.T + Qe
        x, P, nis = update(x_pred, P_pred, zk)
        return (x, P), (x, P, nis, x_pred, P_pred, F)

    _, (xs, Ps, nis, x_preds, P_preds, Fs) = jax.lax.scan(step, (x, P), (u, z[1:]))
    xs, Ps = jnp.concatenate([x[None], xs]), jnp.concatenate([P[None], Ps])
    nis = jnp.concatenate([nis0[None], nis])
    if not cfg.smooth:
        return xs, Ps, nis

    def back(carry, inputs):
        # Rauch, Tung & Striebel 1965: C = P F^T P_pred^-1, x_s = x + C (x_s' - x_pred'), P_s = P + C (P_s' - P_pred') C^T
        xs_next, Ps_next = carry
        x, P, x_pred, P_pred, F = inputs
        C = jnp.linalg.solve(P_pred, F @ P).T
        x_s = x + C @ (xs_next - x_pred)
        P_s = P + C @ (Ps_next - P_pred) @ C.T
        P_s = 0.5 * (P_s + P_s.T)
        return (x_s, P_s), (x_s, P_s)

    _, (x_s, P_s) = jax.lax.scan(back, (xs[-1], Ps[-1]), (xs[:-1], Ps[:-1], x_preds, P_preds, Fs), reverse=True)
    return jnp.concatenate([x_s, xs[-1:]]), jnp.concatenate([P_s, Ps[-1:]]), nis


_filter = jit(_filter_body)  # the arm as data: one compiled program per arm structure


@functools.partial(jit, static_argnames=("constant", "batched"))
def _filter_folded(u, z, x0, P0, dt, torque_var, walk_var, R, cfg: _Config, *, constant, batched: bool):
    """The filter with a known arm compiled in (``constant``: :class:`jaxarm.simulate.batch._ConstantArm`),
    so that the dynamics fold its structural zeros, as ``rollout_batch`` does: the Panda's filter
    compiles in about half the time and runs about 3x faster than with the arm as data. A batch of
    logs is vmapped over u, z and x0."""

    def run(uu, zz, xx):
        return _filter_body(constant.arm, uu, zz, xx, P0, dt, torque_var, walk_var, R, cfg)

    return (jax.vmap(run) if batched else run)(u, z, x0)


@dataclasses.dataclass(frozen=True)
class KalmanEstimate:
    """Result of :func:`kalman_filter`: ``q``, ``qd`` (N, n) filtered states,
    ``external`` (N, n) external joint torques (None unless estimated), ``covariance`` (N, d, d)
    of the state ``(q, qd[, e][, theta])``, ``std`` (N, d) its square-rooted diagonal, ``nis`` (N,)
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
    external_std=None,
    initial_std=None,
    method: str = "rk3",
    parameters=None,
    theta0=None,
    theta_std=None,
    theta_walk=None,
    smooth: bool = False,
    variant: str = "extended",
    dtype=None,
) -> KalmanEstimate:
    """Filter the states of ``arm`` (module docstring) from applied joint torques ``u`` (N - 1, n),
    held over each step of ``dt`` seconds, and measurements ``z`` (N, m) at the N sample times:
    positions (``measure=("q",)``, m = n) or positions and velocities (``("q", "qd")``, m = 2n).
    A batch of B logs of the same length: ``u`` (B, N - 1, n), ``z`` (B, N, m) and ``q0``, ``qd0``
    (n,) or (B, n); they are filtered in one ``vmap``-ed call.

    variant: "extended" (Jacobians by autodiff) or "unscented" (sigma points; module docstring).
    dtype: the filter's floating type (default: JAX's default float, float64 with x64 enabled);
    ``jnp.float32`` runs it in single precision.

    torque_std (scalar or (n,)): the standard deviation of the torque the arm feels around ``u``
    [N m]; position_std, velocity_std: sensor noise [rad, rad/s]; quantization: the encoders' step
    [rad] (adds step^2 / 12). external_std (scalar or (n,), N m / sqrt(s)): estimate external joint
    torques as a random walk of this intensity. q0, qd0 (default 0): the starting estimate, with
    standard deviations ``initial_std`` (2n or 3n,) (default: 10 x position_std for q, 1 rad/s for
    qd, 10 x torque_std for e).
    Joint state-parameter estimation (online identification): ``parameters(arm, theta) -> arm``, a
    traceable function giving the arm for a parameter vector theta (p,) (e.g. ``lambda arm, th:
    arm.replace(payload=jaxarm.Payload(th[0], com, inertia))`` for a payload's mass), starting at
    ``theta0`` with standard deviations
    ``theta_std`` and following a random walk of intensity ``theta_walk`` (default 1e-6 theta_std
    per sqrt(s): nearly constant).
    smooth: run the Rauch-Tung-Striebel smoother backwards after the filter (offline use: every
    estimate then uses the whole log).
    """
    func = f"{variant}_kalman_filter" if variant in VARIANTS else "kalman_filter"
    if variant not in VARIANTS:
        raise ValueError(f"{func}: variant: expected one of {VARIANTS}, got {variant!r}")
    checks.check_arm(arm, func)
    measure = tuple(measure)
    if measure not in MEASUREMENTS:
        raise ValueError(f"{func}: measure: expected one of {MEASUREMENTS}, got {measure!r}")
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
    if "qd" in measure and velocity_std is None:
        raise ValueError(f"{func}: velocity_std: required when velocities are measured")

    def positive(value, name, size):
        v = np.broadcast_to(np.asarray(value, dtype=float), (size,)).copy()
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(f"{func}: {name}: expected positive numbers, got {value!r}")
        return v

    torque_var = positive(torque_std, "torque_std", n) ** 2
    pos_var = positive(position_std, "position_std", n) ** 2 + float(quantization) ** 2 / 12.0
    R = np.diag(np.concatenate([pos_var] + ([positive(velocity_std, "velocity_std", n) ** 2] if "qd" in measure else [])))
    external = external_std is not None
    ext_var = positive(external_std, "external_std", n) ** 2 if external else np.zeros(0)
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
    k = (3 if external else 2) * n
    x0 = np.concatenate([q0, qd0] + ([np.zeros(lead + (n,))] if external else [])
                        + ([np.broadcast_to(theta0, lead + (p,))] if p else []), axis=-1)
    if initial_std is None:
        std0 = np.concatenate([10 * np.sqrt(pos_var), np.ones(n)] + ([10 * np.sqrt(torque_var)] if external else []))
    else:
        std0 = positive(initial_std, "initial_std", k)
    if p:
        std0 = np.concatenate([std0, theta_std])
    cfg = _Config(method=str(method), external=external, measure=measure, parameters=parameters, smooth=bool(smooth),
                  variant=variant)
    integrators.get_method(method)
    dtype = jnp.zeros(0).dtype if dtype is None else jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{func}: dtype: expected a floating type such as jnp.float32, got {dtype}")

    def cast(a):
        return jnp.asarray(a, dtype)

    data = (cast(u), cast(z), cast(x0), cast(np.diag(std0**2)), cast(float(dt)), cast(torque_var),
            cast(np.concatenate([ext_var, walk])), cast(R))
    if checks.concrete(arm):  # compiled in (folded), once per arm value
        arm_np = jax.tree_util.tree_map(
            lambda a: np.asarray(a, dtype) if np.issubdtype(np.asarray(a).dtype, np.floating) else np.asarray(a), arm)
        xs, Ps, nis = _filter_folded(*data, cfg, constant=_ConstantArm(arm_np), batched=batched)
    else:
        arm_d = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a, arm)
        run = _filter
        if batched:
            run = jax.vmap(_filter, in_axes=(None, 0, 0, 0) + (None,) * 6)
        xs, Ps, nis = run(arm_d, *data, cfg)
    xs, Ps = np.asarray(xs), np.asarray(Ps)
    return KalmanEstimate(q=xs[..., :n], qd=xs[..., n:2 * n], external=xs[..., 2 * n:3 * n] if external else None,
                          covariance=Ps, std=np.sqrt(np.einsum("...kii->...ki", Ps)), nis=np.asarray(nis),
                          parameters=xs[..., k:] if p else None, smoothed=bool(smooth), variant=variant)
