"""Inverse kinematics: joint positions that put the tool at a position or a full pose.

Damped least squares (Wampler 1986; Nakamura & Hanafusa 1986), iterated to convergence: at each
iterate q the tool's error e = (p* - p, r) in the world frame, r the rotation vector of R* R^T
(the axis-angle of the remaining rotation), is reduced by

    dq = J^T (J J^T + lambda^2 I)^-1 e

with the geometric Jacobian J (:func:`jaxarm.jacobian`, world frame; only its position rows for
a position target), the step scaled down to at most ``max_step`` rad (or m) per joint, and
q + dq projected onto the joint limits. A joint that sits on a limit and whose step points out
of the range is held for that iteration (its column is dropped from J and the step solved
again), so the other joints do the work instead of the iteration stalling against the stop.

Pure JAX in a ``lax.while_loop``: ``jax.jit`` compiles it, ``jax.vmap`` solves many targets (or
many starting guesses of one target) at once. The result says whether it converged; a target
out of reach or an unlucky start ends at the iteration limit with ``converged`` False and the
closest pose found. For a redundant arm (more joints than task rows) the answer depends on q0:
damped least squares moves the least from it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..core import tracers
from ..core.xla import by_value, eager_compiled, jit, split_settings
from ..dynamics.kinematics import jacobian, tool_pose
from ..model import checks
from ..model.arm import Arm

__all__ = ["IKResult", "inverse_kinematics", "rotation_vector"]


class IKResult(NamedTuple):
    """``q`` (n,) the joint positions found; ``position_error`` [m] and ``rotation_error`` [rad]
    left at q (the rotation error is 0 for a position target); ``iterations``; ``converged``
    (both errors within their tolerances)."""

    q: jnp.ndarray
    position_error: jnp.ndarray
    rotation_error: jnp.ndarray
    iterations: jnp.ndarray
    converged: jnp.ndarray


def rotation_vector(R):
    """The rotation vector (axis times angle, angle in [0, pi]) of a rotation matrix R (3, 3):
    the logarithm of SO(3), accurate near 0 and near pi."""
    R = jnp.asarray(R)
    v = 0.5 * jnp.array([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]])  # sin(angle) axis
    s = jnp.linalg.norm(v)
    c = jnp.clip(0.5 * (jnp.trace(R) - 1.0), -1.0, 1.0)
    angle = jnp.arctan2(s, c)
    small = s < 1e-7
    # away from pi: angle / sin(angle) * v (-> v as angle -> 0)
    scale = jnp.where(small, 1.0 + angle**2 / 6.0, angle / jnp.where(small, 1.0, s))
    generic = scale * v
    # near pi, v vanishes: the axis from the largest diagonal of (R + I) / 2 = axis axis^T
    B = 0.5 * (R + jnp.eye(3, dtype=R.dtype))
    k = jnp.argmax(jnp.diag(B))
    col = B[:, k] / jnp.sqrt(jnp.maximum(B[k, k], 1e-30))
    col = jnp.where(jnp.dot(col, v) < 0, -col, col)  # keep the sign v still carries
    near_pi = (c < 0) & small
    return jnp.where(near_pi, angle * col / jnp.maximum(jnp.linalg.norm(col), 1e-30), generic)


def _limits(arm, dtype):
    if arm.limits is None:
        n = arm.n
        return jnp.full(n, -jnp.inf, dtype), jnp.full(n, jnp.inf, dtype)
    pos = jnp.asarray(arm.limits.position, dtype)
    return pos[:, 0], pos[:, 1]


def _default_start(lower, upper):
    mid = 0.5 * (lower + upper)
    return jnp.where(jnp.isfinite(mid), mid, jnp.where(jnp.isfinite(lower), lower, jnp.where(jnp.isfinite(upper), upper, 0.0)))


STARTS = 16  # default starting guesses for a pose target


def _spread_starts(lower, upper, centre, k):
    """k starting guesses spread over the joint ranges (a fixed pseudo-random design; +-pi where a
    joint has no limit), so that every call tries the same ones."""
    rng = np.random.default_rng(20111)
    u = jnp.asarray(rng.uniform(0.05, 0.95, (k, centre.shape[0])), centre.dtype)
    lo = jnp.where(jnp.isfinite(lower), lower, centre - jnp.pi)
    hi = jnp.where(jnp.isfinite(upper), upper, centre + jnp.pi)
    return lo + u * (hi - lo)


def inverse_kinematics(
    arm: Arm,
    target,
    q0=None,
    *,
    max_iterations: int = 200,
    tol: float = 1e-9,
    rotation_tol: float = 1e-9,
    damping: float = 1e-5,
    max_step: float = 0.5,
    joint_limits: bool = True,
) -> IKResult:
    """Joint positions that put the tool at ``target``: a position (3,) in the world frame, or a
    pose (4, 4) (position and orientation, as :func:`jaxarm.tool_pose` gives).

    q0: the starting guess (n,), or several (k, n): each is solved (batched) and the best result
    returned, the first that converged, else the one closest to the target (default: the middle of
    each joint's position limits, or 0, for a position; for a pose, that and 15 more starts spread
    over the limits, the same every call);
    tol [m], rotation_tol [rad]: when to stop; damping: lambda of damped least squares (in m;
    larger is more robust near singularities and slower); max_step: largest change of one joint
    per iteration (rad or m); joint_limits: keep every iterate within the arm's position limits.
    Returns :class:`IKResult`. jit- and vmap-able (batch over targets or starting guesses).
    """
    func = "inverse_kinematics"
    checks.check_arm(arm, func)
    target = jnp.asarray(target)
    if target.shape not in ((3,), (4, 4)):
        raise ValueError(f"{func}: target: expected a position (3,) or a pose (4, 4), got shape {target.shape}")
    if checks.concrete(target) and not np.all(np.isfinite(np.asarray(target))):
        raise ValueError(f"{func}: target: contains NaN or inf")
    if not isinstance(max_iterations, (int, np.integer)) or isinstance(max_iterations, bool) or max_iterations < 1:
        raise ValueError(f"{func}: max_iterations: expected a positive whole number, got {max_iterations!r}")
    for name, value in (("tol", tol), ("rotation_tol", rotation_tol), ("damping", damping), ("max_step", max_step)):
        if checks.concrete(value) and not float(value) > 0:
            raise ValueError(f"{func}: {name}: expected a positive number, got {value!r}")
    # called in a plain Python loop, or vmapped (or differentiated in forward mode) outside any jit
    # with the arm known: one compiled solve, kept (a transformation of it is kept by JAX)
    if tracers.kept_program_answers(arm, (target, q0)):
        result = _kept_solve(arm, target, q0, dict(max_iterations=max_iterations, tol=tol, rotation_tol=rotation_tol,
                                                    damping=damping, max_step=max_step, joint_limits=joint_limits))
        if result is not None:
            return result
    dtype = jnp.result_type(target.dtype, float)
    lower, upper = _limits(arm, dtype)
    if not joint_limits:
        lower, upper = jnp.full_like(lower, -jnp.inf), jnp.full_like(upper, jnp.inf)
    pose = target.shape == (4, 4)
    if q0 is None:
        q0 = _default_start(lower, upper)
        if pose:
            q0 = jnp.concatenate([q0[None], _spread_starts(lower, upper, q0, STARTS - 1)])
    q0 = jnp.asarray(q0)
    if q0.ndim == 2:
        if q0.shape[1] != arm.n or q0.shape[0] < 1:
            raise ValueError(f"{func}: q0: expected (n,) = ({arm.n},) or (k, {arm.n}) starting guesses, got {q0.shape}")
        options = dict(max_iterations=max_iterations, tol=tol, rotation_tol=rotation_tol, damping=damping,
                       max_step=max_step, joint_limits=joint_limits)
        results = jax.vmap(lambda q: inverse_kinematics(arm, target, q, **options))(q0)
        # the first converged start, else the one with the smallest error (position, then rotation)
        score = jnp.where(results.converged, jnp.arange(q0.shape[0]) - q0.shape[0],
                          results.position_error + results.rotation_error)
        best = jnp.argmin(score)
        return jax.tree_util.tree_map(lambda x: x[best], results)
    q0 = checks.joint_vector(q0, arm, "q0", func).astype(dtype)
    rows = 6 if pose else 3
    target = target.astype(dtype)

    def error(q):
        T = tool_pose(arm, q)
        if pose:
            e_p = target[:3, 3] - T[:3, 3]
            e_r = rotation_vector(target[:3, :3] @ T[:3, :3].T)
            return jnp.concatenate([e_p, e_r])
        return target - T[:3, 3]

    def norms(e):
        return jnp.linalg.norm(e[:3]), (jnp.linalg.norm(e[3:]) if pose else jnp.zeros((), dtype))

    def done(e):
        ep, er = norms(e)
        return (ep <= tol) & (er <= rotation_tol)

    def solve(J, e):
        # Levenberg-Marquardt with the error-dependent damping of Sugihara (2011):
        # lambda^2 = |e|^2 / 2 + damping^2, large far from the target, small near it
        lam2 = 0.5 * jnp.dot(e, e) + damping**2
        return J.T @ jnp.linalg.solve(J @ J.T + lam2 * jnp.eye(rows, dtype=dtype), e)

    def body(state):
        q, e, k = state
        J = jacobian(arm, q)[:rows]
        dq = solve(J, e)
        # hold the joints that sit on a limit and would be pushed out of range
        held = ((q <= lower) & (dq < 0)) | ((q >= upper) & (dq > 0))
        dq = jnp.where(held, 0.0, solve(J * (~held)[None, :], e))
        biggest = jnp.max(jnp.abs(dq))
        dq = dq * jnp.minimum(1.0, max_step / jnp.maximum(biggest, 1e-300))
        q = jnp.clip(q + dq, lower, upper)
        return q, error(q), k + 1

    def cond(state):
        _, e, k = state
        return (k < max_iterations) & ~done(e)

    q0 = jnp.clip(q0, lower, upper)
    q, e, k = jax.lax.while_loop(cond, body, (q0, error(q0), jnp.zeros((), jnp.int32)))
    ep, er = norms(e)
    return IKResult(q=q, position_error=ep, rotation_error=er, iterations=k, converged=done(e))


def _kept_solve(arm, target, q0, settings):
    """:func:`inverse_kinematics` called eagerly (outside any jit, vmap or derivative), answered
    by a compiled solve kept for the next call (:func:`jaxarm.core.xla.eager_compiled`): the arm
    (known by value) and the settings its constants, the target and the starting guesses its
    arguments. Run op by op, every call traced and dispatched the iteration again (a Puma 560 pose:
    0.75 s a call); kept, a call after the first takes what a jitted solve takes. Under a
    ``jax.vmap`` (or forward-mode derivative) applied outside any jit, the kept solve is
    transformed and JAX keeps the transformed program (8 Panda poses: 1.2 s every call op by op).
    None where a setting cannot key a kept program (the solve then runs as called)."""
    settings, arrays = split_settings(settings)
    if arrays:  # a setting given as an array cannot key a kept program
        return None
    if q0 is not None and checks.concrete(q0):
        q0 = np.asarray(q0)
        if np.issubdtype(q0.dtype, np.number) and not np.all(np.isfinite(q0)):  # (inside the program it is traced)
            raise ValueError(f"inverse_kinematics: q0: expected finite values, got non-finite entries at {np.argwhere(~np.isfinite(q0)).tolist()}")
    key = ("inverse_kinematics", by_value(arm), settings, q0 is None)
    solve = eager_compiled(key, lambda: jit(lambda target, q0: inverse_kinematics(arm, target, q0, **dict(settings))))
    return None if solve is None else solve(target, q0)
