"""Trajectory optimization: gradients against finite differences, iLQR against the closed-form
solution of a linear-quadratic problem, shooting (augmented Lagrangian and squashed) and multiple
shooting against iLQR on two-link reaches with active torque limits, a batched shooting solve
against per-problem iLQR solves, and the warm start (IK, minimum-jerk path, inverse dynamics).

Kept cheap for CI: one problem shape (two links, T = 20 steps), each solver configuration compiled
once per module and shared through module-scoped fixtures (``compiled`` traces them one after
the other and runs each XLA compile in a pool of two threads as soon as it is lowered, with
LLVM optimization off). Shooting with the
augmented Lagrangian is only compiled batched (``jax.vmap`` over two arms and goals): its two
answers are checked against iLQR solves of the same problems (one compile for both), which checks
the batching and the agreement of the solvers at once.
"""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm import trajopt
from jaxarm.core.xla import compiler_options

from helpers import assert_close, count_primitive, while_loop_batchings

TORQUE_LIMITS = np.array([20.0, 8.0])  # joint 1's limit is active in the reach below (unlimited it needs ~23 N m)
T, DT = 20, 0.05


def _solver(name, **options):
    solver = {"shooting": trajopt.shooting, "multiple_shooting": trajopt.multiple_shooting, "ilqr": trajopt.ilqr}[name]
    return functools.partial(solver, **options)


def _compile_all(jobs):
    """{key: compiled} for jobs {key: (function, args)}: traced and lowered one after the other (in
    the order given: put the longest compiles first), each XLA compile (most of the time, and it
    releases the GIL) started in a pool of two threads as soon as its lowering is done."""
    # jaxarm's CPU options, and on CPU no LLVM optimization: compiles ~20 % shorter, runs (well
    # under a second each here) about 2x longer
    options = compiler_options()
    if jax.default_backend() == "cpu":
        options["xla_backend_optimization_level"] = 0
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(jax.jit(fn).lower(*args).compile, compiler_options=options)
                   for key, (fn, args) in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


def two_link(payload=0.0):
    arm = jaxarm.load_arm("two_link_planar")  # Craig 6.7, gravity along -y, in the x-y plane
    limits = dataclasses.replace(arm.limits, torque=TORQUE_LIMITS, velocity=np.array([10.0, 10.0]),
                                 position=np.array([[-np.pi, np.pi], [-np.pi, np.pi]]))
    arm = arm.replace(limits=limits)
    return arm.with_payload(payload) if payload else arm


def reach(arm, offset=(0.3, 0.3, 0.0), position=300.0, velocity=3.0, **weights):
    """Reach in T * DT = 1 s; both torque limits end up active. Moderate terminal weights keep the
    problem well enough conditioned for L-BFGS to finish in a few hundred iterations."""
    q0 = jnp.array([-1.2, 0.8])
    target = jaxarm.tool_pose(arm, q0)[:3, 3] + jnp.asarray(offset)
    return trajopt.reach_problem(arm, q0, target, DT, position=position, velocity=velocity, **weights)


def hold_start(arm, problem):
    return jnp.tile(jaxarm.gravity_torques(arm, problem.q0), (T, 1))


SHOOTING_AL = dict(torque_limits="augmented_lagrangian")
SHOOTING_SQUASH = dict(torque_limits="squash", max_iterations=2000)
MULTIPLE_SHOOTING = dict(torque_limits="augmented_lagrangian", segments=4)


def two_problems():
    """Two arms (payload 0 and 0.4 kg) with two different goals."""
    arms = [two_link(payload) for payload in (0.0, 0.4)]
    problems = [reach(a, offset) for a, offset in zip(arms, [(0.3, 0.3, 0.0), (0.2, 0.35, 0.0)])]
    return arms, problems


