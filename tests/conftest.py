"""Test configuration: every accuracy test runs in float64.

The suite runs in two processes (``pytest -n 2``, pytest-xdist): most of its time is XLA
compiling, which is single-threaded. On a GPU each process would otherwise reserve 75 % of the
device's memory at start, so the second could not start: allocate on demand instead (a user's own
setting wins).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
