"""Batched and sharded rollouts: one call simulates a batch on every visible device.

The batch axis is laid out over a 1-D ``jax.sharding.Mesh`` of all devices, so the same code
runs on one CPU, on 8 GPUs, or on several hosts after ``jax.distributed.initialize()`` (every
process then calls :func:`rollout_batch` with the same global arguments; see docs/guide/simulation.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..core import xla as _xla
from ..core.tracers import strong as _strong
from ..model import checks
from ..model.arm import Arm
from .rollouts import Trajectory, check_divergence, rollout


def _value_key(a: np.ndarray):
    """A hashable key of an array's dtype, shape and values (a static argument compared by value)."""
    return a.dtype.str, a.shape, a.tobytes()


class _ConstantArm:
    """An arm as a static argument of a jit: hashed and compared by its values, so the compiled
    program holds its parameters as constants (the dynamics kernels fold its structural zeros,
    :class:`jaxarm.dynamics.algebra.Known`) and an arm with other values compiles anew."""

    def __init__(self, arm: Arm):
        leaves, self.treedef = jax.tree_util.tree_flatten(arm)
        self.leaves = tuple(np.asarray(x) for x in leaves)
        self.arm = jax.tree_util.tree_unflatten(self.treedef, self.leaves)
        self._hash = hash((self.treedef, tuple(_value_key(x) for x in self.leaves)))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return (
            isinstance(other, _ConstantArm)
            and self.treedef == other.treedef
            and all(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True) for a, b in zip(self.leaves, other.leaves))
        )


class _SharedLeaves:
    """The leaves of a batch of arms (:func:`jaxarm.stack_arms`) that are the same for every member,
    as a static argument of a jit (hashed and compared by value, as :class:`_ConstantArm`): the
    compiled program holds them as constants, and only the leaves that differ are data. In a
    batch that varies the masses, COMs or friction, the kinematics then fold as for one constant
    arm (:func:`jaxarm.dynamics.kinematics._bodies`)."""

    def __init__(self, stacked: Arm):
        leaves, self.treedef = jax.tree_util.tree_flatten(stacked)
        arrays = [np.asarray(x) for x in leaves]
        self.values = tuple(np.asarray(a[0]) if np.all(a == a[:1]) else None for a in arrays)
        self._key = tuple(None if v is None else _value_key(v) for v in self.values)
        self._hash = hash((self.treedef, self._key))

    def varying(self, stacked: Arm):
        """The leaves of ``stacked`` that differ across the batch, in order."""
        return [x for x, v in zip(jax.tree_util.tree_leaves(stacked), self.values) if v is None]

    def arm(self, varying):
        """One member's arm from its varying leaves and the shared ones."""
        it = iter(varying)
        return jax.tree_util.tree_unflatten(self.treedef, [next(it) if v is None else v for v in self.values])

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, _SharedLeaves) and self.treedef == other.treedef and self._key == other._key


@_xla.jit(static_argnames=("policy", "arm_batched", "inputs_batched", "options", "constant", "shared"))
def _kernel(arm, q0, qd0, schedule, dt, traced, *, policy, arm_batched, inputs_batched, options, constant=None, shared=None):
    """vmap(rollout) over the batch; the input is ``policy`` when given, else ``schedule``; the
    arm is ``constant.arm`` (compiled in) when given, else ``arm`` (data): a batch of arms, or,
    with ``shared``, the list of the batch's varying leaves (the others compiled in).
    Compiled with :func:`jaxarm.compiler_options` (no YNNPACK fusions on CPU)."""
    if constant is not None:
        arm = constant.arm

    def one(a, q, qd, u):
        if shared is not None:
            a = shared.arm(a)
        return rollout(a, q, qd, policy or u, dt, on_divergence="flag", **traced, **dict(options))

    in_axes = (0 if arm_batched else None, 0, 0, 0 if inputs_batched else None)
    return jax.vmap(one, in_axes=in_axes)(arm, q0, qd0, schedule)


