"""XLA compiler options for the jitted entry points jaxarm owns.

Two options of jaxlib's CPU backend (0.10.x) matter for arm dynamics, both measured in the same
process (docs/benchmarks.md):

- ``xla_cpu_experimental_ynn_fusion_type=""``: no YNNPACK fusions (``__ynn_fusion`` in the compiled
  HLO). For the tiny per-state arrays of arm dynamics (3-vectors, 3x3 rotations, batched) those
  calls cost far more than the arithmetic: turning them off made batched inverse dynamics 2.6x
  (float64) to 30x (float32) faster and 1000-step RK3 rollouts several times faster.
- ``xla_cpu_use_fusion_emitters=False``: the classic loop emitter instead of the MLIR fusion
  emitters. The component-wise forward dynamics of a rollout step is one large elementwise fusion
  of a few thousand scalar operations; the fusion emitters compile it into slower code, and for
  longer (1000-step RK3 rollouts of the Puma at batch 4096: 2.1x the steps/s, compile 5.4 -> 4.1 s;
  batched inverse dynamics, mass matrix and forward dynamics unchanged within noise).

:func:`compiler_options` returns the options the running jaxlib accepts (each is tried once), on a
CPU default backend only, and ``{}`` elsewhere (GPU, TPU). Nothing is set globally: users' own
``jax.jit`` calls are unaffected (they can set ``XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=
--xla_cpu_use_fusion_emitters=false"`` themselves, or jit with :func:`jit`).

:func:`jit` also compiles small while loops into single kernels (:func:`loop_kernels`, one of
XLA's backend options, which ``compiler_options`` cannot carry): at batches up to 64, 1000-step
RK3 rollouts ran 1.1-2.3x faster and their gradients 1.1-3.3x faster
(``experiments/loop_kernels.py``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import os
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np

try:  # (jax.core's names before jax 0.4.36)
    from jax.extend.core import ClosedJaxpr as _ClosedJaxpr, Jaxpr as _Jaxpr, Literal as _Literal
except ImportError:  # pragma: no cover
    from jax.core import ClosedJaxpr as _ClosedJaxpr, Jaxpr as _Jaxpr, Literal as _Literal

YNN_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}
FUSION_EMITTERS_OFF = {"xla_cpu_use_fusion_emitters": False}
CPU_OPTIONS = {**YNN_OFF, **FUSION_EMITTERS_OFF}


def options_for(platform: str, accepted) -> dict:
    """The options for a default backend ``platform`` ("cpu", "gpu", "tpu", ...): those of
    :data:`CPU_OPTIONS` whose name is in ``accepted`` (the names the running jaxlib accepted), on
    CPU only (pure logic, separated for testing)."""
    if platform != "cpu":
        return {}
    return {name: value for name, value in CPU_OPTIONS.items() if name in accepted}


@functools.lru_cache(maxsize=None)
def _cpu_accepts(name: str) -> bool:
    """Compile a tiny function once with the option ``name``; False if this jaxlib rejects it."""
    try:
        jax.jit(lambda x: x + 1.0, compiler_options={name: CPU_OPTIONS[name]}).lower(jnp.zeros(2)).compile()
    except Exception:  # unknown option, or a jax without per-jit compiler_options
        return False
    return True


def compiler_options() -> dict:
    """``compiler_options`` for ``jax.jit``: on CPU the options of :data:`CPU_OPTIONS` this jaxlib
    accepts, else ``{}``. A fresh dict each call (callers may pass it on)."""
    platform = jax.default_backend()
    if platform != "cpu":
        return {}
    return options_for(platform, {name for name in CPU_OPTIONS if _cpu_accepts(name)})


# ---------------------------------------------------------------------------------------------
# Whole loops as single kernels on a CPU
#
# XLA:CPU runs a compiled program as a sequence of kernels ("thunks"), and a while loop's body as
# such a sequence in every iteration: each fused loop, copy, dynamic slice and conditional of a
# rollout step costs a dispatch of its own, and at small batches those dispatches, not the
# arithmetic, take most of the time (the gradient of a batch-16 Panda rollout runs about 210
# kernels per step). XLA's small-while-loop pass (``SmallWhileLoopHoistingPass``) compiles a while
# loop whose body reads and writes less than ``xla_cpu_small_while_loop_byte_threshold`` bytes
# per iteration into one kernel instead, the loop's control flow inside it; the threshold is 1 kB
# unless set, so no loop of a rollout qualifies. One kernel runs on one core, so the pass only
# pays where the loop's arrays are small (docs/benchmarks.md, "Whole loops as single kernels").
# The threshold is one of XLA's backend options, a map that ``jax.jit``'s ``compiler_options``
# cannot set; jaxarm puts it into the compile options of its own compiles only
# (:func:`loop_kernels`), and nothing is set globally: a user's own ``jax.jit`` gets it with
# ``XLA_FLAGS=--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=N``.


def _loop_kernel_bytes():
    """$JAXARM_LOOP_KERNEL_BYTES as a byte count; unset: 512 kB; "off" (or 0): None, XLA's own."""
    setting = os.environ.get("JAXARM_LOOP_KERNEL_BYTES")
    if setting is None:
        return 1 << 19
    if setting.strip().lower() in _OFF:
        return None
    try:
        value = int(setting)
    except ValueError:
        raise ValueError(f"JAXARM_LOOP_KERNEL_BYTES: expected a byte count or 'off', got {setting!r}") from None
    if value < 0:
        raise ValueError(f"JAXARM_LOOP_KERNEL_BYTES: expected a byte count >= 0 or 'off', got {setting!r}")
    return value


