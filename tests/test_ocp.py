"""General optimal-control problems (jaxarm.trajopt.ocp, terms) solved by box-FDDP (trajopt.ddp).

Checked against: the closed-form LQR solution of a linear-quadratic problem (one prismatic joint,
no gravity: the RK3 step is linear, so DDP is exact in one iteration); iLQR with an augmented-
Lagrangian torque limit on the same two-link reach (trajopt.ilqr, a separate implementation):
same optimal cost; an infeasible start (states interpolated to the goal) reaching the same
optimum as a feasible one; the input box never left; a keep-out sphere the unconstrained solution
crosses; vmap over goals equal to a loop; and the errors for bad problems, raised before any compile.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_differences, count_primitive, while_loop_batchings

import jaxarm
from jaxarm import trajopt
from jaxarm.simulate import integrators
from jaxarm.trajopt import terms
from jaxarm.control.trajopt.solvers.ddp import INFEASIBLE, ITERATION_LIMIT

from numpy.testing import assert_allclose as assert_close

T, DT = 20, 0.05
TORQUE_LIMITS = np.array([20.0, 8.0])


def two_link():
    arm = jaxarm.load_arm("two_link_planar")
    limits = dataclasses.replace(arm.limits, torque=TORQUE_LIMITS, velocity=np.array([10.0, 10.0]),
                                 position=np.array([[-np.pi, np.pi], [-np.pi, np.pi]]))
    return arm.replace(limits=limits)


Q0 = jnp.array([-1.2, 0.8])


def reach_costs(arm, position=300.0, velocity=3.0):
    return terms.effort(1.0 / TORQUE_LIMITS**2) + terms.tool_position("goal", position) + terms.joint_velocity(velocity)


def reach_ocp(arm, offset=(0.3, 0.3, 0.0), **kw):
    goal = jaxarm.tool_pose(arm, Q0)[:3, 3] + jnp.asarray(offset)
    return trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), params={"goal": goal}, **kw), goal


@pytest.fixture(scope="module")
def solve():
    """ddp compiled once per problem structure (jaxarm.jit), problems passed as arguments."""
    return jaxarm.jit(trajopt.ddp)


# --------------------------------------------------------------------------- linear-quadratic


def test_linear_quadratic_problem_is_solved_exactly_in_one_iteration_and_matches_lqr(solve):
    arm = jaxarm.make_arm(["P"], mass=[2.0], gravity=(0.0, 0.0, 0.0))
    wq, wv, wu, wf = 3.0, 0.5, 0.2, 40.0
    costs = (terms.joint_position(0.0, wq, when="path") + terms.joint_velocity(wv, target=0.0, when="path")
             + terms.effort(wu) + terms.joint_position(0.0, wf) + terms.joint_velocity(wf))
    problem = trajopt.ocp(arm, [0.5], T, DT, qd0=[0.3], costs=costs)
    res = solve(problem, jnp.zeros((T, 1)))
    assert bool(res.converged), res.reason()
    assert int(res.iterations) <= 2  # the first step is exact; the second only confirms it
    assert np.asarray(res.history.alpha)[0] == 1.0
    lin = jaxarm.linearize_trajectory(arm, res.q[:-1], res.qd[:-1], res.u, DT)
    lqr = jaxarm.tvlqr(lin.A, lin.B, DT * jnp.diag(jnp.array([wq, wv])), DT * wu * jnp.eye(1), jnp.diag(jnp.array([wf, wf])))
    # roll the LQR policy out on the same linear system
    x = jnp.array([0.5, 0.3])
    us = []
    for k in range(T):
        u = -lqr.K[k] @ x
        us.append(u)
        x = lin.A[k] @ x + lin.B[k] @ u
    assert_close(res.u, jnp.stack(us), atol=1e-10, rtol=1e-9)
    assert float(res.max_gap) < 1e-12


# --------------------------------------------------------------------------- reach, box, FDDP


@pytest.fixture(scope="module")
def reach_solutions(solve):
    arm = two_link()
    problem, goal = reach_ocp(arm)
    feasible = solve(problem, None)
    # an infeasible start: states interpolated linearly to an IK solution, inputs holding the start
    q_goal = trajopt.position_ik(arm, Q0, goal)
    s = jnp.linspace(0.0, 1.0, T + 1)[:, None]
    x_init = jnp.concatenate([Q0 + s * (q_goal - Q0), jnp.zeros((T + 1, 2))], axis=1)
    infeasible = solve(problem, None, x_init)
    return arm, problem, goal, feasible, infeasible, x_init


def test_a_knots_box_qp_and_gains_are_the_same_for_one_problem_and_a_batch_and_satisfy_its_kkt_conditions():
    """The backward pass's knot QP (min g.x + x.H x / 2, lo <= x <= hi) with its feedback gains
    K = -H_ff^-1 R_f: one problem solves the gains with the unconstrained minimizer, a batch after
    the free set is known (``_knot_qp``); both agree with each other and with the QP's optimality
    conditions, for knots with no bound active, some, and every one."""
    from jaxarm.control.trajopt.solvers.ddp import _knot_qp

    rng = np.random.default_rng(7)
    m, nx, N = 5, 8, 12
    A = rng.normal(size=(N, m, m))
    H = A @ np.swapaxes(A, 1, 2) + 0.5 * np.eye(m)
    g = rng.normal(size=(N, m)) * np.linspace(0.1, 30.0, N)[:, None]  # small steps inside, large ones clamped
    lo, hi = -np.ones(m) * rng.uniform(0.5, 2.0, m), np.ones(m) * rng.uniform(0.5, 2.0, m)
    R = rng.normal(size=(N, m, nx))
    batch = jax.jit(jax.vmap(_knot_qp, in_axes=(0, 0, None, None, 0)))(H, g, lo, hi, R)
    single = jax.jit(_knot_qp)
    clamped_counts = set()
    for i in range(N):
        x, free, K, ok = single(H[i], g[i], lo, hi, R[i])
        for got, want in zip((x, free, K, ok), batch):
            assert_close(np.asarray(got), np.asarray(want[i]), rtol=1e-10, atol=1e-12)
        x, free, K = np.asarray(x), np.asarray(free), np.asarray(K)
        assert bool(ok) and np.all(x >= lo) and np.all(x <= hi)
        grad = g[i] + H[i] @ x
        # free rows: stationary; clamped rows: at a bound, the gradient pointing out of the box
        assert_close(grad[free], 0.0, atol=1e-9 * (1.0 + np.abs(g[i]).max()))
        at_lo, at_hi = ~free & np.isclose(x, lo), ~free & np.isclose(x, hi)
        assert np.all(at_lo | at_hi | free) and np.all(grad[at_lo] > 0) and np.all(grad[at_hi] < 0)
        want_K = np.zeros((m, nx))
        want_K[free] = -np.linalg.solve(H[i][np.ix_(free, free)], R[i][free])
        assert_close(K, want_K, rtol=1e-9, atol=1e-12)
        clamped_counts.add(int(np.sum(~free)))
    assert {0, m} <= clamped_counts and len(clamped_counts) > 2, clamped_counts  # knots inside, partly and wholly clamped
    # no library factorization in the QP, for one problem or a batch: a call into LAPACK would keep
    # XLA:CPU from compiling the backward pass's loop over the knots into one kernel
    for f in (_knot_qp, jax.vmap(_knot_qp, in_axes=(0, 0, None, None, 0))):
        args = (H[0], g[0], lo, hi, R[0]) if f is _knot_qp else (H, g, lo, hi, R)
        assert count_primitive(jax.make_jaxpr(f)(*args), "cholesky") == 0


def test_box_ddp_never_leaves_the_box_and_the_limit_is_active(reach_solutions):
    arm, problem, goal, res, _, _ = reach_solutions
    assert bool(res.converged), res.reason()
    u = np.asarray(res.u)
    assert np.all(np.abs(u) <= TORQUE_LIMITS + 1e-12)
    assert np.max(np.abs(u[:, 0])) == pytest.approx(TORQUE_LIMITS[0], rel=1e-12)  # joint 1 saturates
    # the trajectory is the rollout of its inputs (the dynamics are met, not just penalized)
    traj = jaxarm.rollout(arm, Q0, jnp.zeros(2), res.u, DT, saturate=False)
    assert_close(res.q, traj.q, atol=1e-10)
    assert float(jnp.linalg.norm(jaxarm.tool_pose(arm, res.q[-1])[:3, 3] - goal)) < 0.01


def test_ddp_reaches_the_optimum_of_augmented_lagrangian_ilqr(reach_solutions):
    """Same costs through ReachProblem: iLQR keeps the torque limit by an augmented Lagrangian, DDP
    inside the backward pass; both must find the same constrained optimum."""
    arm, problem, goal, res, _, _ = reach_solutions
    reach = trajopt.reach_problem(arm, Q0, goal, DT, position=300.0, velocity=3.0)
    u0 = jnp.tile(jaxarm.gravity_torques(arm, Q0), (T, 1))
    ref = jaxarm.jit(trajopt.ilqr)(arm, reach, u0)
    assert bool(ref.converged)
    # iLQR meets the limit to its tolerance (it may exceed it by up to 1e-4 of the limit, which
    # buys it a slightly lower cost); box-DDP meets it exactly
    assert float(res.cost) == pytest.approx(float(ref.cost), rel=3e-5)
    assert float(jnp.max(jnp.abs(ref.u) / TORQUE_LIMITS)) <= 1 + 1e-4
    assert_close(res.u, ref.u, atol=0.05 * TORQUE_LIMITS.max())


def test_second_order_ddp_finds_the_same_optimum_and_converges_quadratically(reach_solutions):
    """DDP with the dynamics' second-order terms (second_order=True) on the box-constrained reach:
    the same optimum as iLQR (the default) to round-off, and near the optimum a quadratic decrease
    of the cost's distance to its optimum (Mayne 1966) where iLQR's is linear; far from it, where
    the costates make the full model indefinite, the iteration takes the Gauss-Newton step and
    needs no more iterations than iLQR."""
    arm, problem, goal, res, _, _ = reach_solutions
    tight = jaxarm.jit(functools.partial(trajopt.ddp, tol=1e-13, max_iterations=200))
    ilqr = tight(problem)
    second = jaxarm.jit(functools.partial(trajopt.ddp, tol=1e-13, max_iterations=200, second_order=True))(problem)
    assert bool(ilqr.converged) and bool(second.converged), (ilqr.reason(), second.reason())
    assert float(second.cost) == pytest.approx(float(ilqr.cost), rel=1e-10)
    assert_close(second.u, ilqr.u, atol=1e-6 * TORQUE_LIMITS.max())
    assert np.all(np.abs(np.asarray(second.u)) <= TORQUE_LIMITS + 1e-12)  # the box still holds
    best = float(ilqr.cost)

    def distances(r):
        c = np.asarray(r.history.cost)[: int(r.iterations)]
        return c[np.isfinite(c)] - best

    d2, d1 = distances(second), distances(ilqr)
    assert int(second.iterations) <= int(ilqr.iterations), (int(second.iterations), int(ilqr.iterations))

    def orders(d):  # log d_{k+1} / log d_k of the relative distances below 1e-3: 2 quadratic, -> 1 linear
        rel = d[(d > 1e-13 * best) & (d < 1e-3 * best)] / best
        return np.log(rel[1:]) / np.log(rel[:-1])

    assert orders(d2).size >= 1 and np.all(orders(d2) > 1.8), orders(d2)
    assert orders(d1).size >= 2 and np.all(orders(d1)[-2:] < 1.5), orders(d1)  # iLQR: linear


def test_step_second_derivatives_are_the_hessian_of_the_costate_times_the_step():
    """p . d^2F from central differences of the analytic step Jacobians (the term DDP and the
    implicit gradients add) against jax.hessian of p . F through the very step, for RK3 and for
    semi-implicit Euler, on a two-joint arm with a prismatic joint, drives and smooth Coulomb friction."""
    import importlib

    from tests.helpers import random_arm

    ocp_module = importlib.import_module("jaxarm.control.step_jacobians")
    arm = random_arm(5, "RP", drives=True)
    arm = arm.replace(drives=dataclasses.replace(arm.drives, coulomb_velocity_scale=np.full(arm.n, 0.05)))
    rng = np.random.default_rng(3)
    n, K, dt = arm.n, 3, 0.01
    xs = jnp.asarray(rng.uniform(-1, 1, (K, 2 * n)))
    us = jnp.asarray(rng.uniform(-3, 3, (K, n)))
    p = jnp.asarray(rng.normal(size=(K, 2 * n)))
    for method in ("rk3", "semi_implicit_euler"):
        D = jaxarm.jit(ocp_module._step_second_derivatives, static_argnums=(4, 5))(arm, xs, us, dt, method, "torque")
        got = jnp.einsum("kjim,ki->kjm", D, p)

        def pF(z, p):
            return p @ ocp_module._step(arm, z[: 2 * n], z[2 * n:], dt, method, "torque")

        want = jaxarm.jit(jax.vmap(jax.hessian(pF)))(jnp.concatenate([xs, us], axis=1), p)
        scale = float(jnp.abs(want).max())
        assert scale > 1e-3  # not trivial
        assert_close(got, want, atol=1e-6 * scale, rtol=0)


def test_feasibility_driven_start_closes_its_gaps_and_finds_the_same_optimum(reach_solutions):
    arm, problem, goal, feasible, res, x_init = reach_solutions
    first_gap = float(res.history.gap[0])
    assert first_gap > 0.1  # it did start infeasible
    assert bool(res.converged), res.reason()
    assert float(res.max_gap) < 1e-9
    assert float(res.cost) == pytest.approx(float(feasible.cost), rel=1e-6)


def test_keep_out_sphere_is_respected_where_the_unconstrained_path_crosses_it(solve, reach_solutions):
    arm, problem, goal, free, _, _ = reach_solutions
    tool = jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(free.q)
    center = tool[T // 2] + jnp.array([0.0, 0.0, 0.0])
    radius = 0.12
    assert float(jnp.min(jnp.linalg.norm(tool - center, axis=1))) < radius  # the free path goes through it
    blocked = trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), params={"goal": goal},
                          constraints=terms.keep_out_sphere(center, radius))
    res = solve(blocked, free.u)
    assert bool(res.converged), res.reason()
    tool = jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(res.q)
    assert float(jnp.min(jnp.linalg.norm(tool - center, axis=1))) >= radius - 1e-4
    assert float(res.max_violation) <= 1e-5
    # KKT: multipliers are non-negative and vanish where the constraint is inactive
    lam = np.asarray(res.multipliers)[:, -1]
    dist = np.asarray(jnp.linalg.norm(tool - center, axis=1))
    assert np.all(lam >= 0) and lam.max() > 0
    assert np.all(lam[dist > radius + 1e-3] == 0)
    assert float(res.cost) > float(free.cost)


def test_a_term_of_the_end_is_evaluated_at_the_final_knot_only(solve):
    """The knots before the last leave out the cost terms of the end (their weight there is zero
    by their ``when``), and the last knot those of the path: a term that cannot be evaluated away
    from where it applies (NaN elsewhere) does not poison the solve, and the solution is that of
    the same problem with a term that can be evaluated everywhere."""
    arm = two_link()
    goal = jaxarm.tool_pose(arm, Q0)[:3, 3] + jnp.array([0.3, 0.3, 0.0])

    def everywhere(arm, x, u, k, params):
        return jaxarm.tool_pose(arm, x[:2])[:3, 3] - params["goal"]

    def at_the_end_only(arm, x, u, k, params):
        return jnp.where(k == T, everywhere(arm, x, u, k, params), jnp.nan)

    found = []
    for fn in (at_the_end_only, everywhere):
        costs = (terms.effort(1.0 / TORQUE_LIMITS**2) + terms.joint_velocity(3.0)
                 + terms.residual(fn, 300.0, when="end", uses_input=False))
        problem = trajopt.ocp(arm, Q0, T, DT, costs=costs, params={"goal": goal})
        res = solve(problem)
        assert bool(res.converged), res.reason()
        found.append((problem, res))
    (problem, res), (_, reference) = found
    assert np.isfinite(float(res.cost)) and np.isfinite(float(trajopt.total_cost(problem, res.x, res.u)))
    assert_close(np.asarray(res.u), np.asarray(reference.u), rtol=1e-10, atol=1e-12)
    assert_close(float(res.cost), float(reference.cost), rtol=1e-12)


def test_vmap_over_goals_equals_a_loop(reach_solutions):
    arm, problem, goal, _, _, _ = reach_solutions
    goals = goal + jnp.array([[0.0, 0.0, 0.0], [-0.05, 0.05, 0.0]])
    batched = jaxarm.jit(jax.vmap(lambda g: trajopt.ddp(problem.replace(params={"goal": g}))))(goals)
    for i in range(2):
        one = jaxarm.jit(trajopt.ddp)(problem.replace(params={"goal": goals[i]}))
        assert_close(batched.u[i], one.u, atol=1e-9)
        assert bool(batched.converged[i])


def test_a_carry_marked_for_vmap_is_the_identity_batched_where_what_it_reads_is_and_differentiates():
    """tracers.batched_with: the carry as it is (values, dtypes); its batching rule batches every
    leaf when a leaf of the carry or of what it reads is, and leaves it alone when nothing is;
    under vmap, forward and reverse mode a loop computes what it computes without it
    (f = x + a x + a^2 x by a scan of three steps)."""
    from jaxarm.core.tracers import batched_with

    def f(a, x, mark=True):
        init = (x, jnp.asarray(0.0), jnp.asarray(0))
        init = batched_with(init, (a,)) if mark else init
        (_, total, steps), _ = jax.lax.scan(lambda c, _: ((c[0] * a, c[1] + c[0], c[2] + 1), None), init, None, length=3)
        return total + 0.0 * steps

    from jaxarm.core.tracers import _mark_batched_rule

    carry = batched_with((jnp.ones(2), jnp.asarray(3), jnp.asarray(True)), (jnp.zeros(4),))
    assert [x.dtype for x in carry] == [jnp.ones(2).dtype, jnp.asarray(3).dtype, bool] and int(carry[1]) == 3
    # the batching rule: every leaf batched (broadcast where it was not) when a leaf read is batched
    leaves, refs = [jnp.asarray(0), jnp.ones((3, 2))], [jnp.zeros((3, 4))]
    out, batched = _mark_batched_rule(3, ([False, True], [True]), leaves, refs)
    assert batched == [True, True] and out[0].shape == (3,) and out[1] is leaves[1]
    out, batched = _mark_batched_rule(3, ([False, True], [False]), leaves, refs)
    assert batched == [True, True] and out[0].shape == (3,)  # (a batched carry leaf counts too)
    out, batched = _mark_batched_rule(3, ([False, False], [False]), [jnp.asarray(0), jnp.ones(2)], [jnp.zeros(4)])
    assert batched == [False, False] and out[0].shape == () and out[1].shape == (2,)  # nothing batched: left alone
    a, x = jnp.array([1.0, 2.0, 0.5]), jnp.array([1.0, 1.0, 2.0])
    for marked in (True, False):
        assert_close(jax.vmap(lambda a, x: f(a, x, marked))(a, x), x + a * x + a**2 * x, rtol=1e-15)
        grads = jax.vmap(jax.grad(lambda a, x: f(a, x, marked), argnums=(0, 1)))(a, x)
        assert_close(grads[0], x + 2 * a * x, rtol=1e-15)
        assert_close(grads[1], 1 + a + a**2, rtol=1e-15)
        assert_close(jax.jvp(lambda s: f(s, 1.0, marked), (2.0,), (1.0,))[1], 5.0, rtol=1e-15)


@pytest.mark.parametrize("batched", ["params", "x0"])
def test_vmap_batches_each_loop_of_the_solver_once(monkeypatch, batched):
    """jax.vmap of a solve batches each loop body of the solver once: every loop's carry starts
    batched where what it reads is, so the fixpoint by which jax finds a loop's batched carry ends
    after its first pass, and the loops nested inside are not batched again for every further pass
    (the Panda reach around an obstacle, 4 goals: 14 batchings of its while loops, now 5; the
    trace took 4.2-4.9 s against 6.5-10.4 s). Counted while tracing, so nothing compiles: each
    call of jax's while-loop batching rule leaves exactly one loop in the batched program."""
    arm = two_link()
    problem, goal = reach_ocp(arm, constraints=terms.keep_out_sphere(jaxarm.tool_pose(arm, Q0)[:3, 3] + 0.15, 0.05))
    calls = while_loop_batchings(monkeypatch)
    if batched == "params":
        solve = jax.vmap(lambda g: trajopt.ddp(problem.replace(params={"goal": g})).u)
        values = goal + jnp.array([[0.0, 0.0, 0.0], [-0.05, 0.05, 0.0], [0.02, 0.0, 0.0]])
    else:
        solve = jax.vmap(lambda x0: trajopt.ddp(problem.replace(x0=x0)).u)
        values = jnp.stack([problem.x0, problem.x0 + 0.01])
    jaxpr = jax.make_jaxpr(jax.jit(solve))(values).jaxpr
    assert len(calls) >= 5  # the solver's loops: augmented-Lagrangian rounds, DDP trips, line search, box QP, ...
    loops = count_primitive(jaxpr, "while")
    assert len(calls) == loops, (len(calls), loops)


