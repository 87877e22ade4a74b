"""One state's dynamics called eagerly, compiled whole.

A function of this layer called outside any jit, vmap or derivative would run op by op: JAX
dispatches every operation on its own, 7-26 ms a call for the Panda's dynamics (hundreds of
operations), against about 0.1 ms for the same work compiled. :func:`compiled_when_eager`
runs such a call as one compiled program instead, kept for the next call:

- for the first arm of a structure (joint count and kinds, the shapes and dtypes of its leaves),
  a program with the arm's values as constants, so that the component algebra folds its zeros
  and ones as under a user's jit that closes over the arm (a third to a fifth of the compile
  time of a program that takes the arm as an argument: the Panda's mass matrix 0.66 s against
  2.2 s);
- once another arm of that structure is met (an arm with a payload, a perturbed or identified
  one), one program that takes the arm as an argument, for every further arm of it: so a loop
  over many arms compiles once, not once per arm.

A ``jax.vmap``, ``jax.jacfwd`` or ``jax.grad`` with respect to the state, applied outside any jit
with a known arm, transforms that kept program instead of every operation (Puma 560: an eager
``jax.vmap`` of inverse dynamics over 4096 states 60 ms a call op by op, 2.5-5 ms kept). A
gradient with respect to the arm outside a jit (``jax.grad`` or ``jax.vjp``: a fit's step in a
Python loop) runs a program kept for it (:func:`_kept_for_traced`): the arm's traced leaves its
arguments, its known ones constants, and JAX keeps the differentiated program, so every call
after the first runs compiled (a Panda's torque loss over 1000 samples with respect to the whole
arm: 0.95-1.03 s a call op by op, 12-14 ms kept; the first call 6.7-8.5 s op by op, 5.8-6.3 s
kept; one state: 5.6-6.9 s and 0.83-0.87 s op by op, 11-12 s and 11-12 ms kept;
``python experiments/eager_calls.py --gradients 1000``). A Jacobian with respect to the arm
(``jax.jacfwd``, one call) runs as written, op by op: XLA:CPU compiles the Jacobian with respect
to every parameter as one program more slowly (8 s for the Puma's inverse dynamics, with the
product of :func:`_fenced`; 55 s without) than op by op runs it (5-9 s). Inside a jit, the
function runs as written, ended by that product under ``jax.jacfwd`` with respect to the arm.

    python experiments/eager_calls.py   # first call, programs compiled and time per call, both ways
"""

from __future__ import annotations

import collections
import copy
import functools
import inspect
import threading

import jax
import jax.numpy as jnp
import numpy as np

from ..core import tracers
from ..core.xla import by_value, eager_compiled
from ..model import checks
from ..model.arm import Arm
from .algebra import _dot_identity

# arguments that are a wrench (force, moment) rather than a per-joint vector
WRENCHES = ("f_ext",)

# the programs kept for eager calls, most recently used last, at most PROGRAMS_KEPT: per function,
# settings and arm structure (joint count and kinds, leaf shapes and dtypes), one with the first
# arm's values as constants and, once another arm of that structure is met, one that takes the
# arm as an argument
_PROGRAMS = collections.OrderedDict()
PROGRAMS_KEPT = 64
# the structures met (their first arm's program compiled), most recently met last
_STRUCTURES = collections.OrderedDict()
_LOCK = threading.Lock()


