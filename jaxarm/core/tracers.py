"""The tracers jax wraps values in while it transforms a function, as jaxarm reads them to pick
the form of a program (which transformations are around a call, whether it is being staged out).
They are jax internals (``jax._src.interpreters``); where this jax lacks one, the kinds it cannot
tell apart are reported as absent and the programs keep their default forms. Also here:
:func:`batched_with`, which starts a loop's carry batched under ``jax.vmap`` (built on jax's
public ``custom_vmap`` and ``custom_jvp`` only)."""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
import numpy as np

try:  # forward- and reverse-mode differentiation, vmap's (which may wrap them), a staged program's
    from jax._src.interpreters.ad import JVPTracer
    from jax._src.interpreters.batching import BatchTracer
    from jax._src.interpreters.partial_eval import DynamicJaxprTracer as StagingTracer
    try:
        from jax._src.interpreters.ad import LinearizeTracer
        AD_TRACERS: tuple = (JVPTracer, LinearizeTracer)
        REVERSE_TRACERS: tuple = (LinearizeTracer,)
    except ImportError:  # pragma: no cover  (jax without a linearize trace: grad traces JVPs)
        AD_TRACERS, REVERSE_TRACERS = (JVPTracer,), ()
except ImportError:  # pragma: no cover
    AD_TRACERS, REVERSE_TRACERS, BatchTracer, StagingTracer = (), (), (), jax.core.Tracer


def strong(x):
    """``x`` as an array without JAX's weak type (``jnp.full(shape, 0.1)`` is weakly typed, and a
    weak and a strong array of the same shape and dtype compile separately): the same shapes and
    dtypes always reuse one compiled kernel."""
    if isinstance(x, jax.core.Tracer):
        return x.astype(x.dtype) if x.weak_type else x
    if isinstance(x, jax.Array) and not x.weak_type:
        return x
    # a known value goes through NumPy and device_put (an eager astype, or jnp.asarray, would
    # compile a small program of its own for each shape and dtype)
    return jax.device_put(np.asarray(x))


def wrapped(x):
    """x and the tracers it wraps, outermost first: a vmap's tracer wraps its values (``val``), a
    jvp's or grad's its primal (``primal``); any other tracer (a staged program's) ends the chain.
    Nothing for a value that is not a tracer."""
    while isinstance(x, jax.core.Tracer):
        yield x
        if isinstance(x, AD_TRACERS):
            x = getattr(x, "primal", None)
        else:
            x = getattr(x, "val", None) if isinstance(x, BatchTracer) else None


def known_underneath(x) -> bool:
    """Whether tracer ``x`` wraps (through vmaps' and jvps' tracers, :func:`wrapped`) a value that
    is known while the function is traced: ``jax.vmap`` over arrays that a jitted function closed
    over, which are constants of the program XLA compiles. False for a value that is not a tracer,
    and where a staged program's tracer ends the chain (an argument of the jit)."""
    last = None
    for last in wrapped(x):
        pass
    if last is None:
        return False
    inner = getattr(last, "primal", None) if isinstance(last, AD_TRACERS) else getattr(last, "val", last)
    return not isinstance(last, StagingTracer) and inner is not None and not isinstance(inner, jax.core.Tracer)


def encloses(outer, inner) -> bool:
    """Whether the transformation that made tracer ``outer`` is applied around the one that made
    tracer ``inner`` (``jax.grad(jax.vmap(f))``: the gradient's tracers enclose the vmap's). False
    where this jax keeps no chain of traces."""
    target, t = getattr(outer, "_trace", None), getattr(inner, "_trace", None)
    while t is not None and target is not None:
        t = getattr(t, "parent_trace", None)
        if t is target:
            return True
    return False


def same_transformation(a, b) -> bool:
    """Whether tracers a and b were made by the same transformation (the same vmap, say)."""
    trace = getattr(a, "_trace", None)
    return trace is not None and trace is getattr(b, "_trace", None)


def batch_size(x) -> int:
    """The size of the batch axis of a vmap's tracer x."""
    dim = getattr(x, "batch_dim", None)
    return int(x.val.shape[dim]) if isinstance(dim, int) else 0


