"""The small dense factorizations of jaxarm.dynamics.linalg against LAPACK."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxarm.dynamics import linalg


@pytest.mark.parametrize("m", [1, 2, 5, 7, 9])
def test_column_cholesky_matches_lapack_reads_the_lower_triangle_and_flags_indefinite_matrices(m):
    rng = np.random.default_rng(m)
    A = rng.normal(size=(4, m, m))
    M = A @ np.swapaxes(A, 1, 2) + 0.1 * np.eye(m)
    factor = jax.jit(linalg.cholesky_factor_columns)
    for Mi in M:
        garbage = Mi + np.triu(rng.normal(size=(m, m)), 1)  # only the lower triangle is read
        L = np.asarray(factor(jnp.asarray(garbage)))
        np.testing.assert_allclose(L, np.linalg.cholesky(Mi), rtol=1e-12, atol=1e-13)
        assert np.all(np.triu(L, 1) == 0.0)
    # a batch (jax.vmap) equals one matrix at a time; float32 works and is as close as its precision
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(linalg.cholesky_factor_columns))(jnp.asarray(M))),
                               np.linalg.cholesky(M), rtol=1e-12, atol=1e-13)
    L32 = np.asarray(factor(jnp.asarray(M[0], jnp.float32)))
    assert L32.dtype == np.float32
    np.testing.assert_allclose(L32, np.linalg.cholesky(M[0]), rtol=2e-4, atol=2e-5)
    # not positive definite: NaN from the first negative pivot on (as LAPACK's factor through jax)
    for j in range(m):
        bad = M[0].copy()
        bad[j, j] = -1.0
        L = np.asarray(factor(jnp.asarray(bad)))
        assert np.all(np.isnan(L[j:, j])) and np.all(np.isfinite(L[:, :j])), j
    # a zero pivot: not finite either
    assert not np.isfinite(np.asarray(factor(jnp.zeros((m, m))))).all()
