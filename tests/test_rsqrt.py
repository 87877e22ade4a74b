"""The division-free reciprocal square root of the unrolled Cholesky factorization
(jaxarm.dynamics.algebra.rsqrt): accurate to a few ulp over the whole normal range in float64 and
float32, NaN where the matrix is not positive definite, exact derivatives (custom JVP), and what it
is for: the Panda's forward dynamics compiled into one loop fusion instead of ~40."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm.core.xla import compiler_options
from jaxarm.dynamics import linalg
from jaxarm.dynamics.algebra import Known, rsqrt
from jaxarm.dynamics.forward import _forward_dynamics


def test_accurate_over_the_normal_range():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.logspace(-300, 300, 6001), rng.uniform(0.25, 4.0, 20000)])
    y = np.asarray(rsqrt(jnp.asarray(x, jnp.float64)))
    ref = 1.0 / np.sqrt(x)
    assert np.max(np.abs(y - ref) / np.spacing(ref)) <= 4
    x32 = x[(x > 1e-36) & (x < 1e36)].astype(np.float32)
    y32 = np.asarray(rsqrt(jnp.asarray(x32)))
    assert y32.dtype == np.float32
    ref32 = (1.0 / np.sqrt(x32.astype(np.float64))).astype(np.float32)
    assert np.max(np.abs(y32.astype(np.float64) - ref32) / np.spacing(ref32)) <= 4


def test_nan_where_not_positive_and_exact_derivatives():
    bad = np.asarray(rsqrt(jnp.array([0.0, -1.0, -1e-300, np.inf, np.nan, 1e-310])))
    assert np.all(np.isnan(bad))
    assert rsqrt(Known(4.0)).value == 0.5
    d1 = jax.grad(rsqrt)(2.0)
    d2 = jax.grad(jax.grad(rsqrt))(2.0)
    assert float(d1) == pytest.approx(-0.5 * 2.0**-1.5, rel=1e-15)
    assert float(d2) == pytest.approx(0.75 * 2.0**-2.5, rel=1e-15)


def test_cholesky_without_divisions_matches_lapack_and_flags_indefinite_matrices():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(6, 6))
    M = A @ A.T + 0.1 * np.eye(6)
    L = np.asarray(linalg.cholesky_factor(jnp.asarray(M)))
    np.testing.assert_allclose(L, np.linalg.cholesky(M), rtol=1e-12, atol=1e-13)
    b = rng.normal(size=(6, 3))
    np.testing.assert_allclose(np.asarray(linalg.cholesky_solve_factored(jnp.asarray(L), jnp.asarray(b))),
                               np.linalg.solve(M, b), rtol=1e-10)
    M[2, 2] = -1.0
    assert np.isnan(np.asarray(linalg.cholesky_factor(jnp.asarray(M)))).any()


def test_forward_dynamics_is_one_loop_fusion():
    """Division-free pivots keep XLA:CPU from splitting the unrolled forward dynamics into a fusion
    per pivot, each recomputing the kinematics (the Panda's was 43 fusions)."""
    if jax.default_backend() != "cpu":
        pytest.skip("a property of XLA:CPU's fusion")
    arm = jaxarm.load_arm("panda")
    n = arm.n
    f = jax.jit(lambda q, qd, tau: jax.vmap(lambda a, b, c: _forward_dynamics(arm, a, b, c))(q, qd, tau),
                compiler_options=compiler_options())
    z = jnp.zeros((64, n))
    text = f.lower(z, z, z).compile().as_text()
    entry = text[text.index("ENTRY"):]
    assert entry.count(" fusion(") <= 3, entry.count(" fusion(")