def rollout_batch(
    arm: Arm,
    q0,
    qd0,
    inputs,
    dt,
    *,
    arm_batched: bool = False,
    inputs_batched: bool = True,
    constant_arm: bool = True,
    devices=None,
    on_divergence: str = "raise",
    **kwargs,
) -> Trajectory:
    """Simulate a batch of B rollouts, sharded over ``devices`` (default: all visible devices).

    q0, qd0: (B, n); inputs: (B, T, n) schedules (or one (T, n) schedule shared by all with
    ``inputs_batched=False``, or a policy function); arm: one Arm, or a batch of arms from
    :func:`jaxarm.stack_arms` with ``arm_batched=True``. Other keywords go to :func:`jaxarm.rollout`.
    The batch is padded to a multiple of the device count and trimmed afterwards, so the result
    equals ``jax.vmap(rollout)`` exactly. Returns a Trajectory whose arrays have a leading axis B.
    Compiled kernels are cached: repeated calls with the same shapes and options do not recompile
    (a policy is part of the cache key, so reuse the same policy object).

    constant_arm: compile the arm's values into the program (default; one arm, not batched, not a
    tracer), so that its structural zeros cost nothing: a 1000-step RK3 rollout of the Puma 560
    runs ~1.6x faster and compiles ~2x faster than with the arm as data (docs/benchmarks.md).
    Calls with an arm of other values then compile again; pass ``constant_arm=False`` to compile
    once for every arm of the same structure (a Python loop over many arms; or batch them with
    ``arm_batched=True``). The results are the same up to rounding. With ``arm_batched=True``
    (and a concrete batch of arms) the leaves that are the same for every member are compiled in
    and only those that differ are data: a batch that varies masses, COMs, payloads or friction
    keeps its kinematics folded (4096 Panda rollouts, float64: 0.8-1.1x the speed of one constant
    arm instead of 0.3x, docs/benchmarks.md); another batch with the same shared values reuses the program.
    """
    q0, qd0 = jnp.asarray(q0), jnp.asarray(qd0)
    if q0.ndim != 2 or q0.shape != qd0.shape:
        raise ValueError(f"rollout_batch: q0, qd0: expected matching shapes (B, n), got {q0.shape} and {qd0.shape}")
    B = q0.shape[0]
    if not isinstance(dt, jax.core.Tracer) and not float(dt) > 0:
        raise ValueError(f"rollout_batch: dt: expected a positive time step, got {dt!r}")
    policy = callable(inputs)
    if policy:
        inputs_batched = False
    elif inputs_batched and jnp.shape(inputs)[0] != B:
        raise ValueError(f"rollout_batch: inputs: expected a leading batch axis of {B}, got shape {jnp.shape(inputs)}")
    if arm_batched:
        sizes = {np.shape(x)[0] for x in jax.tree_util.tree_leaves(arm)}
        if sizes != {B}:
            raise ValueError(f"rollout_batch: arm: arm_batched=True needs every leaf to have a leading axis {B}, got {sorted(sizes)}")
    devices = list(jax.devices() if devices is None else devices)
    nd = len(devices)
    padded = -(-B // nd) * nd

    def pad(x):  # with copies of the last element, never garbage
        x = _strong(x)
        return x if padded == B else jnp.concatenate([x, jnp.repeat(x[-1:], padded - B, axis=0)])

    # Numeric options are traced arguments (they may be arrays or tracers); the rest is static.
    traced = {k: kwargs.pop(k) for k in ("f_ext", "t0", "bound") if k in kwargs}
    options = tuple(sorted(kwargs.items()))
    try:
        hash(options)
    except TypeError:
        raise ValueError(f"rollout_batch: options {sorted(kwargs)} must be hashable values") from None
    constant = _ConstantArm(arm) if constant_arm and not arm_batched and checks.concrete(arm) else None
    shared = _SharedLeaves(arm) if constant_arm and arm_batched and checks.concrete(arm) else None
    args = [
        None if constant is not None else [pad(x) for x in shared.varying(arm)] if shared is not None
        else jax.tree_util.tree_map(pad, arm) if arm_batched else arm,
        pad(q0),
        pad(qd0),
        None if policy else (pad(inputs) if inputs_batched else _strong(inputs)),
        jnp.asarray(dt),
        traced,
    ]
    # Lay the batch axis over a 1-D mesh; the jitted kernel follows the data's sharding.
    mesh = Mesh(np.array(devices), ("batch",))
    batched, replicated = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    flags = [arm_batched, True, True, inputs_batched, False, False]
    for k, (a, b) in enumerate(zip(args, flags)):
        if checks.concrete(a):
            args[k] = jax.device_put(a, batched if b else replicated)
    traj = _kernel(
        *args,
        policy=inputs if policy else None,
        arm_batched=arm_batched,
        inputs_batched=inputs_batched,
        options=options,
        constant=constant,
        shared=shared,
    )
    if padded != B:
        traj = jax.tree_util.tree_map(lambda x: x[:B], traj)
    if on_divergence == "raise":
        seen = traj
        if not traj.diverged_step.is_fully_addressable:  # several processes: each checks the whole batch
            from jax.experimental import multihost_utils

            steps, t = multihost_utils.process_allgather((traj.diverged_step, traj.t), tiled=True)
            seen = traj._replace(diverged_step=steps, t=t)
        check_divergence(seen)
    return traj
