"""Finite-horizon, time-varying LQR (TV-LQR) about a nominal trajectory.

With the discrete linearization dx_{k+1} = A_k dx_k + B_k du_k (:func:`jaxarm.linearize_trajectory`)
and the cost  sum_k (dx_k^T Q_k dx_k + du_k^T R_k du_k) + dx_T^T Qf dx_T,  the optimal feedback is
du_k = -K_k dx_k, from the backward Riccati recursion (Anderson & Moore, Optimal Control, ch. 2):

    P_T = Qf
    K_k = (R_k + B_k^T P_{k+1} B_k)^-1 B_k^T P_{k+1} A_k
    P_k = Q_k + A_k^T P_{k+1} (A_k - B_k K_k)

run with ``jax.lax.scan``. :func:`tvlqr_controller` turns the gains into a ``policy(t, q, qd)`` for
:func:`jaxarm.rollout`: u = u_nom_k - K_k (x - x_nom_k).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..model import checks
from ..model.arm import Arm
from .linearize import _check_dt, _trajectory, linearize_trajectory


class TVLQR(NamedTuple):
    """Solution of the finite-horizon LQR: gains K (T, m, N) (du = -K dx) and cost-to-go
    matrices P (T+1, N, N) (the optimal cost from step k is dx_k^T P_k dx_k); P[T] = Qf."""

    K: jnp.ndarray
    P: jnp.ndarray


def _weights(W, T, size, name):
    W = jnp.asarray(W)
    if W.ndim == 0:
        W = W * jnp.eye(size, dtype=jnp.result_type(W.dtype, float))
    elif W.ndim == 1:
        if W.shape != (size,):
            raise ValueError(f"tvlqr: {name}: expected a scalar, a diagonal ({size},), a matrix ({size}, {size}) or ({T}, {size}, {size}), got {W.shape}")
        W = jnp.diag(W)
    if W.shape == (size, size):
        W = jnp.broadcast_to(W, (T, size, size))
    if W.shape != (T, size, size):
        raise ValueError(f"tvlqr: {name}: expected a scalar, a diagonal ({size},), a matrix ({size}, {size}) or ({T}, {size}, {size}), got {W.shape}")
    return W


def tvlqr(A, B, Q, R, Qf=None) -> TVLQR:
    """Finite-horizon discrete time-varying LQR by the backward Riccati recursion (module doc).

    A: (T, N, N), B: (T, N, m) the step Jacobians; Q: state weight, R: input weight, each a scalar,
    a diagonal, a matrix or one per step ((T, N, N), (T, m, m)); Qf: terminal weight (default Q's
    last). Q, Qf symmetric positive semidefinite, R positive definite. Returns :class:`TVLQR`
    with K (T, m, N), P (T+1, N, N).
    """
    A, B = jnp.asarray(A), jnp.asarray(B)
    if A.ndim != 3 or A.shape[1] != A.shape[2]:
        raise ValueError(f"tvlqr: A: expected a stack of square matrices (T, N, N), got {A.shape}")
    T, N = A.shape[0], A.shape[1]
    if B.ndim != 3 or B.shape[:2] != (T, N):
        raise ValueError(f"tvlqr: B: expected shape ({T}, {N}, m) to match A {A.shape}, got {B.shape}")
    m = B.shape[2]
    Qs = _weights(Q, T, N, "Q")
    Rs = _weights(R, T, m, "R")
    Qf = Qs[-1] if Qf is None else jnp.asarray(Qf)
    if Qf.ndim == 1 and Qf.shape == (N,):
        Qf = jnp.diag(Qf)
    elif Qf.ndim == 0:
        Qf = Qf * jnp.eye(N)
    if Qf.shape != (N, N):
        raise ValueError(f"tvlqr: Qf: expected a scalar, a diagonal ({N},) or a matrix ({N}, {N}), got {Qf.shape}")
    if not isinstance(Rs, jax.core.Tracer):
        eig = np.linalg.eigvalsh(0.5 * (np.asarray(Rs) + np.swapaxes(np.asarray(Rs), 1, 2)))
        if not np.all(eig > 0):
            raise ValueError(f"tvlqr: R: expected positive definite input weights, smallest eigenvalue {eig.min():.3g}")
    dtype = jnp.result_type(A.dtype, B.dtype, Qs.dtype, Rs.dtype, Qf.dtype, float)
    return _riccati(A.astype(dtype), B.astype(dtype), Qs.astype(dtype), Rs.astype(dtype), Qf.astype(dtype))


@jax.jit
def _riccati(A, B, Q, R, Qf):
    def back(P, k):
        a, b = A[k], B[k]
        PB = P @ b
        gain = jnp.linalg.solve(R[k] + b.T @ PB, PB.T @ a)  # (R + B'PB)^-1 B'PA
        P_new = Q[k] + a.T @ P @ (a - b @ gain)
        P_new = 0.5 * (P_new + P_new.T)  # keep P symmetric against round-off
        return P_new, (gain, P_new)

    T = A.shape[0]
    _, (K, P) = jax.lax.scan(back, Qf, jnp.arange(T), reverse=True)
    return TVLQR(K=K, P=jnp.concatenate([P, Qf[None]], axis=0))


def tvlqr_controller(K, q_nom, qd_nom, u_nom, dt, *, t0=0.0, torque_limit=None):
    """A rollout policy ``u = policy(t, q, qd)`` tracking a nominal trajectory with TV-LQR gains:
    u = u_nom_k - K_k ((q, qd) - (q_nom_k, qd_nom_k)), k = round((t - t0) / dt) clamped to [0, T-1].

    K: (T, n, 2n) gains (:func:`tvlqr`); q_nom, qd_nom: (T+1, n) or (T, n) nominal states (e.g. a
    :class:`jaxarm.Trajectory`'s q, qd); u_nom: (T, n) nominal inputs; dt, t0: the rollout's step and
    start time. torque_limit: optional scalar or (n,) bound, u clipped to [-limit, limit] (e.g.
    ``arm.limits.torque``).
    """
    K = jnp.asarray(K)
    u_nom = jnp.asarray(u_nom)
    q_nom, qd_nom = jnp.asarray(q_nom), jnp.asarray(qd_nom)
    if K.ndim != 3 or K.shape[2] != 2 * K.shape[1]:
        raise ValueError(f"tvlqr_controller: K: expected gains of shape (T, n, 2n), got {K.shape}")
    T, n = K.shape[0], K.shape[1]
    if u_nom.shape != (T, n):
        raise ValueError(f"tvlqr_controller: u_nom: expected shape ({T}, {n}) (one input per gain), got {u_nom.shape}")
    for name, x in (("q_nom", q_nom), ("qd_nom", qd_nom)):
        if x.ndim != 2 or x.shape[1] != n or x.shape[0] not in (T, T + 1):
            raise ValueError(f"tvlqr_controller: {name}: expected shape ({T + 1}, {n}) or ({T}, {n}), got {x.shape}")
    _check_dt(dt, "tvlqr_controller")
    x_nom = jnp.concatenate([q_nom[:T], qd_nom[:T]], axis=1)
    limit = None if torque_limit is None else jnp.asarray(torque_limit)

    def policy(t, q, qd):
        k = jnp.clip(jnp.round((t - t0) / dt).astype(jnp.int32), 0, T - 1)
        dx = jnp.concatenate([q, qd]) - x_nom[k]
        u = u_nom[k] - K[k] @ dx
        if limit is not None:
            u = jnp.clip(u, -limit, limit)
        return u

    return policy


def tvlqr_tracking(
    arm: Arm, q_nom, qd_nom, u_nom, dt, Q, R, Qf=None, *, method="rk3", input: str = "torque",
    torque_limit=None, t0=0.0,
):
    """Linearize ``arm`` along a nominal trajectory (q_nom, qd_nom: (T+1, n) states, u_nom: (T, n)
    inputs, e.g. from :func:`jaxarm.rollout`), solve :func:`tvlqr` and return
    ``(policy, TVLQR)``, the policy ready for ``rollout(arm, q0, qd0, policy, dt, steps=T)``."""
    checks.check_arm(arm, "tvlqr_tracking")
    u_nom = jnp.asarray(u_nom)
    if u_nom.ndim != 2:
        raise ValueError(f"tvlqr_tracking: u_nom: expected shape (T, {arm.n}), got {u_nom.shape}")
    T = u_nom.shape[0]
    arrays, _ = _trajectory(arm, "tvlqr_tracking", q_nom=jnp.asarray(q_nom)[:T], qd_nom=jnp.asarray(qd_nom)[:T], u_nom=u_nom)
    A, B = linearize_trajectory(arm, arrays["q_nom"], arrays["qd_nom"], arrays["u_nom"], dt, method=method, input=input)
    sol = tvlqr(A, B, Q, R, Qf)
    return tvlqr_controller(sol.K, q_nom, qd_nom, u_nom, dt, t0=t0, torque_limit=torque_limit), sol