@pytest.fixture(scope="module")
def compiled():
    """Every solver configuration of this file, compiled once (in parallel)."""
    arms, problems = two_problems()
    u0 = hold_start(arms[0], problems[0])
    stacked_arm = jaxarm.stack_arms(arms)
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *problems)
    lq = lq_problem()
    grad_fn, u_grad = gradient_case()
    jobs = {  # longest compiles first
        "multiple_shooting": (_solver("multiple_shooting", **MULTIPLE_SHOOTING), (arms[0], problems[0], u0)),
        "batched_shooting": (jax.vmap(_solver("shooting", **SHOOTING_AL), in_axes=(0, 0, None)), (stacked_arm, stacked, u0)),
        "shooting_squash": (_solver("shooting", **SHOOTING_SQUASH), (arms[0], problems[0], u0)),
        "ilqr": (_solver("ilqr"), (arms[0], problems[0], u0)),
        "shooting_f32": (_solver("shooting", **SHOOTING_AL), (arms[0].astype(np.float32), problems[0], u0)),
        "ilqr_f32": (_solver("ilqr"), (arms[0].astype(np.float32), problems[0], u0)),
        "lq_ilqr": (_solver("ilqr"), (lq.arm, lq.problem, lq.u0)),
        "cost_gradient": (grad_fn, (u_grad,)),
        "warm_start": (warm_start_outputs, warm_start_case()),
    }
    return _compile_all(jobs)


@pytest.fixture(scope="module")
def solutions(compiled):
    arms, problems = two_problems()
    arm, problem = arms[0], problems[0]
    u0 = hold_start(arm, problem)
    stacked_arm = jaxarm.stack_arms(arms)
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *problems)
    batch = compiled["batched_shooting"](stacked_arm, stacked, u0)
    return arm, problem, {
        "ilqr": compiled["ilqr"](arm, problem, u0),
        "ilqr_1": compiled["ilqr"](arms[1], problems[1], u0),  # same compiled solver, another arm and goal
        "shooting": jax.tree_util.tree_map(lambda x: x[0], batch),
        "shooting_1": jax.tree_util.tree_map(lambda x: x[1], batch),
        "shooting_squash": compiled["shooting_squash"](arm, problem, u0),
        "multiple_shooting": compiled["multiple_shooting"](arm, problem, u0),
    }


# --------------------------------------------------------------------------- gradients


def gradient_case():
    """(value_and_grad of J(u) through an 8-step RK3 rollout with every cost term on, u (8, 2))."""
    arm = two_link()
    problem = reach(arm, orientation=3.0, velocity=5.0, smoothness=1e-3, path_position=2.0)
    steps = 8
    u = hold_start(arm, problem)[:steps] + jnp.asarray(np.random.default_rng(0).normal(0, 2.0, (steps, 2)))

    def cost(u):
        traj = jaxarm.rollout(arm, problem.q0, problem.qd0, u, DT, saturate=False, on_divergence="flag")
        return trajopt.trajectory_cost(arm, problem, traj.q, traj.qd, u)

    return jax.value_and_grad(cost), u


def test_cost_gradient_matches_finite_differences(compiled):
    """d J / d u through an RK3 rollout (every cost term switched on) vs central differences."""
    _, u = gradient_case()
    value_and_grad = compiled["cost_gradient"]  # one compile, reused for the differences
    f = lambda u: value_and_grad(u)[0]  # noqa: E731
    _, g = value_and_grad(u)
    rng = np.random.default_rng(1)
    h = 1e-5
    for _ in range(4):
        d = jnp.asarray(rng.normal(size=u.shape))
        fd = (f(u + h * d) - f(u - h * d)) / (2 * h)
        exact = jnp.sum(g * d)
        assert abs(float(fd - exact)) <= 1e-6 * max(1.0, abs(float(exact))), (float(fd), float(exact))


# --------------------------------------------------------------------------- iLQR on an LQ problem


def cartesian_arm(m1=3.0, m2=1.5):
    """Two perpendicular prismatic joints (standard DH, alpha1 = 90 deg): M = diag(m1 + m2, m2),
    constant; gravity -z loads joint 1 only; the tool position is affine in q."""
    return jaxarm.make_arm(
        "PP", convention="standard", a=[0.3, 0.0], alpha=[np.pi / 2, 0.0], d=[0.1, 0.2], theta=[0.0, 0.0],
        mass=[m1, m2], com=np.zeros((2, 3)), inertia=np.stack([0.01 * np.eye(3)] * 2),
    )


