"""Reverse-mode gradients of long scans by the discrete adjoint with step Jacobians.

``scan(body, params, init, xs)`` computes what ``jax.lax.scan(lambda c, x: body(params, c, x),
init, xs)`` computes, with its own reverse-mode rule. For a recursion c_{k+1}, y_k = g(p, c_k, x_k)
and a scalar cost, the cotangents obey the discrete adjoint (costate) recursion

    lambda_k  = (dg/dc_k)^T [lambda_{k+1}; ybar_k]
    xbar_k    = (dg/dx_k)^T [lambda_{k+1}; ybar_k]
    pbar      = sum_k (dg/dp)^T [lambda_{k+1}; ybar_k]

(Bryson & Ho, Applied Optimal Control, 1975, sec. 2.2; for a time-stepped ODE, the adjoint of the
discretization, so the gradient is exact for the discrete rollout, not an approximation of the
continuous adjoint). Plain ``jax.grad`` of a scan evaluates the first line by transposing every
step's dynamics one after the other: thousands of small dependent kernels, which is slow on a CPU
(a 1000-step RK3 rollout of a 6-joint arm costs ~25 forward rollouts). Here the sequential part is
only a small matrix-vector product per step: the step Jacobians d g / d(c_k, x_k) are computed
first, for all k at once (they depend on the stored states only), in forward mode (one tangent per
carry and input entry, ~18 for a 6-joint arm) vmapped over time, which XLA vectorizes like any
large batch; the parameter cotangent is one reverse pass vmapped over time. Measured on the Puma
560 (``experiments/benchmark.py --quantities rollout_grad``), see docs/how-it-works.md.

Compile it with jaxarm's CPU compiler options (:func:`jaxarm.jit`): with XLA's CPU fusion
emitters on (a plain ``jax.jit``, jaxlib 0.10) the vmapped forward-mode Jacobians compile into
code ~100-200x slower (Puma, 1000 steps: 3.0 s instead of 0.016 s for the Jacobians alone;
``jax.linearize`` instead of ``jacfwd`` and optimization barriers between the stages were tried
and do not avoid it).

Costs and limits: the stored Jacobians take T x d_c x (d_c + d_x) numbers per scan (d_c, d_x the
float entries of the carry and of one step's input; 1000 x 12 x 18 floats = 1.7 MB for the Puma),
times the batch size under ``vmap``. A ``custom_vjp`` has no forward-mode rule, so ``jax.jvp`` /
``jax.jacfwd`` / ``jax.hessian`` of such a scan raise; use the plain scan for those. Integer leaves
(counters, flags) are carried along and have no cotangent. ``body`` must not close over traced
values that are differentiated: pass them in ``params``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["scan"]


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


class _Flat:
    """The float leaves of a pytree as one vector, and back (integer leaves held aside)."""

    def __init__(self, example):
        leaves, self.treedef = jax.tree_util.tree_flatten(example)
        self.is_float = [_is_float(x) for x in leaves]
        self.shapes = [jnp.shape(x) for x in leaves]
        self.dtypes = [jnp.result_type(x) for x in leaves]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.size = sum(n for n, f in zip(self.sizes, self.is_float) if f)

    def ravel(self, tree, dtype):
        leaves = jax.tree_util.tree_leaves(tree)
        parts = [jnp.ravel(x).astype(dtype) for x, f in zip(leaves, self.is_float) if f]
        return jnp.concatenate(parts) if parts else jnp.zeros((0,), dtype)

    def unravel(self, v, like):
        """``like``'s pytree with its float leaves taken from the vector v."""
        leaves = jax.tree_util.tree_leaves(like)
        out, i = [], 0
        for x, f, s, n, d in zip(leaves, self.is_float, self.shapes, self.sizes, self.dtypes):
            if f:
                out.append(v[i:i + n].reshape(s).astype(d))
                i += n
            else:
                out.append(x)
        return jax.tree_util.tree_unflatten(self.treedef, out)

    def cotangent(self, v):
        """The cotangent pytree: float leaves from v, None (zero) for integer leaves."""
        out, i = [], 0
        for f, s, n, d in zip(self.is_float, self.shapes, self.sizes, self.dtypes):
            if f:
                out.append(v[..., i:i + n].reshape(v.shape[:-1] + s).astype(d))
                i += n
            else:
                out.append(None)
        return jax.tree_util.tree_unflatten(self.treedef, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def scan(body, params, init, xs):
    """``jax.lax.scan(lambda c, x: body(params, c, x), init, xs)`` with the adjoint reverse rule."""
    return jax.lax.scan(functools.partial(body, params), init, xs)


def _scan_fwd(body, params, init, xs):
    def step(c, x):
        c_next, y = body(params, c, x)
        return c_next, (c, y)

    last, (cs, ys) = jax.lax.scan(step, init, xs)
    return (last, ys), (params, cs, xs)


def _scan_bwd(body, residuals, cotangents):
    params, cs, xs = residuals
    ct_last, ct_ys = cotangents
    c0 = jax.tree_util.tree_map(lambda a: a[0], cs)
    x0 = jax.tree_util.tree_map(lambda a: a[0], xs)
    y0 = jax.eval_shape(lambda: body(params, c0, x0)[1])
    fc, fx, fy = _Flat(c0), _Flat(x0), _Flat(y0)
    leaves = [a for a in jax.tree_util.tree_leaves((cs, xs)) if _is_float(a)]
    dtype = jnp.result_type(*leaves) if leaves else jnp.float32
    dc = fc.size

    def outputs(p, v, c, x):
        """Step k's float outputs (carry, then ys) as one vector, of the float inputs v = (c, x)."""
        c_next, y = body(p, fc.unravel(v[:dc], c), fx.unravel(v[dc:], x))
        return jnp.concatenate([fc.ravel(c_next, dtype), fy.ravel(y, dtype)])

    ybar = jax.vmap(lambda y: fy.ravel(y, dtype))(ct_ys)  # (T, float entries of ys)

    def jacobian(c, x, yb):
        """(d carry'/d(c, x): (dc, dc + dx), and the ys' share of the cotangent: (dc + dx,))."""
        v = jnp.concatenate([fc.ravel(c, dtype), fx.ravel(x, dtype)])
        J = jax.jacfwd(lambda w: outputs(params, w, c, x))(v)
        return J[:dc], J[dc:].T @ yb

    J, r = jax.vmap(jacobian)(cs, xs, ybar)

    def back(lam, k):  # lam: cotangent of the carry after step k
        v = J[k].T @ lam + r[k]
        return v[:dc], (v[dc:], lam)

    lam_last = fc.ravel(ct_last, dtype)
    lam0, (xbar, lams) = jax.lax.scan(back, lam_last, jnp.arange(J.shape[0]), reverse=True)

    def param_cotangent(c, x, lam, yb):
        v = jnp.concatenate([fc.ravel(c, dtype), fx.ravel(x, dtype)])
        w = jnp.concatenate([lam, yb])
        pb = jax.vjp(lambda p: outputs(p, v, c, x), params)[1](w)[0]
        return jax.tree_util.tree_map(lambda a, b: b if _is_float(a) else jnp.zeros((), dtype), params, pb)

    # Unused parameter cotangents are removed by dead-code elimination under jit.
    pbar = jax.vmap(param_cotangent)(cs, xs, lams, ybar)
    pbar = jax.tree_util.tree_map(lambda a, b: b.sum(0) if _is_float(a) else None, params, pbar)
    return pbar, fc.cotangent(lam0), fx.cotangent(xbar)


scan.defvjp(_scan_fwd, _scan_bwd)
