"""The point-to-point reach (:class:`ReachProblem`) and the internal setup of its solvers
(:func:`jaxarm.trajopt.shooting`, :func:`~jaxarm.trajopt.multiple_shooting`,
:func:`~jaxarm.trajopt.ilqr`).

A reach is data -- start state, tool target, time step, cost weights -- so one solver call can be
``jax.vmap``-ed over many goals or many arms (:func:`jaxarm.stack_arms`). The three solvers
minimize the same objective over an input schedule u (T, n) (torque, or motor voltage with
``input="voltage"``):

    J = sum_k [ sum_i w_i u_ki^2 + w_path |p(q_k) - p*|^2 ] dt              (effort, path)
        + s sum_k |u_k - u_{k-1}|^2 / dt                                    (smoothness)
        + w_p |p(q_T) - p*|^2 + w_R (3 - tr(R*^T R(q_T))) + w_v |qd_T|^2    (tool pose, rest)

subject to the arm's limits: |u| <= u_max (``arm.limits.torque`` or ``arm.drives.voltage_limit``),
q within ``arm.limits.position`` and |qd| <= ``arm.limits.velocity`` at every step (infinite limits
are inactive). Inequality and defect constraints are handled by the augmented Lagrangian
(Nocedal & Wright 2006, section 17.4, eqs 17.36 and 17.65, multiplier update 17.39); the input
limit by either the same augmented Lagrangian or by squashing, u = u_max tanh(z).

The decision variable is the dimensionless z (T, n): u = u_max tanh(z) ("squash") or u = u_max z
("augmented_lagrangian"), with u_max replaced by 1 where a joint has no limit, so all joints are
equally scaled for the optimizers and the iLQR regularization is in the same units everywhere.
The solvers simulate an internal copy of the arm with its input limits removed: the solver itself
keeps u inside them (exactly for squash, to ``tol_violation`` for the augmented Lagrangian), so the
dynamics never hide a violation behind a clip with zero gradient."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...model import checks
from ...model.arm import Arm
from ...simulate import integrators
from ..linearize import _check_input_kind

TORQUE_LIMIT_MODES = ("squash", "augmented_lagrangian")


class ReachProblem(NamedTuple):
    """A point-to-point problem for one arm (a pytree of arrays: vmap over a stack of them).

    q0, qd0: (n,) initial state; target: (3,) tool position goal (world frame);
    target_rotation: (3, 3) tool orientation goal (used when ``orientation > 0``);
    dt: () time step; effort: (n,) weights w_i of sum_k w_i u_ki^2 dt;
    position, orientation, velocity: () weights of the terminal tool position error |p - p*|^2 (1/m^2),
    orientation error 3 - tr(R*^T R) (= |R - R*|_F^2 / 2) and joint speed |qd_T|^2 ((rad/s)^-2);
    smoothness: () weight of sum |u_k - u_{k-1}|^2 / dt; path_position: () weight of the running
    position error sum |p(q_k) - p*|^2 dt. The horizon T is the length of the input schedule.
    """

    q0: jnp.ndarray
    qd0: jnp.ndarray
    target: jnp.ndarray
    target_rotation: jnp.ndarray
    dt: jnp.ndarray
    effort: jnp.ndarray
    position: jnp.ndarray
    orientation: jnp.ndarray
    velocity: jnp.ndarray
    smoothness: jnp.ndarray
    path_position: jnp.ndarray


class IterationLog(NamedTuple):
    """Per-iteration record, each (max_iterations,), NaN after the last iteration.

    cost: objective (cost + augmented-Lagrangian terms) after the iteration; rel_change: its
    relative decrease; alpha: accepted line-search step (iLQR; 0 = rejected, NaN for shooting);
    regularization: the Levenberg-Marquardt term mu used in the backward pass (iLQR; NaN for shooting).
    """

    cost: jnp.ndarray
    rel_change: jnp.ndarray
    alpha: jnp.ndarray
    regularization: jnp.ndarray


class TrajoptResult(NamedTuple):
    """A solver's answer.

    u: (T, n) optimized input schedule (torque or voltage; pass it back as a warm start);
    q, qd: (T+1, n) the trajectory of a single rollout of u from the initial state;
    cost: () the objective J of that trajectory (no constraint terms);
    max_violation: () largest constraint violation: input and velocity limits as fractions of the
    limit, joint positions in rad or m, multiple-shooting defects in state units;
    iterations: () inner iterations used (all augmented-Lagrangian rounds together);
    converged: () bool, the relative cost change fell below ``tol`` and max_violation below
    ``tol_violation``; history: :class:`IterationLog`.
    """

    u: jnp.ndarray
    q: jnp.ndarray
    qd: jnp.ndarray
    cost: jnp.ndarray
    max_violation: jnp.ndarray
    iterations: jnp.ndarray
    converged: jnp.ndarray
    history: IterationLog


class _Multipliers(NamedTuple):
    state: jnp.ndarray  # (T, 4n) for x_1..x_T: q - upper, lower - q, qd/v - 1, -qd/v - 1
    input: jnp.ndarray  # (T, 2n): u/u_max - 1, -u/u_max - 1
    defect: jnp.ndarray  # (S-1, 2n) multiple-shooting defects (S = 1: (0, 2n))


@dataclasses.dataclass(frozen=True)
class _Setup:
    """Static solver options and the arm-dependent scaling shared by every stage."""

    arm: Arm  # input limits removed (the solver enforces them)
    problem: ReachProblem
    scale: jnp.ndarray  # (n,) u_max where finite, else 1
    limited: jnp.ndarray  # (n,) bool, finite input limit
    squash: bool
    input: str
    method: object
    T: int
    checkpoint: bool = False
    adjoint: bool = False

    def to_input(self, z):
        """u (..., n) from the dimensionless decision z (..., n)."""
        bounded = jnp.where(self.limited, jnp.tanh(z), z) if self.squash else z
        return self.scale * bounded

    def input_slope(self, z):
        """du/dz (..., n) (the map is elementwise)."""
        if self.squash:
            return self.scale * jnp.where(self.limited, 1.0 - jnp.tanh(z) ** 2, 1.0)
        return jnp.broadcast_to(self.scale, z.shape)

    def from_input(self, u):
        """The decision z that gives u (inputs at or beyond a squashed limit map just inside it)."""
        r = u / self.scale
        if self.squash:
            r = jnp.where(self.limited, jnp.arctanh(jnp.clip(r, -1 + 1e-6, 1 - 1e-6)), r)
        return r


# --------------------------------------------------------------------------- problem


def reach_problem(
    arm: Arm,
    q0,
    target,
    dt,
    *,
    qd0=None,
    target_rotation=None,
    effort=None,
    position=1e4,
    orientation=0.0,
    velocity=10.0,
    smoothness=0.0,
    path_position=0.0,
    input: str = "torque",
) -> ReachProblem:
    """A :class:`ReachProblem`: move the tool from rest at q0 (n,) to ``target`` (3,) (world frame).

    effort: (n,) or scalar weights; default 1 / u_max^2 per joint (u_max the torque limit, or the
    voltage limit with ``input="voltage"``; 1 where unlimited), so the effort term is the time
    integral of the squared fraction of the available input.
    """
    func = "reach_problem"
    checks.check_arm(arm, func)
    _check_input_kind(arm, input, func)
    n = arm.n
    q0 = checks.joint_vector(q0, arm, "q0", func)
    qd0 = jnp.zeros_like(q0) if qd0 is None else checks.joint_vector(qd0, arm, "qd0", func)
    target = _array(target, (3,), "target", func)
    R = jnp.eye(3) if target_rotation is None else _array(target_rotation, (3, 3), "target_rotation", func)
    if not float(dt) > 0:
        raise ValueError(f"{func}: dt: expected a positive time step, got {dt!r}")
    if effort is None:
        lim = np.asarray(_input_limit(arm, input), dtype=float)
        effort = np.where(np.isfinite(lim), 1.0 / np.where(np.isfinite(lim), lim, 1.0) ** 2, 1.0)
    effort = jnp.broadcast_to(_array(effort, None, "effort", func), (n,)) if np.ndim(effort) == 0 else _array(effort, (n,), "effort", func)
    weights = {}
    for name, w in (("position", position), ("orientation", orientation), ("velocity", velocity),
                    ("smoothness", smoothness), ("path_position", path_position)):
        weights[name] = _array(w, (), name, func)
        if not float(weights[name]) >= 0:
            raise ValueError(f"{func}: {name}: expected a non-negative weight, got {w!r}")
    if not bool(jnp.all(effort >= 0)):
        raise ValueError(f"{func}: effort: expected non-negative weights, got {np.asarray(effort).tolist()}")
    return ReachProblem(q0=q0, qd0=qd0, target=target, target_rotation=R, dt=jnp.asarray(float(dt)), effort=effort, **weights)


def _array(x, shape, name, func):
    a = jnp.asarray(x, dtype=jnp.result_type(float))
    if shape is not None and a.shape != shape:
        raise ValueError(f"{func}: {name}: expected shape {shape}, got {a.shape}")
    if not isinstance(a, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(a)))):
        raise ValueError(f"{func}: {name}: expected finite values, got {np.asarray(a).tolist()}")
    return a


def _input_limit(arm, input):
    return arm.drives.voltage_limit if input == "voltage" else arm.limits.torque


def _without_input_limits(arm: Arm, input: str) -> Arm:
    """The arm with its input limits (torque, or voltage) set to infinity. A concrete limit gives
    a NumPy array, so that an arm closed over by a jit stays concrete (not traced) and the
    dynamics fold its constants (:func:`jaxarm.dynamics.kinematics._bodies`)."""
    def unlimited(x):
        dtype = jnp.result_type(x) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else jnp.result_type(float)
        if checks.concrete(x):
            return np.full(np.shape(x), np.inf, dtype)
        return jnp.full(jnp.shape(x), jnp.inf, dtype)

    if input == "voltage":
        return arm.replace(drives=dataclasses.replace(arm.drives, voltage_limit=unlimited(arm.drives.voltage_limit)))
    return arm.replace(limits=dataclasses.replace(arm.limits, torque=unlimited(arm.limits.torque)))


def _setup(arm, problem, u_init, func, *, torque_limits, input, method, checkpoint=False, adjoint=False):
    checks.check_arm(arm, func)
    _check_input_kind(arm, input, func)
    if not isinstance(problem, ReachProblem):
        raise TypeError(f"{func}: problem: expected a jaxarm.trajopt.ReachProblem (see reach_problem), got {type(problem).__name__}")
    n = arm.n
    for name in ("q0", "qd0", "effort"):
        if jnp.shape(getattr(problem, name)) != (n,):
            raise ValueError(f"{func}: problem.{name}: expected shape ({n},) for this {n}-joint arm, got {jnp.shape(getattr(problem, name))}")
    if torque_limits not in TORQUE_LIMIT_MODES:
        raise ValueError(f"{func}: torque_limits: expected one of {TORQUE_LIMIT_MODES}, got {torque_limits!r}")
    integrators.get_method(method)
    u_init = jnp.asarray(u_init)
    if u_init.ndim != 2 or u_init.shape[1] != n or u_init.shape[0] < 1:
        raise ValueError(f"{func}: u_init: expected an input schedule of shape (T, {n}) with T >= 1 (the warm start), got {u_init.shape}")
    if not isinstance(u_init, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(u_init)))):
        raise ValueError(f"{func}: u_init: expected finite values, got NaN or inf")
    # the solve computes in the arm's precision: a float32 arm gives a float32 solve, also where
    # float64 is enabled and the problem's arrays (reach_problem) or the warm start are float64
    dtype = _arm_dtype(arm)
    problem = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype) if jnp.issubdtype(jnp.result_type(a), jnp.floating) else a, problem)
    lim = jnp.asarray(_input_limit(arm, input), dtype=dtype)
    limited = jnp.isfinite(lim)
    scale = jnp.where(limited, lim, jnp.ones((), dtype))
    setup = _Setup(
        arm=_without_input_limits(arm, input), problem=problem, scale=scale, limited=limited,
        squash=torque_limits == "squash", input=input, method=method, T=int(u_init.shape[0]),
        checkpoint=bool(checkpoint), adjoint=bool(adjoint),
    )
    return setup, u_init.astype(dtype)


def _arm_dtype(arm):
    """The floating-point type of the arm's arrays (the default float type if it has none)."""
    leaves = [a for a in jax.tree_util.tree_leaves(arm) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating)]
    return jnp.result_type(*leaves) if leaves else jnp.result_type(float)


def _eager_reach(solver, given):
    """``solver(**given)`` (:func:`jaxarm.trajopt.ilqr`, ``shooting`` or ``multiple_shooting``) called
    eagerly, outside any jit, vmap or derivative, answered by a compiled solve kept for the next
    call (:func:`jaxarm.core.xla.eager_compiled`): the arm (known by value) and the settings are its
    constants, the :class:`ReachProblem` and the warm start its arguments, so a loop over targets
    compiles once (Puma reach, T = 50, ``ilqr``: 17 s and then 13 s a call run op by op). None
    where a setting cannot key a kept program (the caller then solves as called)."""
    from ...core.xla import by_value, eager_compiled, jit, split_settings

    given = dict(given)
    arm, problem, u_init = given.pop("arm"), given.pop("problem"), given.pop("u_init")
    settings, arrays = split_settings(given)
    key = (solver.__name__, by_value(arm), jax.tree_util.tree_structure(problem), settings, tuple(sorted(arrays)))
    solve = eager_compiled(key, lambda: jit(lambda problem, u_init, arrays: solver(arm, problem, u_init, **dict(settings), **arrays)))
    return None if solve is None else solve(problem, u_init, arrays)