_OFF = ("", "0", "off", "no", "false", "none")
LOOP_KERNEL_BYTES = _loop_kernel_bytes()
"""The byte threshold under which :func:`jit` compiles a while loop into one kernel on a CPU:
512 kB, or ``$JAXARM_LOOP_KERNEL_BYTES`` (``off``: XLA's own default, 1 kB). XLA measures a loop
by the bytes one iteration of its body reads and writes. At 512 kB the time loops of 1000-step
rollouts qualify up to about 100 rollouts at once and those of their gradients up to about 64;
at 256 rollouts one kernel on one core was slower than XLA's multi-threaded kernels (Panda
gradient: 303 against 262 ms with 1 MB), so larger batches keep XLA's default."""

_LOOP_OPTION = "xla_cpu_small_while_loop_byte_threshold"
_extra = threading.local()  # the backend options of the compiles made on this thread now
_patch = {"installed": False, "error": None}


def _proto_field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    def varint(n):
        out = bytearray()
        while True:
            low, n = n & 0x7F, n >> 7
            out.append(low | (0x80 if n else 0))
            if not n:
                return bytes(out)
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def with_backend_options(compile_options, options: dict):
    """``compile_options`` (jaxlib's ``CompileOptions``) with entries added to its
    ``debug_options.xla_backend_extra_options`` map (DebugOptions field 500, in
    ``executable_build_options``, field 3 of both messages). A serialized message followed by
    more fields of the same message parses as their merge, so the entries are appended to the
    serialization and the whole parsed again."""
    entries = b"".join(_proto_field(500, _proto_field(1, str(k).encode()) + _proto_field(2, str(v).encode()))
                       for k, v in options.items())
    patch = _proto_field(3, _proto_field(3, entries))
    return type(compile_options).ParseFromString(compile_options.SerializeAsString() + patch)


def _install_backend_options() -> bool:
    """Route the backend options of :func:`loop_kernels` into jax's compile options: wrap
    ``jax._src.compiler.get_compile_options`` once, so that a compile made inside
    :func:`loop_kernels` on this thread gets them and every other compile is left as it was.
    False, with the reason kept (:func:`loop_kernels_status`), where this jax has no such
    function or its compile options do not serialize as expected."""
    if _patch["installed"] or _patch["error"]:
        return _patch["installed"]
    try:
        from jax._src import compiler
        from jax._src.lib import xla_client

        probe = with_backend_options(xla_client.CompileOptions(), {_LOOP_OPTION: 1})
        if _LOOP_OPTION.encode() not in probe.SerializeAsString():
            raise RuntimeError("the option did not survive a round trip through CompileOptions")
        original = compiler.get_compile_options

        @functools.wraps(original)
        def get_compile_options(*args, **kwargs):
            options = original(*args, **kwargs)
            extra = getattr(_extra, "options", None)
            if not extra or _patch["error"]:
                return options
            try:
                return with_backend_options(options, extra)
            except Exception as error:  # never fail a compile for a speed option: compile without it
                _patch["error"] = f"{type(error).__name__}: {error}"
                return options

        compiler.get_compile_options = get_compile_options
    except Exception as error:  # a jax whose internals differ: compile as before
        _patch["error"] = f"{type(error).__name__}: {error}"
        return False
    _patch["installed"] = True
    return True