def test_a_problem_closed_over_by_a_jit_keeps_its_arm_constant_and_solves_the_same(reach_solutions, monkeypatch):
    """Closed over by the user's jit (only the goal traced), the problem's arm stays a constant
    inside the solver: the body model is computed once in NumPy, never traced (a traced body
    model, and no folding of the arm's structural zeros, doubled the compiled program), and the
    solution equals the one with the whole problem passed as an argument (everything traced)."""
    from jaxarm.dynamics import kinematics

    arm, problem, goal, feasible, _, _ = reach_solutions
    traced_calls = []
    original = kinematics.body_model

    def recording(a, *args, **kw):
        traced_calls.append(any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(a)))
        return original(a, *args, **kw)

    monkeypatch.setattr(kinematics, "body_model", recording)
    closed = jaxarm.jit(lambda g: trajopt.ddp(problem.replace(params={"goal": g})))(goal)
    assert traced_calls and not any(traced_calls)
    assert bool(closed.converged) and int(closed.iterations) == int(feasible.iterations)
    assert_close(closed.u, feasible.u, atol=1e-9)
    assert_close(closed.cost, feasible.cost, rtol=1e-10)
    # and with the whole problem an argument, the body model is traced (the check above can fail)
    traced_calls.clear()
    jax.jit(lambda p: trajopt.ddp(p)).trace(problem)  # a new function: not a cached trace
    assert any(traced_calls)


