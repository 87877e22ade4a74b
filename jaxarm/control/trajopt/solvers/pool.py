"""Many problems of one structure solved through a fixed pool of batch slots (continuous batching).

A ``jax.vmap``-ed :func:`jaxarm.trajopt.ddp` iterates until its slowest member stops: every
member pays for the iterations of the hardest one (64 UR5 reaches of which 4 are out of reach: the
60 others converge in 15-40 iterations, and run 200 with them). :func:`solve_many` keeps a pool of
``slots`` problems in one compiled, ``vmap``-ed solver that runs ``round_iterations`` DDP
iterations at a time. After each round, the problems that stopped (converged, no progress,
infeasible, non-finite, or out of iterations) leave the pool and waiting ones take their slots;
the others go on from where they are: their inputs, states and constraint multipliers are the
next round's warm start, with the regularization of their last iteration and the
augmented-Lagrangian state they reached (penalty, multiplier updates made, violation at the last
update). A round that ends inside an augmented-Lagrangian round resumes inside it, so each problem
takes the iterates one :func:`ddp` solve would take. The same scheme serves large language
models' requests ("continuous batching", Yu et al. 2022, Orca, OSDI). One program is compiled,
whatever the number of problems; the host gathers and scatters the slots between rounds. The
problems may differ in params, start state, arm, step and input bounds.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from ....core.xla import jit as _jit
from ....model import checks
from ....simulate.batch import _SharedLeaves
from ..ocp import OCP, solver_arm
from .ddp import ITERATION_LIMIT, DDPLog, OCPResult, _constraint_layout, _hold, _start_scalar, ddp


_CACHE: dict = {}  # id(problem) -> (problem, {(batched fields, shared arm leaves, round_iterations, options): (solver, hold)})

# the problem's fields a pool can batch, besides params and the start state: the arm (stacked), dt,
# and the input bounds
_FIELDS = ("params", "x0", "arm", "dt", "lower", "upper")


def _member(problem, fields, shared, arm_leaves):
    """One problem of the batch: ``problem`` with its batched fields replaced (the arm rebuilt from
    its varying leaves and the batch's shared ones)."""
    if shared is not None:
        fields = {**fields, "arm": shared.arm(arm_leaves)}
    return problem.replace(**fields) if fields else problem


def _compiled(problem, tree, shared, round_iterations, options):
    """The vmapped round of ``round_iterations`` DDP iterations for ``problem`` (closed over, its
    batched fields arguments) and the vmapped inputs that hold a start pose, kept for the last 8
    problems."""
    entry = _CACHE.get(id(problem))
    if entry is None or entry[0] is not problem:
        if len(_CACHE) >= 8:
            _CACHE.pop(next(iter(_CACHE)))
        entry = _CACHE[id(problem)] = (problem, {})
    key = (tree, shared, round_iterations, tuple(sorted(options.items())))
    if key not in entry[1]:
        def member(leaves, arm_leaves):
            return _member(problem, jax.tree_util.tree_unflatten(tree, leaves), shared, arm_leaves)

        solver = _jit(jax.vmap(lambda f, a, u, x, lam, reg, mu, viol, rounds, qdd: ddp(
            member(f, a), u, x, multipliers=lam, regularization=reg, mu=mu, last_violation=viol, al_rounds=rounds,
            qdd_init=qdd, max_iterations=round_iterations, **options)))
        hold = jax.jit(jax.vmap(lambda f, a: _hold(member(f, a), solver_arm(member(f, a)), jnp.result_type(problem.x0))))
        entry[1][key] = (solver, hold)
    return entry[1][key]


def _batched(name, value, reference, N, func, dtype=None, finite=False):
    """The leaves of a batched field as NumPy arrays (N, *shape of the problem's), checked: the
    problem's structure with a leading batch axis of one size N (None: taken from the first)."""
    leaves, tree = jax.tree_util.tree_flatten(value)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(reference)
    if tree != ref_tree:
        hint = ": N arms of the problem's arm's structure, stacked by jaxarm.stack_arms" if name == "arm" else \
            f" ({ref_tree}) with a leading batch axis, got {tree}"
        raise ValueError(f"{func}: {name}: expected the structure of the problem's {name}{hint}")
    out = []
    for a, r in zip(leaves, ref_leaves):
        a = np.asarray(a, dtype) if dtype is not None else np.asarray(a)
        if a.ndim == 0 or (N is not None and a.shape[0] != N) or a.shape[1:] != np.shape(r):
            raise ValueError(f"{func}: {name}: every leaf needs shape (N, *its shape in the problem) with one N for all "
                             f"batched fields; got {a.shape} for a leaf of shape {np.shape(r)}"
                             + (f" (N = {N})" if N is not None else ""))
        if finite and not np.all(np.isfinite(a)):
            raise ValueError(f"{func}: {name}: expected finite values")
        N = a.shape[0] if N is None else N
        out.append(a)
    return out, tree, N


def solve_many(problem: OCP, params=None, *, x0=None, arm=None, dt=None, lower=None, upper=None, u_init=None,
               x_init=None, multipliers=None, slots: int | None = None, round_iterations: int = 10,
               max_iterations: int = 200, workers: int | None = None, report=None, **options) -> OCPResult:
    """Solve N problems that differ from ``problem`` in some of its fields by :func:`jaxarm.trajopt.ddp`,
    through a pool of ``slots`` problems solved side by side (see the module docstring). Returns
    one :class:`OCPResult` with a leading axis N: per problem, its final iterate, the total
    iterations over its rounds and the history of all of them ((N, max_iterations) each).
    ``options`` go to :func:`ddp` (tol, tol_violation, mu, al_iterations, ...).

    What differs, each with a leading batch axis N (at least one; None: the problem's own):

    - params: the problem's params pytree, e.g. ``{"goal": goals}`` for goals (N, 3);
    - x0: (N, 2n) start states (q, qd);
    - arm: N arms of the problem's arm's structure, stacked (:func:`jaxarm.stack_arms`; payloads,
      masses, friction identified on N robots, a domain randomization). The leaves equal across the
      batch stay constants of the compiled solver (kinematics varied by none of the arms fold as
      for one arm); only those that differ are data (``report`` lists them);
    - dt: (N,) steps (durations T dt; path costs rescale with dt, as in ``problem.replace``);
    - lower, upper: (N, n) input bounds.

    Warm starts, per problem: u_init (N, T, n) inputs, x_init (N, T+1, 2n) states (the solution of
    a similar batch, or of the previous control period), multipliers (N, T+1, m). By default every
    problem starts as :func:`ddp` starts it: the inputs holding its start pose, its start state at
    every knot, zero multipliers.

    slots: the pool's size; by default 4 on a CPU and 1024 on other platforms. On the 2-core CPU,
    64 UR5 reaches took 1.7 s with 4 slots, 2.0 s with 2, 1.9 s with 8 and 2.7 s with 16 (rounds
    of 10 iterations; Crocoddyl's FDDP, one solve after another: 2.5 s): beyond a few slots, the
    problems that finish early in a round and the longest line search of the batch cost more
    than the wider batch saves. The GPU default is the batch size at which a vmapped UR5 solve on an
    H100 reached 75 solves/s; the pool itself has not been timed on a GPU. The choice is part of
    what ``report`` receives.

    workers: how many pools of ``slots`` run side by side, each in a thread of its own, all taking
    their problems from one queue; by default one per CPU core on a CPU (at most as many as the
    problems fill) and 1 on other platforms. On a CPU one compiled solve runs on about one core
    (XLA:CPU's kernels of a 6-joint solver are too small to split): 64 UR5 reaches took 2.8 s with
    one pool of 4 slots and 1.75 s with two on the 2-core CPU, 64 Panda reaches 7.5 and 3.5 s
    (docs/guide/trajopt.md). Each problem
    is solved as with one pool; only which slot and round it lands in differs.

    ``report``: a callable receiving a dict at the end (rounds, slot-rounds used, problems, the
    pool size, the workers, seconds, the batched fields and, for a batch of arms, the leaves that
    differ), or None.

    Each problem is solved as one :func:`ddp` call with max_iterations, al_iterations and every
    other option would solve it: a round that ends inside an augmented-Lagrangian round is resumed
    inside it (same multipliers and penalty), multipliers are updated only when a round's DDP
    iterations converged, and al_iterations counts the multiplier updates over all rounds.
    max_iterations counts whole rounds: it is rounded up to a multiple of ``round_iterations``
    (200 and 10 by default).

    The compiled solver is kept per problem structure and settings: a second call with new values
    of the same shapes compiles nothing (a batch of arms with other shared leaves compiles again).
    The problem is closed over (its arm a constant of the program, unless arms are batched); only
    the batched fields, warm starts, multipliers, regularizations and penalties are arguments.
    """
    func = "solve_many"
    if not isinstance(problem, OCP):
        raise TypeError(f"{func}: problem: expected a jaxarm.trajopt.OCP, got {type(problem).__name__}")
    if slots is None:
        slots = 4 if jax.default_backend() == "cpu" else 1024
    for name, v in (("slots", slots), ("round_iterations", round_iterations), ("max_iterations", max_iterations),
                    ("workers", 1 if workers is None else workers)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{func}: {name}: expected a whole number >= 1" + (" or None" if name == "workers" else "")
                             + f", got {v!r}")
    given = {name: v for name, v in (("params", params), ("x0", x0), ("arm", arm), ("dt", dt), ("lower", lower),
                                     ("upper", upper), ("u_init", u_init), ("x_init", x_init),
                                     ("multipliers", multipliers)) if v is not None}
    if not checks.concrete((given, problem)):
        raise TypeError(f"{func}: runs on the host (a Python loop over rounds of a compiled solver): call it outside "
                        "jax.jit, jax.vmap and jax.grad; to batch inside a traced program, jax.vmap trajopt.ddp itself")
    for name in ("al_rounds", "last_violation"):
        if name in options:
            raise ValueError(f"{func}: {name}: not taken (the pool carries each problem's own from round to round)")
    n, T = problem.n, problem.T
    dtype = np.dtype(jnp.result_type(problem.x0))
    m = int(sum(_constraint_layout(problem)[0]))
    # the batched fields: each checked against the problem's own, one N for all
    N = None
    fields, arm_leaves, shared = {}, [], None
    for name in ("params", "x0", "dt", "lower", "upper"):
        if name in given:
            reference = jnp.asarray(getattr(problem, name)) if name != "params" else problem.params
            leaves, tree, N = _batched(name, given[name], reference, N, func, None if name == "params" else dtype,
                                       finite=name in ("x0", "dt"))
            if not leaves:
                raise ValueError(f"{func}: {name}: the problem's {name} has no arrays to batch over")
            fields[name] = jax.tree_util.tree_unflatten(tree, leaves)
    if "lower" in fields or "upper" in fields:
        lo = fields.get("lower", np.broadcast_to(np.asarray(problem.lower, dtype), (N, n)))
        hi = fields.get("upper", np.broadcast_to(np.asarray(problem.upper, dtype), (N, n)))
        if np.any(np.isnan(lo)) or np.any(np.isnan(hi)) or np.any(lo > hi):
            raise ValueError(f"{func}: lower, upper: expected lower <= upper for every problem (no NaN)")
    if "dt" in fields and not np.all(fields["dt"] > 0):
        raise ValueError(f"{func}: dt: expected steps > 0, got {fields['dt'].tolist()}")
    if "arm" in given:
        leaves, _, N = _batched("arm", given["arm"], problem.arm, N, func)
        stacked = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(problem.arm), leaves)
        shared = _SharedLeaves(stacked)
        arm_leaves = shared.varying(stacked)
    if N is None:
        raise ValueError(f"{func}: nothing to batch over: give params, x0, arm, dt, lower or upper with a leading "
                         "batch axis (one per problem)")
    if N == 0:
        raise ValueError(f"{func}: no problems (N = 0)")
    B = min(slots, N)
    max_iterations = -(-max_iterations // round_iterations) * round_iterations  # whole rounds
    defaults = inspect.signature(ddp).parameters
    reg_start = options.pop("regularization", defaults["regularization"].default)
    mu_start = options.pop("mu", defaults["mu"].default)
    _start_scalar(mu_start, "mu", dtype, func)
    _start_scalar(reg_start, "regularization", dtype, func)
    tree = jax.tree_util.tree_structure(fields)
    flat = jax.tree_util.tree_leaves(fields)
    solver, hold = _compiled(problem, tree, shared, round_iterations, options)
    x0s = fields.get("x0", np.broadcast_to(np.asarray(problem.x0, dtype), (N, 2 * n)))

    def start(name, shape, default):
        if name not in given:
            return default()
        a = np.array(given[name], dtype)
        if a.shape != shape:
            raise ValueError(f"{func}: {name}: expected shape {shape} (one per problem), got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{func}: {name}: expected finite values")
        return a

    def holding():  # the inputs that hold each start pose (one for all when nothing they depend on is batched)
        if flat or arm_leaves:
            return np.array(hold(flat, arm_leaves), dtype)
        return np.array(np.broadcast_to(_hold(problem, solver_arm(problem), dtype), (N, T, n)), dtype)

    u = start("u_init", (N, T, n), holding)
    x = start("x_init", (N, T + 1, 2 * n), lambda: np.broadcast_to(x0s[:, None, :], (N, T + 1, 2 * n)).copy())
    lam = start("multipliers", (N, T + 1, m), lambda: np.zeros((N, T + 1, m), dtype))
    reg = np.full(N, reg_start, dtype)  # each problem's regularization, carried from round to round
    mu = np.full(N, mu_start, dtype)  # its penalty, its violation at its last multiplier update, and its
    viol = np.full(N, np.inf, dtype)  # multiplier updates so far (augmented-Lagrangian rounds)
    al_rounds = np.zeros(N, np.int64)
    qdd = np.full((N, T, n), np.nan, dtype)  # the accelerations at its knots (NaN: not known yet)
    used = np.zeros(N, int)  # iterations so far
    history = {f: np.full((N, max_iterations), np.nan, dtype) for f in DDPLog._fields}
    final = [None] * N  # per problem: the round's result arrays (numpy) where it stopped
    queue = list(range(N))
    lock = threading.Lock()  # the queue and the counters (each problem's rows are written by one worker only)
    counts = {"rounds": 0, "slot_rounds": 0}
    # pools run side by side, one per core on a CPU: a compiled solve runs on about one core there
    if workers is None:
        workers = (os.cpu_count() or 1) if jax.default_backend() == "cpu" else 1
    workers = int(min(workers, -(-N // B)))
    compiled_once = threading.Event()

    def take():
        with lock:
            return queue.pop(0) if queue else None

    def work(pool, first):
        while any(i is not None for i in pool):
            idx = np.array([i if i is not None else next(j for j in pool if j is not None) for i in pool])
            if not first:
                compiled_once.wait()  # (the first round compiles the solver, once)
            try:
                out = solver([a[idx] for a in flat], [a[idx] for a in arm_leaves], u[idx], x[idx], lam[idx], reg[idx],
                             mu[idx], viol[idx], al_rounds[idx], qdd[idx])
                out = jax.tree_util.tree_map(np.asarray, out)
            finally:
                compiled_once.set()
            with lock:
                counts["rounds"] += 1
                counts["slot_rounds"] += sum(i is not None for i in pool)
            for s, i in enumerate(pool):
                if i is None:
                    continue
                it = int(out.iterations[s])
                for f in DDPLog._fields:  # (max_iterations is a whole number of rounds: the history has room)
                    history[f][i, used[i]: used[i] + it] = getattr(out.history, f)[s, :it]
                used[i] += it
                u[i], x[i], lam[i], mu[i] = out.u[s], out.x[s], out.multipliers[s], out.penalty[s]
                viol[i], al_rounds[i], qdd[i] = out.update_violation[s], out.al_rounds[s], out.qdd[s]
                if it > 0:  # the regularization of its last iteration: where the next round starts
                    reg[i] = out.history.regularization[s, it - 1]
                stopped = int(out.status[s]) != ITERATION_LIMIT or used[i] >= max_iterations
                if stopped:
                    final[i] = jax.tree_util.tree_map(lambda a: a[s], out)
                    pool[s] = take()

    pools = [[take() for _ in range(B)] for _ in range(workers)]  # (the first pool full: its first round compiles)
    t0 = time.perf_counter()
    if workers == 1:
        work(pools[0], True)
    else:
        with concurrent.futures.ThreadPoolExecutor(workers) as executor:
            running = [executor.submit(work, pool, k == 0) for k, pool in enumerate(pools)]
            for r in running:
                r.result()
    seconds = time.perf_counter() - t0
    rounds, slot_rounds = counts["rounds"], counts["slot_rounds"]
    if report is not None:
        varying = [] if shared is None else [jax.tree_util.keystr(path) for (path, _), v in
                                             zip(jax.tree_util.tree_flatten_with_path(problem.arm)[0], shared.values) if v is None]
        report(dict(rounds=rounds, slot_rounds=slot_rounds, problems=N, slots=B, workers=workers, round_iterations=round_iterations,
                    max_iterations=max_iterations, seconds=seconds,
                    batched=[f for f in _FIELDS if f in fields or (f == "arm" and shared is not None)],
                    arm_leaves_varying=varying))
    stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *final)
    stacked = stacked._replace(iterations=used.astype(np.asarray(stacked.iterations).dtype),
                               history=DDPLog(**{f: history[f] for f in DDPLog._fields}))
    return jax.tree_util.tree_map(jnp.asarray, stacked)