def closed_form_lq(problem, p0, J, m_total, m2, g, steps):
    """Minimize the (quadratic) reach cost of a double integrator qdd = M^-1 (u - G) by one linear
    solve over the stacked inputs U (2T,). RK3 is exact for a constant acceleration over a step:
    q+ = q + dt qd + dt^2/2 a, qd+ = qd + dt a."""
    dt = float(problem.dt)
    Minv = np.diag([1.0 / m_total, 1.0 / m2])
    G = np.array([m_total * g, 0.0])
    N = 2 * steps
    # x_k = c_k + S_k U, x = (q, qd)
    c, S = np.concatenate([np.asarray(problem.q0), np.asarray(problem.qd0)]), np.zeros((4, N))
    cs, Ss = [c], [S]
    for k in range(steps):
        Ak = np.block([[np.eye(2), dt * np.eye(2)], [np.zeros((2, 2)), np.eye(2)]])
        Bk = np.vstack([0.5 * dt * dt * Minv, dt * Minv])
        E = np.zeros((2, N))
        E[:, 2 * k:2 * k + 2] = np.eye(2)
        c, S = Ak @ c - Bk @ G, Ak @ S + Bk @ E
        cs.append(c)
        Ss.append(S)
    target = np.asarray(problem.target)
    # J(U) = sum of squared residuals r = a + C U, weighted
    rows, offs = [], []

    def add(weight, C, a):
        rows.append(np.sqrt(weight) * C)
        offs.append(np.sqrt(weight) * a)

    w = np.asarray(problem.effort)
    for k in range(steps):
        E = np.zeros((2, N))
        E[:, 2 * k:2 * k + 2] = np.eye(2)
        add(dt, np.sqrt(w)[:, None] * E, np.zeros(2))
        add(float(problem.path_position) * dt, J @ Ss[k][:2], p0 + J @ cs[k][:2] - target)
        if k > 0:
            D = np.zeros((2, N))
            D[:, 2 * k:2 * k + 2], D[:, 2 * k - 2:2 * k] = np.eye(2), -np.eye(2)
            add(float(problem.smoothness) / dt, D, np.zeros(2))
    add(float(problem.position), J @ Ss[-1][:2], p0 + J @ cs[-1][:2] - target)
    add(float(problem.velocity), Ss[-1][2:], cs[-1][2:])
    C, a = np.vstack(rows), np.concatenate(offs)
    U, *_ = np.linalg.lstsq(C, -a, rcond=None)
    return U.reshape(steps, 2), float(np.sum((a + C @ U) ** 2))


class LQ(NamedTuple):
    arm: object
    problem: object
    u0: object
    p0: np.ndarray
    J: np.ndarray
    masses: tuple


def lq_problem(m1=3.0, m2=1.5, steps=12):
    arm = cartesian_arm(m1, m2)
    p0 = np.asarray(jaxarm.tool_pose(arm, jnp.zeros(2))[:3, 3])
    J = np.array([[0.0, 0.0], [0.0, -1.0], [1.0, 0.0]])  # joint 1 along z0, joint 2 along z1 = -y0
    problem = trajopt.reach_problem(arm, jnp.array([0.1, 0.0]), p0 + np.array([0.0, -0.2, 0.3]), 0.05,
                                    position=50.0, velocity=3.0, smoothness=1e-3, path_position=0.5)
    return LQ(arm, problem, jnp.zeros((steps, 2)), p0, J, (m1, m2))