def test_an_eager_call_compiles_once_for_new_params_and_equals_the_jitted_solve(reach_solutions):
    """Called outside any jit, as a new user first calls it, ddp answers with a compiled solve it
    keeps (the problem but its params a constant, the params an argument): a second eager call with
    a new goal compiles nothing and equals the same solve jitted by hand; another setting is another
    solve; bad input still raises before anything is compiled."""
    from jaxarm.core import xla
    from tests.test_recompiles import count_compiles

    arm, problem, goal, *_ = reach_solutions
    goal2 = goal + jnp.array([-0.05, 0.05, 0.0])
    xla._EAGER.clear()
    first = trajopt.ddp(problem, max_iterations=40)
    assert len(xla._EAGER) == 1
    with count_compiles() as events:
        second = trajopt.ddp(problem.replace(params={"goal": goal2}), max_iterations=40)
        jax.block_until_ready(second.u)
    assert len(events) == 0, f"{len(events)} new compiles"
    by_hand = jaxarm.jit(lambda g: trajopt.ddp(problem.replace(params={"goal": g}), max_iterations=40))
    assert_close(np.asarray(second.u), np.asarray(by_hand(goal2).u), rtol=0, atol=1e-12)
    assert_close(np.asarray(first.u), np.asarray(by_hand(goal).u), rtol=0, atol=1e-12)
    assert bool(first.converged) and bool(second.converged), (first.reason(), second.reason())
    trajopt.ddp(problem, max_iterations=np.int64(40))  # a NumPy scalar is the setting it holds
    assert len(xla._EAGER) == 1
    trajopt.ddp(problem, max_iterations=41)
    assert len(xla._EAGER) == 2
    with pytest.raises(ValueError, match="u_init"):
        trajopt.ddp(problem, jnp.full((T, 2), jnp.nan))
    with pytest.raises(ValueError, match="mu"):
        trajopt.ddp(problem, mu=np.asarray(-1.0))
    # a Python int among the params (an index a term may read) stays a constant of the kept program
    labelled = problem.replace(params={"goal": goal2, "joint": 1})
    assert_close(np.asarray(trajopt.ddp(labelled, max_iterations=40).u), np.asarray(second.u), rtol=0, atol=1e-12)
    # what counts as eager: outside every transformation, with jits enabled
    from jaxarm.core import tracers

    seen = [tracers.eager()]
    jax.jit(lambda x: seen.append(tracers.eager()) or x)(1.0)
    jax.vmap(lambda x: seen.append(tracers.eager()) or x)(jnp.ones(2))
    with jax.disable_jit():
        seen.append(tracers.eager())
    assert seen == [True, False, False, False]


def test_an_eager_gradient_of_a_solve_compiles_once_and_equals_the_jitted_gradient(reach_solutions):
    """jax.grad (and jax.vmap) of a solve applied outside any jit, with the params the only traced
    values: the kept solve is transformed, and JAX keeps the transformed program, so a second
    call with a new goal compiles nothing (run op by op, every call traced and compiled the solver
    and its adjoint again); the gradient is the jitted one."""
    from tests.test_recompiles import count_compiles

    arm, problem, goal, *_ = reach_solutions
    goal2 = goal + jnp.array([-0.05, 0.05, 0.0])

    def cost(g):
        return trajopt.ddp(problem.replace(params={"goal": g}), max_iterations=40).cost

    first = jax.grad(cost)(goal)
    jax.vmap(cost)(jnp.stack([goal, goal2]))
    with count_compiles() as events:
        second = jax.block_until_ready(jax.grad(cost)(goal2))
        batched = jax.block_until_ready(jax.vmap(cost)(jnp.stack([goal2, goal])))
    assert len(events) == 0, f"{len(events)} new compiles"
    by_hand = jaxarm.jit(jax.grad(cost))
    assert_close(np.asarray(second), np.asarray(by_hand(goal2)), rtol=1e-10, atol=1e-12)
    assert_close(np.asarray(first), np.asarray(by_hand(goal)), rtol=1e-10, atol=1e-12)
    assert_close(np.asarray(batched), np.asarray([cost(goal2), cost(goal)]), rtol=1e-12, atol=0)
    assert float(jnp.max(jnp.abs(second))) > 1e-3