@contextlib.contextmanager
def loop_kernels(threshold: int | None = None):
    """Compiles made inside this context (on this thread, on a CPU) compile each while loop whose
    body reads and writes less than ``threshold`` bytes per iteration (default
    :data:`LOOP_KERNEL_BYTES`; None there: XLA's own default) into one kernel. ``threshold=0``
    turns XLA's pass off. :func:`jit` compiles inside it; use it around
    ``jax.jit(f).lower(...).compile(compiler_options=jaxarm.compiler_options())`` to get what
    :func:`jit` gets."""
    threshold = LOOP_KERNEL_BYTES if threshold is None else int(threshold)
    if threshold is not None and threshold < 0:
        raise ValueError(f"loop_kernels: threshold: expected a byte count >= 0, got {threshold}")
    extra = _backend_options(threshold, jax.default_backend())
    if not extra:
        yield
        return
    previous = getattr(_extra, "options", None)
    _extra.options = {**(previous or {}), **extra}
    try:
        yield
    finally:
        _extra.options = previous


def _backend_options(threshold, platform):
    """The backend options of compiles for ``platform`` with a loop-kernel ``threshold`` (None:
    XLA's own), or None where there are none to add (not a CPU; this jax cannot carry them)."""
    if threshold is None or platform != "cpu" or not _install_backend_options():
        return None
    return {_LOOP_OPTION: threshold}


def loop_kernels_active() -> bool:
    """Whether the program being traced or compiled now, on this thread, will have its small while
    loops compiled as single kernels: inside :func:`jit` or :func:`loop_kernels` with a threshold
    above zero, or, outside them, with a threshold above XLA's own 1 kB in ``XLA_FLAGS``. A hint
    for the form of a program, read while it is traced
    (:func:`jaxarm.integrators.gradient_written_out`)."""
    options = getattr(_extra, "options", None) or {}
    threshold = options.get(_LOOP_OPTION)
    if threshold is None:  # set for every compile by the user (XLA_FLAGS, read when jax starts)
        threshold = _flag_threshold(os.environ.get("XLA_FLAGS", ""))
        return threshold is not None and threshold > _XLA_LOOP_BYTES
    return int(threshold) > 0


_XLA_LOOP_BYTES = 1024  # XLA's own threshold: no loop of a rollout's qualifies


def _flag_threshold(flags: str):
    """The small-while-loop byte threshold set in an ``XLA_FLAGS`` string, or None."""
    found = re.findall(_LOOP_OPTION + r"=(\d+)", flags)
    return int(found[-1]) if found else None


_EMITTERS_OPTION = "xla_cpu_use_fusion_emitters"


def fusion_emitters_active() -> bool:
    """Whether the program being lowered on this thread now will be compiled by XLA:CPU's fusion
    emitters (XLA's default): False inside a call of :func:`jit` (which turns them off) and where
    the user's ``XLA_FLAGS`` turn them off for every compile. For lowering rules that shape a
    program for one emitter or the other (:func:`jaxarm.dynamics.algebra.entries`' ``stored``)."""
    if getattr(_extra, "emitters_off", False):
        return False
    flag = re.findall(r"--xla_cpu_use_fusion_emitters=(\w+)", os.environ.get("XLA_FLAGS", ""))
    return not (flag and flag[-1].lower() in ("false", "0"))


@contextlib.contextmanager
def fusion_emitters_off():
    """Lower programs on this thread as for a compile with XLA:CPU's fusion emitters off, as
    :func:`jit` does (:func:`fusion_emitters_active`): for programs lowered by hand and compiled
    with :func:`compiler_options` (``jax.jit(f).lower(...).compile(compiler_options=...)``)."""
    previous = getattr(_extra, "emitters_off", False)
    _extra.emitters_off = True
    try:
        yield
    finally:
        _extra.emitters_off = previous


