"""Many problems of one structure solved through a fixed pool of batch slots (continuous batching).

A ``jax.vmap``-ed :func:`jaxarm.trajopt.ddp` iterates until its slowest member stops: every
member pays for the iterations of the hardest one (64 UR5 reaches of which 4 are out of reach: the
60 others converge in 15-40 iterations, and run 200 with them). :func:`solve_many` keeps a pool of
``slots`` problems in one compiled, ``vmap``-ed solver that runs ``round_iterations`` DDP
iterations at a time. After each round, the problems that stopped (converged, no progress,
infeasible, non-finite, or out of iterations) leave the pool and waiting ones take their slots;
the others go on from where they are: their inputs, states and constraint multipliers are the
next round's warm start, with the regularization of their last iteration and the
augmented-Lagrangian penalty and constraint violation they reached (so the penalty rises from
round to round where the violation does not fall fourfold, as within one :func:`ddp` solve; each
round ends with a multiplier update). The same scheme serves large language models'
requests ("continuous batching", Yu et al. 2022, Orca, OSDI). One program is compiled, whatever
the number of problems; the host gathers and scatters the slots between rounds.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from ....core.xla import jit as _jit
from ....model import checks
from ..ocp import OCP, solver_arm
from .ddp import ITERATION_LIMIT, DDPLog, OCPResult, _constraint_layout, _hold, _start_scalar, ddp


_CACHE: dict = {}  # id(problem) -> (problem, {(params tree, round_iterations, options): (solver, hold)})


def _compiled(problem, tree, round_iterations, options):
    """The vmapped round of ``round_iterations`` DDP iterations for ``problem`` (closed over) and the
    vmapped inputs that hold a start pose, kept for the last 8 problems."""
    entry = _CACHE.get(id(problem))
    if entry is None or entry[0] is not problem:
        if len(_CACHE) >= 8:
            _CACHE.pop(next(iter(_CACHE)))
        entry = _CACHE[id(problem)] = (problem, {})
    key = (tree, round_iterations, tuple(sorted(options.items())))
    if key not in entry[1]:
        solver = _jit(jax.vmap(lambda p, x0, u, x, lam, reg, mu, viol: ddp(
            problem.replace(params=jax.tree_util.tree_unflatten(tree, p), x0=x0), u, x, multipliers=lam, regularization=reg,
            mu=mu, last_violation=viol, max_iterations=round_iterations, **options)))
        hold = jax.jit(jax.vmap(lambda x0: _hold(problem.replace(x0=x0), solver_arm(problem), jnp.result_type(problem.x0))))
        entry[1][key] = (solver, hold)
    return entry[1][key]


def solve_many(problem: OCP, params, *, x0=None, slots: int | None = None, round_iterations: int = 10, max_iterations: int = 200,
               report=None, **options) -> OCPResult:
    """Solve ``problem`` once for each entry of ``params`` (the problem's params pytree with a
    leading batch axis N on every leaf, e.g. ``{"goal": goals}`` for goals (N, 3)) by
    :func:`jaxarm.trajopt.ddp`, through a pool of ``slots`` problems solved side by side
    (see the module docstring). Returns one :class:`OCPResult` with a leading axis N: per
    problem, its final iterate, the total iterations over its rounds and the history of all of
    them ((N, max_iterations) each). ``options`` go to :func:`ddp` (tol, tol_violation, mu, ...).
    x0: (N, 2n) start states (q, qd), one per problem, or None for the problem's own.

    slots: the pool's size; by default 4 on a CPU and 1024 on other platforms. On the 2-core CPU,
    64 UR5 reaches took 1.7 s with 4 slots, 2.0 s with 2, 1.9 s with 8 and 2.7 s with 16 (rounds
    of 10 iterations; Crocoddyl's FDDP, one solve after another: 2.5 s): beyond a few slots, the
    problems that finish early in a round and the longest line search of the batch cost more
    than the wider batch saves. The GPU default is the batch size at which a vmapped UR5 solve on an
    H100 reached 75 solves/s; the pool itself has not been timed on a GPU. The choice is part of
    what ``report`` receives.

    Start: the inputs holding the start pose and the start state at every knot, as :func:`ddp`'s
    defaults. ``report``: a callable receiving a dict (rounds, slot-rounds used, problems, the
    pool size, seconds) at the end, or None.

    max_iterations counts whole rounds: it is rounded up to a multiple of ``round_iterations``
    (200 and 10 by default).

    The compiled solver is kept per problem structure and settings: a second call with new params
    of the same shapes compiles nothing. The problem is closed over (its arm a constant of the
    program); only the params, start states, warm starts, multipliers and regularizations are
    arguments.
    """
    func = "solve_many"
    if not isinstance(problem, OCP):
        raise TypeError(f"{func}: problem: expected a jaxarm.trajopt.OCP, got {type(problem).__name__}")
    if slots is None:
        slots = 4 if jax.default_backend() == "cpu" else 1024
    for name, v in (("slots", slots), ("round_iterations", round_iterations), ("max_iterations", max_iterations)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{func}: {name}: expected a whole number >= 1, got {v!r}")
    leaves, tree = jax.tree_util.tree_flatten(params)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(problem.params)
    if tree != ref_tree:
        raise ValueError(f"{func}: params: expected the structure of problem.params ({ref_tree}) with a leading batch "
                         f"axis, got {tree}")
    if not leaves:
        raise ValueError(f"{func}: params: the problem has no params to batch over")
    if not checks.concrete((params, problem, x0)):
        raise TypeError(f"{func}: runs on the host (a Python loop over rounds of a compiled solver): call it outside "
                        "jax.jit, jax.vmap and jax.grad; to batch inside a traced program, jax.vmap trajopt.ddp itself")
    leaves = [np.asarray(a) for a in leaves]
    N = leaves[0].shape[0] if leaves[0].ndim else 0
    for a, r in zip(leaves, ref_leaves):
        if a.ndim == 0 or a.shape[0] != N or a.shape[1:] != np.shape(r):
            raise ValueError(f"{func}: params: every leaf needs shape (N, *shape in problem.params) with one N; "
                             f"got {a.shape} for a leaf of shape {np.shape(r)} (N = {N})")
    if N == 0:
        raise ValueError(f"{func}: params: no problems (N = 0)")
    B = min(slots, N)
    max_iterations = -(-max_iterations // round_iterations) * round_iterations  # whole rounds
    n, T = problem.n, problem.T
    dtype = np.dtype(jnp.result_type(problem.x0))
    m = int(sum(_constraint_layout(problem)[0]))

    for name in ("u_init", "x_init", "multipliers"):
        if name in options:
            raise ValueError(f"{func}: {name}: not taken (every problem starts from ddp's default start)")
    reg_start = options.pop("regularization", 0.0)
    mu_start = options.pop("mu", 10.0)
    _start_scalar(mu_start, "mu", dtype, func, lambda v: np.isfinite(v) and v > 0, "a finite number > 0 (the penalty to start from)")
    if x0 is None:
        x0 = np.broadcast_to(np.asarray(problem.x0), (N, 2 * n))
    x0 = np.asarray(x0, dtype)
    if x0.shape != (N, 2 * n):
        raise ValueError(f"{func}: x0: expected shape ({N}, {2 * n}) (a start state q, qd per problem), got {x0.shape}")
    if not np.all(np.isfinite(x0)):
        raise ValueError(f"{func}: x0: expected finite start states")
    solver, hold = _compiled(problem, tree, round_iterations, options)
    lower, upper = np.asarray(problem.lower, dtype), np.asarray(problem.upper, dtype)
    u = np.clip(np.asarray(hold(x0), dtype), lower, upper)
    x = np.broadcast_to(x0[:, None, :], (N, T + 1, 2 * n)).copy()
    lam = np.zeros((N, T + 1, m), dtype)
    reg = np.full(N, reg_start, dtype)  # each problem's regularization, carried from round to round
    mu = np.full(N, mu_start, dtype)  # its penalty and its constraint violation at the last round's end
    viol = np.full(N, np.inf, dtype)
    used = np.zeros(N, int)  # iterations so far
    history = {f: np.full((N, max_iterations), np.nan, dtype) for f in DDPLog._fields}
    final = [None] * N  # per problem: the round's result arrays (numpy) where it stopped
    queue = list(range(N))
    pool = [queue.pop(0) for _ in range(B)]
    rounds = slot_rounds = 0
    t0 = time.perf_counter()
    while any(i is not None for i in pool):
        idx = np.array([i if i is not None else next(j for j in pool if j is not None) for i in pool])
        out = solver([a[idx] for a in leaves], x0[idx], u[idx], x[idx], lam[idx], reg[idx], mu[idx], viol[idx])
        out = jax.tree_util.tree_map(np.asarray, out)
        rounds += 1
        for s, i in enumerate(pool):
            if i is None:
                continue
            slot_rounds += 1
            it = int(out.iterations[s])
            for f in DDPLog._fields:  # (max_iterations is a whole number of rounds: the history has room)
                history[f][i, used[i]: used[i] + it] = getattr(out.history, f)[s, :it]
            used[i] += it
            u[i], x[i], lam[i], mu[i], viol[i] = out.u[s], out.x[s], out.multipliers[s], out.penalty[s], out.max_violation[s]
            if it > 0:  # the regularization of its last iteration: where the next round starts
                reg[i] = out.history.regularization[s, it - 1]
            stopped = int(out.status[s]) != ITERATION_LIMIT or used[i] >= max_iterations
            if stopped:
                final[i] = jax.tree_util.tree_map(lambda a: a[s], out)
                pool[s] = queue.pop(0) if queue else None
    seconds = time.perf_counter() - t0
    if report is not None:
        report(dict(rounds=rounds, slot_rounds=slot_rounds, problems=N, slots=B, round_iterations=round_iterations,
                    max_iterations=max_iterations, seconds=seconds))
    stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *final)
    stacked = stacked._replace(iterations=used.astype(np.asarray(stacked.iterations).dtype),
                               history=DDPLog(**{f: history[f] for f in DDPLog._fields}))
    return jax.tree_util.tree_map(jnp.asarray, stacked)
