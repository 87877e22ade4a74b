"""Batched and sharded rollouts: one call simulates a batch on every visible device.

The batch axis is laid out over a 1-D ``jax.sharding.Mesh`` of all devices, so the same code
runs on one CPU, on 8 GPUs, or on several hosts after ``jax.distributed.initialize()`` (every
process then calls :func:`rollout_batch` with the same global arguments; see the README).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .arm import Arm
from .simulate import Trajectory, check_divergence, rollout


def rollout_batch(
    arm: Arm,
    q0,
    qd0,
    inputs,
    dt,
    *,
    arm_batched: bool = False,
    inputs_batched: bool = True,
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
    """
    q0, qd0 = jnp.asarray(q0), jnp.asarray(qd0)
    if q0.ndim != 2 or q0.shape != qd0.shape:
        raise ValueError(f"rollout_batch: q0, qd0: expected matching shapes (B, n), got {q0.shape} and {qd0.shape}")
    B = q0.shape[0]
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

    def pad(x):
        x = jnp.asarray(x)
        if padded == B:
            return x
        reps = jnp.concatenate([x, jnp.repeat(x[-1:], padded - B, axis=0)])  # pad with copies, never garbage
        return reps

    single = functools.partial(rollout, dt=dt, on_divergence="flag", **kwargs)
    arm_axis = 0 if arm_batched else None
    in_axis = 0 if inputs_batched else None
    if policy:
        f = lambda a, q, qd: single(a, q, qd, inputs)  # noqa: E731
        fn = jax.vmap(f, in_axes=(arm_axis, 0, 0))
        args = (arm, pad(q0), pad(qd0))
    else:
        fn = jax.vmap(single, in_axes=(arm_axis, 0, 0, in_axis))
        args = (arm, pad(q0), pad(qd0), pad(inputs) if inputs_batched else jnp.asarray(inputs))
    if arm_batched:
        args = (jax.tree_util.tree_map(pad, arm),) + args[1:]

    mesh = Mesh(np.array(devices), ("batch",))
    batched = NamedSharding(mesh, P("batch"))
    replicated = NamedSharding(mesh, P())

    def sharding_for(x, is_batched):
        return batched if is_batched else replicated

    flags = [arm_batched, True, True] + ([] if policy else [inputs_batched])
    in_shardings = tuple(
        jax.tree_util.tree_map(lambda x, b=b: sharding_for(x, b), a) for a, b in zip(args, flags)
    )
    args = jax.device_put(args, in_shardings)
    traj = jax.jit(fn, in_shardings=in_shardings, out_shardings=batched)(*args)
    if padded != B:
        traj = jax.tree_util.tree_map(lambda x: x[:B], traj)
    if on_divergence == "raise":
        check_divergence(traj)
    return traj
