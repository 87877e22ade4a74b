"""Test configuration: every accuracy test runs in float64, and every program that takes a second
or more to compile is compiled once per test run.

The suite runs in two processes (``pytest -n 2``, pytest-xdist): most of its time is XLA
compiling, which is single-threaded. On a GPU each process would otherwise reserve 75 % of the
device's memory at start, so the second could not start: allocate on demand instead (a user's own
setting wins).

The two processes share one JAX compilation cache (:func:`compile_cache`): the same program --
a module's solver fixture run in both processes once tests are shared out between them, the same
problem solved in several modules through different Python functions, a documentation page's
program that a test compiled first -- is compiled by whichever process meets it first and loaded by
the others. It starts empty in every run, and programs that compile in under a second are not
stored (so ``tests/test_recompiles.py`` still sees small programs compile).

XLA compiles the tests' programs with LLVM's optimization off
(``XLA_FLAGS=--xla_backend_optimization_level=0``, which the processes the tests start inherit,
except the documentation pages: they run as a user runs them). XLA's own passes, and so the
programs it builds, are the same; only their machine code is less optimized, and its results
agree with the optimized code's to round-off (Panda inverse dynamics and 200-step rollouts:
3.5e-16 relative, from multiply-adds contracted and sines vectorized differently). Compiling
takes most of the suite's time, and a third less this way (``tests/test_ocp.py``: 308 s -> 201 s
on two cores; the whole suite 1488 s -> 1306 s, since some tests mostly run their programs). To
test the optimized code users run, set ``JAXARM_TEST_OPTIMIZED=1`` (an optimization level of
your own in ``XLA_FLAGS`` is left as it is). What is timed, ``benchmarks/`` and
``experiments/``, runs with XLA's defaults.
"""

import os

UNOPTIMIZED = "--xla_backend_optimization_level=0"
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if os.environ.get("JAXARM_TEST_OPTIMIZED") != "1" and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + UNOPTIMIZED).strip()
    os.environ["JAXARM_TEST_UNOPTIMIZED"] = UNOPTIMIZED  # (tests/docs_pages.py takes it out again)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """The run's JAX compilation cache folder, in use from the first test on (also passed to the
    documentation pages, which run in processes of their own). Under pytest-xdist the workers'
    temporary folders have a common parent, which is new in every run; a run in one process uses
    its own temporary folder."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax-cache"
    folder.mkdir(exist_ok=True)
    if not jax.config.jax_compilation_cache_dir:  # a cache the user configured is left as it is
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    return folder