def test_solve_many_solves_each_problem_as_ddp_does_and_lets_finished_ones_leave_the_pool(reach_solutions):
    """trajopt.solve_many (a pool of 2 slots, rounds of 6 iterations) against one ddp solve per goal:
    the same optimum (each problem converged; costs equal to the solver's tolerance, a resumed
    round taking a slightly different path), total iterations counted over the rounds with the
    whole history kept, an unreachable goal stopped at max_iterations without holding the others
    back (fewer slot-rounds than a vmap running every problem for the slowest one), a second call
    with new goals compiling nothing, and bad batches rejected."""
    from test_recompiles import count_compiles

    arm, problem, goal, _, _, _ = reach_solutions
    goals = goal + jnp.array([[0.0, 0.0, 0.0], [-0.05, 0.05, 0.0], [5.0, 5.0, 0.0], [0.05, -0.1, 0.0], [0.1, 0.0, 0.0]])
    stats = []
    res = trajopt.solve_many(problem, {"goal": goals}, slots=2, round_iterations=6, max_iterations=36, report=stats.append)
    one = jaxarm.jit(lambda g: trajopt.ddp(problem.replace(params={"goal": g}), max_iterations=36))
    rounds_needed = []
    for i in range(5):
        r = one(goals[i])
        assert int(res.status[i]) == int(r.status), (i, int(res.status[i]), r.reason())
        if i == 2:  # out of reach: both stop at the iteration limit
            assert not bool(res.converged[i]) and int(res.iterations[i]) == 36
            assert np.all(np.isfinite(np.asarray(res.history.cost[i])))
            continue
        assert bool(res.converged[i]) and bool(r.converged)
        assert_close(float(res.cost[i]), float(r.cost), rtol=1e-6)
        k = int(res.iterations[i])
        assert abs(k - int(r.iterations)) <= 2, (i, k, int(r.iterations))
        h = np.asarray(res.history.cost[i])
        assert np.all(np.isfinite(h[:k])) and np.all(np.isnan(h[k:]))
        rounds_needed.append(-(-k // 6))
    assert stats[0]["problems"] == 5 and stats[0]["slots"] == 2
    assert stats[0]["slot_rounds"] == sum(rounds_needed) + 6  # each problem its own rounds; the unreachable one six
    assert stats[0]["slot_rounds"] < 5 * 6  # a vmap of the five runs all of them as long as the unreachable one
    shuffled = np.asarray(goals)[[1, 0, 3, 4, 2]]
    with count_compiles() as compiles:
        again = trajopt.solve_many(problem, {"goal": shuffled}, slots=2, round_iterations=6, max_iterations=36)
    assert compiles == []
    assert_close(np.asarray(again.cost)[:4], np.asarray(res.cost)[[1, 0, 3, 4]], rtol=1e-6)
    # pools side by side, each in a thread (one queue): every problem solved as with one pool
    side = []
    threaded = trajopt.solve_many(problem, {"goal": goals}, slots=2, round_iterations=6, max_iterations=36, workers=3,
                                  report=side.append)
    single = trajopt.solve_many(problem, {"goal": goals}, slots=2, round_iterations=6, max_iterations=36, workers=1)
    assert side[0]["workers"] == 3 and side[0]["slot_rounds"] == stats[0]["slot_rounds"]
    assert np.array_equal(np.asarray(threaded.iterations), np.asarray(single.iterations))
    assert_close(np.asarray(threaded.u), np.asarray(single.u), rtol=0, atol=1e-12)
    assert_close(np.asarray(threaded.history.cost), np.asarray(single.history.cost), rtol=1e-12)
    with pytest.raises(ValueError, match="workers"):
        trajopt.solve_many(problem, {"goal": goals}, workers=0)
    # start states batched too: each problem from its own x0, as ddp from that start
    x0s = np.stack([np.asarray(problem.x0), np.asarray(problem.x0) + np.array([0.2, -0.1, 0.5, 0.0])])
    many = trajopt.solve_many(problem, {"goal": np.asarray(goals)[:2]}, x0=x0s, slots=2, round_iterations=6, max_iterations=36)
    from_x0 = jaxarm.jit(lambda g, x0: trajopt.ddp(problem.replace(params={"goal": g}, x0=x0), max_iterations=36))
    for i in range(2):
        r = from_x0(goals[i], jnp.asarray(x0s[i]))
        assert bool(many.converged[i]) and bool(r.converged)
        assert_close(np.asarray(many.x[i, 0]), x0s[i], atol=1e-12)
        assert_close(float(many.cost[i]), float(r.cost), rtol=1e-6)
    with pytest.raises(ValueError, match="x0"):
        trajopt.solve_many(problem, {"goal": goals}, x0=x0s)
    with pytest.raises(ValueError, match="params"):
        trajopt.solve_many(problem, {"goal": goals[:, :2]})
    with pytest.raises(ValueError, match="params"):
        trajopt.solve_many(problem, {"target": goals})
    with pytest.raises(ValueError, match="slots"):
        trajopt.solve_many(problem, {"goal": goals}, slots=0)
    with pytest.raises(TypeError, match="outside"):
        jax.jit(lambda g: trajopt.solve_many(problem, {"goal": g}).cost)(goals)


def test_solve_many_carries_each_constrained_problems_penalty_from_round_to_round(reach_solutions):
    """A keep-out sphere on the free path, solved for three goals by solve_many in rounds of 4
    iterations: each problem resumes with the augmented-Lagrangian penalty and violation it reached
    (OCPResult.penalty, max_violation), so its penalty rises across rounds as within one ddp solve;
    every problem meets the constraint and reaches the optimum of a single ddp solve. ddp takes
    the penalty as a traced value: one compile for any penalty."""
    from test_recompiles import count_compiles

    arm, _, goal, free, _, _ = reach_solutions
    tool = jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(free.q)
    center, radius = tool[T // 2], 0.12
    blocked = trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), params={"goal": goal},
                          constraints=terms.keep_out_sphere(center, radius))
    goals = goal + jnp.array([[0.0, 0.0, 0.0], [-0.03, 0.03, 0.0], [0.03, -0.03, 0.0]])
    many = trajopt.solve_many(blocked, {"goal": goals}, slots=2, round_iterations=4, max_iterations=200, mu=10.0)
    one = jaxarm.jit(lambda g: trajopt.ddp(blocked.replace(params={"goal": g})))
    for i in range(3):
        r = one(goals[i])
        assert bool(r.converged) and bool(many.converged[i]), (r.reason(), int(many.status[i]))
        assert float(many.max_violation[i]) <= 1e-5
        assert float(many.penalty[i]) > 10.0  # raised on the way (a restart at mu every round never raises it)
        assert_close(float(many.cost[i]), float(r.cost), rtol=1e-4)
    # resuming one solve by hand, the penalty an argument: a second penalty compiles nothing new
    resume = jaxarm.jit(lambda u, x, lam, mu, viol: trajopt.ddp(blocked, u, x, multipliers=lam, mu=mu, last_violation=viol,
                                                               max_iterations=4))
    first = trajopt.ddp(blocked, max_iterations=4)
    step = resume(first.u, first.x, first.multipliers, first.penalty, first.max_violation)
    with count_compiles() as compiles:
        again = resume(step.u, step.x, step.multipliers, step.penalty, step.max_violation)
    assert compiles == []
    assert float(again.penalty) >= float(step.penalty) >= float(first.penalty) >= 10.0
    with pytest.raises(ValueError, match="mu"):
        trajopt.ddp(blocked, mu=0.0)
    with pytest.raises(ValueError, match="last_violation"):
        trajopt.ddp(blocked, last_violation=-1.0)
    with pytest.raises(ValueError, match="mu"):
        trajopt.solve_many(blocked, {"goal": goals}, mu=-1.0)


def test_a_solve_resumed_in_short_rounds_follows_one_ddp_solve_exactly(reach_solutions):
    """A keep-out sphere solved by one ddp call (22 iterations, 7 augmented-Lagrangian rounds)
    and by a chain of calls of 4 iterations each, every call resuming where the last stopped
    (inputs, states, multipliers, penalty, the violation at the last multiplier update, the updates
    made, the last regularization): a round cut by max_iterations is resumed inside it (no
    multiplier update), so the chain takes the same iterates -- the same cost history, iterations,
    updates and penalty. solve_many, whose pool resumes its problems the same way, takes as many
    iterations per problem as one ddp solve, and al_iterations bounds the updates over its rounds."""
    arm, _, goal, free, _, _ = reach_solutions
    tool = jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(free.q)
    blocked = trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), params={"goal": goal},
                          constraints=terms.keep_out_sphere(tool[T // 2], 0.12))
    one = jaxarm.jit(trajopt.ddp)(blocked)
    assert bool(one.converged) and int(one.al_rounds) >= 3, one.reason()
    resume = jaxarm.jit(lambda u, x, lam, mu, viol, rounds, reg: trajopt.ddp(
        blocked, u, x, multipliers=lam, mu=mu, last_violation=viol, al_rounds=rounds, regularization=reg, max_iterations=4))
    r = trajopt.ddp(blocked, max_iterations=4)
    # the first round needs more than 4 iterations: no update yet, the multipliers untouched
    assert int(r.al_rounds) == 0 and float(r.penalty) == 10.0 and not np.any(np.asarray(r.multipliers))
    assert float(r.update_violation) == np.inf
    costs, calls = list(np.asarray(r.history.cost[:4])), 1
    while int(r.status) == ITERATION_LIMIT and calls < 50:
        r = resume(r.u, r.x, r.multipliers, r.penalty, r.update_violation, r.al_rounds,
                   r.history.regularization[int(r.iterations) - 1])
        costs += list(np.asarray(r.history.cost[: int(r.iterations)]))
        calls += 1
    assert bool(r.converged), r.reason()
    assert len(costs) == int(one.iterations)
    assert_close(np.asarray(costs), np.asarray(one.history.cost[: int(one.iterations)]), rtol=1e-10)
    assert int(r.al_rounds) == int(one.al_rounds) and float(r.penalty) == float(one.penalty)
    assert_close(np.asarray(r.u), np.asarray(one.u), atol=1e-9)
    # the same chain handing on the knots' accelerations (qdd_init): the same iterates, the
    # accelerations not evaluated again; and NaN accelerations are evaluated, as none given
    handed = jaxarm.jit(lambda u, x, lam, mu, viol, rounds, reg, qdd: trajopt.ddp(
        blocked, u, x, multipliers=lam, mu=mu, last_violation=viol, al_rounds=rounds, regularization=reg, qdd_init=qdd,
        max_iterations=4))
    r = trajopt.ddp(blocked, max_iterations=4)
    costs_handed = list(np.asarray(r.history.cost[:4]))
    for calls in range(50):
        if int(r.status) != ITERATION_LIMIT:
            break
        qdd = r.qdd if calls % 2 == 0 else jnp.full_like(r.qdd, jnp.nan)
        r = handed(r.u, r.x, r.multipliers, r.penalty, r.update_violation, r.al_rounds,
                   r.history.regularization[int(r.iterations) - 1], qdd)
        costs_handed += list(np.asarray(r.history.cost[: int(r.iterations)]))
    assert bool(r.converged), r.reason()
    assert_close(np.asarray(costs_handed), np.asarray(costs), rtol=1e-10)
    with pytest.raises(ValueError, match="qdd_init"):
        trajopt.ddp(blocked, qdd_init=jnp.zeros((T + 1, 2)))
    goals = goal + jnp.array([[0.0, 0.0, 0.0], [-0.03, 0.03, 0.0]])
    many = trajopt.solve_many(blocked, {"goal": goals}, slots=1, round_iterations=4)
    single = jaxarm.jit(lambda g: trajopt.ddp(blocked.replace(params={"goal": g})))
    for i in range(2):
        s = single(goals[i])
        assert bool(many.converged[i]) and int(many.iterations[i]) == int(s.iterations)
        assert int(many.al_rounds[i]) == int(s.al_rounds)
        assert_close(float(many.cost[i]), float(s.cost), rtol=1e-10)
    # al_iterations counts the updates over all rounds: two updates allowed, the constraint not met
    # by then, both stop as constraints not satisfied after as many iterations
    capped = trajopt.solve_many(blocked, {"goal": goals[:1]}, slots=1, round_iterations=4, al_iterations=2, mu=1e-3,
                                mu_growth=1.0)
    s = trajopt.ddp(blocked, al_iterations=2, mu=1e-3, mu_growth=1.0)
    assert int(s.status) == int(capped.status[0]) == INFEASIBLE, s.reason()
    assert int(capped.al_rounds[0]) == int(s.al_rounds) == 2
    assert int(capped.iterations[0]) == int(s.iterations)
    with pytest.raises(ValueError, match="al_rounds"):
        trajopt.ddp(blocked, al_rounds=1.5)
    with pytest.raises(ValueError, match="al_rounds"):
        trajopt.solve_many(blocked, {"goal": goals}, al_rounds=1)


def test_solve_many_batches_arms_durations_bounds_and_warm_starts(reach_solutions):
    """Problems differing in their arm (payloads: link masses scaled, jaxarm.stack_arms), their
    step and their input bounds, solved by solve_many and by one ddp solve each with the same
    fields: the same optima. The arms' shared leaves (kinematics, inertias of the links not
    scaled) stay constants of the program, and report says which leaves vary. Warm-started from
    the solutions (u_init, x_init), every problem converges at once. Bad batches are rejected."""
    arm, problem, goal, _, _, _ = reach_solutions
    masses = np.asarray(arm.links.mass)
    arms = [arm.replace(links=arm.links.replace(mass=masses * np.array([1.0, f]))) for f in (1.0, 1.4, 0.7)]
    stacked = jaxarm.stack_arms(arms)
    dts = np.array([DT, 0.06, 0.045])
    upper = np.array([TORQUE_LIMITS, TORQUE_LIMITS * 1.5, TORQUE_LIMITS])
    stats = []
    many = trajopt.solve_many(problem, arm=stacked, dt=dts, lower=-upper, upper=upper, slots=2, round_iterations=8,
                              report=stats.append)
    assert stats[0]["batched"] == ["arm", "dt", "lower", "upper"]
    assert any("mass" in leaf for leaf in stats[0]["arm_leaves_varying"])
    assert len(stats[0]["arm_leaves_varying"]) < len(jax.tree_util.tree_leaves(arm)) // 2
    one = jaxarm.jit(lambda a, dt, hi: trajopt.ddp(problem.replace(arm=a, dt=dt, lower=-hi, upper=hi)))
    for i in range(3):
        r = one(arms[i], dts[i], upper[i])
        assert bool(r.converged) and bool(many.converged[i]), (i, r.reason(), int(many.status[i]))
        assert_close(float(many.cost[i]), float(r.cost), rtol=1e-6)
        assert np.all(np.abs(np.asarray(many.u[i])) <= upper[i] + 1e-12)
    assert not np.isclose(float(many.cost[0]), float(many.cost[1]), rtol=1e-3)  # the fields did change the problems
    warm = trajopt.solve_many(problem, arm=stacked, dt=dts, lower=-upper, upper=upper, u_init=many.u, x_init=many.x,
                              slots=2, round_iterations=8)
    assert np.all(np.asarray(warm.converged)) and np.all(np.asarray(warm.iterations) <= 2)
    assert_close(np.asarray(warm.cost), np.asarray(many.cost), rtol=1e-8)
    # a batch of equal arms: nothing of the arm is data, every problem the same one
    same = trajopt.solve_many(problem, arm=jaxarm.stack_arms([arm, arm]), report=stats.append)
    assert stats[-1]["arm_leaves_varying"] == [] and np.all(np.asarray(same.converged))
    assert_close(np.asarray(same.cost), float(one(arm, DT, TORQUE_LIMITS).cost), rtol=1e-6)
    with pytest.raises(ValueError, match="stack_arms"):
        trajopt.solve_many(problem, arm=[arm, arm])
    with pytest.raises(ValueError, match="nothing to batch"):
        trajopt.solve_many(problem)
    with pytest.raises(ValueError, match="dt"):
        trajopt.solve_many(problem, dt=np.array([DT, -DT]))
    with pytest.raises(ValueError, match="lower, upper"):
        trajopt.solve_many(problem, lower=upper, upper=-upper)
    with pytest.raises(ValueError, match="arm"):
        trajopt.solve_many(problem, {"goal": np.stack([goal] * 2)}, arm=stacked)  # N = 2 against 3 arms
    with pytest.raises(ValueError, match="u_init"):
        trajopt.solve_many(problem, dt=dts, u_init=np.zeros((3, T + 1, 2)))
    with pytest.raises(ValueError, match="x_init"):
        trajopt.solve_many(problem, dt=dts, x_init=np.full((3, T + 1, 4), np.nan))


def test_iteration_limit_is_reported_with_advice(solve):
    arm = two_link()
    problem, _ = reach_ocp(arm)
    res = jaxarm.jit(lambda p: trajopt.ddp(p, max_iterations=2))(problem)
    assert not bool(res.converged)
    assert int(res.status) == 1
    text = res.reason()
    assert "iteration limit" in text and "max_iterations" in text


# --------------------------------------------------------------------------- errors before compile


def test_bad_problems_get_one_clear_error():
    arm = two_link()
    goal = jnp.zeros(3)
    with pytest.raises(ValueError, match="term 'running': a cost must return a scalar, got shape \\(2,\\)"):
        trajopt.ocp(arm, Q0, T, DT, running=lambda x, u, k, p: u)
    with pytest.raises(KeyError, match="names params\\['goal'\\]"):
        trajopt.ocp(arm, Q0, T, DT, costs=terms.tool_position("goal"))
    with pytest.raises(ValueError, match="input bounds are infeasible at joint 2"):
        trajopt.ocp(arm, Q0, T, DT, costs=terms.effort(), lower=[-1.0, 2.0], upper=[1.0, 1.0])
    with pytest.raises(ValueError, match="T: expected a whole number"):
        trajopt.ocp(arm, Q0, 0, DT, costs=terms.effort())
    with pytest.raises(ValueError, match="q0: expected"):
        trajopt.ocp(arm, jnp.zeros(3), T, DT, costs=terms.effort())
    with pytest.raises(ValueError, match="not a knot"):
        trajopt.ocp(arm, Q0, T, DT, costs=terms.tool_position(goal, when=(0.123,)))
    with pytest.raises(ValueError, match="weight: expected non-negative"):
        terms.tool_position(goal, -1.0)
    with pytest.raises(ValueError, match="is a constraint"):
        trajopt.ocp(arm, Q0, T, DT, costs=terms.keep_out_sphere(goal, 0.1))
    with pytest.raises(ValueError, match="no cost"):
        trajopt.ocp(arm, Q0, T, DT)
    problem = trajopt.ocp(arm, Q0, T, DT, costs=terms.effort())
    with pytest.raises(ValueError, match=f"u_init: expected shape \\({T}, 2\\)"):
        trajopt.ddp(problem, jnp.zeros((T + 1, 2)))
    with pytest.raises(ValueError, match="x_init: expected shape"):
        trajopt.ddp(problem, None, jnp.zeros((T, 4)))


def test_replace_with_new_values_of_the_same_shapes_traces_the_terms_once():
    """An MPC loop replaces the targets every control step: the terms are traced (checked) once per
    shapes, and new shapes are checked again, with the same clear errors."""
    arm = two_link()
    traced = []

    def tracking(arm, x, u, k, p):
        traced.append(k)
        return jaxarm.tool_pose(arm, x[: arm.n])[:3, 3] - p["targets"][k]

    costs = terms.residual(tracking, when="path", uses_input=False, name="tracking") + terms.effort()
    problem = trajopt.ocp(arm, Q0, T, DT, costs=costs, params={"targets": jnp.zeros((T + 1, 3))})
    after_build = len(traced)
    assert after_build >= 1
    for i in range(3):
        moved = problem.replace(params={"targets": jnp.full((T + 1, 3), 0.1 * i)})
        assert_close(moved.params["targets"], 0.1 * i)
    assert len(traced) == after_build
    problem.replace(x0=jnp.ones(4), dt=0.02)  # new values, same shapes
    assert len(traced) == after_build
    with pytest.raises(ValueError, match="term 'tracking' fails when evaluated at a knot"):
        problem.replace(params={"targets": jnp.zeros((T + 1, 2))})  # new shapes: checked again
    assert len(traced) > after_build
    with pytest.raises(ValueError, match="x0: expected shape \\(4,\\)"):
        problem.replace(x0=jnp.zeros(3))


def test_terms_compose_by_addition_and_via_points_land_on_knots():
    goal = jnp.array([0.5, 0.5, 0.0])
    total = terms.effort() + terms.tool_position(goal) + (terms.joint_velocity() + terms.tool_position(goal, when=(0.5,)))
    assert [t.name for t in total] == ["effort", "tool_position", "joint_velocity", "tool_position"]
    problem = trajopt.ocp(two_link(), Q0, T, DT, costs=total)
    via = problem.costs[3].schedule
    assert np.flatnonzero(np.asarray(via)).tolist() == [10]
    path = problem.costs[0]
    assert path.integrated and not problem.costs[3].integrated
    assert np.allclose(np.asarray(path.schedule)[:T], 1.0) and float(path.schedule[T]) == 0.0  # times dt when evaluated


def test_a_new_dt_rescales_the_path_costs_with_the_dynamics():
    """problem.replace(dt=...) (or a vmap over dt: a duration sweep with a fixed knot count) is the
    problem built with that dt: the same total cost for the same trajectory."""
    arm = two_link()
    costs = terms.effort(0.3) + terms.tool_position(jnp.array([0.5, 0.5, 0.0]), 10.0) + terms.joint_velocity(0.5, when="path")
    short = trajopt.ocp(arm, Q0, T, DT, costs=costs)
    longer = trajopt.ocp(arm, Q0, T, 2 * DT, costs=costs)
    rng = np.random.default_rng(1)
    x, u = jnp.asarray(rng.normal(size=(T + 1, 4))), jnp.asarray(rng.normal(size=(T, 2)))
    moved = short.replace(dt=jnp.asarray(2 * DT))
    assert float(trajopt.total_cost(moved, x, u)) == pytest.approx(float(trajopt.total_cost(longer, x, u)), rel=1e-14)
    assert float(trajopt.total_cost(moved, x, u)) != pytest.approx(float(trajopt.total_cost(short, x, u)), rel=1e-3)
    sweep = jax.vmap(lambda dt: trajopt.total_cost(short.replace(dt=dt), x, u))(jnp.asarray([DT, 2 * DT]))
    assert_close(sweep, [trajopt.total_cost(short, x, u), trajopt.total_cost(longer, x, u)], rtol=1e-14)


# --------------------------------------------------------------------------- receding horizon


def test_mpc_closes_the_loop_on_a_heavier_arm_than_it_plans_on():
    """Plan on the nominal two-link arm, simulate one with a 0.3 kg payload it does not know of:
    replanning from each measured state brings the tool near the goal and keeps it there (a small
    offset remains: no integral action), where replaying the first plan open loop misses by far.
    The goal is one the arm can hold against gravity within its torque limits (the reach goal of
    the tests above is not: there the best any controller can do is pass through it)."""
    arm = two_link()
    true_arm = arm.with_payload(0.3)
    q_goal = jnp.array([-1.45, 0.35])
    assert np.all(np.abs(np.asarray(jaxarm.gravity_torques(true_arm, q_goal))) < 0.8 * TORQUE_LIMITS)
    goal = jaxarm.tool_pose(arm, q_goal)[:3, 3]
    costs = (terms.effort(1.0 / TORQUE_LIMITS**2) + terms.tool_position("goal", 300.0, when="path")
             + terms.tool_position("goal", 300.0) + terms.joint_velocity(3.0))
    problem = trajopt.ocp(arm, Q0, T, DT, costs=costs, params={"goal": goal})
    step = jaxarm.jit(trajopt.mpc_step)
    first = jaxarm.jit(trajopt.ddp)(problem)
    x, plan = problem.x0, first
    for k in range(2 * T):
        plan = step(problem, x, plan)
        assert bool(plan.converged), plan.reason()
        u = plan.u[0]
        assert np.all(np.abs(np.asarray(u)) <= TORQUE_LIMITS + 1e-12)
        traj = jaxarm.rollout(true_arm, x[:2], x[2:], u[None], DT, saturate=False)
        x = jnp.concatenate([traj.q[-1], traj.qd[-1]])
    tip = lambda q: jaxarm.tool_pose(arm, q)[:3, 3]  # noqa: E731
    open_loop = jaxarm.rollout(true_arm, Q0, jnp.zeros(2), first.u, DT, saturate=False)
    miss_open = float(jnp.linalg.norm(tip(open_loop.q[-1]) - goal))
    miss_mpc = float(jnp.linalg.norm(tip(x[:2]) - goal))
    assert miss_open > 0.1
    assert miss_mpc < 0.02
    with pytest.raises(ValueError, match="mpc_step: x: expected the measured state"):
        trajopt.mpc_step(problem, jnp.zeros(3))


def test_mpc_step_in_a_plain_python_loop_compiles_its_step_once(reach_solutions):
    """mpc_step called eagerly keeps its compiled step (params, measured state and plan its
    arguments): after the first step and the first with a plan, a control loop compiles nothing,
    and each step equals the step jitted by hand."""
    from tests.test_recompiles import count_compiles

    arm, problem, goal, *_ = reach_solutions
    by_hand = jaxarm.jit(lambda params, x, plan: trajopt.mpc_step(problem.replace(params=params), x, plan, max_iterations=2))
    plan = trajopt.mpc_step(problem, problem.x0, max_iterations=2)
    plan = trajopt.mpc_step(problem, plan.x[1], plan, max_iterations=2)
    jax.block_until_ready(plan.u)
    compiles = 0
    for k in range(3):
        moved = problem.replace(params={"goal": goal + 0.01 * k})
        x = plan.x[1]
        with count_compiles() as events:
            new = trajopt.mpc_step(moved, x, plan, max_iterations=2)
            jax.block_until_ready(new.u)
        compiles += len(events)
        reference = by_hand(moved.params, x, plan)
        plan = new
    assert compiles == 0, f"{compiles} new compiles"
    assert_close(np.asarray(plan.u), np.asarray(reference.u), rtol=0, atol=1e-12)


def test_mpc_with_one_iteration_a_step_updates_the_multipliers_of_its_constraints_every_step(reach_solutions):
    """Receding-horizon control of the keep-out-sphere reach with one DDP iteration per control
    step (the real-time iteration scheme): no step converges, yet every step ends with a multiplier
    update (mpc_step's update_at_limit), so the sphere's multipliers grow and the closed loop stays
    outside it. With updates only after converged rounds (ddp's default) the multipliers would
    never move at all."""
    arm, _, goal, free, _, _ = reach_solutions
    tool = jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(free.q)
    center, radius = tool[T // 2], 0.12
    blocked = trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), params={"goal": goal},
                          constraints=terms.keep_out_sphere(center, radius))
    start = trajopt.ddp(blocked, max_iterations=3)
    for update in (True, False):
        step = jaxarm.jit(lambda x, plan: trajopt.mpc_step(blocked, x, plan, max_iterations=1,
                                                           **({} if update else {"update_at_limit": False})))
        x, plan, distance, largest = blocked.x0, start, np.inf, 0.0
        for _ in range(T):
            plan = step(x, plan)
            traj = jaxarm.rollout(arm, x[:2], x[2:], plan.u[0][None], DT, saturate=False)
            x = jnp.concatenate([traj.q[-1], traj.qd[-1]])
            distance = min(distance, float(jnp.linalg.norm(jaxarm.tool_pose(arm, x[:2])[:3, 3] - center)))
            largest = max(largest, float(jnp.max(plan.multipliers)))
        if update:
            assert largest > 0.1 and distance >= radius, (largest, distance)
        else:
            assert largest == 0.0


def test_reach_problem_written_as_terms_has_the_same_objective():
    arm = two_link()
    goal = jaxarm.tool_pose(arm, Q0)[:3, 3] + jnp.array([0.3, 0.3, 0.0])
    R = jnp.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    reach = trajopt.reach_problem(arm, Q0, goal, DT, position=300.0, velocity=3.0, orientation=2.0,
                                  target_rotation=R, path_position=5.0)
    problem = trajopt.reach_ocp(arm, reach, T)
    u = jax.random.normal(jax.random.PRNGKey(0), (T, 2)) * 3.0
    traj = jaxarm.rollout(arm, Q0, jnp.zeros(2), u, DT, saturate=False)
    x = jnp.concatenate([traj.q, traj.qd], axis=1)
    expected = float(trajopt.trajectory_cost(arm, reach, traj.q, traj.qd, u))
    assert float(trajopt.total_cost(problem, x, u)) == pytest.approx(expected, rel=1e-12)
    # the input smoothness is the input-rate term
    smooth = reach._replace(smoothness=jnp.asarray(0.7))
    expected = float(trajopt.trajectory_cost(arm, smooth, traj.q, traj.qd, u))
    assert float(trajopt.total_cost(trajopt.reach_ocp(arm, smooth, T), x, u)) == pytest.approx(expected, rel=1e-12)



def test_geometric_terms_measure_what_they_say():
    """Signed distances, the tool speed and the tool axis against direct computations."""
    arm = two_link()
    q, qd = jnp.array([0.3, -0.7]), jnp.array([0.5, 1.2])
    x, u = jnp.concatenate([q, qd]), jnp.zeros(2)
    frames, tool = jaxarm.forward_kinematics(arm, q)
    center = jnp.array([0.4, 0.9, 0.1])

    def value(term):
        return np.asarray(term.fn(arm, x, u, 0, term.values({}), {}))

    p = np.asarray(tool[:3, 3])
    assert value(terms.keep_out_sphere(center, 0.2, margin=0.05)) == pytest.approx(0.25 - np.linalg.norm(p - center), abs=1e-12)
    # link 2's segment from its origin to the tool point, (0, 0, 0) to (0.5, 0, 0) in its frame
    a, b = np.asarray(frames[2][:3, 3]), np.asarray(frames[2][:3, :3] @ np.array([0.5, 0.0, 0.0]) + frames[2][:3, 3])
    s = np.clip(np.dot(center - a, b - a) / np.dot(b - a, b - a), 0, 1)
    expected = 0.2 - np.linalg.norm(a + s * (b - a) - center)
    assert value(terms.keep_out_capsule(2, (0, 0, 0), (0.5, 0, 0), center, 0.2)) == pytest.approx(expected, abs=1e-12)
    v = np.asarray(jaxarm.jacobian(arm, q)[:3] @ qd)
    assert value(terms.tool_speed_limit(2.0)) == pytest.approx(np.sum(v**2) / 4.0 - 1.0, rel=1e-12)
    axis_res = value(terms.tool_axis((1.0, 0.0, 0.0), (0.0, 1.0, 0.0)))
    assert axis_res == pytest.approx(np.asarray(tool[:3, 0]) - np.array([0.0, 1.0, 0.0]), abs=1e-12)


@pytest.mark.parametrize("method", ["semi_implicit_euler", "rk3"])
def test_a_float32_arm_makes_a_float32_problem_that_converges_with_the_default_tolerances(reach_solutions, method):
    """arm.astype(float32) with x64 enabled: the problem, the solve and its result are float32
    throughout (goal and weights given in float64 included), it converges with ddp's defaults (the
    gap tolerance follows the precision: a full step's rounding leaves gaps near 1e-6, which 1e-9
    would never accept) and lands on float64's optimum to float32's resolution."""
    arm, _, goal, _, _, _ = reach_solutions
    low = arm.astype(jnp.float32)
    problem = trajopt.ocp(low, Q0, T, DT, costs=reach_costs(low), params={"goal": goal}, method=method)
    assert problem.x0.dtype == jnp.float32
    r = jaxarm.jit(trajopt.ddp)(problem)
    assert bool(r.converged), r.reason()
    assert all(a.dtype == jnp.float32 for a in (r.x, r.u, r.qdd, r.cost, r.multipliers))
    reference = jaxarm.jit(trajopt.ddp)(trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), params={"goal": goal}, method=method))
    assert bool(reference.converged) and reference.x.dtype == jnp.float64, reference.reason()
    assert float(r.cost) == pytest.approx(float(reference.cost), rel=1e-5)
    assert float(jnp.max(jnp.abs(r.q - reference.q))) < 1e-3
    assert float(jnp.max(jnp.abs(r.q - reference.q))) > 0  # really computed in float32
    from jaxarm.control.trajopt.solvers.ddp import default_tol_gap
    assert default_tol_gap(jnp.float64) == 1e-9 and default_tol_gap(jnp.float32) == pytest.approx(1.19e-5, rel=1e-2)