def loop_kernels_status() -> dict:
    """What :func:`jit` does with loops on this machine: the threshold in bytes, or why it is not
    applied (not a CPU; this jax's compile options could not carry it)."""
    if jax.default_backend() != "cpu":
        return {"loop_kernel_bytes": None, "reason": f"default backend {jax.default_backend()!r}, not a CPU"}
    if LOOP_KERNEL_BYTES is None:
        return {"loop_kernel_bytes": None, "reason": "JAXARM_LOOP_KERNEL_BYTES is off: XLA's own threshold (1 kB)"}
    if not _install_backend_options() or _patch["error"]:
        return {"loop_kernel_bytes": None, "reason": _patch["error"]}
    return {"loop_kernel_bytes": LOOP_KERNEL_BYTES}


def jit(fun=None, **kwargs):
    """``jax.jit`` with :func:`compiler_options` (decorator or call; other keywords pass through).
    The options are resolved at the first call, after the user has chosen the platform. Called
    inside another trace (the user's own jit, grad, vmap) it is a plain ``jax.jit``: jax accepts
    compiler options on top-level jits only, and the outer jit's options then apply."""
    if fun is None:
        return functools.partial(jit, **kwargs)
    compiled = {}

    @functools.wraps(fun)
    def wrapper(*args, **kw):
        nested = any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kw)))
        key = (jax.default_backend(), nested)
        if key not in compiled:
            options = {} if nested else {"compiler_options": compiler_options()}
            compiled[key] = (jax.jit(fun, **options, **kwargs),
                             options.get("compiler_options", {}).get(_EMITTERS_OPTION) is False)
        jitted, emitters_off = compiled[key]
        extra = None if nested else _backend_options(LOOP_KERNEL_BYTES, key[0])
        if not extra and not emitters_off:
            return jitted(*args, **kw)
        # (loop_kernels(), without a generator per call; and what fusion_emitters_active reads)
        previous, previous_off = getattr(_extra, "options", None), getattr(_extra, "emitters_off", False)
        _extra.options, _extra.emitters_off = extra, emitters_off
        try:
            return jitted(*args, **kw)
        finally:
            _extra.options, _extra.emitters_off = previous, previous_off

    return wrapper


# compiled programs kept for eager calls of the solvers (see eager_compiled), most recently used last
_EAGER = collections.OrderedDict()
EAGER_CACHE_SIZE = 8


def eager_compiled(key, make, *, store=None, size=None):
    """The compiled function kept under ``key`` (hashable), made by ``make()`` (a :func:`jit`) the
    first time. For a solver called eagerly, outside any jit, vmap or derivative: run op by op,
    every call traced and compiled its loops again; compiled once and kept, the next call with
    the same constants runs at once. At most ``size`` (default :data:`EAGER_CACHE_SIZE`) are kept
    in ``store`` (an ``OrderedDict``; default the solvers' own), the least recently used dropped
    first. None where ``key`` cannot be hashed (a setting that cannot key a kept program: the
    caller then runs the call as made)."""
    store = _EAGER if store is None else store
    size = EAGER_CACHE_SIZE if size is None else size
    try:
        hash(key)
    except TypeError:
        return None
    fn = store.pop(key, None)
    if fn is None:
        fn = make()
    store[key] = fn
    while len(store) > size:
        store.popitem(last=False)
    return fn