def test_ilqr_solves_a_linear_quadratic_problem_in_one_iteration(compiled):
    arm, problem, u0, p0, J, (m1, m2) = lq_problem()
    g, steps = 9.81, u0.shape[0]
    assert_close(jaxarm.mass_matrix(arm, jnp.array([0.3, -0.2])), np.diag([m1 + m2, m2]), 1e-12, "constant M")
    assert_close(jaxarm.gravity_torques(arm, jnp.zeros(2)), [(m1 + m2) * g, 0.0], 1e-12, "gravity load")
    q = jnp.array([0.4, -0.7])
    assert_close(jaxarm.tool_pose(arm, q)[:3, 3], p0 + J @ np.asarray(q), 1e-12, "affine tool position")
    res = compiled["lq_ilqr"](arm, problem, u0)  # regularization 0 (the default)
    U, J_star = closed_form_lq(problem, p0, J, m1 + m2, m2, g, steps)
    assert float(res.history.alpha[0]) == 1.0  # the full Newton step is taken...
    assert_close(res.history.cost[0], J_star, 1e-9, "cost after one iteration")  # ...and is optimal
    assert_close(res.u, U, 1e-7, "optimal inputs")
    assert_close(res.cost, J_star, 1e-9, "final cost")
    assert bool(res.converged) and int(res.iterations) <= 2


# --------------------------------------------------------------------------- reach: solvers agree


def test_ilqr_converges_and_reports_each_iteration(solutions):
    arm, problem, sol = solutions
    res = sol["ilqr"]
    k = int(res.iterations)
    assert bool(res.converged) and k < 50
    h = res.history
    accepted = np.asarray(h.alpha[:k]) > 0
    assert accepted.any() and np.all(np.asarray(h.rel_change[:k])[accepted] > 0)  # accepted steps decrease the objective
    assert abs(float(h.rel_change[k - 1])) < 1e-6  # the stopping rule
    assert np.all(np.isnan(np.asarray(h.cost[k:])))
    assert np.all(np.isfinite(np.asarray(h.regularization[:k])))


def test_ilqr_and_shooting_reach_the_same_optimum(solutions):
    """Same constraint handling (augmented Lagrangian on the torque limits) -> same optimum."""
    arm, problem, sol = solutions
    a, b = sol["ilqr"], sol["shooting"]
    assert bool(a.converged) and bool(b.converged)
    # stated tolerance: both satisfy the limits to tol_violation = 1e-4 of the limit, so costs agree
    # to about that relatively; torques within 2 % of their scale
    assert abs(float(a.cost) - float(b.cost)) <= 1e-4 * float(a.cost), (float(a.cost), float(b.cost))
    assert_close(a.u / TORQUE_LIMITS, b.u / TORQUE_LIMITS, 2e-2, "optimal torques / limit")
    tool = [jaxarm.tool_pose(arm, res.q[-1])[:3, 3] for res in (a, b)]
    assert float(jnp.linalg.norm(tool[0] - problem.target)) < 5e-3  # soft terminal cost (weight 300 / m^2)
    assert float(jnp.linalg.norm(tool[0] - tool[1])) < 1e-4


def test_squashed_shooting_stops_on_the_plateau_rule(solutions):
    """u = u_max tanh z never reaches an active limit (z -> inf), so the gradient never vanishes;
    the windowed relative-cost rule (default tol 1e-7 over 10 iterations) must stop it, close to the
    augmented-Lagrangian optimum and strictly inside the limits."""
    arm, problem, sol = solutions
    res, best = sol["shooting_squash"], float(sol["ilqr"].cost)
    k = int(res.iterations)
    assert bool(res.converged) and k < SHOOTING_SQUASH["max_iterations"]
    c = np.asarray(res.history.cost)
    assert c[k - 1 - 10] - c[k - 1] <= 1e-7 * abs(c[k - 1 - 10])  # the rule that stopped it
    assert c[k - 1 - 20] - c[k - 1] > 1e-7 * abs(c[k - 1 - 20])  # ...and not long before
    assert 0.0 <= float(res.cost) - best <= 1e-3 * best, (float(res.cost), best)


def test_limits_respected(solutions):
    """Squashing keeps the torques strictly inside the limits; the augmented Lagrangian (iLQR,
    shooting and multiple shooting) reaches them to within tol_violation (1e-4 of the limit)."""
    arm, problem, sol = solutions
    for name, res in sol.items():
        frac = np.abs(np.asarray(res.u)) / TORQUE_LIMITS
        slack = 0.0 if name == "shooting_squash" else 1e-4
        assert frac.max() <= 1.0 + slack, name
        assert frac[:, 0].max() > 0.95, f"{name}: the torque limit should be active in this test"
        assert 0.0 <= float(res.max_violation) <= slack, name
        assert np.all(np.abs(np.asarray(res.qd)) <= 10.0)