def test_a_float32_problems_solution_differentiates_in_float32_to_float64s_gradient(reach_solutions):
    """jax.grad through ddp on a float32 problem (its weights given in float64): the gradient with
    respect to a float32 goal is float32 (the reported cost's derivative is taken in the problem's
    precision; a float64 tangent was a TypeError) and equals float64's to float32's resolution."""
    arm, _, goal, _, _, _ = reach_solutions

    def gradient(arm, tol):
        def loss(g):
            r = trajopt.ddp(trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), params={"goal": g}), tol=tol)
            return r.cost + jnp.sum(r.u[:, 1])
        return jaxarm.jit(jax.grad(loss))(goal.astype(arm.links.mass.dtype))

    low, high = gradient(arm.astype(jnp.float32), 1e-6), gradient(arm, 1e-10)
    assert low.dtype == jnp.float32 and high.dtype == jnp.float64
    assert np.all(np.isfinite(np.asarray(low)))
    assert_close(np.asarray(low, float), np.asarray(high), atol=1e-2 * float(jnp.max(jnp.abs(high))))
    assert float(jnp.max(jnp.abs(high))) > 1.0  # not trivial


@pytest.mark.parametrize("method", ["semi_implicit_euler", "rk3"])
def test_the_reported_accelerations_are_the_forward_dynamics_at_the_knots_and_differentiate_so(method):
    """OCPResult.qdd comes from the solver's rollout; it equals the forward dynamics at every
    knot, and its derivative with respect to the goal (through the solution's implicit
    gradients) equals that of the forward dynamics evaluated at the differentiated solution."""
    arm = two_link()
    problem, goal = reach_ocp(arm, method=method)
    solve = jaxarm.jit(lambda g: trajopt.ddp(problem.replace(params={"goal": g})))
    r = solve(goal)
    assert bool(r.converged), r.reason()
    fd = jax.vmap(lambda q, qd, u: jaxarm.forward_dynamics(arm, q, qd, u))(r.q[:-1], r.qd[:-1], r.u)
    assert_close(np.asarray(r.qdd), np.asarray(fd), rtol=1e-12, atol=1e-12)
    assert float(jnp.max(jnp.abs(fd))) > 1.0
    w = jnp.asarray(np.random.default_rng(0).standard_normal((T, 2)))
    reported = jax.grad(lambda g: jnp.sum(w * solve(g).qdd))(goal)
    recomputed = jax.grad(lambda g: jnp.sum(w * jax.vmap(lambda q, qd, u: jaxarm.forward_dynamics(arm, q, qd, u))(
        solve(g).q[:-1], solve(g).qd[:-1], solve(g).u)))(goal)
    assert_close(np.asarray(reported), np.asarray(recomputed), rtol=1e-8, atol=1e-10)
    assert float(jnp.linalg.norm(reported)) > 1e-3