def by_value(tree):
    """A pytree of known values as a hashable key: its structure, and each leaf's dtype, shape and
    a digest of its bytes."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    digests = []
    for a in leaves:
        a = np.asarray(a)
        digests.append((a.dtype.str, a.shape, hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()))
    return structure, tuple(digests)


def split_settings(given: dict):
    """A solver's keyword arguments split into its settings (Python values, NumPy scalars as the
    Python values they hold, functions, optax transformations: constants of the compiled program
    and part of its key) and its arrays (arguments of the program)."""
    arrays = {k: v for k, v in given.items() if isinstance(v, (jax.Array, np.ndarray, list))}
    settings = tuple(sorted(((k, v.item() if isinstance(v, np.generic) else v) for k, v in given.items() if k not in arrays),
                            key=lambda kv: kv[0]))
    return settings, arrays


def passed_leaves(tree):
    """``tree`` (a user's pytree, e.g. a problem's ``params``) as arguments of a kept program:
    (key, leaves to pass, rebuild). Its arrays and floats are passed; its Python ints, bools and
    strings (an index a term reads, say) stay constants, in the key. ``rebuild(passed)`` is the
    tree again, from the passed leaves (traced, inside the program)."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    passed = [not isinstance(a, (int, str, np.bool_, np.integer)) for a in leaves]  # (bool is an int)
    kept = tuple((i, a) for i, (a, p) in enumerate(zip(leaves, passed)) if not p)

    def rebuild(values):
        it = iter(values)
        return jax.tree_util.tree_unflatten(structure, [next(it) if p else a for a, p in zip(leaves, passed)])

    return (structure, kept), [a for a, p in zip(leaves, passed) if p], rebuild


def enable_compilation_cache(path=None, *, min_compile_time: float = 0.5):
    """Keep compiled XLA programs in JAX's persistent compilation cache, so that a later process
    (a rerun of a script, a restarted notebook) loads them instead of compiling again: the first
    call of a trajectory-optimization solver, or of a long rollout's gradient, then costs its
    tracing and a load (seconds) instead of the whole compile (tens of seconds on a small CPU).

    Location: ``path``, else $JAXARM_CACHE_DIR, else $XDG_CACHE_HOME/jaxarm/xla, else
    ~/.cache/jaxarm/xla. ``JAXARM_CACHE_DIR=off`` disables it, and a cache already configured for
    JAX (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is left as it is. Programs that compile
    in less than ``min_compile_time`` seconds are not stored. Returns the directory in use (the
    one already configured, if any), or None when the cache is off or the directory cannot be
    created. The ``jaxarm`` command calls it on start.
    """
    if not (min_compile_time >= 0):
        raise ValueError(f"enable_compilation_cache: min_compile_time: expected a number >= 0, got {min_compile_time!r}")
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return str(configured)
    setting = path if path is not None else os.environ.get("JAXARM_CACHE_DIR")
    if setting is not None and str(setting).strip().lower() in _OFF:
        return None
    if setting is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        setting = os.path.join(base, "jaxarm", "xla")
    setting = os.fspath(setting)
    try:
        os.makedirs(setting, exist_ok=True)
    except OSError:
        return None  # no writable cache: compile every time
    jax.config.update("jax_compilation_cache_dir", setting)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time))
    return setting


