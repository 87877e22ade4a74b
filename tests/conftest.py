"""Test configuration: every accuracy test runs in float64.

The suite runs in two processes (``pytest -n 2``, pytest-xdist): most of its time is XLA
compiling, which is single-threaded. On a GPU each process would otherwise reserve 75 % of the
device's memory at start, so the second could not start: allocate on demand instead (a user's own
setting wins).

XLA compiles the test programs without LLVM's optimizations (``--xla_backend_optimization_level=0``
in ``XLA_FLAGS``, inherited by the documentation pages and commands the tests run as
subprocesses): the same HLO optimizations and numerics contract, about 20 % less time compiling,
which is most of the suite's time (a sample of the slowest tests: 250 s -> 198 s on 2 cores).
Programs then run up to 2x slower, which no test measures; the benchmarks and the packaging
smoke test of ``.ci/run`` compile at the default level. ``JAXARM_TEST_LLVM_OPT=1`` (or an
optimization level of your own in ``XLA_FLAGS``) keeps the default.
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "") and not os.environ.get("JAXARM_TEST_LLVM_OPT"):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
