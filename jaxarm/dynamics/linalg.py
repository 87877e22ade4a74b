"""Small dense linear algebra unrolled over the static joint count.

For the n <= ~10 matrices of an arm, LAPACK calls (one custom call per matrix, and per reverse-mode
step) cost far more than the arithmetic. Written with scalar operations, the factorization fuses
with the rest of the dynamics under ``vmap`` and differentiates like any other expression. The
pivots use :func:`jaxarm.dynamics.algebra.rsqrt` (multiplications only) rather than a square root
and divisions, which XLA:CPU would not fuse across (see there).

For a small matrix factored or solved at every trip of a loop (a backward pass over the knots of
an optimal-control problem, a Kalman filter's steps), :func:`cholesky_factor_columns`,
:func:`cholesky_solve_columns` and :func:`spd_solve` do the same work as loops of their own over
the rows: no library call, which XLA:CPU cannot put inside a loop it compiles as one kernel, and
far fewer operations in the program than the unrolled forms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import algebra
from .algebra import minus, mul


def cholesky_solve(M, b):
    """Solve M x = b for a symmetric positive definite M (n, n) by an unrolled Cholesky
    factorization M = L L^T (Golub & Van Loan alg. 4.2.1) and two triangular substitutions."""
    n = M.shape[-1]
    rows = [[M[i, j] for j in range(n)] for i in range(n)]
    return jnp.stack(cholesky_solve_scalars(rows, [b[i] for i in range(n)]))


def cholesky_solve_scalars(M, b):
    """:func:`cholesky_solve` on scalars: M a list of n rows of n scalars (only the lower
    triangle is read), b a list of n scalars; returns x as a list of n scalars. With every entry a
    separate scalar the factorization fuses with the component-wise dynamics kernels."""
    return cholesky_solve_factored_scalars(*cholesky_factor_scalars(M), b)


def cholesky_factor_scalars(M):
    """The lower Cholesky factor of M (a list of n rows of n scalars, lower triangle read) as
    scalars: L (n rows, None above the diagonal) and the reciprocals of its diagonal."""
    n = len(M)
    L = [[None] * n for _ in range(n)]
    inv_diag = [None] * n
    for j in range(n):
        s = M[j][j]
        for k in range(j):
            s = minus(s, mul(L[j][k], L[j][k]))
        inv = algebra.rsqrt(s)  # multiplications only: the factorization stays in one loop fusion
        L[j][j] = mul(s, inv)
        inv_diag[j] = inv
        for i in range(j + 1, n):
            s = M[i][j]
            for k in range(j):
                s = minus(s, mul(L[i][k], L[j][k]))
            L[i][j] = mul(s, inv_diag[j])
    return L, inv_diag


def cholesky_solve_factored_scalars(L, inv_diag, b):
    """Solve L L^T x = b on scalars (the output of :func:`cholesky_factor_scalars`)."""
    n = len(b)
    y = [None] * n
    for i in range(n):  # L y = b
        s = b[i]
        for k in range(i):
            s = minus(s, mul(L[i][k], y[k]))
        y[i] = mul(s, inv_diag[i])
    x = [None] * n
    for i in reversed(range(n)):  # L^T x = y
        s = y[i]
        for k in range(i + 1, n):
            s = minus(s, mul(L[k][i], x[k]))
        x[i] = mul(s, inv_diag[i])
    return x


def cholesky_factor(M):
    """The lower Cholesky factor L (..., n, n) of symmetric positive definite matrices M (..., n, n),
    unrolled (Golub & Van Loan alg. 4.2.1, :func:`cholesky_factor_scalars`: for a batch, every
    operation is one elementwise operation over it); NaN entries where M is not positive
    definite."""
    n = M.shape[-1]
    L, _ = cholesky_factor_scalars([[M[..., i, j] for j in range(n)] for i in range(n)])
    zero = jnp.zeros(M.shape[:-2], M.dtype)
    return jnp.stack([jnp.stack([L[i][j] if j <= i else zero for j in range(n)], axis=-1) for i in range(n)], axis=-2)


def cholesky_factor_columns(M):
    """The lower Cholesky factor L (m, m) of a symmetric positive definite M (m, m), one column per
    trip of a loop (the gaxpy Cholesky, Golub & Van Loan alg. 4.2.1: v = M[:, j] - L L[j]^T, the
    columns from j on still zero; L[j:, j] = v[j:] / sqrt(v[j])); NaN entries where M is not
    positive definite. Only the lower triangle of M is read.

    For a loop that factors a small matrix at every trip (a backward pass over the knots of an
    optimal-control problem): no library call, which XLA:CPU cannot put inside a loop compiled as
    one kernel (:func:`jaxarm.core.xla.loop_kernels`), and m trips of a few vector operations
    instead of the O(m^3) scalar operations of :func:`cholesky_factor`, so the program stays
    small. Under ``jax.vmap`` each trip is vectorized over the batch."""
    m = M.shape[-1]
    rows = jnp.arange(m)

    def column(j, L):
        v = M[:, j] - L @ L[j]
        return L.at[:, j].set(jnp.where(rows >= j, v / jnp.sqrt(v[j]), 0.0))

    return jax.lax.fori_loop(0, m, column, jnp.zeros_like(M))


def cholesky_solve_columns(L, B):
    """Solve L L^T X = B for X, B (m,) or (m, k), L lower triangular (m, m): the two triangular
    substitutions one row per trip of a loop (the companion of :func:`cholesky_factor_columns`;
    :func:`cholesky_solve_factored` is the same unrolled, O(m^2) operations in the program)."""
    m = L.shape[-1]

    def forward(i, y):  # L y = B, the rows of y from i on still zero
        return y.at[i].set((B[i] - L[i] @ y) / L[i, i])

    y = jax.lax.fori_loop(0, m, forward, jnp.zeros_like(B))

    def backward(j, x):  # L^T x = y, from the last row up
        i = m - 1 - j
        return x.at[i].set((y[i] - L[:, i] @ x) / L[i, i])

    return jax.lax.fori_loop(0, m, backward, jnp.zeros_like(B))


def spd_solve(S, B):
    """Solve S X = B for a symmetric positive definite S (m, m) (its lower triangle read) and B
    (m,) or (m, k), by :func:`cholesky_factor_columns` and :func:`cholesky_solve_columns`: for
    solves inside a loop (a filter's steps), where a library call would keep XLA:CPU from compiling
    the loop as one kernel; NaN where S is not positive definite."""
    return cholesky_solve_columns(cholesky_factor_columns(S), B)


# jaxlib's LAPACK kernels split a batch of matrices over XLA:CPU's thread pool when the batch's
# work is at least this many floating-point operations (its ParallelBatchMap), and wait for the
# parts on a thread of that same pool
LAPACK_SPLIT_WORK = 200_000


@jax.custom_jvp
def cholesky_factor_by_batch(H):
    """The lower Cholesky factors of symmetric positive definite matrices H (..., m, m) (lower
    triangles read), NaN entries where a matrix is not positive definite: by the platform's library
    (LAPACK's potrf on a CPU) for a batch too small for jaxlib to split over threads, and unrolled
    on the entries otherwise and under ``jax.vmap`` (:func:`cholesky_factor_scalars`: every
    operation one elementwise operation over the batch).

    Why not the library everywhere: for a batch of at least :data:`LAPACK_SPLIT_WORK` operations
    (m^3 / 3 per matrix), jaxlib's kernel splits the batch over XLA:CPU's thread pool and waits for
    the parts on a thread of that same pool. Two programs holding such a factorization, run at
    once (from two Python threads, or on two CPU devices), then waited for each other for ever:
    32 UR5 reaches in one ``jax.vmap``-ed :func:`jaxarm.trajopt.ddp` (their step Jacobians factor
    3200 mass matrices), called from two threads, never returned (jaxlib 0.10.2, 2 cores).
    Differentiated (forward and reverse mode, any order), it is the unrolled factorization
    (:func:`cholesky_factor`)."""
    return _factor_by_batch(H)


@cholesky_factor_by_batch.defjvp
def _cholesky_factor_by_batch_jvp(primals, tangents):
    # (a batching rule alone has no reverse mode): differentiated, the unrolled factorization,
    # whose primal is the factor too (not computed a second time by the library)
    return jax.jvp(cholesky_factor, primals, tangents)


@jax.custom_batching.custom_vmap
def _factor_by_batch(H):
    m = H.shape[-1]
    if int(np.prod(H.shape[:-2], dtype=np.int64)) * m**3 / 3 < LAPACK_SPLIT_WORK:
        return jnp.linalg.cholesky(H)
    return cholesky_factor(H)


@_factor_by_batch.def_vmap
def _factor_by_batch_vmap(axis_size, in_batched, H):
    (batched,) = in_batched
    if not batched:
        return _factor_by_batch(H), False
    return cholesky_factor(H), True


def cholesky_solve_factored(L, B):
    """Solve L L^T X = B for X, B (n,) or (n, m), by two unrolled triangular substitutions."""
    n = L.shape[-1]
    y = [None] * n
    for i in range(n):
        s = B[i]
        for k in range(i):
            s = s - L[i, k] * y[k]
        y[i] = s / L[i, i]
    x = [None] * n
    for i in reversed(range(n)):
        s = y[i]
        for k in range(i + 1, n):
            s = s - L[k, i] * x[k]
        x[i] = s / L[i, i]
    return jnp.stack(x)