def test_multiple_shooting_reaches_the_single_shooting_optimum(solutions):
    """Four segments whose starts are free: at the answer the defects are closed (the reported
    max_violation includes them, and a single rollout of the optimized u is what is reported) and
    the cost is iLQR's and single shooting's to the augmented-Lagrangian tolerance."""
    arm, problem, sol = solutions
    ms, ref, single = sol["multiple_shooting"], sol["ilqr"], sol["shooting"]
    assert bool(ms.converged)
    assert float(ms.max_violation) <= 1e-4
    assert abs(float(ms.cost) - float(ref.cost)) <= 1e-4 * float(ref.cost), (float(ms.cost), float(ref.cost))
    assert abs(float(ms.cost) - float(single.cost)) <= 1e-4 * float(ref.cost), (float(ms.cost), float(single.cost))
    assert_close(ms.u / TORQUE_LIMITS, ref.u / TORQUE_LIMITS, 2e-2, "optimal torques / limit")
    # its trajectory is one rollout of its u from the start (not the stitched segments)
    traj = jaxarm.rollout(arm, problem.q0, problem.qd0, ms.u, DT, saturate=False)
    assert_close(ms.q, traj.q, 1e-12, "reported q is a single rollout")


def _float64_arrays(jaxpr):
    """(primitive, shape, file) of every float64 array with more than one entry that ``jaxpr``
    computes, nested jaxprs (loops, conditionals, custom derivatives) included; file: the
    innermost source file outside JAX that made it."""
    found = []
    for e in jaxpr.eqns:
        for v in e.outvars:
            if getattr(v.aval, "dtype", None) == np.float64 and np.prod(v.aval.shape) > 1:
                files = [f.file_name for f in e.source_info.traceback.frames if "jax/_src" not in f.file_name.replace("\\", "/")]
                found.append((e.primitive.name, v.aval.shape, files[0] if files else ""))
        for p in e.params.values():
            for sub in p if isinstance(p, (list, tuple)) else [p]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _float64_arrays(inner)
    return found


def test_a_float32_arm_solves_in_float32(compiled, solutions):
    """arm.astype(float32) with float64 enabled and a float64 problem and warm start: iLQR and
    shooting compute in float32 (no float64 array in the program; the shooting objective too,
    where optax's line search steps by a float64 step length), converge with their default
    tolerances (shooting's plateau tolerance is 10 float32 epsilons there), and reach the float64
    optimum to the augmented-Lagrangian tolerance."""
    arm, problem, sol = solutions
    arm32 = arm.astype(np.float32)
    u0 = hold_start(arm, problem)
    for key, solver in (("ilqr", _solver("ilqr")), ("shooting", _solver("shooting", **SHOOTING_AL))):
        res, ref = compiled[key + "_f32"](arm32, problem, u0), sol[key]
        assert res.u.dtype == res.q.dtype == res.cost.dtype == np.float32, key
        assert bool(res.converged), key
        assert float(res.max_violation) <= 1e-4, key
        assert abs(float(res.cost) - float(ref.cost)) <= 1e-4 * float(ref.cost), (key, float(res.cost), float(ref.cost))
        wide = _float64_arrays(jax.make_jaxpr(solver)(arm32, problem, u0).jaxpr)
        # none made by jaxarm (dynamics, rollouts, costs, the solvers' own arithmetic); shooting keeps
        # some in optax, whose L-BFGS and zoom line search follow its float64 step length (its state
        # passes its loop and the identity that marks the loop's carry for jax.vmap, tracers.batched_with)
        ours = [w for w in wide if "jaxarm" in w[2].replace("\\", "/").split("/")
                and not (w[2].endswith("shooting.py") and w[0] in ("while", "convert_element_type"))  # optax's state in its loop
                and not (key == "shooting" and w[2].endswith("tracers.py") and w[0] in ("custom_jvp_call", "custom_vmap_call"))]
        assert not ours, (key, ours[:10])
        assert key == "shooting" or not wide, (key, wide[:10])