def compiled_when_eager(fn=None, *, static=(), states=()):
    """Decorate ``fn(arm, *vectors)`` (each vector a per-joint array, a wrench named in
    :data:`WRENCHES` or a state (q, qd) named in ``states``; ``static``: names of arguments that
    are Python settings, constants of the compiled program).

    Called with no leaf of its arguments traced, it checks them on their values (the arm with
    :func:`jaxarm.model.checks.check_arm`, each vector with :func:`~jaxarm.model.checks.joint_vector`,
    :func:`~jaxarm.model.checks.wrench` or :func:`~jaxarm.model.checks.state_vector`, so that bad
    input is reported as it is when traced, before anything compiles) and runs ``fn`` as one
    compiled program kept for the next call (the settings its constants, the vectors its
    arguments, the arm as the module's description says). Called with a known arm under a vmap
    or derivative applied outside any jit, it runs that kept program on the traced vectors.
    Otherwise it runs ``fn`` itself, which ``fn.__wrapped__`` is too (with a traced arm that
    carries a forward-mode basis, ``jax.jacfwd`` with respect to it, its output ended by
    :func:`_fenced`)."""
    if fn is None:
        return functools.partial(compiled_when_eager, static=static, states=states)
    signature = inspect.signature(fn)
    arm_name = next(iter(signature.parameters))
    func = fn.__name__

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            given = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return fn(*args, **kwargs)  # Python's own message for a wrong call
        settings = tuple((k, v) for k, v in given.items() if k in static)
        vectors = {k: v for k, v in given.items() if k not in static and k != arm_name}
        arm = given.get(arm_name)
        if not checks.concrete(arm):
            values = list(vectors.values())
            if isinstance(arm, Arm) and tracers.transformed_eagerly((arm, values)) and tracers.reversed_eagerly(arm):
                # jax.grad with respect to the arm outside any jit: its kept program, transformed
                split = checks.TracedLeaves(arm)
                program = _kept_for_traced(fn, settings, split, tracers.shared_reversed(arm, values))
                if program is not None:
                    return program(split.traced, vectors)
            out = fn(*args, **kwargs)
            return _fenced(out) if tracers.forward_basis(arm) else out
        checks.check_arm(arm, func)
        if checks.concrete(list(vectors.values())):
            for name, value in vectors.items():
                if value is not None:
                    check = (checks.wrench if name in WRENCHES else functools.partial(
                        checks.state_vector if name in states else checks.joint_vector, arm=arm))
                    vectors[name] = check(value, name=name, func=func, xp=np)  # on the host: no dispatch
        elif not tracers.transformed_eagerly(list(vectors.values())):
            return fn(*args, **kwargs)
        # (traced vectors: a derivative or vmap with respect to the state applied outside any jit,
        # jax.vmap(jaxarm.inverse_dynamics, (None, 0, 0, 0))(arm, ...): the kept program, applied to
        # the traced values, so that the transformation, too, is one program compiled once; they
        # are checked at trace time, as inside a jit)
        program, pass_arm = _kept(fn, settings, arm)
        if program is None:  # a setting that cannot key a kept program
            return fn(*args, **kwargs)
        return program(arm, vectors) if pass_arm else program(vectors)

    return call


def _fenced(out):
    """``out`` (each floating array) multiplied by the identity on its last axis: the same numbers
    where they are finite (an infinite entry makes its row NaN, 0 * inf).

    Under ``jax.jacfwd`` with respect to the arm, every output is a vmap over the basis of the
    arm's parameters, and the component algebra makes it one long elementwise expression; jacfwd
    then cuts the result into one block per arm leaf, and XLA fuses the whole expression into each
    of those slices, computing it once per leaf (the Puma 560's inverse dynamics: 27 copies, an
    optimized program of 20 MB that XLA:CPU compiles in 41-55 s). XLA fuses no elementwise
    producer into a dot, so the product ends the expression there: computed once, then cut
    (compiled in 7-8 s, 6 MB, and 0.86 ms a call instead of 1.39 ms;
    ``experiments/arm_jacobian_compile.py``).
    The optimization barrier that would say this directly is dropped by XLA:CPU."""
    def one(x):
        if not hasattr(x, "dtype") or x.ndim == 0 or x.size == 0 or not jnp.issubdtype(x.dtype, jnp.inexact):
            return x
        return _dot_identity(x)

    return jax.tree_util.tree_map(one, out)


