"""One knot of an optimal-control problem: its cost, constraints and their quadratic model, shared by
:func:`jaxarm.trajopt.ddp` and the implicit differentiation of its solution."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import terms as _terms
from ..ocp import OCP


def _constraint_layout(problem: OCP):
    """Sizes of the constraint terms (static) and which entries are equalities."""
    n = problem.n
    dtype = jnp.result_type(problem.x0)
    x, u = jax.ShapeDtypeStruct((2 * n,), dtype), jax.ShapeDtypeStruct((n,), dtype)
    k = jax.ShapeDtypeStruct((), jnp.int32)
    sizes = []
    for t in problem.constraints:
        out = jax.eval_shape(lambda arm, x, u, k, p, t=t: t.fn(arm, x, u, k, t.values(p), p), problem.arm, x, u, k, problem.params)
        sizes.append(out.shape[0])
    eq = np.concatenate([np.full(m, t.kind == "equality") for t, m in zip(problem.constraints, sizes)]) if sizes else np.zeros(0, bool)
    return sizes, eq


def _skipped(problem, final: bool) -> frozenset:
    """The cost terms (indices into ``problem.costs``) whose weight is zero by construction at the
    final knot (``final``) or at every knot before it, read from the schedule their static ``when``
    gives (:func:`jaxarm.trajopt.terms.schedule`; via points at given times depend on dt and are
    never skipped): a term of the path (or one that reads the input) at the final knot, a term of
    the end before it. Their values there would only be multiplied by zero."""
    T = problem.T
    knots = slice(T, T + 1) if final else slice(0, T)
    return frozenset(i for i, t in enumerate(problem.costs)
                     if isinstance(t.when, str) and not np.any(_terms.schedule(t, T, 1.0, "_skipped")[knots]))


def _at_knots(problem, fn, *per_knot):
    """``fn(skip, *args_k)`` at every knot k = 0..T, the arrays ``per_knot`` having T+1 rows:
    vmapped over the knots before the last, and at the last apart, each group skipping the cost
    terms that are zero there (:func:`_skipped`): a tool target at the end is then not evaluated,
    nor differentiated, at the T knots of the path. Outputs stacked as one vmap would stack them."""
    T = problem.T
    head = jax.vmap(functools.partial(fn, _skipped(problem, False)))(*(a[:T] for a in per_knot))
    tail = jax.vmap(functools.partial(fn, _skipped(problem, True)))(*(a[T:] for a in per_knot))
    return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), head, tail)


def _residuals(problem, arm, xu, k, skip=frozenset()):
    """Stacked residuals (r,) of the least-squares costs at knot k, and their weights (r,); the
    terms in ``skip`` (indices, :func:`_skipped`) are left out."""
    n = problem.n
    x, u = xu[: 2 * n], xu[2 * n:]
    rs, ws = [], []
    for i, t in enumerate(problem.costs):
        if t.kind != "residual" or i in skip:
            continue
        d = t.values(problem.params)
        r = t.fn(arm, x, u, k, d, problem.params)
        rs.append(r)
        ws.append(jnp.broadcast_to(d["weight"] * _terms.factor(t, k, problem.dt), r.shape))
    if not rs:
        return jnp.zeros(0, xu.dtype), jnp.zeros(0, xu.dtype)
    return jnp.concatenate(rs), jnp.concatenate(ws)


def _scalars(problem, arm, xu, k, skip=frozenset()):
    n = problem.n
    x, u = xu[: 2 * n], xu[2 * n:]
    total = jnp.zeros((), xu.dtype)
    for i, t in enumerate(problem.costs):
        if t.kind == "scalar" and i not in skip:
            total = total + _terms.factor(t, k, problem.dt) * t.fn(arm, x, u, k, t.values(problem.params), problem.params)
    return total


def _constraints(problem, arm, xu, k):
    """Stacked constraint values (m,) at knot k and whether each applies there (m,) bool."""
    n = problem.n
    x, u = xu[: 2 * n], xu[2 * n:]
    cs, ms = [], []
    for t in problem.constraints:
        c = t.fn(arm, x, u, k, t.values(problem.params), problem.params)
        cs.append(c)
        ms.append(jnp.broadcast_to(t.schedule[k] > 0, c.shape))
    if not cs:
        return jnp.zeros(0, xu.dtype), jnp.zeros(0, bool)
    return jnp.concatenate(cs), jnp.concatenate(ms)


def _al_parts(c, active, eq, lam, mu):
    """Augmented-Lagrangian value, first and (Gauss-Newton) second derivatives in c, entrywise:
    inequalities (max(0, lam + mu c)^2 - lam^2) / (2 mu) (Nocedal & Wright eq 17.65), equalities
    lam c + mu c^2 / 2 (eq 17.36); zero where the constraint does not apply."""
    shifted = lam + mu * c
    pos = shifted > 0
    val = jnp.where(eq, lam * c + 0.5 * mu * c**2, (jnp.maximum(0.0, shifted) ** 2 - lam**2) / (2.0 * mu))
    d1 = jnp.where(eq, shifted, jnp.maximum(0.0, shifted))
    d2 = jnp.where(eq | pos, mu, 0.0)
    z = jnp.zeros_like(c)
    return jnp.where(active, val, z), jnp.where(active, d1, z), jnp.where(active, d2, z)


def _violation(c, active, eq):
    return jnp.where(active, jnp.where(eq, jnp.abs(c), jnp.maximum(c, 0.0)), 0.0)


def _knot_cost(problem, arm, xu, k, skip=frozenset()):
    """The problem's cost at knot k (no constraint terms)."""
    r, w = _residuals(problem, arm, xu, k, skip)
    return jnp.sum(w * r**2) + _scalars(problem, arm, xu, k, skip)