# --------------------------------------------------------------------------- batched


def test_batched_solve_equals_per_problem_solves(solutions):
    """One vmap over arms (different payloads, via stack_arms) and goals: each batched shooting
    answer equals the per-problem iLQR solve (same constraint handling, so the same optimum)."""
    arm, problem, sol = solutions
    costs = []
    for i, key in enumerate(("", "_1")):
        batch, one = sol["shooting" + key], sol["ilqr" + key]
        assert bool(batch.converged) and bool(one.converged)
        assert_close(batch.cost, one.cost, 1e-4, f"problem {i} cost")  # AL: limits met to tol_violation 1e-4
        assert_close(batch.u / TORQUE_LIMITS, one.u / TORQUE_LIMITS, 2e-2, f"problem {i} inputs / limit")
        costs.append(float(one.cost))
    assert abs(costs[0] - costs[1]) > 1e-3 * costs[0]  # the two problems really differ



@pytest.mark.parametrize("solver", ["shooting", "multiple_shooting", "ilqr"])
def test_vmap_batches_each_loop_of_the_solver_once(monkeypatch, solver):
    """jax.vmap over arms and goals batches each loop of the solver once, optax's line search
    inside shooting included: every loop's carry starts batched where the arm and problem are
    (jaxarm.core.tracers.batched_with), so the fixpoint by which jax finds a loop's batched carry
    does not batch the loops nested inside again for every pass (batched shooting: 11 batchings
    of its 3 while loops before; its trace 9.6-11.9 s -> 6.5-6.7 s, iLQR's 7.6-8.9 s -> 4.5-5.1 s).
    Counted while tracing, nothing compiled: each call of jax's while-loop batching rule leaves
    exactly one loop in the batched program."""
    calls = while_loop_batchings(monkeypatch)
    arms, problems = two_problems()
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *problems)
    options = {"shooting": SHOOTING_AL, "multiple_shooting": MULTIPLE_SHOOTING, "ilqr": {}}[solver]
    solve = jax.vmap(lambda a, p, u: _solver(solver, **options)(a, p, u).u, in_axes=(0, 0, None))
    jaxpr = jax.make_jaxpr(solve)(jaxarm.stack_arms(arms), stacked, hold_start(arms[0], problems[0])).jaxpr
    assert len(calls) >= 3  # the augmented-Lagrangian rounds, the inner iterations, a line search
    loops = count_primitive(jaxpr, "while")
    assert len(calls) == loops, (len(calls), loops)

# --------------------------------------------------------------------------- warm start


def warm_start_case():
    arm = two_link()
    return arm, reach(arm, offset=(0.15, 0.2, 0.0))  # peak torque below the limits: no clipping


def warm_start_outputs(arm, problem):
    """Warm start u (T, n), forward dynamics at its mid-step path states, its rollout q and the path q."""
    u = trajopt.reach_warm_start(arm, problem, T)
    q_goal = trajopt.position_ik(arm, problem.q0, problem.target)
    mid = trajopt.minimum_jerk(problem.q0, q_goal, T * problem.dt, (jnp.arange(T) + 0.5) * problem.dt)
    qdd = jax.vmap(jaxarm.forward_dynamics, in_axes=(None, 0, 0, 0))(arm, mid[0], mid[1], u)
    traj = jaxarm.rollout(arm, problem.q0, problem.qd0, u, DT, saturate=False)
    path = trajopt.minimum_jerk(problem.q0, q_goal, T * problem.dt, jnp.arange(T + 1) * problem.dt)[0]
    return u, qdd, traj.q, path