def linearization(fn, *args):
    """``(fn(*args), residuals, apply)``: ``jax.linearize`` of ``fn`` at ``args`` split into the
    values its linear map reads that were computed from ``args`` (``residuals``, a list of arrays:
    the sines, rotations, velocities, ... the tangents are linear in) and the map itself,
    ``apply(residuals, *tangents)``, which closes over nothing traced. The residuals can so be
    computed where XLA cannot fuse them into each product that reads them
    (:func:`computed_once`), and ``apply`` vmapped over tangents, over points, or looped over.

    ``fn``'s forward mode is traced into one jaxpr (``jax.jvp``) and its equations sorted by what
    they read: the primal inputs only (evaluated here), the tangents (``apply``'s), or neither
    (constants: evaluated by both, so that XLA still folds them into the products); nested jits
    are inlined first. This takes less tracing than ``jax.linearize``, which linearizes each
    primitive by tracing its derivative rule apart (the Panda's step Jacobians at 100 points:
    0.52 -> 0.29 s). Values the map can make again from stored ones at the cost of an operation
    (copies, negations, entries of a vector, sums and products of stored values) are made again,
    not stored: XLA:CPU computes each stored value in a fusion of its own (Newton-Euler of the
    Panda: 118 values per point instead of 136). A program in which a loop or conditional carries
    tangents is split by JAX's partial evaluation instead, which splits those too."""
    flat, tree = jax.tree_util.tree_flatten(args)
    k = len(flat)

    def jvp_flat(*xs):
        return jax.jvp(fn, jax.tree_util.tree_unflatten(tree, xs[:k]), jax.tree_util.tree_unflatten(tree, xs[k:]))

    closed, (y_shape, _) = jax.make_jaxpr(jvp_flat, return_shape=True)(*flat, *flat)
    y_tree = jax.tree_util.tree_structure(y_shape)
    ny = y_tree.num_leaves
    if any(e.primitive.name in _NESTED_JITS for e in closed.jaxpr.eqns):  # (jnp.where, clip, ... inside fn)
        closed = jax.make_jaxpr(lambda *xs: _evaluate_inlined(closed.jaxpr, closed.consts, xs))(*flat, *flat)
    jaxpr = closed.jaxpr
    # each variable's class: 0 a constant, 1 computed from the primal inputs, 2 from the tangents
    kind = {v: 0 for v in jaxpr.constvars}
    kind.update({v: 1 for v in jaxpr.invars[:k]})
    kind.update({v: 2 for v in jaxpr.invars[k:]})
    eqn_kind = []
    for e in jaxpr.eqns:
        c = max((0 if isinstance(v, _Literal) else kind[v] for v in e.invars), default=0)
        eqn_kind.append(c)
        kind.update({v: c for v in e.outvars})
    if any(c == 2 and _inner_jaxprs(e) for e, c in zip(jaxpr.eqns, eqn_kind)):
        # a loop or conditional that carries tangents (its primal and tangent values in one
        # equation): JAX's partial evaluation splits it
        from jax._src.interpreters import partial_eval as pe
        known, unknown, _, _ = pe.partial_eval_jaxpr_nounits(closed, [False] * k + [True] * k,
                                                              instantiate=[False] * ny + [True] * (len(jaxpr.outvars) - ny))
        outs = jax.core.eval_jaxpr(known.jaxpr, known.consts, *flat)

        def apply(residuals, *tangents):
            return jax.tree_util.tree_unflatten(y_tree, jax.core.eval_jaxpr(unknown.jaxpr, unknown.consts, *residuals,
                                                                             *jax.tree_util.tree_leaves(tangents)))

        return jax.tree_util.tree_unflatten(y_tree, outs[:ny]), list(outs[ny:]), apply

    tangent_out = jaxpr.outvars[ny:]
    made_by = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    # the primal values the map reads; one made by a copy, a negation or a split of primal values
    # is made again by the map, which then reads its operands instead (the entries of q: one
    # residual instead of n, each an output XLA:CPU stores from a fusion of its own)
    wanted = collections.deque([v for e, c in zip(jaxpr.eqns, eqn_kind) if c == 2 for v in e.invars] + list(tangent_out))
    recomputed, residual_vars, chosen = set(), [], set()
    while wanted:
        v = wanted.popleft()
        if isinstance(v, _Literal) or kind[v] != 1 or v in chosen:
            continue
        i = made_by.get(v)
        if i is not None and jaxpr.eqns[i].primitive.name in _REMADE:
            if i not in recomputed:
                recomputed.add(i)
                wanted.extend(jaxpr.eqns[i].invars)
            continue
        residual_vars.append(v)
        chosen.add(v)
    # a residual that is the sum, difference or product of others is made again too
    available = set(residual_vars)
    changed = True
    while changed:
        changed = False
        for v in list(residual_vars):
            i = made_by.get(v)
            if i is None or jaxpr.eqns[i].primitive.name not in _REMADE_FROM_RESIDUALS:
                continue
            operands = [u for u in jaxpr.eqns[i].invars if not isinstance(u, _Literal) and kind[u] == 1]
            if all(u in available for u in operands):
                residual_vars.remove(v)
                recomputed.add(i)
                changed = True
    primal_eqns = _needed([e for e, c in zip(jaxpr.eqns, eqn_kind) if c < 2], list(jaxpr.outvars[:ny]) + residual_vars)
    map_eqns = _needed([e for i, (e, c) in enumerate(zip(jaxpr.eqns, eqn_kind)) if c != 1 or i in recomputed], tangent_out)
    consts = dict(zip(jaxpr.constvars, closed.consts))
    env = _evaluate(primal_eqns, {**consts, **dict(zip(jaxpr.invars[:k], flat))})

    def apply(residuals, *tangents):
        values = {**consts, **dict(zip(residual_vars, residuals)),
                  **dict(zip(jaxpr.invars[k:], jax.tree_util.tree_leaves(tangents)))}
        out = _evaluate(map_eqns, values)
        return jax.tree_util.tree_unflatten(y_tree, [_read(out, v) for v in tangent_out])

    y = jax.tree_util.tree_unflatten(y_tree, [_read(env, v) for v in jaxpr.outvars[:ny]])
    return y, [env[v] for v in residual_vars], apply


