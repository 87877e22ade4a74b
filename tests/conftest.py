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
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

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
