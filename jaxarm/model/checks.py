"""Input checks run at trace time, so bad input fails with a message naming the argument
instead of a shape error from deep inside XLA (or a silent NaN)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .arm import Arm


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def concrete(tree) -> bool:
    """True when no leaf of ``tree`` (an arm, say) is a tracer: its values are known while
    tracing (closed over by a jit, not an argument of it, not differentiated or vmapped)."""
    return all(_is_concrete(x) for x in jax.tree_util.tree_leaves(tree))


class TracedLeaves:
    """A pytree split into its traced leaves (``traced``, a list, in leaf order) and the known
    rest; :meth:`join` rebuilds the tree from traced values. For a custom derivative rule
    (``jax.custom_jvp``/``custom_vjp``), which traces every array passed to it: pass ``traced``
    and close over the rest, so that known values (an arm closed over by the user's jit) stay
    constants of the program and fold."""

    def __init__(self, tree):
        leaves, self.treedef = jax.tree_util.tree_flatten(tree)
        self.index = [i for i, a in enumerate(leaves) if not _is_concrete(a)]
        self.leaves = [a if _is_concrete(a) else None for a in leaves]
        self.traced = [leaves[i] for i in self.index]

    def join(self, traced):
        leaves = list(self.leaves)
        for i, a in zip(self.index, traced):
            leaves[i] = a
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def check_arm(arm, func: str) -> None:
    """The arm is a single :class:`jaxarm.Arm` (not a stack of them)."""
    if not isinstance(arm, Arm):
        raise TypeError(f"{func}: arm: expected a jaxarm.Arm (see jaxarm.load_arm / make_arm), got {type(arm).__name__}")
    mass = arm.links.mass
    if getattr(mass, "ndim", 1) != 1:
        raise ValueError(
            f"{func}: arm: leaves have a batch axis (links.mass has shape {tuple(mass.shape)}); "
            "map over a batch of arms with jax.vmap(..., in_axes=(0, ...))"
        )


def joint_state(arm, func: str, **vectors):
    """Check the arm and each per-joint vector (``q=..., qd=...``); returns the vectors, in order."""
    check_arm(arm, func)
    return [joint_vector(v, arm, k, func) for k, v in vectors.items()]


def joint_vector(x, arm, name: str, func: str, *, allow_none: bool = False, xp=jnp):
    """Validate a per-joint vector: shape (n,), real floating values, finite when concrete.
    Returned as an array of ``xp`` (``numpy`` for known values checked on the host)."""
    if x is None:
        if allow_none:
            return None
        raise ValueError(f"{func}: {name}: expected an array of shape ({arm.n},), got None")
    x = xp.asarray(x)
    if x.shape != (arm.n,):
        hint = " (for a batch, wrap the call in jax.vmap)" if x.ndim == 2 and x.shape[-1] == arm.n else ""
        raise ValueError(f"{func}: {name}: expected shape ({arm.n},) for this {arm.n}-joint arm, got {x.shape}{hint}")
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise TypeError(f"{func}: {name}: expected real numbers, got dtype {x.dtype}")
    if jnp.issubdtype(x.dtype, jnp.integer):
        x = x.astype(jnp.result_type(float))
    if _is_concrete(x) and not bool(np.all(np.isfinite(np.asarray(x)))):
        bad = np.flatnonzero(~np.isfinite(np.asarray(x)))
        raise ValueError(f"{func}: {name}: expected finite values, got {np.asarray(x)[bad].tolist()} at joint(s) {(bad + 1).tolist()}")
    return x


def state_vector(x, arm, name: str, func: str, *, xp=jnp):
    """Validate a state x = (q, qd): shape (2n,), real values, finite when concrete; an array of
    ``xp``, floating."""
    n = arm.n
    x = xp.asarray(x)
    if x.shape != (2 * n,):
        raise ValueError(f"{func}: {name}: expected shape ({2 * n},) = (q, qd) stacked, got {x.shape}")
    q = joint_vector(x[:n], arm, f"{name}[:n] (q)", func, xp=xp)
    qd = joint_vector(x[n:], arm, f"{name}[n:] (qd)", func, xp=xp)
    return xp.concatenate([q, qd]).astype(jnp.result_type(q.dtype, float))


def wrench(x, name: str, func: str, *, xp=jnp):
    """Validate an external wrench (force, moment): shape (6,), finite when concrete; an array
    of ``xp``."""
    if x is None:
        return None
    x = xp.asarray(x)
    if x.shape != (6,):
        raise ValueError(f"{func}: {name}: expected shape (6,) = (force xyz, moment xyz), got {x.shape}")
    if _is_concrete(x) and not bool(np.all(np.isfinite(np.asarray(x)))):
        raise ValueError(f"{func}: {name}: expected finite values, got {np.asarray(x).tolist()}")
    return x