# primitives that copy or rearrange values: the linear map of :func:`linearization` makes them again
# from their operands rather than reading their results as residuals
_REMADE = frozenset({"jaxarm_entries", "neg", "slice", "squeeze", "reshape", "split", "convert_element_type",
                     "broadcast_in_dim", "copy"})

_REMADE_FROM_RESIDUALS = frozenset({"add", "sub", "mul"})


_NESTED_JITS = ("jit", "pjit")


def _evaluate_inlined(jaxpr, consts, args):
    """``jaxpr`` evaluated in the current trace with its nested jits' equations bound in its place."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for e in jaxpr.eqns:
        if e.primitive.name in _NESTED_JITS:
            inner = e.params["jaxpr"]
            out = _evaluate_inlined(inner.jaxpr, inner.consts, [_read(env, v) for v in e.invars])
            env.update(zip(e.outvars, out))
        else:
            _bind(e, env)
    return [_read(env, v) for v in jaxpr.outvars]


def _inner_jaxprs(eqn) -> bool:
    """Whether a jaxpr equation holds jaxprs of its own (a nested jit, a loop, a custom rule)."""
    return any(isinstance(p, (_Jaxpr, _ClosedJaxpr)) or
               (isinstance(p, (tuple, list)) and any(isinstance(q, (_Jaxpr, _ClosedJaxpr)) for q in p))
               for p in eqn.params.values())


def _needed(eqns, outputs):
    """The equations of ``eqns`` (in order) that ``outputs`` depend on."""
    wanted = {v for v in outputs if not isinstance(v, _Literal)}
    kept = []
    for e in reversed(eqns):
        if any(v in wanted for v in e.outvars):
            kept.append(e)
            wanted.update(v for v in e.invars if not isinstance(v, _Literal))
    return kept[::-1]


def _read(env, v):
    return v.val if isinstance(v, _Literal) else env[v]


def _evaluate(eqns, env):
    """``eqns`` bound in order in the current trace (as ``jax.core.eval_jaxpr`` does), their
    operands read from ``env`` (variable -> value, a dict of the caller's own) and their results
    added to it; returns ``env``."""
    for e in eqns:
        _bind(e, env)
    return env


def _bind(e, env):
    """The equation ``e`` bound in the current trace, its operands read from ``env`` and its
    results written into it."""
    from jax._src import source_info_util

    context = e.ctx.manager if hasattr(e, "ctx") else contextlib.nullcontext()
    with source_info_util.user_context(e.source_info.traceback,
                                       name_stack=source_info_util.current_name_stack() + e.source_info.name_stack), context:
        params = e.primitive.get_bind_params(e.params)
        subfuns, params = params if isinstance(params, tuple) else ((), params)  # (older jax: a pair)
        out = e.primitive.bind(*subfuns, *(_read(env, v) for v in e.invars), **params)
    env.update(zip(e.outvars, out) if e.primitive.multiple_results else ((e.outvars[0], out),))


def linearized_once(fn, *args):
    """``(fn(*args), jvp)``: ``jvp(*tangents)`` is the Jacobian-vector product of ``fn`` at ``args``
    (:func:`linearization`), its residuals and ``fn(*args)`` computed once (:func:`computed_once`)
    and read by every product. With ``jax.jacfwd`` in one piece XLA:CPU fuses the whole primal
    computation into the fusion of each Jacobian entry it feeds (see :func:`computed_once`)."""
    captured = []

    def primal_and_residuals(*xs):
        y, residuals, apply = linearization(fn, *xs)
        captured.append(apply)
        return y, residuals

    y, residuals = computed_once(primal_and_residuals, *args)
    return y, functools.partial(captured[-1], residuals)


def jacobians_once(fn, *args):
    """``(fn(*args), (d fn / d args[0], ...))`` for ``fn`` of 1-D arrays with a 1-D output: forward mode
    along every input direction (as ``jax.jacfwd(fn, argnums=range(len(args)))``) with the primal
    pass computed once (:func:`linearized_once`)."""
    y, apply = linearized_once(fn, *args)
    sizes = [int(a.shape[0]) for a in args]
    cuts = np.cumsum(sizes)[:-1].tolist()
    eye = jnp.eye(sum(sizes), dtype=y.dtype)
    J = jax.vmap(lambda t: apply(*(v.astype(a.dtype) for v, a in zip(jnp.split(t, cuts), args))), out_axes=1)(eye)
    return y, tuple(jnp.split(J, cuts, axis=1))


def _jaxpr_function(fn, *args):
    """``fn`` traced once at ``args`` (pytrees) into a jaxpr whose closed-over values are explicit
    operands (all of them: ``jax.closure_convert`` hoists the floating-point ones only, and a
    batching rule cannot take a closed-over batched value of any type). Returns ``evaluate``
    (``evaluate(*consts, *leaves)``: the list of fn's output leaves), the consts, the leaves of
    ``args``, and the outputs' tree and shapes."""
    flat, tree = jax.tree_util.tree_flatten(args)
    closed, shapes = jax.make_jaxpr(lambda *xs: fn(*jax.tree_util.tree_unflatten(tree, xs)), return_shape=True)(*flat)
    jaxpr, consts = closed.jaxpr, list(closed.consts)
    m = len(consts)

    def evaluate(*values):
        return jax.core.eval_jaxpr(jaxpr, list(values[:m]), *values[m:])

    return evaluate, consts, flat, jax.tree_util.tree_structure(shapes), shapes


def computed_once(fn, *args):
    """``fn(*args)``, computed where XLA:CPU cannot fuse it into each of its consumers.

    XLA fuses an elementwise producer into every consumer it feeds, computing it again in each
    one. That is the right choice for cheap producers, and the wrong one for a whole unrolled
    forward dynamics (thousands of scalar operations) that feeds dozens of Jacobian entries: each
    entry's loop fusion then contains the whole dynamics, and compiling the trajectory solver
    took 35 s for the UR5, of which most went to those copies (240k lines of optimized HLO).
    Here ``fn`` runs as the body of a loop that executes once (a ``lax.while_loop`` whose trip
    count XLA cannot know: it runs when every input is finite), so its outputs are stored once
    and read by the consumers. With non-finite inputs the outputs are NaN, as the dynamics would
    give. Under ``jax.vmap`` the loop stays a loop (a batched predicate only masks the update).

    Differentiable in forward and reverse mode: the derivative rule differentiates ``fn`` itself
    (outside the loop), so ``jax.grad`` through it works as through ``fn``.

    On platforms other than a CPU this is ``fn(*args)``: there each loop iteration synchronizes
    with the host, and the effect on compile time there has not been measured."""
    if jax.default_backend() != "cpu":
        return fn(*args)
    evaluate, consts, flat, out_tree, shapes = _jaxpr_function(fn, *args)  # consts: fn's closed-over values
    m = len(consts)

    @jax.custom_jvp
    def once(*values):
        floats = [x for x in values[m:] if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in floats])) if floats else jnp.array(True)
        empty = [jnp.full(s.shape, jnp.nan, s.dtype) if jnp.issubdtype(s.dtype, jnp.inexact) else jnp.zeros(s.shape, s.dtype)
                 for s in jax.tree_util.tree_leaves(shapes)]

        def body(carry):  # fn traced once (above), evaluated here
            return jnp.array(True), evaluate(*values)

        return jax.lax.while_loop(lambda c: ~c[0], body, (~finite, empty))[1]

    @once.defjvp
    def _(primals, tangents):
        return once(*primals), jax.jvp(evaluate, primals, tangents)[1]

    return jax.tree_util.tree_unflatten(out_tree, once(*consts, *flat))