def test_reach_warm_start_follows_the_minimum_jerk_path(compiled):
    """position_ik puts the tool on the target; minimum_jerk is rest to rest with its closed-form
    derivatives (against finite differences); the inverse-dynamics torques, rolled out, follow the
    path (forward dynamics of them give the path's acceleration at mid-step; the rollout drifts
    only O(dt^2))."""
    arm, problem = warm_start_case()
    q_goal = trajopt.position_ik(arm, problem.q0, problem.target)
    assert float(jnp.linalg.norm(jaxarm.tool_pose(arm, q_goal)[:3, 3] - problem.target)) < 1e-10
    t = jnp.linspace(0.0, 1.0, 11)
    q, qd, qdd = trajopt.minimum_jerk(problem.q0, q_goal, 1.0, t)
    assert_close(q[0], problem.q0, 1e-15, "start")
    assert_close(q[-1], q_goal, 1e-14, "end")
    assert_close(qd[jnp.asarray([0, -1])], np.zeros((2, 2)), 1e-14, "rest to rest")
    assert_close(qdd[jnp.asarray([0, -1])], np.zeros((2, 2)), 1e-13, "zero end accelerations")
    h = 1e-6
    for f, df in ((0, qd), (1, qdd)):
        plus = trajopt.minimum_jerk(problem.q0, q_goal, 1.0, t[1:-1] + h)[f]
        minus = trajopt.minimum_jerk(problem.q0, q_goal, 1.0, t[1:-1] - h)[f]
        assert_close((plus - minus) / (2 * h), df[1:-1], 1e-7, f"derivative {f + 1}")
    u, qdd, q_roll, path = compiled["warm_start"](arm, problem)
    assert float(jnp.max(jnp.abs(u) / TORQUE_LIMITS)) < 0.99
    assert_close(qdd, trajopt.minimum_jerk(problem.q0, q_goal, 1.0, (jnp.arange(T) + 0.5) * DT)[2], 1e-9,
                 "forward dynamics of the warm start = path acceleration at mid-step")
    assert float(jnp.max(jnp.abs(q_roll - path))) < 5e-3  # O(dt^2) drift: 1.8e-3 rad at dt = 50 ms (measured)
    with pytest.raises(ValueError, match="T: expected a positive whole number"):
        trajopt.reach_warm_start(arm, problem, 0)


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_reported_before_tracing():
    arm = two_link()
    problem = reach(arm)
    u0 = hold_start(arm, problem)
    with pytest.raises(ValueError, match="u_init: expected an input schedule of shape"):
        trajopt.shooting(arm, problem, u0[:, :1])
    with pytest.raises(ValueError, match="torque_limits"):
        trajopt.ilqr(arm, problem, u0, torque_limits="clip")
    with pytest.raises(ValueError, match="segments"):
        trajopt.multiple_shooting(arm, problem, u0, segments=7)
    with pytest.raises(TypeError, match="problem"):
        trajopt.ilqr(arm, {"q0": problem.q0}, u0)
    with pytest.raises(ValueError, match="target"):
        trajopt.reach_problem(arm, problem.q0, [0.0, 1.0], DT)
    with pytest.raises(ValueError, match="u_init: expected finite"):
        trajopt.ilqr(arm, problem, u0.at[3, 1].set(jnp.nan))


def test_an_eager_ilqr_call_compiles_once_for_a_new_target_and_equals_the_jitted_solve():
    """Called outside any jit, a ReachProblem solver answers with a compiled solve it keeps (the arm
    and the settings constants, the problem and the warm start arguments): a second eager call for
    another target compiles nothing and equals the same solve jitted by hand."""
    from jaxarm.core import xla
    from tests.test_recompiles import count_compiles

    arm = two_link()
    problem, other = reach(arm), reach(arm, offset=(0.25, 0.3, 0.0))
    u0 = hold_start(arm, problem)
    xla._EAGER.clear()
    trajopt.ilqr(arm, problem, u0, max_iterations=5)
    with count_compiles() as events:
        res = trajopt.ilqr(arm, other, u0, max_iterations=5)
        jax.block_until_ready(res.u)
    assert len(events) == 0, f"{len(events)} new compiles"
    by_hand = jaxarm.jit(lambda p, u: trajopt.ilqr(arm, p, u, max_iterations=5))(other, u0)
    np.testing.assert_allclose(np.asarray(res.u), np.asarray(by_hand.u), rtol=0, atol=1e-12)
    assert len(xla._EAGER) == 1