def vmapped_size(tree) -> int:
    """How many values each array of ``tree`` stands for while it is traced: the product of the
    sizes of the vmaps around it (its chain of tracers, :func:`wrapped`), the largest over the
    leaves; 1 where no vmap is seen (none, or one applied outside a jit that traces this)."""
    size = 1
    for leaf in jax.tree_util.tree_leaves(tree):
        n = 1
        for t in wrapped(leaf):
            if isinstance(t, BatchTracer):
                n *= max(batch_size(t), 1)
        size = max(size, n)
    return size


def shared_reversed(shared, batched) -> bool:
    """Whether reverse mode differentiates ``shared`` (a pytree: an arm) across a batch (of more
    than one) that the leaves of ``batched`` (states, inputs) belong to and ``shared`` does not:
    a ``jax.grad`` taken around a ``jax.vmap`` that leaves ``shared`` out (identification from
    many samples or experiments). Its cotangent is then a sum over the batch. Not for a
    ``jax.vmap`` of ``jax.grad`` (one gradient per member: nothing is summed), a batch of one, or
    forward mode. False where this jax cannot tell. Inside :func:`shared_reversed_as` (a program
    traced for transformations applied around it, which it cannot see), the answer given there."""
    forced = getattr(_SHARED_REVERSED, "value", None)
    if forced is not None:
        return forced
    batches = [t for x in jax.tree_util.tree_leaves(batched) for t in wrapped(x)
               if isinstance(t, BatchTracer) and batch_size(t) > 1]
    if not batches:
        return False
    for leaf in jax.tree_util.tree_leaves(shared):
        if not (isinstance(leaf, jax.core.Tracer) and jnp.issubdtype(leaf.dtype, jnp.inexact)):
            continue  # only a traced floating-point array can carry a tangent
        chain = list(wrapped(leaf))
        for b in batches:
            if any(same_transformation(t, b) for t in chain):
                continue  # batched by this vmap as well
            if any(isinstance(t, REVERSE_TRACERS) and encloses(t, b) for t in chain):
                return True
    return False


_SHARED_REVERSED = threading.local()


@contextlib.contextmanager
def _answering(answer: threading.local, value: bool):
    """While inside, ``answer.value`` is ``value`` (the answer a question below gives instead of
    looking at the tracers); restored after."""
    previous = getattr(answer, "value", None)
    answer.value = bool(value)
    try:
        yield
    finally:
        answer.value = previous


def shared_reversed_as(value: bool):
    """While a program is traced for transformations that will be applied around it (a program
    kept for eager calls, whose jit hides the ``jax.grad`` and ``jax.vmap`` outside it),
    :func:`shared_reversed` answers ``value``, found outside (a context manager)."""
    return _answering(_SHARED_REVERSED, value)


def reverse_differentiated(tree) -> bool:
    """Whether reverse mode (``jax.grad``, ``jax.vjp``) differentiates a leaf of ``tree`` here, and
    no forward mode along a basis (``jax.jacfwd``, ``jax.hessian``) does. False where this jax
    cannot tell. Inside :func:`reverse_differentiated_as` (a program traced for a reverse mode
    applied around it, which it cannot see), the answer given there."""
    forced = getattr(_REVERSE_DIFFERENTIATED, "value", None)
    if forced is not None:
        return forced
    return reversed_eagerly(tree)


_REVERSE_DIFFERENTIATED = threading.local()


def reverse_differentiated_as(value: bool):
    """While a program is traced for a reverse mode that will be applied around it (a program kept
    for eager gradients), :func:`reverse_differentiated` answers ``value`` (a context manager)."""
    return _answering(_REVERSE_DIFFERENTIATED, value)


def reversed_eagerly(tree) -> bool:
    """Whether reverse mode (``jax.grad``, ``jax.vjp``) applied outside any jit differentiates a
    leaf of ``tree``, and no forward mode along a basis (``jax.jacfwd``, ``jax.hessian``) does
    (inside a jit too: the tracers tell, not where they were made; :func:`reverse_differentiated`
    asks it where a kept program may have been told the answer)."""
    if forward_basis(tree):
        return False
    return any(isinstance(t, REVERSE_TRACERS) for leaf in jax.tree_util.tree_leaves(tree) for t in wrapped(leaf))


def forward_basis(tree) -> bool:
    """Whether some leaf of ``tree`` is differentiated in forward mode along a batch of
    directions: ``jax.jacfwd`` (or ``jax.hessian``) with respect to it, which runs a jvp whose
    tangents are a vmap over the basis. False where this jax cannot tell."""
    for leaf in jax.tree_util.tree_leaves(tree):
        for t in wrapped(leaf):
            if isinstance(t, AD_TRACERS) and isinstance(getattr(t, "tangent", None), BatchTracer):
                return True
    return False