def _knot_value(problem, arm, eq, xu, k, lam, mu, skip=frozenset(), with_cost=False):
    """The augmented Lagrangian at knot k: its cost plus the constraints' terms (and, with
    ``with_cost``, the cost alone as well)."""
    val = _knot_cost(problem, arm, xu, k, skip)
    c, active = _constraints(problem, arm, xu, k)
    al, _, _ = _al_parts(c, active, eq, lam, mu)
    return (val + jnp.sum(al), val) if with_cost else val + jnp.sum(al)


def _knot_quadratic(problem, arm, eq, has_scalars, xu, k, lam, mu, skip=frozenset()):
    """Gradient (2n+n,) and Hessian (3n, 3n) of one knot's objective: Gauss-Newton for residuals
    and constraint penalties (one forward-mode Jacobian of all of them), exact for scalar terms."""
    def stacked(xu):
        r, w = _residuals(problem, arm, xu, k, skip)
        c, active = _constraints(problem, arm, xu, k)
        out = jnp.concatenate([r, c])
        return out, (out, w, active)

    J, (vals, w, active) = jax.jacfwd(stacked, has_aux=True)(xu)
    nr = w.shape[0]
    r, c = vals[:nr], vals[nr:]
    Jr, Jc = J[:nr], J[nr:]
    _, d1, d2 = _al_parts(c, active, eq, lam, mu)
    g = 2.0 * Jr.T @ (w * r) + Jc.T @ d1
    H = 2.0 * Jr.T @ (w[:, None] * Jr) + Jc.T @ (d2[:, None] * Jc)
    if has_scalars:
        s = lambda xu: _scalars(problem, arm, xu, k, skip)  # noqa: E731
        g = g + jax.grad(s)(xu)
        H = H + jax.hessian(s)(xu)
    return g, H


def _rate_term(problem):
    """The problem's input-rate term (:func:`jaxarm.trajopt.terms.input_rate`), or None."""
    found = [t for t in problem.costs if t.kind == "rate"]
    return found[0] if found else None


def _rate_parts(problem, us):
    """For the input-rate term: per-knot weights c (T, n) = schedule_k w / dt, and the previous
    inputs u_{k-1} (T, n) (u_{-1} = the term's ``previous``, zero where it has none: its weight is
    zero there). The cost is sum c (u - u_prev)^2."""
    t = _rate_term(problem)
    n, T = problem.n, problem.T
    d = t.values(problem.params)
    dtype = us.dtype
    w = jnp.broadcast_to(jnp.asarray(d["w"], dtype), (n,))
    c = t.schedule[:T, None].astype(dtype) * w[None] / problem.dt
    prev = jnp.broadcast_to(jnp.asarray(d["previous"], dtype), (n,)) if "previous" in d else jnp.zeros(n, dtype)
    return c, jnp.concatenate([prev[None], us[:-1]])


def _rate_cost(problem, us):
    """The input-rate term's cost (zero without one)."""
    if _rate_term(problem) is None:
        return jnp.zeros((), us.dtype)
    c, prev = _rate_parts(problem, us)
    return jnp.sum(c * (us - prev) ** 2)
