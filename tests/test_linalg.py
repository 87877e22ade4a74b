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


@pytest.mark.parametrize("m", [1, 3, 7, 14])
def test_column_substitutions_and_spd_solve_match_numpy_for_vectors_and_matrices(m):
    rng = np.random.default_rng(10 + m)
    A = rng.normal(size=(m, m))
    S = A @ A.T + 0.5 * np.eye(m)
    L = np.linalg.cholesky(S)
    for B in (rng.normal(size=m), rng.normal(size=(m, 4))):
        want = np.linalg.solve(S, B)
        got = np.asarray(jax.jit(linalg.cholesky_solve_columns)(jnp.asarray(L), jnp.asarray(B)))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        assert got.shape == B.shape
        np.testing.assert_allclose(np.asarray(jax.jit(linalg.spd_solve)(jnp.asarray(S), jnp.asarray(B))), want,
                                   rtol=1e-10, atol=1e-12)
    # batched (a vmap over systems) and differentiated (a filter's likelihood by jax.grad) as numpy says
    Bs = rng.normal(size=(3, m))
    np.testing.assert_allclose(np.asarray(jax.vmap(linalg.spd_solve, in_axes=(None, 0))(jnp.asarray(S), jnp.asarray(Bs))),
                               np.linalg.solve(S, Bs.T).T, rtol=1e-10, atol=1e-12)
    b = rng.normal(size=m)
    grad = np.asarray(jax.grad(lambda S: jnp.sum(linalg.spd_solve(0.5 * (S + S.T), jnp.asarray(b))))(jnp.asarray(S)))
    x, y = np.linalg.solve(S, b), np.linalg.solve(S, np.ones(m))  # d(1^T S^-1 b)/dS = -S^-1 1 b^T S^-1, symmetrized
    want = -0.5 * (np.outer(y, x) + np.outer(x, y))
    np.testing.assert_allclose(grad, want, rtol=1e-8, atol=1e-10)
    # not positive definite: NaN, not a silent answer
    bad = S.copy()
    bad[m - 1, m - 1] = -1.0
    assert np.isnan(np.asarray(linalg.spd_solve(jnp.asarray(bad), jnp.asarray(b)))).any()