def _kept(fn, settings, arm):
    """The kept program for a call of ``fn`` with these settings and this (known) arm, and
    whether it takes the arm as an argument; (None, False) where a setting cannot key it."""
    tree, leaves = by_value(arm)  # the arm's structure and each leaf's dtype, shape and bytes' digest
    try:
        structure = _Key((fn, settings, tree, tuple(leaf[:2] for leaf in leaves)))
    except TypeError:
        return None, False
    known = _Key((structure, leaves))
    with _LOCK:  # (the programs are made here, compiled at their first call, outside)
        if known not in _PROGRAMS and structure in _STRUCTURES:
            # another arm of a structure met before: one program for every arm of it
            return eager_compiled(structure, lambda: _program_of_any_arm(fn, settings), store=_PROGRAMS, size=PROGRAMS_KEPT), True
        program = eager_compiled(known, lambda: _program(fn, arm, settings), store=_PROGRAMS, size=PROGRAMS_KEPT)
        _STRUCTURES.pop(structure, None)
        _STRUCTURES[structure] = None
        while len(_STRUCTURES) > PROGRAMS_KEPT:
            _STRUCTURES.popitem(last=False)
        return program, False


class _Key:
    """A key of the kept programs that hashes its tuple once (it is looked up several times)."""

    __slots__ = ("value", "hash")

    def __init__(self, value):
        self.value, self.hash = value, hash(value)

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        return isinstance(other, _Key) and self.hash == other.hash and self.value == other.value


def _program(fn, arm, settings):
    frozen = jax.tree_util.tree_map(np.array, arm)  # a copy: the values the program is kept under
    return jax.jit(lambda vectors: fn(frozen, **vectors, **dict(settings)))


def _kept_for_traced(fn, settings, split, summed):
    """The kept program for a call of ``fn`` with an arm differentiated in reverse mode outside
    any jit (``jax.grad`` of a loss with respect to the arm, called in a Python loop), the arm
    given split (:class:`jaxarm.model.checks.TracedLeaves`): its traced leaves the program's
    arguments, its known leaves constants (by value: they key the program,
    and fold), ``summed`` whether the gradient is summed over a batch of states (a ``jax.vmap``
    inside the ``jax.grad``; :func:`jaxarm.core.tracers.shared_reversed`, which the program's jit
    cannot see and is told: :func:`jaxarm.core.tracers.shared_reversed_as`; and that reverse mode
    differentiates the arm, :func:`jaxarm.core.tracers.reverse_differentiated_as`, so that traced
    kinematics are read in groups as under a jit: ``newton_euler._reads_grouped``; a Panda's
    one-state gradient with respect to the whole arm, first call 7.4 s (11.9 s in an earlier
    run), ``experiments/eager_calls.py --gradients 1000``). JAX differentiates
    (and batches) the program and keeps what it made, so every call after the first runs compiled:
    a Panda's torque loss over 1000 samples, differentiated with respect to the whole arm, 6.7-8.5 s
    the first call and 0.95-1.03 s each after op by op; kept, 5.8-6.3 s and 12-14 ms. None where a
    setting cannot key a program."""
    known = [None if a is None else np.array(a) for a in split.leaves]
    try:
        key = _Key(("traced", fn, settings, split.treedef, tuple(split.index),
                    tuple((jnp.shape(x), jnp.result_type(x)) for x in split.traced), by_value(known), bool(summed)))
    except TypeError:
        return None

    def make():
        frozen = copy.copy(split)  # the same split, its known leaves the copies the program is kept under
        frozen.leaves, frozen.traced = known, []  # (and no tracer of this call kept with it)

        def run(traced, vectors):
            # (kept for reverse mode only: reverse_differentiated_as tells the trace so)
            with tracers.shared_reversed_as(summed), tracers.reverse_differentiated_as(True):
                return fn(frozen.join(traced), **vectors, **dict(settings))

        return jax.jit(run)

    with _LOCK:
        return eager_compiled(key, make, store=_PROGRAMS, size=PROGRAMS_KEPT)


def _program_of_any_arm(fn, settings):
    return jax.jit(lambda arm, vectors: fn(arm, **vectors, **dict(settings)))