def eager() -> bool:
    """Whether the caller runs outside every jax transformation (no jit, vmap or derivative is
    being traced) with jits enabled, so that a program compiled now would run at once. False
    under ``jax.disable_jit()`` (nothing is compiled there), and where this jax cannot tell."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover
        return False
    return bool(trace_state_clean()) and not jax.config.jax_disable_jit


def transformed_eagerly(tree) -> bool:
    """Whether the leaves of ``tree`` include tracers and every one of them belongs to
    transformations applied outside any jit (``jax.vmap``, ``jax.jvp``, ``jax.grad``,
    ``jax.jacfwd`` called eagerly): each chain of wrapped tracers ends at a known value, with no
    staged program among them. A function wrapped in a ``jax.jit`` there is transformed and
    compiled as one program; run as it is, every operation of it would be transformed and
    dispatched on its own. False under ``jax.disable_jit()`` and where this jax cannot tell."""
    if jax.config.jax_disable_jit or StagingTracer is jax.core.Tracer:
        return False
    found = False
    for leaf in jax.tree_util.tree_leaves(tree):
        if not isinstance(leaf, jax.core.Tracer):
            continue
        found = True
        last = list(wrapped(leaf))[-1]  # (what it wraps is no tracer, or it is not a vmap's or derivative's)
        if isinstance(last, AD_TRACERS):
            inner = getattr(last, "primal", None)
        elif isinstance(last, BatchTracer):
            inner = getattr(last, "val", None)
        else:  # a staged program's tracer, or one this module does not know
            return False
        if inner is None:
            return False
    return found


def kept_program_answers(known, values) -> bool:
    """Whether a program compiled and kept for the next call (:func:`jaxarm.core.xla.eager_compiled`,
    its constants ``known``, its arguments ``values``) answers this call: called eagerly, or under
    transformations applied outside any jit (:func:`transformed_eagerly`) that reach ``values``
    only, ``known`` holding no tracer (its values key the kept program). JAX then keeps the
    transformed program too."""
    return eager() or (not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(known))
                       and transformed_eagerly(values))


@jax.custom_batching.custom_vmap
def _mark_batched(leaves, refs):
    return leaves


@_mark_batched.def_vmap
def _mark_batched_rule(axis_size, in_batched, leaves, refs):
    leaves_batched, refs_batched = in_batched
    if not (any(leaves_batched) or any(refs_batched)):
        return leaves, leaves_batched
    return [x if b else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x)) for x, b in zip(leaves, leaves_batched)], [True] * len(leaves)


@jax.custom_jvp
def _mark(leaves, refs):
    return _mark_batched(leaves, refs)


@_mark.defjvp
def _mark_jvp(primals, tangents):
    # the identity's derivative (a batching rule alone has no reverse mode)
    return _mark_batched(*primals), tangents[0]


def batched_with(carry, refs):
    """A loop's initial ``carry`` as it is; under ``jax.vmap``, batched in every leaf as soon as a
    leaf of ``carry`` or a traced leaf of ``refs`` (what the loop reads) is batched.

    ``jax.vmap`` finds which parts of a loop's carry are batched by a fixpoint: it batches the
    body with the initial carry's pattern, and again each time a part the body's output batches
    was unbatched on the way in (a counter, a flag, a step length starts as a constant), then once
    more for the loop itself; each of those passes batches the loops inside the body the same way
    over. Under ``jax.vmap`` of a solve, every part of every carry ends up batched (each loop's
    predicate depends on the problem, which batches the whole carry), so starting there changes
    nothing the program computes and batches each body once (docs/guide/trajopt.md, "Tracing a
    ``jax.vmap``-ed solve": the DDP solver's while loops were batched 14 times where there are 5,
    and a batched Puma duration sweep traced and compiled in 9.2-9.5 s instead of 19.6-20.7 s).
    Unbatched, this is the identity; differentiated, the identity's derivative."""
    leaves, tree = jax.tree_util.tree_flatten(carry)
    traced = [r for r in jax.tree_util.tree_leaves(refs) if isinstance(r, jax.core.Tracer)]
    return jax.tree_util.tree_unflatten(tree, _mark([jnp.asarray(x) for x in leaves], traced))
