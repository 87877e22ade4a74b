"""Box-constrained, feasibility-driven DDP for :class:`jaxarm.trajopt.OCP` problems.

The solver combines three published pieces:

- iLQR / DDP (Li & Todorov 2004; Tassa, Erez & Todorov 2012): a Riccati-like backward pass on the
  linearized step x_{k+1} = F(x_k, u_k) and the quadratized costs, a nonlinear forward pass with
  a backtracking line search and Levenberg-Marquardt regularization of Q_uu. Least-squares terms
  are quadratized by Gauss-Newton, scalar terms by ``jax.hessian``; the dynamics enter through their
  first derivatives only (iLQR; the full-DDP curvature V_x' d^2F is not offered).
- Box-DDP (Tassa, Mansard & Todorov 2014, "Control-limited differential dynamic programming"): the input bounds
  lower <= u <= upper are handled inside the backward pass. Each stage solves the box-constrained
  QP min_du 1/2 du^T Q_uu du + Q_u^T du with u + du in the box by projected Newton; the feedback
  gain acts only on the free inputs (rows of clamped inputs are zero), so no iterate ever leaves
  the box.
- Feasibility-driven DDP (FDDP; Mastalli et al. 2020, "Crocoddyl: an efficient and versatile
  framework for multi-contact optimal control"): the state
  trajectory is a decision too, so a solve may start from an infeasible guess (for example
  states interpolated towards a goal). The gaps f_{k+1} = F(x_k, u_k) - x_{k+1} enter the backward
  pass (V_x' = V_x + V_xx f) and the forward pass closes them by the step length:
  x_{k+1} = F(x_k, u_k) - (1 - alpha) f_{k+1}, so a full step makes the trajectory dynamically
  feasible. The expected change of the cost along a step is evaluated exactly for the quadratic
  model (it is alpha g1 + alpha^2 g2, both from one linear rollout).

General constraints g <= 0 and h = 0 (joint limits, keep-out spheres, via points, terminal
equalities) are handled by an augmented Lagrangian around the DDP iterations (Nocedal & Wright
2006, eqs 17.39 and 17.65; as in ALTRO, Howell, Jackson & Manchester 2019): the same compiled
iteration body serves every outer round.

The solution is differentiable with respect to the problem by the implicit function theorem
(:mod:`.implicit`): the iterations run inside a ``jax.custom_vjp`` whose backward pass solves the
KKT system at the optimum.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ....core import tracers
from ....core.xla import _jaxpr_function, eager_compiled, jit, split_settings
from ....dynamics import linalg
from ....model import checks
from ...step_jacobians import _EULER, _TABLEAUS, _accel_factored, _step_accel, _step_jacobians, _step_second_derivatives
from ..ocp import OCP, _finite, _kept_key, solver_arm
from .implicit import solution_vjp
from .knots import (_at_knots, _constraint_layout, _constraints, _knot_cost, _knot_quadratic, _knot_value, _rate_cost,
                    _rate_parts, _rate_term, _violation)

# Why a solve stopped (``OCPResult.status``); see :meth:`OCPResult.reason`.
CONVERGED, ITERATION_LIMIT, NO_PROGRESS, INFEASIBLE, NOT_FINITE = 0, 1, 2, 3, 4
STATUS = {
    CONVERGED: "converged",
    ITERATION_LIMIT: "iteration limit",
    NO_PROGRESS: "no progress (regularization at its bound)",
    INFEASIBLE: "constraints not satisfied",
    NOT_FINITE: "non-finite values",
}
ADVICE = {
    CONVERGED: "",
    ITERATION_LIMIT: "raise max_iterations, or start closer (a warm start: u_init from a previous "
                     "solution, x_init of states towards the goal); if the history shows many short steps "
                     "(alpha << 1), the problem is ill-conditioned: add a small regularization along the path "
                     "(terms.joint_position(q0, w, when='path'), terms.joint_velocity(w, when='path')), "
                     "which redundant arms need",
    NO_PROGRESS: "the line search found no decrease even with heavy regularization: the problem is badly "
                 "scaled (weights of very different sizes), a term is not smooth where the solver is, or tol "
                 "is below what the floating-point type can resolve (use float64)",
    INFEASIBLE: "the constraints could not all be met: check that they are compatible (a keep-out region "
                "around the goal, limits the start state already violates, bounds too tight for the motion); "
                "raise al_iterations or mu_max if the violation was still shrinking",
    NOT_FINITE: "the rollout produced NaN or inf: smaller dt, or bounds that keep the inputs reasonable",
}


class DDPLog(NamedTuple):
    """Per iteration, (max_iterations,) each, NaN after the last: cost (the objective with the
    augmented-Lagrangian terms), gap (largest dynamics defect |f|), alpha (accepted step, 0 when
    rejected), regularization (mu on Q_uu), expected (the model's predicted change at alpha = 1)."""

    cost: jnp.ndarray
    gap: jnp.ndarray
    alpha: jnp.ndarray
    regularization: jnp.ndarray
    expected: jnp.ndarray


class OCPResult(NamedTuple):
    """The answer of :func:`ddp`.

    x: (T+1, 2n) states (q, qd); u: (T, n) inputs (pass back as ``u_init`` to warm-start);
    cost: () the problem's cost (no constraint terms); max_violation: () largest constraint
    violation (g > 0 or |h|) over the knots where each constraint applies; max_gap: () largest
    dynamics defect |F(x_k, u_k) - x_{k+1}| (0 once feasible); iterations: () DDP iterations (all
    augmented-Lagrangian rounds); converged: () bool; status: () int, why it stopped (see
    :meth:`reason`); multipliers: (T+1, m) the constraints' Lagrange multipliers; history: DDPLog;
    penalty: () the augmented-Lagrangian penalty mu where the solve stopped; al_rounds: () the
    multiplier updates made (augmented-Lagrangian rounds completed, those of the solve it resumed
    included); update_violation: () the constraint violation at the last update (what the next
    round's penalty rule compares with); qdd: (T, n) the joint accelerations at the knots,
    qdd(x_k, u_k), as the solver's rollout found them (differentiable as the forward dynamics
    there). To resume a solve where it stopped, as :func:`jaxarm.trajopt.solve_many` does:
    ``ddp(problem, r.u, r.x, multipliers=r.multipliers, mu=r.penalty,
    last_violation=r.update_violation, al_rounds=r.al_rounds, qdd_init=r.qdd)``.
    """

    x: jnp.ndarray
    u: jnp.ndarray
    cost: jnp.ndarray
    max_violation: jnp.ndarray
    max_gap: jnp.ndarray
    iterations: jnp.ndarray
    converged: jnp.ndarray
    status: jnp.ndarray
    multipliers: jnp.ndarray
    history: DDPLog
    penalty: jnp.ndarray
    al_rounds: jnp.ndarray
    update_violation: jnp.ndarray
    qdd: jnp.ndarray

    @property
    def q(self):
        return self.x[..., : self.u.shape[-1]]

    @property
    def qd(self):
        return self.x[..., self.u.shape[-1]:]

    def reason(self) -> str:
        """Why the solve stopped and, when it did not converge, what to try (one solve, concrete)."""
        status = int(np.asarray(self.status))
        text = f"{STATUS[status]} after {int(np.asarray(self.iterations))} iterations: cost {float(np.asarray(self.cost)):.6g}, " \
               f"max violation {float(np.asarray(self.max_violation)):.3g}, max gap {float(np.asarray(self.max_gap)):.3g}"
        return text if status == CONVERGED else f"{text}. Try: {ADVICE[status]}"


# --------------------------------------------------------------------------- box QP


def _factor(H):
    """The lower Cholesky factor of a knot's H (m, m), NaN where H is not positive definite, one
    column per trip of a loop (:func:`jaxarm.dynamics.linalg.cholesky_factor_columns`), for one
    problem and, vectorized over its problems, for a batch.

    Neither the platform's library nor the unrolled scalar factorization. LAPACK's potrf is a
    library call, which keeps XLA:CPU from compiling the backward pass's loop over the knots into
    one kernel (:func:`jaxarm.core.xla.loop_kernels`, what :func:`jaxarm.jit` and an eager
    ``ddp`` compile with), so each of its 40 operations per knot ran as a kernel of its own; the
    unrolled factorization (three per knot: the Newton step, projected Newton's steps and its
    final free set) makes the program a quarter larger. Reaches of
    ``experiments/trajopt_crocoddyl.py`` on the bundled arms (100 knots; the forms compiled in
    one process and timed in alternation, ``python experiments/ddp_box_qp_factor.py``), medians:
    one Panda reach 104 ms against 176 ms with potrf, the Puma's 73 against 125 ms, batches of 8
    within 5 % of the unrolled form, compile times within the machine's spread; under a plain
    ``jax.jit`` (no loop kernels) the three within the spread of its timings."""
    return linalg.cholesky_factor_columns(H)


def _box_qp(H, g, lo, hi, R, iterations: int = 10, joint: bool = False):
    """min_x g^T x + x^T H x / 2 subject to lo <= x <= hi by projected Newton (Bertsekas 1982; the
    solver of Tassa, Mansard & Todorov 2014): Newton steps on the free set, a projected Armijo
    line search over alpha = 1, 1/2, ..., 1/512. Returns x, the free set, the feedback gains
    -H_ff^-1 R_f on the free rows (zero on clamped ones; R = Q_ux, the gains K of box-DDP) and
    whether H restricted to the free set was positive definite.

    joint: the gains' right-hand sides are solved together with the unconstrained minimizer's (one
    substitution on [g | R]; when that minimizer is inside the box, the usual case, the free set is
    every row and nothing is solved again), else after the free set is known (one substitution
    more). :func:`_knot_qp` picks the first for one problem and the second for a batch."""
    m = g.shape[0]
    eye = jnp.eye(m, dtype=H.dtype)
    f = lambda x: g @ x + 0.5 * x @ H @ x  # noqa: E731
    alphas = 0.5 ** jnp.arange(10, dtype=H.dtype)

    def free_set(x):
        grad = g + H @ x
        clamped = ((x <= lo) & (grad > 0)) | ((x >= hi) & (grad < 0))
        return ~clamped, grad

    def factor(free):
        Hf = jnp.where(free[:, None] & free[None, :], H, eye)
        return _factor(Hf)

    def gains(free, L):
        K = -linalg.cholesky_solve_factored(L, jnp.where(free[:, None], R, 0.0))
        return jnp.where(free[:, None], K, 0.0), jnp.all(jnp.isfinite(L))

    tiny = 10.0 * jnp.finfo(H.dtype).eps

    def body(c):
        i, x, _ = c
        free, grad = free_set(x)
        L = factor(free)
        step = -linalg.cholesky_solve_factored(L, jnp.where(free, grad, 0.0))
        trial = jnp.clip(x[None] + alphas[:, None] * step[None], lo, hi)
        fx = f(x)
        ok = jax.vmap(f)(trial) <= fx + 1e-4 * (trial - x[None]) @ grad
        j = jnp.argmax(ok)
        x_new = jnp.where(jnp.any(ok) & jnp.all(jnp.isfinite(step)), trial[j], x)
        # a Newton step that no longer moves x: the free set is right and x its exact minimizer
        # (an interior solution stops after two iterations instead of running all of them)
        done = jnp.all(jnp.abs(x_new - x) <= tiny * (1.0 + jnp.abs(x)))
        return i + 1, x_new, done

    # the unconstrained minimizer first: inside the box (the usual case, no bound active) it is the
    # answer, and the free set and factor are the whole H's; otherwise projected Newton starts from
    # its projection onto the box. Under jax.vmap the lax.cond becomes a select that evaluates both
    # branches for every knot of every problem of the batch: projected Newton's loop therefore starts
    # as done where the minimizer is inside, and runs only as long as a problem of the batch needs it
    # (UR5 reaches, 16 in one vmap: 10 % of each iteration's time)
    L = _factor(H)
    if joint:
        Y = linalg.cholesky_solve_factored(L, jnp.concatenate([g[:, None], R], axis=1))
        x = -Y[:, 0]
    else:
        x = -linalg.cholesky_solve_factored(L, g)
    inside = jnp.all((x >= lo) & (x <= hi)) & jnp.all(jnp.isfinite(x))

    def projected_newton():
        start = jnp.where(inside, x, jnp.clip(jnp.where(jnp.isfinite(x), x, 0.0), lo, hi))
        init = tracers.batched_with((jnp.asarray(0), start, inside), (H, g))
        _, x_box, _ = jax.lax.while_loop(lambda c: (c[0] < iterations) & ~c[2], body, init)
        free = free_set(x_box)[0] | inside
        return x_box, free, factor(free)

    if joint:
        def boxed():
            x_box, free, Lf = projected_newton()
            return (x_box, free) + gains(free, Lf)

        return jax.lax.cond(inside, lambda: (x, jnp.ones(m, bool), -Y[:, 1:], jnp.all(jnp.isfinite(L))), boxed)
    x, free, L = jax.lax.cond(inside, lambda: (x, jnp.ones(m, bool), L), projected_newton)
    return (x, free) + gains(free, L)


@jax.custom_batching.custom_vmap
def _knot_qp(H, g, lo, hi, R):
    """A knot's box QP and feedback gains (:func:`_box_qp`). One problem: the gains solved with the
    unconstrained minimizer (a substitution fewer, and fewer small kernels: the Panda's backward
    pass over 100 knots 1.0-1.25 against 1.2-1.5 ms, its reach 8-9 % shorter at the median,
    ``experiments/ddp_knot_gains.py``, compiled without loop kernels; compiled as :func:`jaxarm.jit`
    compiles, with the column-loop factorization, the two forms are within 3 %). A batch
    (``jax.vmap``) evaluates both branches of the conditional for every problem, so there the
    gains are solved once, after it (in the joint form a batch of 8 UR5 reaches took 9-12 %
    longer)."""
    return _box_qp(H, g, lo, hi, R, joint=True)


@_knot_qp.def_vmap
def _knot_qp_batched(axis_size, in_batched, H, g, lo, hi, R):
    out = jax.vmap(functools.partial(_box_qp, joint=False), in_axes=tuple(0 if b else None for b in in_batched))(H, g, lo, hi, R)
    return out, jax.tree_util.tree_map(lambda _: True, out)


# --------------------------------------------------------------------------- solver


def _unless(skip, compute, otherwise, *operands):
    """``otherwise`` where ``skip``, else ``compute(*operands)`` (``compute`` may close over traced
    values). Unbatched, a ``lax.cond``. Under ``jax.vmap`` a cond with a batched predicate becomes a
    select that evaluates ``compute`` for every problem of the batch, always; here the batched
    rule (``jax.custom_batching.custom_vmap``) skips when every problem of the batch skips, and
    otherwise computes for the whole batch and keeps ``otherwise`` where a problem skips. DDP's last
    trip, whose linearization nothing reads, is skipped so by a batch whose problems all stop
    together (a ``solve_many`` round, or the trip after which the last problem of a ``vmap``
    stops). With a plain cond, 64 UR5 goals by ``solve_many`` took 1.84 s, against 1.60 s in the
    run before it with the loop not yet turned around (a linearization for nothing every round of
    10 iterations). A loop of at most one trip skips as this does under vmap, but made every
    single-solve iteration 0.3 ms slower (1.2 against 0.83 ms for the UR5). The linearization
    inside a conditional still costs batches a few per cent (8 UR5 problems, 12 iterations:
    54.6-56.2 ms against 52.1-53.8 ms before the loop was turned around)."""
    # compute's closed-over values (traced ones of any dtype) become operands of its jaxpr
    evaluate, consts, flat, out_tree, _ = _jaxpr_function(compute, *operands)

    def converted(*args):
        return jax.tree_util.tree_unflatten(out_tree, evaluate(*args))

    @jax.custom_batching.custom_vmap
    def pick(skip, otherwise, args):
        return jax.lax.cond(skip, lambda: otherwise, lambda: converted(*args))

    batched_computes = {}  # in_axes -> compute batched, under a jax.jit of its own (see run)

    @pick.def_vmap
    def pick_batched(axis_size, in_batched, skip, otherwise, args):
        skip_batched, otherwise_batched, args_batched = in_batched

        def batched(a, b):
            return a if b else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a))

        skip = batched(skip, skip_batched)
        otherwise = jax.tree_util.tree_map(batched, otherwise, otherwise_batched)

        def run():
            # jax.vmap batches a loop's body again while the batched parts of its carry settle,
            # and each time meets this rule (each loop's carry now starts batched, so once per
            # loop: tracers.batched_with; before that, a solve_many round of 4 Panda problems met
            # it 18 times in 5 batching patterns). Batched once per pattern and kept as a jitted
            # function, compute is traced once (jit's cache answers later calls) and inlined by
            # XLA as before: that round traced in 14-16 s against 19 s
            in_axes = tuple(0 if b else None for b in args_batched)
            if in_axes not in batched_computes:
                batched_computes[in_axes] = jax.jit(jax.vmap(converted, in_axes=in_axes))
            out = batched_computes[in_axes](*args)
            return jax.tree_util.tree_map(
                lambda o, d: jnp.where(skip.reshape((axis_size,) + (1,) * (d.ndim - 1)), d, o), out, otherwise)

        out = jax.lax.cond(jnp.all(skip), lambda: otherwise, run)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return pick(skip, otherwise, tuple(consts) + tuple(flat))


