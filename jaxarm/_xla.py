"""XLA compiler options for the jitted entry points jaxarm owns.

jaxlib's CPU backend (0.10.x) hands many small fusions to YNNPACK (``__ynn_fusion`` in the compiled
HLO). For the tiny per-state arrays of arm dynamics (3-vectors, 3x3 rotations, batched) those calls
cost far more than the arithmetic: turning them off made batched inverse dynamics 2.6x (float64) to
30x (float32) faster and 1000-step RK3 rollouts several times faster (see the README's benchmark).

:func:`compiler_options` returns the per-``jax.jit`` option that disables them, only on a CPU
default backend whose jaxlib accepts it, and ``{}`` elsewhere (GPU, TPU, a jaxlib without the
option). Nothing is set globally: users' own ``jax.jit`` calls are unaffected (they can set
``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`` themselves).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

YNN_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}


def options_for(platform: str, accepted: bool) -> dict:
    """The options for a default backend ``platform`` ("cpu", "gpu", "tpu", ...) given whether the
    running jaxlib accepted them (pure logic, separated for testing)."""
    return dict(YNN_OFF) if platform == "cpu" and accepted else {}


@functools.lru_cache(maxsize=None)
def _cpu_accepts_ynn_option() -> bool:
    """Compile a tiny function once with the option; False if this jaxlib rejects it."""
    try:
        jax.jit(lambda x: x + 1.0, compiler_options=YNN_OFF).lower(jnp.zeros(2)).compile()
    except Exception:  # unknown option, or a jax without per-jit compiler_options
        return False
    return True


def compiler_options() -> dict:
    """``compiler_options`` for ``jax.jit``: YNNPACK fusions off on CPU when supported, else ``{}``.
    A fresh dict each call (callers may pass it on)."""
    platform = jax.default_backend()
    return options_for(platform, platform == "cpu" and _cpu_accepts_ynn_option())


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
            compiled[key] = jax.jit(fun, **options, **kwargs)
        return compiled[key](*args, **kw)

    return wrapper