def test_total_cost_is_differentiable_with_respect_to_params():
    arm = two_link()
    problem, goal = reach_ocp(arm)
    u = jnp.ones((T, 2))
    traj = jaxarm.rollout(arm, Q0, jnp.zeros(2), u, DT, saturate=False)
    x = jnp.concatenate([traj.q, traj.qd], axis=1)
    cost = lambda g: trajopt.total_cost(problem.replace(params={"goal": g}), x, u)  # noqa: E731
    grad = np.asarray(jax.grad(cost)(goal))
    h = 1e-6
    fd = np.array([(cost(goal.at[i].add(h)) - cost(goal.at[i].add(-h))) / (2 * h) for i in range(3)])
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
    assert np.linalg.norm(grad) > 1.0


@pytest.mark.parametrize("method,input", [("rk3", "torque"), ("rk4", "voltage"), ("euler", "torque"),
                                          ("semi_implicit_euler", "voltage"), (integrators.euler, "torque")])
def test_step_jacobians_equal_forward_mode_through_the_step(method, input):
    """The solvers' A_k, B_k (stages in a loop, accelerations' Jacobians from inverse dynamics and
    M^-1) against jax.jacfwd of the very step the rollout takes, on an arm with a prismatic joint,
    drives, smooth Coulomb friction and (for voltage input) the motor model."""
    import importlib

    from tests.helpers import random_arm

    ocp_module = importlib.import_module("jaxarm.control.step_jacobians")
    arm = random_arm(5, "RRPR", drives=True, payload=True)
    drives = dataclasses.replace(arm.drives, coulomb_velocity_scale=np.full(arm.n, 0.05))
    arm = arm.replace(drives=drives)
    if input == "voltage":
        if not np.all(np.asarray(arm.drives.torque_constant) > 0):
            pytest.skip("random arm without a motor model")
    rng = np.random.default_rng(0)
    n, T, dt = arm.n, 4, 0.01
    xs = jnp.asarray(rng.uniform(-1, 1, (T, 2 * n)))
    us = jnp.asarray(rng.uniform(-3, 3, (T, n)))
    # jaxarm.jit: under XLA:CPU's default options the reference below compiles for minutes
    y, A, B = jaxarm.jit(ocp_module._step_jacobians, static_argnums=(4, 5))(arm, xs, us, dt, method, input)

    def step(x, u):
        return ocp_module._step(arm, x, u, dt, method, input)

    y_ref, (A_ref, B_ref) = jaxarm.jit(jax.vmap(lambda x, u: (step(x, u), jax.jacfwd(step, (0, 1))(x, u))))(xs, us)
    assert_close(y, y_ref, rtol=1e-13, atol=1e-13)
    assert_close(A, A_ref, rtol=1e-9, atol=1e-11)
    assert_close(B, B_ref, rtol=1e-9, atol=1e-11)
    assert np.abs(np.asarray(A) - np.eye(2 * n)).max() > 1e-3 and np.abs(np.asarray(B)).max() > 1e-6  # not trivial
    if isinstance(method, str):
        # given the accelerations a rollout of the same steps found (the knots', or every stage's),
        # as the solvers' line search hands them on: the same step and Jacobians
        acc = jax.vmap(lambda x, u: ocp_module._step_accel(arm, x[:n], x[n:], u, dt, method, input, stages=True)[2])(xs, us)
        assert acc.shape == ((T, n) if "euler" in method else (T, 3 if method == "rk3" else 4, n))
        y2, A2, B2 = jaxarm.jit(functools.partial(ocp_module._step_jacobians, qdd=acc), static_argnums=(4, 5))(
            arm, xs, us, dt, method, input)
        assert_close(y2, y, rtol=1e-13, atol=1e-13)
        assert_close(A2, A, rtol=1e-11, atol=1e-12)
        assert_close(B2, B, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("method,input", [("rk3", "torque"), ("rk4", "voltage"), ("euler", "torque"),
                                          ("semi_implicit_euler", "torque")])
def test_hand_written_step_adjoint_equals_reverse_mode_through_the_step(method, input):
    """The implicit gradients' derivative of the integrator step with respect to the problem's data
    (adjoint of the stages, one reverse pass through Newton-Euler, dt summed by hand) against
    jax.grad through the very step, with respect to every array of the problem (the arm's links,
    drives, friction, payload and kinematics, dt), on a two-joint arm with drives and friction."""
    from jaxarm.control.step_jacobians import _step
    from jaxarm.control.trajopt.ocp import solver_arm
    from jaxarm.control.trajopt.solvers.implicit import _dynamics_data_vjp
    from tests.helpers import random_arm

    arm = random_arm(5, "RP", drives=True, payload=True)
    arm = arm.replace(drives=dataclasses.replace(arm.drives, coulomb_velocity_scale=np.full(arm.n, 0.05)))
    if input == "voltage" and not np.all(np.asarray(arm.drives.torque_constant) > 0):
        pytest.skip("random arm without a motor model")
    problem = trajopt.ocp(arm, jnp.array([0.3, 0.1]), 2, 0.01, costs=terms.effort(), method=method, input=input,
                          joint_limits=False)
    rng = np.random.default_rng(1)
    zs = jnp.asarray(rng.uniform(-1, 1, (3, 3 * arm.n)))
    ws = jnp.asarray(rng.normal(size=(3, 2 * arm.n)))

    def through_the_step(p):
        a = solver_arm(p)
        F = jax.vmap(lambda z: _step(a, z[: 2 * arm.n], z[2 * arm.n:], p.dt, p.method, p.input))(zs)
        return jnp.sum(ws * F)

    by_hand = jax.jit(jax.grad(lambda p: _dynamics_data_vjp(problem, zs, ws)(p)))(problem)
    reference = jax.jit(jax.grad(through_the_step))(problem)
    leaves, ref_leaves = jax.tree_util.tree_leaves(by_hand), jax.tree_util.tree_leaves(reference)
    assert len(leaves) == len(ref_leaves)
    for a, b in zip(leaves, ref_leaves):
        assert_close(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
    assert abs(float(reference.dt)) > 1e-3 and np.abs(np.asarray(reference.arm.links.mass)).max() > 1e-6  # not trivial


def test_crocoddyl_comparison_skips_cleanly_without_its_environment(tmp_path, capsys):
    """experiments/trajopt_crocoddyl.py runs Crocoddyl in its own environment; without one it says
    so in one JSON line and exits 0 (no traceback, nothing solved)."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "trajopt_crocoddyl.py"
    spec = importlib.util.spec_from_file_location("trajopt_crocoddyl", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--crocoddyl-python", str(tmp_path / "missing" / "python")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "machine" in lines[0] and lines[-1]["quantity"] == "skipped" and "--setup" in lines[-1]["reason"]


# --------------------------------------------------------------------------- implicit gradients


def test_gradients_of_the_solution_match_finite_differences_with_an_active_obstacle_and_clamped_inputs(reach_solutions):
    """Gradients of a loss of the optimal trajectory with respect to the problem's data (params,
    start state, bounds, dt, an arm's mass) by the implicit function theorem at the optimum, against
    central differences of tightly converged solves. The obstacle is active at one knot and some
    inputs sit on the torque limit, so every part of the adjoint system is exercised."""
    arm, _, goal, free, _, _ = reach_solutions
    tool = jax.vmap(lambda q: jaxarm.tool_pose(arm, q)[:3, 3])(free.q)
    centre = tool[T // 2] + jnp.array([0.02, -0.01, 0.0])
    problem = trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), constraints=terms.keep_out_sphere("centre", 0.1),
                          params={"goal": goal, "centre": centre})
    options = dict(tol=1e-13, tol_violation=1e-11, max_iterations=300, al_iterations=40, mu_max=1e10)
    weights = jnp.arange(T * 2, dtype=float).reshape(T, 2) / T

    def loss(p):
        r = trajopt.ddp(p, **options)
        return jnp.sum(weights * r.u) + 10.0 * jnp.sum(r.x[-5:, :2] ** 2) + r.cost, r

    value = jaxarm.jit(loss)
    _, res = value(problem)
    assert bool(res.converged), res.reason()
    lam = np.asarray(res.multipliers)[:, -1]
    assert lam.max() > 0.1  # the obstacle pushes the path
    clamped = np.asarray((res.u == problem.lower) | (res.u == problem.upper))
    assert clamped.any() and not clamped.all()
    grad = jaxarm.jit(jax.grad(lambda p: loss(p)[0]))(problem)


    def with_param(name):
        return lambda p, v: p.replace(params={**p.params, name: jnp.asarray(v)})

    def with_mass(p, v):
        return p.replace(arm=p.arm.replace(links=dataclasses.replace(p.arm.links, mass=jnp.asarray(v))))

    cases = [
        ("goal", lambda p: p.params["goal"][:2], lambda p, v: with_param("goal")(p, jnp.concatenate([v, p.params["goal"][2:]])),
         grad.params["goal"][:2], 1e-5),
        ("centre", lambda p: p.params["centre"][:2], lambda p, v: with_param("centre")(p, jnp.concatenate([v, p.params["centre"][2:]])),
         grad.params["centre"][:2], 1e-5),
        ("x0", lambda p: p.x0, lambda p, v: p.replace(x0=jnp.asarray(v)), grad.x0, 1e-5),
        ("upper", lambda p: p.upper, lambda p, v: p.replace(upper=jnp.asarray(v)), grad.upper, 1e-5),
        ("dt", lambda p: p.dt, lambda p, v: p.replace(dt=jnp.asarray(v)), grad.dt, 1e-6),
        ("mass", lambda p: p.arm.links.mass, with_mass, grad.arm.links.mass, 1e-5),
    ]
    for name, get, put, g, h in cases:
        fd = central_differences(value, problem, get, put, h)
        g = np.asarray(g)
        assert np.max(np.abs(g - fd)) <= 1e-4 * max(np.max(np.abs(fd)), 1.0), (name, g, fd)
    assert np.max(np.abs(np.asarray(grad.params["centre"]))) > 100.0  # the active obstacle matters
    assert np.asarray(grad.upper)[0] < -1.0  # so does the clamped torque limit


def test_the_adjoint_systems_riccati_solve_equals_the_dense_kkt_solution():
    """The implicit gradients' adjoint system, solved knot after knot (a Riccati recursion, the
    active constraints by Uzawa's iteration), against the same linear-quadratic problem reduced to
    its inputs and its KKT system solved densely by NumPy: random dynamics, positive definite knot
    Hessians, an input-rate term, inputs held at their bounds and active constraints on states and
    inputs. Uzawa's penalty, from recursions, against its definition on the dense matrices."""
    from jaxarm.control.trajopt.solvers import implicit

    rng = np.random.default_rng(3)
    T, n, m = 7, 2, 2
    nx, N = 2 * n, T * n
    A = np.eye(nx) + 0.3 * rng.normal(size=(T, nx, nx))
    B = rng.normal(size=(T, nx, n))
    R = rng.normal(size=(T + 1, 3 * n, 3 * n))
    Q = R @ np.swapaxes(R, 1, 2) / (3 * n) + 0.1 * np.eye(3 * n)
    free = np.ones((T, n))
    free[2, 0] = free[5, 1] = 0.0
    c_rate = rng.uniform(0.1, 1.0, (T, n))
    active = np.zeros((T + 1, m), bool)
    active[[1, 3, 4, T], [0, 1, 0, 1]] = True
    C = np.where(active[:, :, None], rng.normal(size=(T + 1, m, 3 * n)), 0.0)
    C[T, :, nx:] = 0.0
    x_bar, u_bar = rng.normal(size=(T + 1, nx)), rng.normal(size=(T, n))
    dz, omega = implicit._adjoint_solve(*(jnp.asarray(a) for a in (Q, A, B, C, free, c_rate, active, x_bar, u_bar)))

    # the dense reduction: dz_k = Phi_k v, Phi_k = (S_k, E_k), S_{k+1} = A_k S_k + B_k E_k
    E = np.concatenate([np.eye(N).reshape(T, n, N), np.zeros((1, n, N))])
    S = [np.zeros((nx, N))]
    for k in range(T):
        S.append(A[k] @ S[k] + B[k] @ E[k])
    Phi = np.concatenate([np.stack(S), E], axis=1)
    H = np.einsum("kai,kab,kbj->ij", Phi, Q, Phi)
    D = np.zeros((N, N))  # the rate term, sum_k c_k (du_k - du_{k-1})^2 / 2 (du_{-1} = 0)
    for k in range(T):
        d = np.zeros((n, N))
        d[:, k * n:(k + 1) * n] = np.eye(n)
        if k:
            d[:, (k - 1) * n:k * n] = -np.eye(n)
        D += d.T @ (c_rate[k][:, None] * d)
    H = H + D
    b = np.einsum("kai,ka->i", Phi, np.concatenate([x_bar, np.concatenate([u_bar, np.zeros((1, n))])], axis=1))
    G = np.einsum("kma,kai->kmi", C, Phi).reshape(-1, N)
    rows, f = np.flatnonzero(active.reshape(-1)), np.flatnonzero(free.reshape(-1))
    kkt = np.block([[H[np.ix_(f, f)], G[np.ix_(rows, f)].T], [G[np.ix_(rows, f)], np.zeros((rows.size, rows.size))]])
    sol = np.linalg.solve(kkt, np.concatenate([b[f], np.zeros(rows.size)]))
    v = np.zeros(N)
    v[f] = sol[:f.size]
    assert_close(np.asarray(dz), np.einsum("kai,i->ka", Phi, v), rtol=1e-9, atol=1e-10)
    assert_close(np.asarray(omega).reshape(-1)[rows], sol[f.size:], rtol=1e-9, atol=1e-10)
    assert np.all(np.asarray(omega)[~active] == 0.0) and np.all(np.asarray(dz)[:T, nx:][free == 0] == 0.0)
    assert np.abs(sol[f.size:]).max() > 0.1  # the constraints matter

    rho = implicit._penalty(*(jnp.asarray(a) for a in (Q, A, B, C, free, c_rate, active)))
    Gf = np.where(free.reshape(-1)[None, :] > 0, G, 0.0)
    dense_rho = implicit.PENALTY * np.max(np.where(free.reshape(-1) > 0, np.abs(np.diag(H)), 1.0)) / np.max(np.sum(Gf**2, axis=1))
    assert float(rho) == pytest.approx(dense_rho, rel=1e-12)


def test_a_gradient_with_respect_to_data_the_step_does_not_read_leaves_the_dynamics_out(reach_solutions, monkeypatch):
    """Differentiating a solution with respect to params (goals, obstacle centres), the start state
    or the bounds only, the adjoint builds no derivative of the integrator step with respect to the
    data (the largest part of its program), and gives the same cotangents as the adjoint that
    differentiates every leaf; with respect to the arm or dt it does build it."""
    from jaxarm.control.trajopt.solvers import implicit

    arm, problem, goal, res, _, _ = reach_solutions
    leaves = jax.tree_util.tree_leaves(problem)
    names = [getattr(path[0], "name", None) for path, _ in jax.tree_util.tree_flatten_with_path(problem)[0]]
    floats = [jnp.issubdtype(jnp.result_type(a), jnp.inexact) for a in leaves]
    chosen = [f and name in ("params", "x0", "upper") for f, name in zip(floats, names)]
    assert any(chosen) and not implicit._dynamics_perturbed(problem, chosen)
    assert implicit._dynamics_perturbed(problem, [f and name == "dt" for f, name in zip(floats, names)])
    assert implicit._dynamics_perturbed(problem, [f and name == "arm" for f, name in zip(floats, names)])
    x_bar = jnp.zeros_like(res.x).at[-1, :2].set(1.0)
    u_bar = jnp.ones_like(res.u)
    built = []
    original = implicit._dynamics_data_vjp
    monkeypatch.setattr(implicit, "_dynamics_data_vjp", lambda *a: built.append(1) or original(*a))

    def vjp(perturbed):
        return jax.jit(lambda p: implicit.solution_vjp(p, res.x, res.u, res.multipliers, x_bar, u_bar, perturbed))(problem)

    some, every = vjp(chosen), vjp(None)
    assert len(built) == 1  # for the adjoint of every leaf only
    for name, a, b in ((("goal",), some.params["goal"], every.params["goal"]), ("x0", some.x0, every.x0),
                       ("upper", some.upper, every.upper)):
        assert_close(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12, err_msg=str(name))
    assert np.max(np.abs(np.asarray(every.params["goal"]))) > 1e-3  # not trivial
    assert float(jnp.max(jnp.abs(some.arm.links.mass))) == 0.0 and float(some.dt) == 0.0  # not computed


def test_gradients_of_the_solution_for_chosen_data_with_a_semi_implicit_euler_step(reach_solutions):
    """The same check for a semi-implicit Euler step (its own adjoint) and a gradient taken with
    respect to some of the data only (the goal, dt and the links' masses): the rest of the problem
    is not differentiated."""
    arm = reach_solutions[0]
    goal0 = reach_solutions[2]
    problem = trajopt.ocp(arm, Q0, T, DT, costs=reach_costs(arm), params={"goal": goal0}, method="semi_implicit_euler")
    options = dict(tol=1e-13, max_iterations=300)

    def loss(goal, dt, mass):
        p = problem.replace(params={"goal": goal}, dt=dt, arm=arm.replace(links=dataclasses.replace(arm.links, mass=mass)))
        r = trajopt.ddp(p, **options)
        return jnp.sum(r.x[-1, :2] ** 2) + jnp.sum(r.u[:, 1]) + r.cost, r

    value = jaxarm.jit(loss)
    args = (jnp.asarray(goal0), jnp.asarray(DT), jnp.asarray(arm.links.mass, float))
    _, res = value(*args)
    assert bool(res.converged), res.reason()
    gradient = jaxarm.jit(jax.grad(lambda *a: loss(*a)[0], argnums=(0, 1, 2)))
    grads = gradient(*args)
    for which, h in ((0, 1e-5), (1, 1e-7), (2, 1e-5)):
        base = np.asarray(args[which], float)
        fd = np.zeros(base.size)
        for i in range(base.size):
            e = np.zeros(base.size)
            e[i] = h
            e = e.reshape(base.shape)
            plus = [jnp.asarray(base + e) if j == which else a for j, a in enumerate(args)]
            minus = [jnp.asarray(base - e) if j == which else a for j, a in enumerate(args)]
            fd[i] = (float(value(*plus)[0]) - float(value(*minus)[0])) / (2 * h)
        g = np.asarray(grads[which], float).reshape(-1)
        assert np.max(np.abs(g - fd)) <= 1e-4 * max(np.max(np.abs(fd)), 1.0), (which, g, fd)
    # batched: jax.vmap of the gradient over goals equals one gradient at a time
    goals = jnp.stack([args[0], args[0] + jnp.array([-0.05, 0.05, 0.0])])
    batched = jaxarm.jit(jax.vmap(jax.grad(lambda g: loss(g, *args[1:])[0])))(goals)
    assert_close(np.asarray(batched[0]), np.asarray(grads[0]), rtol=1e-6, atol=1e-9)  # a batch iterates until its slowest member stops
    one = gradient(goals[1], *args[1:])[0]  # the compiled gradient above, at the second goal
    assert_close(np.asarray(batched[1]), np.asarray(one), rtol=1e-6, atol=1e-9)