class _Backward(NamedTuple):
    k: jnp.ndarray  # (T, n) feedforward du
    K: jnp.ndarray  # (T, n, 2n) feedback gains (zero rows for clamped inputs)
    ok: jnp.ndarray  # () every regularized Q_uu was positive definite


def ddp(
    problem: OCP,
    u_init=None,
    x_init=None,
    *,
    max_iterations: int = 200,
    tol: float = 1e-6,
    tol_violation: float = 1e-5,
    tol_gap: float | None = None,
    regularization: float = 0.0,
    reg_min: float = 1e-9,
    reg_max: float = 1e9,
    reg_factor: float = 10.0,
    line_search_steps: int = 10,
    armijo: float = 1e-4,
    al_iterations: int = 20,
    mu: float = 10.0,
    mu_growth: float = 10.0,
    mu_max: float = 1e8,
    multipliers=None,
    second_order: bool = False,
    last_violation=None,
    al_rounds=0,
    update_at_limit: bool = False,
    qdd_init=None,
) -> OCPResult:
    """Solve an :class:`jaxarm.trajopt.OCP` by box-constrained feasibility-driven DDP (see the
    module docstring) with an augmented Lagrangian for its constraints.

    u_init: (T, n) initial inputs (default: the inputs that hold the start pose against gravity,
    clipped to the bounds; zero for voltage input); x_init: (T+1, 2n) initial states (default: the
    start state at every knot, as Crocoddyl's solvers start). An x_init that is not the rollout of
    u_init (the default, or states interpolated towards the goal) starts the solve infeasible: the
    gaps close along the iterations (all of them in the first full step). Pass the rollout of
    u_init (``jaxarm.rollout``) for a feasible start. On the Puma reach of
    ``experiments/trajopt_ddp.py`` the default start needs 39 iterations against 44 from the
    rollout, and it leaves the rollout's compiled copy of the dynamics out of the program; on the
    same reach as ``trajopt.reach_ocp`` with the inputs of ``trajopt.reach_warm_start``
    (``experiments/trajopt_puma.py``) the default start took 96 iterations to a local optimum
    0.26 % higher, the warm start's rollout 43.
    multipliers: (T+1, m) the constraints' multipliers to start from (a warm start,
    e.g. ``previous.multipliers``). qdd_init: (T, n) the joint accelerations at the knots of
    (x_init, u_init), qdd(x_k, u_k) (a previous result's ``qdd`` with its x and u), so that the
    solve does not evaluate them again (one rollout fewer); any non-finite entry: evaluated (as
    without). A Runge-Kutta method by name evaluates them again in any case (its linearization
    reads the accelerations of every stage, which a result does not keep).
    regularization: the Levenberg-Marquardt regularization of Q_uu to start (each
    augmented-Lagrangian round) from: a number, or a scalar array (traced, e.g. the last entry of a
    previous result's ``history.regularization``, to resume a solve where it stopped).
    mu: the augmented-Lagrangian penalty to start from: a number, or a scalar array (traced, e.g. a
    previous result's ``penalty``). After each round of DDP iterations that converged, the
    multipliers are updated and the penalty multiplied by ``mu_growth`` (at most ``mu_max``) unless
    the violation fell fourfold since the last update (Conn, Gould & Toint 1991); a round stopped by
    ``max_iterations`` leaves both as they were, so that a resumed solve goes on inside that round.
    ``last_violation`` (a number or scalar array, e.g. a previous result's ``update_violation``) is
    the violation the first update compares with, none (no rise at the first update) by default;
    ``al_rounds`` (a whole number or integer scalar array, e.g. a previous result's ``al_rounds``)
    the updates already made: ``al_iterations`` bounds the total. ``update_at_limit``: also update
    the multipliers (and penalty) when ``max_iterations`` stops a round, as a receding-horizon
    controller running a few iterations per control step needs (:func:`jaxarm.trajopt.mpc_step`
    sets it: one update per step, the real-time iteration scheme's multiplier estimate).
    second_order: DDP proper (Mayne 1966; Tassa, Mansard & Todorov 2014, eq. 5): the backward pass
    adds the dynamics' second-order terms V'_x . F_zz to Q_xx, Q_ux and Q_uu (and to the model the
    line search compares with), where iLQR (the default) keeps the Gauss-Newton model. The terms
    come from central differences of the analytic step Jacobians at every knot
    (``_step_second_derivatives``): each iteration evaluates the step Jacobians at 6n + 1 points per
    knot instead of one, so an iteration costs several times more; near the optimum DDP converges
    quadratically where iLQR converges linearly on problems whose dynamics' curvature matters.

    Stops when the trajectory is feasible (gaps below ``tol_gap``; None: 1e-9 in float64, 100
    machine epsilons, 1.2e-5, in float32, where a full step's rounding alone leaves gaps of about
    1e-6 and 1e-9 would never be met), the constraints hold to
    ``tol_violation`` and the model's predicted decrease of a full step is below ``tol`` relative
    to the cost (or an accepted step changed it by less); ``status`` and :meth:`OCPResult.reason`
    say why otherwise. Pure and traceable: ``jax.jit`` it, ``jax.vmap`` it over problems (e.g.
    ``jax.vmap(lambda g: ddp(problem.replace(params={"goal": g})))``; a vmap iterates until its
    slowest member stops, so for many goals on a CPU :func:`jaxarm.trajopt.solve_many` is faster:
    64 UR5 reaches 14.8 s in one vmap against 1.34 s, ``experiments/trajopt_crocoddyl.py --arms ur5
    --batches 64``). Jit a function that closes
    over the problem and takes what changes as arguments, as that example does: the problem's
    leaves that are not traced (the arm, above all) stay constants of the compiled solver, whose
    numbers the dynamics fold (UR5 reach: first call 4.9 s and warm solve 16.5 ms, against 10.8 s
    and 25.8 ms for ``jaxarm.jit(ddp)(problem)``, where every array of the problem is traced).
    Called eagerly (outside any jit, vmap or derivative), ``ddp(problem)`` does this itself: it
    compiles the solve once with everything but the problem's ``params`` and the arrays given
    (warm starts, multipliers) as constants, keeps it, and answers the next eager call of the
    same problem, settings and shapes without compiling (a loop over goals; Puma reach, T = 50:
    first call 5.0 s, then 0.03 s a call, where each call took 6.3 s run op by op). So does a
    ``jax.grad`` or ``jax.vmap`` of it applied outside any jit that reaches only the params and
    the arrays given: the kept solve is transformed, and JAX keeps the transformed program (the
    Panda obstacle example's gradient of the optimal effort with respect to the centre, eagerly:
    a second call 1.3 s, where each call took 28 s). Its first call compiles under XLA's default
    options (jax takes compiler options on top-level jits only): ``jaxarm.jit(jax.grad(f))``
    compiles faster.

    Differentiable in reverse mode (``jax.grad``, ``jax.vjp``) with respect to the problem: the
    cotangents of ``x``, ``u`` and ``cost`` (and of anything computed from them) reach every array
    of the problem -- params, x0, dt, lower/upper, the terms' data, the arm -- by the implicit
    function theorem at the solution (:mod:`jaxarm.control.trajopt.solvers.implicit`), never
    through the iterations. Valid at a converged strict local minimum (check ``converged``; an
    unconverged result gives the sensitivity of a point that is not an optimum). The multipliers,
    counters and history are not differentiated; forward mode (``jax.jvp``) is not offered.
    """
    given = dict(locals())  # the call as made (an eager call is answered by a cached compiled solve)
    func = "ddp"
    if not isinstance(problem, OCP):
        raise TypeError(f"{func}: problem: expected a jaxarm.trajopt.OCP (see jaxarm.trajopt.ocp), got {type(problem).__name__}")
    for name, v in (("max_iterations", max_iterations), ("al_iterations", al_iterations), ("line_search_steps", line_search_steps)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{func}: {name}: expected a whole number >= 1, got {v!r}")
    if tol_gap is None:
        tol_gap = default_tol_gap(jnp.result_type(problem.x0))
    for name, v in (("tol", tol), ("tol_violation", tol_violation), ("tol_gap", tol_gap), ("reg_min", reg_min), ("reg_max", reg_max), ("mu_max", mu_max)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{func}: {name}: expected a finite number >= 0, got {v!r}")
    for name, v in (("second_order", second_order), ("update_at_limit", update_at_limit)):
        if not isinstance(v, (bool, np.bool_)):
            raise ValueError(f"{func}: {name}: expected True or False, got {v!r}")
    if not reg_factor > 1 or not mu_growth >= 1:
        raise ValueError(f"{func}: reg_factor > 1 and mu_growth >= 1 expected, got {reg_factor!r}, {mu_growth!r}")
    n, T = problem.n, problem.T
    dtype = jnp.result_type(problem.x0)
    sizes, eq_np = _constraint_layout(problem)
    m = int(sum(sizes))
    lower = jnp.asarray(problem.lower, dtype)
    upper = jnp.asarray(problem.upper, dtype)


    if u_init is None:
        u_init = _hold(problem, solver_arm(problem), dtype)
    u_init = jnp.asarray(u_init, dtype)
    if u_init.shape != (T, n):
        raise ValueError(f"{func}: u_init: expected shape ({T}, {n}) (T steps of the problem, one input per joint), got {u_init.shape}")
    _finite(u_init, "u_init", func, show_values=False)
    us0 = jnp.clip(u_init, lower, upper)
    if x_init is None:
        xs0 = jnp.broadcast_to(problem.x0, (T + 1, 2 * n))
    else:
        xs0 = jnp.asarray(x_init, dtype)
        if xs0.shape != (T + 1, 2 * n):
            raise ValueError(f"{func}: x_init: expected shape ({T + 1}, {2 * n}) (states q, qd at the T+1 knots), got {xs0.shape}")
        _finite(xs0, "x_init", func, show_values=False)
    acc0 = jnp.full((T, n), jnp.nan, dtype) if qdd_init is None else jnp.asarray(qdd_init, dtype)
    if acc0.shape != (T, n):
        raise ValueError(f"{func}: qdd_init: expected shape ({T}, {n}) (the accelerations at the T knots of x_init), got {acc0.shape}")
    stages = _stage_count(problem)
    if stages:  # a Runge-Kutta step's linearization reads every stage's acceleration: evaluated again
        acc0 = jnp.full((T, stages, n), jnp.nan, dtype)
    lam0 = jnp.zeros((T + 1, m), dtype) if multipliers is None else jnp.asarray(multipliers, dtype)
    if lam0.shape != (T + 1, m):
        raise ValueError(f"{func}: multipliers: expected shape ({T + 1}, {m}), got {lam0.shape}")
    reg0 = _start_scalar(regularization, "regularization", dtype, func)
    mu0 = _start_scalar(mu, "mu", dtype, func)
    viol0 = _start_scalar(jnp.inf if last_violation is None else last_violation, "last_violation", dtype, func)
    rounds0 = _start_scalar(al_rounds, "al_rounds", jnp.int32, func)
    if tracers.kept_program_answers(*_constants_and_arguments(given)):
        solved = _compiled(dict(given))
        if solved is not None:
            return solved
    options = _Options(max_iterations, tol, tol_violation, tol_gap, reg_min, reg_max, reg_factor,
                       line_search_steps, armijo, al_iterations, mu_growth, mu_max, bool(second_order), bool(update_at_limit))
    # only the problem's traced leaves (a jit's or vmap's arguments, differentiated values) go in
    # as arguments; the known ones (an arm closed over by the user's jit, say) stay constants of
    # the program, so that the dynamics fold the arm's structural zeros and its body model is
    # computed once, in NumPy, instead of in every iteration
    split = checks.TracedLeaves(problem)
    xs, us, lam, it, done, stop, log, gap, mu_final, rounds, viol_update, final_cost, acc = _solve(
        split.traced, us0, xs0, (lam0, reg0, mu0, viol0, rounds0, acc0), options, split)

    arm = solver_arm(problem)
    eq = jnp.asarray(eq_np)
    ks = jnp.arange(T + 1)
    xu = jnp.concatenate([xs, jnp.concatenate([us, jnp.zeros((1, n), dtype)])], axis=1)
    cost = _reported_cost(problem, xs, us, final_cost)
    cv, active = jax.vmap(lambda xu, k: _constraints(problem, arm, xu, k))(xu, ks)
    viol = jnp.max(_violation(cv, active, eq), initial=0.0)
    finite = jnp.isfinite(cost) & jnp.all(jnp.isfinite(xs))
    converged = done & (viol <= tol_violation) & (gap <= tol_gap) & finite
    status = jnp.where(converged, CONVERGED,
                       jnp.where(~finite, NOT_FINITE,
                                 jnp.where(stop, NO_PROGRESS,
                                           # infeasible: the augmented-Lagrangian rounds ran out, the last
                                           # one converged (a converged round that is not the last, stopped
                                           # by the iteration limit with the constraints still violated,
                                           # stopped at that limit)
                                           jnp.where(done & (viol > tol_violation) & ((it < max_iterations) | (rounds >= al_iterations)),
                                                     INFEASIBLE, ITERATION_LIMIT))))
    result = OCPResult(x=xs, u=us, cost=cost, max_violation=viol, max_gap=gap, iterations=it, converged=converged,
                       status=status, multipliers=lam, history=log, penalty=mu_final, al_rounds=rounds,
                       update_violation=viol_update,
                       qdd=_reported_accelerations(problem, xs, us, acc[:, 0] if stages else acc))
    # no weakly typed leaves (the counters start from Python ints): a result fed back as a warm
    # start (mpc_step) must not compile the solver a second time
    return jax.tree_util.tree_map(tracers.strong, result)


def _constants_and_arguments(given):
    """What a kept solve of ``ddp(**given)`` (:func:`_compiled`) compiles in as constants (the
    problem without its ``params``) and takes as arguments (the params and the arrays given): a
    ``jax.grad`` or ``jax.vmap`` of a solve applied outside any jit that reaches only the latter
    transforms the kept solve, and JAX keeps the transformed program for the next call. Run op by
    op, every eager gradient of a solve traced and compiled the solver and its adjoint again."""
    problem = given["problem"]
    _, arrays = split_settings({k: v for k, v in given.items() if k != "problem"})
    return dataclasses.replace(problem, params=None), (problem.params, arrays)


def _compiled(given):
    """``ddp(**given)``, called eagerly (outside any jit, vmap or derivative), answered by a compiled
    solve kept for the next call (:func:`jaxarm.core.xla.eager_compiled`). Its constants: the
    problem but its ``params`` (the arm, start state, dt, bounds, terms), known by value, and the
    solver's settings; its arguments: the problem's ``params`` (goals, obstacle centres, weights)
    and the arrays given (warm starts, multipliers). A loop of eager calls over goals then
    compiles once, as a user's jit that closes over the problem does; run op by op instead, every
    call traced and compiled its loops again (Puma reach, T = 50: 6.3 s a call after the first
    8.6 s, against 0.03 s after a first call of 5.0 s)."""
    problem_key, params, rebuild = _kept_key(given.pop("problem"))
    settings, arrays = split_settings(given)
    key = ("ddp", problem_key, settings, tuple(sorted(arrays)))
    solve = eager_compiled(key, lambda: jit(lambda params, arrays: ddp(rebuild(params), **dict(settings), **arrays)))
    return None if solve is None else solve(params, arrays)


def default_tol_gap(dtype) -> float:
    """The dynamics-gap tolerance :func:`ddp` uses by default in ``dtype``: 1e-9, or 100 machine
    epsilons where that is larger (float32: 1.2e-5)."""
    return max(1e-9, 100.0 * float(jnp.finfo(dtype).eps))


# what a known starting scalar must satisfy, and how the error says it
_START = {
    "regularization": (lambda v: np.isfinite(v) and v >= 0, "a finite number >= 0 (the starting regularization)"),
    "mu": (lambda v: np.isfinite(v) and v > 0, "a finite number > 0 (the penalty to start from)"),
    "last_violation": (lambda v: v >= 0, "a number >= 0 (a previous result's update_violation) or None"),
    "al_rounds": (lambda v: float(v).is_integer() and v >= 0, "a whole number >= 0 (a previous result's al_rounds)"),
}


def _start_scalar(value, name, dtype, func):
    """A scalar a solve starts from (``name``, one of :data:`_START`): a number, or a scalar array
    that may be traced (to resume a solve); a known one must satisfy its condition."""
    ok, expected = _START[name]
    a = jnp.asarray(value, dtype)
    if a.shape != () or (not isinstance(value, jax.core.Tracer) and not bool(ok(np.asarray(value)))):
        raise ValueError(f"{func}: {name}: expected {expected}, got {value!r}")
    return a


class _Options(NamedTuple):
    """The solver's settings (static: part of the compiled program)."""

    max_iterations: int
    tol: float
    tol_violation: float
    tol_gap: float
    reg_min: float
    reg_max: float
    reg_factor: float
    line_search_steps: int
    armijo: float
    al_iterations: int
    mu_growth: float
    mu_max: float
    second_order: bool = False
    update_at_limit: bool = False


def _solve_impl(problem: OCP, us0, xs0, start, options: _Options):
    """The DDP iterations inside the augmented-Lagrangian rounds: (x, u, multipliers, iterations,
    done, stop, log, final gap, final penalty, multiplier updates, violation at the last update)."""
    # the multipliers, regularization, penalty, violation at the last update and updates made to start from
    lam0, regularization, mu0, viol0, rounds0, acc0 = start
    (max_iterations, tol, tol_violation, tol_gap, reg_min, reg_max, reg_factor, line_search_steps,
     armijo, al_iterations, mu_growth, mu_max, second_order, update_at_limit) = options
    n, T = problem.n, problem.T
    dtype = jnp.result_type(problem.x0)
    arm = solver_arm(problem)
    _, eq_np = _constraint_layout(problem)
    eq = jnp.asarray(eq_np)
    has_scalars = any(t.kind == "scalar" for t in problem.costs)
    lower = jnp.asarray(problem.lower, dtype)
    upper = jnp.asarray(problem.upper, dtype)
    # the accelerations the linearization reads from the line search's rollout: the knots' (Euler
    # methods), every stage's (Runge-Kutta methods by name), none (a step function: jax.jacfwd)
    stages = _stage_count(problem)
    given = stages > 0 or (isinstance(problem.method, str) and problem.method in _EULER)
    step = lambda q, qd, u: _step_accel(arm, q, qd, u, problem.dt, problem.method, problem.input, stages=stages > 0)  # noqa: E731
    ks = jnp.arange(T + 1)
    # an input-rate term couples consecutive inputs: the solver's state is then (x, u_{k-1}) (3n),
    # with u_{k-1} moved on by the dynamics (u_prev+ = u) and the rate a least-squares cost of the knot
    rate = _rate_term(problem) is not None

    def pad(us):
        return jnp.concatenate([us, jnp.zeros((1, n), dtype)])

    def objective(xs, us, lam, mu):
        """The augmented Lagrangian the line search compares, and the cost alone (what ddp reports)."""
        xu = jnp.concatenate([xs, pad(us)], axis=1)
        values, costs = _at_knots(problem, lambda skip, xu, k, lam_k: _knot_value(problem, arm, eq, xu, k, lam_k, mu, skip,
                                                                                  with_cost=True), xu, ks, lam)
        rate_cost = _rate_cost(problem, us)
        # (in the problem's precision: a term's weights given in float64 under x64 would otherwise
        # lift a float32 problem's objective, quadratics and constraints to float64)
        return (jnp.sum(values) + rate_cost).astype(dtype), (jnp.sum(costs) + rate_cost).astype(dtype)

    def constraint_values(xs, us):
        xu = jnp.concatenate([xs, pad(us)], axis=1)
        cv, active = jax.vmap(lambda xu, k: _constraints(problem, arm, xu, k))(xu, ks)
        return cv.astype(dtype), active

    def dynamics(xs, us, acc):
        y, A, B = _step_jacobians(arm, xs[:-1], us, problem.dt, problem.method, problem.input, qdd=acc if given else None)
        gaps = jnp.concatenate([(problem.x0 - xs[0])[None], y - xs[1:]])  # f_0 .. f_T
        if rate:  # (x, u_prev)+ = (F(x, u), u): no gap in u_prev, which is always the previous input
            A = jnp.zeros((T, 3 * n, 3 * n), dtype).at[:, : 2 * n, : 2 * n].set(A)
            B = jnp.concatenate([B, jnp.broadcast_to(jnp.eye(n, dtype=dtype), (T, n, n))], axis=1)
            gaps = jnp.concatenate([gaps, jnp.zeros((T + 1, n), dtype)], axis=1)
        return gaps, A, B

    def with_rate(g, H, us):
        """The knots' gradients and Hessians in (x, u_prev, u) with the input rate's c |u - u_prev|^2."""
        c, prev = _rate_parts(problem, us)
        c2, r = 2.0 * pad(c), pad(us - prev)
        C = c2[:, :, None] * jnp.eye(n, dtype=dtype)
        nx = 2 * n
        g = jnp.concatenate([g[:, :nx], -c2 * r, g[:, nx:] + c2 * r], axis=1)
        zero = jnp.zeros((T + 1, nx, n), dtype)
        H = jnp.concatenate([
            jnp.concatenate([H[:, :nx, :nx], zero, H[:, :nx, nx:]], axis=2),
            jnp.concatenate([jnp.swapaxes(zero, 1, 2), C, -C], axis=2),
            jnp.concatenate([H[:, nx:, :nx], -C, H[:, nx:, nx:] + C], axis=2)], axis=1)
        return g, H

    # where (x, u) sits in the solver's knot vector (x[, u_prev], u): the dynamics' second derivatives
    xu_index = np.r_[np.arange(2 * n), np.arange(3 * n, 4 * n)] if rate else np.arange(3 * n)

    def backward(xs, us, A, B, gaps, g, H, reg, D, exact):
        nx = A.shape[-1]
        VxT, VxxT = g[T, :nx], H[T, :nx, :nx]

        # Each stage in few, larger products (a knot's small products each cost a call of their own
        # on a CPU, which made this loop half of an iteration): with F = [A B] and the gap f,
        # [Q_z | Q_zz] = [g | H] + F^T [V'_x | V'_xx F], V'_x = V_x + V_xx f, z = (x, u), and
        # [V_x | V_xx] = [Q_x | Q_xx] + [K; Q_ux]^T [Q_uu [du | K] + [Q_u | Q_ux]; [du | K]]
        # (the box-DDP value update, Tassa, Mansard & Todorov 2014, eq. 5 with their free-set
        # gains, written as one product)
        def stage(carry, d):
            Vx, Vxx, ok = carry
            x, u, F, f_next, g, H, D = d
            P = Vxx @ jnp.concatenate([f_next[:, None], F], axis=1)
            Vx_next = Vx + P[:, 0]  # the gap-corrected value gradient (FDDP)
            if exact:  # + V'_x . F_zz (D: d[A B]/dz_j, row j; u_prev+ = u is linear)
                F2 = jnp.einsum("jim,i->jm", D, Vx_next[: 2 * n])
                H = H.at[xu_index[:, None], xu_index].add(0.5 * (F2 + F2.T))
            Q = F.T @ jnp.concatenate([Vx_next[:, None], P[:, 1:]], axis=1)
            q, Q = g + Q[:, 0], H + Q[:, 1:]
            Qx, Qu, Qxx, Qux, Quu = q[:nx], q[nx:], Q[:nx, :nx], Q[nx:, :nx], Q[nx:, nx:]
            Quu = 0.5 * (Quu + Quu.T)
            Quu_reg = Quu + reg * jnp.eye(n, dtype=dtype)
            du, _, K, factored = _knot_qp(Quu_reg, Qu, lower - u, upper - u, Qux)
            ok = ok & factored & jnp.all(jnp.isfinite(du))
            W = jnp.concatenate([du[:, None], K], axis=1)
            V = jnp.concatenate([Qx[:, None], Qxx], axis=1) + jnp.concatenate([K, Qux]).T @ jnp.concatenate(
                [Quu @ W + jnp.concatenate([Qu[:, None], Qux], axis=1), W])
            Vxx = V[:, 1:]
            return (V[:, 0], 0.5 * (Vxx + Vxx.T), ok), (du, K, H)

        F = jnp.concatenate([A, B], axis=2)
        init = tracers.batched_with((VxT, VxxT, jnp.asarray(True)), (g, H, A, B, gaps))
        (Vx0, Vxx0, ok), (k, K, Hs) = jax.lax.scan(stage, init, (xs[:-1], us, F, gaps[1:], g[:T], H[:T], D), reverse=True)
        ok = ok & jnp.all(jnp.isfinite(k)) & jnp.all(jnp.isfinite(K))
        return _Backward(k, K, ok), jnp.concatenate([Hs, H[T:]])  # the knots' Hessians the step was built with

    def expected(bw, A, B, gaps, g, H):
        """g1, g2 of the model's change alpha g1 + alpha^2 g2 along the step (one linear rollout)."""
        def lin(dx, d):
            F, f_next, k, K = d
            du = k + K @ dx
            return F @ jnp.concatenate([dx, du]) + f_next, (dx, du)

        init = tracers.batched_with(gaps[0], (A, B, gaps, bw))
        dxT, (dx, du) = jax.lax.scan(lin, init, (jnp.concatenate([A, B], axis=2), gaps[1:], bw.k, bw.K))
        dxu = jnp.concatenate([jnp.concatenate([dx, du], axis=1), jnp.concatenate([dxT, jnp.zeros(n, dtype)])[None]])
        g1 = jnp.sum(g * dxu)
        g2 = 0.5 * jnp.sum(jnp.einsum("ki,kij,kj->k", dxu, H, dxu))
        return g1, g2

    def forward(xs, us, gaps, bw, alpha, fresh):
        """The line search's rollout along the step (bw, alpha): the states (T+1, 2n), inputs
        (T, n) and the accelerations the next linearization reads: at the new knots (T, n), or
        at every stage of a Runge-Kutta step (T, s, n). ``fresh``: the step from every knot as it
        is, the trajectory unchanged (a round's first trip, see ``inner``)."""
        prev = _rate_parts(problem, us)[1] if rate else us  # (unused without a rate term)

        # q and qd carried apart (see _step_pair: batched, a concatenated state made this loop 14x slower)
        def one(carry, d):
            q, qd, up = carry
            x_ref, up_ref, u_ref, k, K, f_next = d
            q, qd, up = (jnp.where(fresh, a, b) for a, b in ((x_ref[:n], q), (x_ref[n:], qd), (up_ref, up)))
            x = jnp.concatenate([q, qd])
            dx = jnp.concatenate([x - x_ref, up - up_ref]) if rate else x - x_ref
            u = jnp.clip(u_ref + alpha * k + K @ dx, lower, upper)
            q_next, qd_next, a = step(q, qd, u)
            q_next = q_next - (1.0 - alpha) * f_next[:n]
            qd_next = qd_next - (1.0 - alpha) * f_next[n: 2 * n]
            return (q_next, qd_next, u), (q_next, qd_next, u, a)

        x0 = xs[0] + alpha * gaps[0, : 2 * n]
        init = tracers.batched_with((x0[:n], x0[n:], prev[0]), (xs, us, gaps, bw, alpha, fresh))
        _, (qn, qdn, un, an) = jax.lax.scan(one, init, (xs[:-1], prev, us, bw.k, bw.K, gaps[1:]))
        x_new = jnp.concatenate([x0[None], jnp.concatenate([qn, qdn], axis=1)])
        return jnp.where(fresh, xs, x_new), un, an

    def linearize(xs, us, acc, J, lam, mu, reg):
        """The step's model at (xs, us): gaps, the backward pass, the model's change g1, g2 along its
        step, the largest gap, and whether the model expects no further decrease (converged)."""
        gaps, A, B = dynamics(xs, us, acc)
        xu = jnp.concatenate([xs, pad(us)], axis=1)
        g, H = _at_knots(problem, lambda skip, xu, k, lam_k: _knot_quadratic(problem, arm, eq, has_scalars, xu, k, lam_k, mu, skip),
                         xu, ks, lam)
        if rate:
            g, H = with_rate(g, H, us)
        g, H = g.astype(dtype), H.astype(dtype)
        if second_order:
            # DDP's step where its model is convex along the way back (every Q_uu positive
            # definite), else this iteration's Gauss-Newton (iLQR) step: far from the optimum
            # the costates make V'_x . F_zz indefinite
            D = _step_second_derivatives(arm, xs[:-1], us, problem.dt, problem.method, problem.input)
            exact, H_exact = backward(xs, us, A, B, gaps, g, H, reg, D, True)
            bw, H = jax.lax.cond(exact.ok, lambda: (exact, H_exact), lambda: backward(xs, us, A, B, gaps, g, H, reg, D, False))
        else:
            bw, H = backward(xs, us, A, B, gaps, g, H, reg, jnp.zeros((T, 0), dtype), False)
        g1, g2 = expected(bw, A, B, gaps, g, H)
        gap = jnp.max(jnp.abs(gaps))
        small = bw.ok & (gap <= tol_gap) & (-(g1 + g2) <= tol * jnp.maximum(jnp.abs(J), 1e-12))
        return gaps, bw, g1, g2, gap, small

    def inner(xs, us, acc, lam, mu, it, log, gap):
        """One augmented-Lagrangian round of DDP iterations.

        The loop is turned around: each trip first runs the line search along the step the last
        trip's backward pass found, then linearizes where it landed. The line search's rollout
        evaluates the forward dynamics at the new knots (and stage points), and the linearization
        reads those accelerations, so the program holds one compiled forward dynamics and one
        objective (in the line search) instead of two each. A round's first trip
        ("fresh") is no iteration: its rollout steps from every knot as it is (alpha = 0, the
        trajectory unchanged, accepted), which evaluates the round's objective and the knots'
        accelerations. The last trip of a solve does not linearize (:func:`_unless`)."""
        nx = 3 * n if rate else 2 * n
        zero = jnp.zeros((), dtype)

        def cond(c):
            return c[0] | ((c[8] < max_iterations) & ~c[9] & ~c[10])

        def body(c):
            fresh, xs, us, acc, J, C, reg, fails, it, done, stop, log, gap, gaps, bw, g1, g2 = c
            known = jnp.all(jnp.isfinite(acc))
            # (under jax.vmap every problem of the batch makes the trip; one that has stopped
            # already neither searches -- at its optimum every step would be rejected, and the
            # batch's line search would run its full length every trip -- nor linearizes)
            running = cond(c)

            def ls_cond(c):
                j, alpha, *_, accepted = c
                return (j < line_search_steps) & ~accepted & bw.ok & running

            def ls_body(c):
                j, alpha, *_ = c
                # (a round's first trip where the knots' accelerations are known: no rollout)
                x_new, u_new, a_new = _unless(fresh & known, lambda xs, us: forward(xs, us, gaps, bw, alpha, fresh), (xs, us, acc),
                                              xs, us)
                J_new, C_new = objective(x_new, u_new, lam, mu)
                dJ = J_new - J
                model = alpha * g1 + alpha**2 * g2
                # descent expected: Armijo on the model's decrease; an increase expected (closing
                # gaps may cost): accept up to twice the predicted increase (as Crocoddyl's FDDP)
                accepted = fresh | (jnp.isfinite(J_new) & jnp.where(model < 0, dJ <= armijo * model, dJ <= 2.0 * model))
                return j + 1, jnp.where(accepted, alpha, 0.5 * alpha), x_new, u_new, a_new, J_new, C_new, accepted

            alpha0 = jnp.where(fresh, zero, jnp.ones((), dtype))
            _, alpha, x_new, u_new, a_new, J_new, C_new, accepted = jax.lax.while_loop(
                ls_cond, ls_body, tracers.batched_with((jnp.asarray(0), alpha0, xs, us, acc, J, C, jnp.asarray(False)), c))
            counted = ~fresh  # a round's first trip evaluates; it is no iteration
            row = jnp.where(counted, it, max_iterations)  # (out of bounds: the log is left as it was)
            log = DDPLog(log.cost.at[row].set(jnp.where(accepted, J_new, J), mode="drop"),
                         log.gap.at[row].set(gap, mode="drop"),
                         log.alpha.at[row].set(jnp.where(accepted, alpha, 0.0), mode="drop"),
                         log.regularization.at[row].set(reg, mode="drop"),
                         log.expected.at[row].set(g1 + g2, mode="drop"))
            rel = jnp.abs(J - J_new) / jnp.maximum(jnp.abs(J), 1e-12)
            done = counted & accepted & (gap <= tol_gap) & (alpha == 1.0) & (rel < tol)
            xs, us, acc, J, C = (jnp.where(accepted, a, b) for a, b in ((x_new, xs), (u_new, us), (a_new, acc), (J_new, J), (C_new, C)))
            raised = jnp.maximum(reg * reg_factor ** (fails + 1), reg_min)
            lowered = jnp.where(reg / reg_factor >= reg_min, reg / reg_factor, 0.0)  # back to exact Newton steps
            reg = jnp.where(counted, jnp.where(accepted, lowered, raised), reg)
            fails = jnp.where(counted, jnp.where(accepted, 0, fails + 1), fails)
            it = it + counted.astype(it.dtype)
            stop = (reg > reg_max) | ~jnp.isfinite(J)
            # the forward pass leaves gaps (1 - alpha) f exactly (x_{k+1} = F(x_k, u_k) - (1 - alpha) f_{k+1}):
            # the final trajectory's gaps without another linearization
            gap = jnp.where(accepted & counted, (1.0 - alpha) * gap, gap)
            last = ~running | done | stop | (it >= max_iterations)
            gaps, bw, g1, g2, gap, small = _unless(last, lambda xs, us, acc: linearize(xs, us, acc, J, lam, mu, reg),
                                                   (gaps, bw, g1, g2, gap, jnp.asarray(False)), xs, us, acc)
            return (jnp.asarray(False), xs, us, acc, J, C, reg, fails, it, done | small, stop, log, gap, gaps, bw, g1, g2)

        bw = _Backward(jnp.zeros((T, n), dtype), jnp.zeros((T, n, nx), dtype), jnp.asarray(True))
        init = (jnp.asarray(True), xs, us, acc, zero, zero, regularization, jnp.asarray(0), it, jnp.asarray(False),
                jnp.asarray(False), log, gap, jnp.zeros((T + 1, nx), dtype), bw, zero, zero)
        c = jax.lax.while_loop(cond, body, tracers.batched_with(init, (lam, mu)))
        _, xs, us, acc, _, C, _, _, it, done, stop, log, gap, *_ = c
        return xs, us, acc, it, done, stop, log, gap, C

    # (a round stopped by the iteration limit or without progress ends the loop: another round
    # follows only one whose DDP iterations converged, after its multiplier update)
    def outer_cond(c):
        xs, us, acc, lam, mu, rounds, trips, it, done, stop, viol, viol_ref, log, gap, C = c
        return (trips == 0) | ((rounds < al_iterations) & (viol > tol_violation) & (it < max_iterations) & ~stop)

    def outer_body(c):
        xs, us, acc, lam, mu, rounds, trips, it, done, stop, _, viol_ref, log, gap, _ = c
        xs, us, acc, it, done, stop, log, gap, C = inner(xs, us, acc, lam, mu, it, log, gap)
        cv, active = constraint_values(xs, us)
        viol = jnp.max(_violation(cv, active, eq), initial=0.0)
        # the multiplier update (Nocedal & Wright 2006, eqs 17.39 and 17.65) after a converged round
        # only: a round cut short by max_iterations is resumed as it was (unless update_at_limit)
        update = (done | (it >= max_iterations)) if update_at_limit else done
        shifted = lam + mu * cv
        lam = jnp.where(update, jnp.where(active, jnp.where(eq, shifted, jnp.maximum(0.0, shifted)), 0.0), lam)
        # raise the penalty only when the violation did not drop fourfold (Conn, Gould & Toint 1991)
        mu = jnp.where(update & (viol > tol_violation) & (viol > 0.25 * viol_ref), jnp.minimum(mu * mu_growth, mu_max), mu)
        return (xs, us, acc, lam, mu, rounds + update.astype(rounds.dtype), trips + 1, it, done, stop, viol,
                jnp.where(update, viol, viol_ref), log, gap, C)

    nan = jnp.full((max_iterations,), jnp.nan, dtype)
    # (accelerations given with a non-finite entry are not known: the first trip's rollout evaluates them)
    init = (xs0, us0, acc0, lam0, mu0, rounds0, jnp.asarray(0), jnp.asarray(0), jnp.asarray(False),
            jnp.asarray(False), jnp.asarray(jnp.inf, dtype), viol0, DDPLog(nan, nan, nan, nan, nan), jnp.asarray(jnp.inf, dtype),
            jnp.asarray(jnp.nan, dtype))
    init = tracers.batched_with(init, (problem, us0, xs0, start))  # (one batching of each loop under vmap)
    xs, us, acc, lam, mu_final, rounds, _, it, done, stop, viol, viol_ref, log, gap, C = jax.lax.while_loop(outer_cond, outer_body, init)
    return xs, us, lam, it, done, stop, log, gap, mu_final, rounds, viol_ref, C, acc


@jax.tree_util.register_static
class _Perturbed:
    """Which traced leaves of the problem are differentiated (static: a tuple of bools)."""

    def __init__(self, flags):
        self.flags = tuple(flags)

    def __hash__(self):
        return hash(self.flags)

    def __eq__(self, other):
        return isinstance(other, _Perturbed) and self.flags == other.flags


def _solve_split(traced, us0, xs0, start, options, split):
    return _solve_impl(split.join(traced), us0, xs0, start, options)


def _solve_fwd(traced, us0, xs0, start, options, split):
    def primal(tree):
        return jax.tree_util.tree_map(lambda a: a.value, tree, is_leaf=lambda a: isinstance(a, jax.custom_derivatives.CustomVJPPrimal))

    flags = [a.perturbed for a in jax.tree_util.tree_leaves(traced, is_leaf=lambda a: isinstance(a, jax.custom_derivatives.CustomVJPPrimal))]
    traced, us0, xs0, start = primal(traced), primal(us0), primal(xs0), primal(start)
    out = _solve_impl(split.join(traced), us0, xs0, start, options)
    xs, us, lam = out[:3]
    return out, (traced, xs, us, lam, us0, xs0, start, _Perturbed(flags))


def _solve_bwd(options, split, residuals, cotangents):
    traced, xs, us, lam, us0, xs0, start, flags = residuals
    # the multipliers, counters and log are not differentiated; a solution does not depend on where
    # the solve started
    x_bar, u_bar = (jnp.zeros_like(a) if isinstance(c, jax.custom_derivatives.SymbolicZero) else c
                    for a, c in ((xs, cotangents[0]), (us, cotangents[1])))
    perturbed = [False] * len(split.leaves)  # over all of the problem's leaves
    for i, f in zip(split.index, flags.flags):
        perturbed[i] = f
    problem_bar = solution_vjp(split.join(traced), xs, us, lam, x_bar, u_bar, perturbed)
    leaves_bar = jax.tree_util.tree_leaves(problem_bar)
    # (the count of multiplier updates is an integer: its cotangent is float0)
    start_bar = jax.tree_util.tree_map(
        lambda a: jnp.zeros_like(a) if jnp.issubdtype(a.dtype, jnp.inexact) else np.zeros(a.shape, jax.dtypes.float0), start)
    return [leaves_bar[i] for i in split.index], jnp.zeros_like(us0), jnp.zeros_like(xs0), start_bar


_solve = jax.custom_vjp(_solve_split, nondiff_argnums=(4, 5))
_solve.defvjp(_solve_fwd, _solve_bwd, symbolic_zeros=True)


def _hold(problem: OCP, arm, dtype):
    """Inputs that hold the start pose: gravity torques at (q0, 0), clipped to the bounds."""
    from ....dynamics.newton_euler import _inverse_dynamics

    n, T = problem.n, problem.T
    if problem.input == "voltage":
        return jnp.zeros((T, n), dtype)
    q0 = problem.x0[:n]
    z = jnp.zeros(n, dtype)
    tau = _inverse_dynamics(arm, q0, z, z, None)
    return jnp.broadcast_to(jnp.clip(tau, problem.lower, problem.upper), (T, n)).astype(dtype)


@jax.custom_jvp
def _reported_cost(problem: OCP, x, u, value):
    """:func:`total_cost` of the solution (x, u), whose value the solver has found already
    (``value``: the cost of the trajectory it kept, from the objective it evaluated there), so that
    a program that does not differentiate the solve compiles no further copy of the cost terms
    (the tool's kinematics, ...). Its derivatives are those of ``total_cost(problem, x, u)``."""
    return value


@_reported_cost.defjvp
def _reported_cost_jvp(primals, tangents):
    problem, x, u, value = primals
    _, tangent = jax.jvp(total_cost, (problem, x, u), tangents[:3])
    return value, tangent


def _stage_count(problem: OCP) -> int:
    """The stages of the problem's Runge-Kutta method by name, 0 for any other method."""
    return len(_TABLEAUS[problem.method][2]) if isinstance(problem.method, str) and problem.method in _TABLEAUS else 0


@jax.custom_jvp
def _reported_accelerations(problem: OCP, x, u, value):
    """The joint accelerations qdd(x_k, u_k) (T, n) at the knots of a solution, whose values the
    solver's rollout has found (``value``), so that no further forward dynamics is compiled; their
    derivatives are those of the forward dynamics there."""
    return value


@_reported_accelerations.defjvp
def _reported_accelerations_jvp(primals, tangents):
    problem, x, u, value = primals

    def accelerations(problem, x, u):
        arm = solver_arm(problem)
        return jax.vmap(lambda x, u: _accel_factored(arm, x, u, problem.input)[0])(x[:-1], u)

    _, tangent = jax.jvp(accelerations, (problem, x, u), tangents[:3])
    return value, tangent


def total_cost(problem: OCP, x, u):
    """The cost sum_k l(x_k, u_k, k) + l_T(x_T) of a trajectory x (T+1, 2n) under inputs u (T, n)
    (no constraint terms): what :func:`ddp` minimizes and reports as ``OCPResult.cost``."""
    n, T = problem.n, problem.T
    dtype = jnp.result_type(problem.x0)
    x, u = jnp.asarray(x, dtype), jnp.asarray(u, dtype)
    if x.shape != (T + 1, 2 * n) or u.shape != (T, n):
        raise ValueError(f"total_cost: expected x ({T + 1}, {2 * n}) and u ({T}, {n}), got {x.shape} and {u.shape}")
    arm = solver_arm(problem)
    xu = jnp.concatenate([x, jnp.concatenate([u, jnp.zeros((1, n), dtype)])], axis=1)
    # (in the problem's precision: a term's weights given in float64 under x64 would otherwise lift a
    # float32 problem's cost to float64)
    return (jnp.sum(_at_knots(problem, lambda skip, xu, k: _knot_cost(problem, arm, xu, k, skip), xu, jnp.arange(T + 1)))
            + _rate_cost(problem, u)).astype(dtype)
