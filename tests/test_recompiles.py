"""No accidental recompiles: a jitted rollout, its gradient, a linearization or a batched rollout
called again with new values of the same shapes compiles nothing new.

New values here means new states and inputs, a Python float dt that differs, and new physical
parameters of a traced arm (an arm passed as a jit argument: the identification and domain
randomization case). Compilations are counted by JAX's own monitoring event for every backend
compile, so a compile hidden inside jaxarm (a helper jit keyed on a value) is caught too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_compiles():
    events = []

    def listener(name, seconds, **kwargs):
        if name == COMPILE_EVENT:
            events.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _arms():
    arm = jaxarm.load_arm("two_link_planar")
    heavier = arm.replace(links=dataclasses.replace(arm.links, mass=np.asarray(arm.links.mass) * 1.3),
                          drives=dataclasses.replace(arm.drives, viscous_friction=np.asarray(arm.drives.viscous_friction) + 0.1))
    return arm, heavier


def test_the_counter_sees_a_compile():
    with count_compiles() as events:
        jax.jit(lambda x: x * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
    assert len(events) >= 1


def test_rollout_and_its_gradient_compile_once_for_new_values():
    arm, heavier = _arms()
    T = 50
    rollout = jax.jit(lambda a, q0, qd0, u, dt: jaxarm.rollout(a, q0, qd0, u, dt).q[-1])

    def cost(u, a, q0, dt):
        return jnp.sum(jaxarm.rollout(a, q0, jnp.zeros_like(q0), u, dt).q[-1] ** 2)

    grad = jax.jit(jax.grad(cost))
    u0, u1 = jnp.zeros((T, 2)), jnp.ones((T, 2))
    q0, q1 = jnp.array([0.1, 0.2]), jnp.array([-0.3, 0.5])
    rollout(arm, q0, q0, u0, 1e-3).block_until_ready()
    grad(u0, arm, q0, 1e-3).block_until_ready()
    with count_compiles() as events:
        for a, q, u, dt in ((heavier, q1, u1, 2e-3), (arm, q1, u0, 5e-4)):
            rollout(a, q, q, u, dt).block_until_ready()
            grad(u, a, q, dt).block_until_ready()
    assert events == [], f"{len(events)} compile(s) for new values of the same shapes"


def test_eager_transformations_of_a_rollout_compile_once_for_new_values():
    """jax.grad, jax.jacfwd and jax.vmap of a rollout of a known arm called outside any jit: the
    rollout's kept program is transformed, and JAX keeps the transformed program, so a second
    call with new values compiles nothing (run op by op, every call traced and compiled the time
    loops again: 2.5 s a gradient of 1000 Panda steps). The numbers are those of the same
    transformation under a jit."""
    arm, _ = _arms()
    T = 50

    def cost(u, q0):
        return jnp.sum(jaxarm.rollout(arm, q0, jnp.zeros(2), u, 1e-3).q[-1] ** 2)

    calls = (jax.grad(cost), jax.jacfwd(cost, argnums=1), lambda u, q: jax.vmap(cost, (0, None))(jnp.stack([u, 2.0 * u]), q))
    u0, u1 = jnp.zeros((T, 2)), jnp.ones((T, 2))
    q0, q1 = jnp.array([0.1, 0.2]), jnp.array([-0.3, 0.5])
    for f in calls:
        jax.block_until_ready(f(u0, q0))
    with count_compiles() as events:
        out = [jax.block_until_ready(f(u1, q1)) for f in calls]
    assert events == [], f"{len(events)} compile(s) for new values of the same shapes"
    for f, eager in zip(calls, out):
        np.testing.assert_allclose(eager, jax.jit(f)(u1, q1), rtol=1e-12, atol=1e-15)
    assert float(jnp.max(jnp.abs(out[0]))) > 1e-6


def test_linearization_and_batched_rollout_compile_once_for_new_values():
    arm, heavier = _arms()
    T = 20
    lin = jax.jit(lambda a, q, qd, u, dt: jaxarm.linearize_trajectory(a, q, qd, u, dt))
    q = jnp.zeros((T, 2))
    lin(arm, q, q, q, 1e-3)[0].block_until_ready()
    q0 = jnp.zeros((8, 2))
    jaxarm.rollout_batch(arm, q0, q0, jnp.zeros((8, T, 2)), 1e-3, constant_arm=False).q.block_until_ready()
    # new inputs made before counting (an eager `q + 0.1` compiles its own small program)
    qa, qb, ua = (jnp.full((T, 2), v, dtype=q.dtype) for v in (0.1, 0.2, 1.0))
    qc, uc = jnp.full((8, 2), 0.1, dtype=q0.dtype), jnp.ones((8, T, 2), dtype=q0.dtype)
    with count_compiles() as events:
        lin(heavier, qa, qb, ua, 2e-3)[0].block_until_ready()
        out = jaxarm.rollout_batch(heavier, qc, q0, uc, 2e-3, constant_arm=False)
        out.q.block_until_ready()
    assert events == [], f"{len(events)} compile(s) for new values of the same shapes"


def test_a_batch_of_arms_with_new_masses_reuses_the_batched_kernel():
    """rollout_batch(arm_batched=True) compiles in the leaves the batch shares (the kinematics);
    a new batch with other masses and friction, the same shared leaves, compiles nothing new."""
    arm, _ = _arms()
    rng = np.random.default_rng(2)

    def batch():
        return jaxarm.stack_arms([arm.replace(links=dataclasses.replace(arm.links, mass=np.asarray(arm.links.mass) * rng.uniform(0.8, 1.2, 2)),
                                              drives=dataclasses.replace(arm.drives, viscous_friction=rng.uniform(0.0, 0.2, 2)))
                                  for _ in range(8)])

    q0, u = jnp.zeros((8, 2)), jnp.ones((8, 20, 2))
    first = jaxarm.rollout_batch(batch(), q0, q0, u, 2e-3, arm_batched=True)
    first.q.block_until_ready()
    other = batch()
    with count_compiles() as events:
        second = jaxarm.rollout_batch(other, q0, q0, u, 2e-3, arm_batched=True)
        second.q.block_until_ready()
    assert events == [], f"{len(events)} compile(s) for a batch of arms with new masses"
    assert not np.allclose(first.q, second.q)


def test_a_weakly_typed_input_reuses_the_batched_kernel(caplog):
    """``jnp.full(shape, 0.1)`` is weakly typed; JAX would compile a jit again for it. rollout_batch
    strips the weak type, so its kernel is not compiled again (JAX's compile log names it)."""
    _, heavier = _arms()
    q0, u = jnp.zeros((8, 2)), jnp.ones((8, 20, 2))
    jaxarm.rollout_batch(heavier, q0, q0, u, 2e-3, constant_arm=False).q.block_until_ready()
    weak = jnp.full((8, 2), 0.3)
    assert weak.weak_type
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        jaxarm.rollout_batch(heavier, weak, q0, u, 2e-3, constant_arm=False).q.block_until_ready()
    compiled = [r.getMessage()[:40] for r in caplog.records if r.getMessage().startswith("Compiling")]
    assert not any("_kernel" in m for m in compiled), compiled


def test_trajectory_optimization_compiles_once_for_new_goals_start_states_and_arms():
    """A jitted trajopt.ddp called again with a new goal (a params entry), a new start state and a
    heavier arm (the problem passed as an argument, varied with ``replace``) compiles nothing new;
    so does mpc_step fed its own previous plan. (A problem built again by ``ocp()`` carries new
    term functions, which jit sees as a new problem structure: vary a problem with ``replace``.)"""
    from jaxarm import trajopt
    from jaxarm.trajopt import terms

    arm, heavier = _arms()
    q0 = jnp.array([-1.2, 0.8])
    goal = jaxarm.tool_pose(arm, q0)[:3, 3] + jnp.array([0.2, 0.2, 0.0])
    goal2, x0_2 = goal + 0.05, jnp.array([-1.1, 0.8, 0.0, 0.0])
    costs = terms.effort(0.01) + terms.tool_position("goal", 100.0) + terms.joint_velocity(1.0)
    problem = trajopt.ocp(arm, q0, 10, 0.05, costs=costs, params={"goal": goal})
    solve = jax.jit(lambda p: trajopt.ddp(p, max_iterations=3, al_iterations=1))
    step = jax.jit(lambda p, x, plan: trajopt.mpc_step(p, x, plan, max_iterations=2))
    first = solve(problem)
    plan = step(problem, problem.x0, first)  # its history is shorter than ddp's here (2 vs 3 iterations):
    plan = step(problem, plan.x[1], plan)  # a plan of mpc_step's own shapes is compiled for once
    jax.block_until_ready(plan)
    with count_compiles() as events:
        variants = [problem.replace(params={"goal": goal2}), problem.replace(x0=x0_2), problem.replace(arm=heavier)]
        for p in variants:
            jax.block_until_ready(solve(p))
        jax.block_until_ready(step(problem, plan.x[1], plan))
    assert len(events) == 0, f"{len(events)} new compiles"


def test_an_eager_rollout_compiles_once_and_equals_the_jitted_rollout():
    """Called outside any jit, a rollout of an input schedule answers with a compiled rollout it
    keeps (the arm a constant, states, schedule, dt, t0 and wrench arguments): a second call with
    new values compiles nothing and equals a jitted rollout of the same values."""
    arm, _ = _arms()
    T = 40
    rng = np.random.default_rng(3)
    q0, qd0 = jnp.array([-1.2, 0.8]), jnp.zeros(2)
    u1, u2 = (jnp.asarray(rng.uniform(-2.0, 2.0, (T, 2))) for _ in range(2))
    q0b = q0 + 0.1
    jax.block_until_ready(jaxarm.rollout(arm, q0, qd0, u1, 0.01).q)
    with count_compiles() as events:
        traj = jaxarm.rollout(arm, q0b, qd0, u2, 0.02)
        jax.block_until_ready(traj.q)
    assert len(events) == 0, f"{len(events)} new compiles"
    ref = jax.jit(lambda q0, u, dt: jaxarm.rollout(arm, q0, qd0, u, dt).q)(q0b, u2, 0.02)
    np.testing.assert_allclose(np.asarray(traj.q), np.asarray(ref), rtol=0, atol=1e-12)


def test_eager_dynamics_compile_whole_once_per_arm_structure_and_equal_the_traced_ones():
    """Called outside any jit, each function of one state (kinematics, Newton-Euler, the mass
    matrix, forward dynamics, energies, friction) runs as one compiled program: the first arm of
    a structure compiles one (its values constants), a second arm of the same structure one more
    (the arm an argument), a third arm, other joint values or a list for q nothing; the results
    are those of the same functions traced inside a jit, and bad input is still reported by name
    (before anything compiles)."""
    arm = jaxarm.load_arm("rp_arm")
    drives = dataclasses.replace(arm.drives, viscous_friction=np.asarray(arm.drives.viscous_friction) + 0.2,
                                 coulomb_friction=np.asarray(arm.drives.coulomb_friction) + 0.3)
    second, third = arm.with_payload(1.5), arm.replace(drives=drives)
    q, qd, qdd = np.array([0.3, 0.2]), np.array([-0.4, 0.5]), np.array([0.7, -0.1])
    f = np.array([1.0, -2.0, 0.5, 0.1, 0.2, -0.3])
    calls = {
        "tool_pose": lambda a, q: jaxarm.tool_pose(a, q),
        "forward_kinematics": lambda a, q: jaxarm.forward_kinematics(a, q),
        "jacobian": lambda a, q: jaxarm.jacobian(a, q),
        "jacobian_tool": lambda a, q: jaxarm.jacobian(a, q, frame="tool"),
        "inverse_dynamics": lambda a, q: jaxarm.inverse_dynamics(a, q, qd, qdd, f_ext=f),
        "rigid_body_torques": lambda a, q: jaxarm.rigid_body_torques(a, q, qd, qdd),
        "joint_wrenches": lambda a, q: jaxarm.joint_wrenches(a, q, qd, qdd, f),
        "bias_forces": lambda a, q: jaxarm.bias_forces(a, q, qd),
        "gravity_torques": lambda a, q: jaxarm.gravity_torques(a, q),
        "mass_matrix": lambda a, q: jaxarm.mass_matrix(a, q),
        "mass_matrix_by_columns": lambda a, q: jaxarm.mass_matrix_by_columns(a, q),
        "coriolis_matrix": lambda a, q: jaxarm.coriolis_matrix(a, q, qd),
        "forward_dynamics": lambda a, q: jaxarm.forward_dynamics(a, q, qd, qdd, f_ext=f),
        "kinetic_energy": lambda a, q: jaxarm.kinetic_energy(a, q, qd),
        "potential_energy": lambda a, q: jaxarm.potential_energy(a, q),
        "friction_torques": lambda a, q: jaxarm.friction_torques(a, qd + q),
        "state_derivative": lambda a, q: jaxarm.linearize.state_derivative(a, jnp.concatenate([jnp.asarray(q), qd]), qdd),
    }
    q_list = list(q + 0.2)
    jnp.asarray(q_list)  # (a list's first conversion compiles a program of its own)
    for name, call in calls.items():
        with count_compiles() as first:
            results = [call(arm, q)]
        assert 1 <= len(first) <= 3, (name, len(first))
        with count_compiles() as another:
            results.append(call(second, q))
        assert 1 <= len(another) <= 3, (name, len(another))
        with count_compiles() as again:
            results += [call(third, q_list), call(arm, q + 0.1), call(second, q_list)]
        assert len(again) == 0, (name, len(again))
        for a, x, result in zip((arm, second, third, arm, second), (q, q, q_list, q + 0.1, q_list), results):
            traced = jax.jit(call)(a, jnp.asarray(x))
            for e, t in zip(jax.tree_util.tree_leaves(result), jax.tree_util.tree_leaves(traced)):
                np.testing.assert_allclose(e, t, rtol=1e-13, atol=1e-14, err_msg=name)
    with count_compiles() as bad:
        with pytest.raises(ValueError, match=r"tool_pose: q: expected shape \(2,\)"):
            jaxarm.tool_pose(arm, np.zeros(5))
        with pytest.raises(ValueError, match=r"inverse_dynamics: qd: expected finite values, got \[nan\] at joint\(s\) \[2\]"):
            jaxarm.inverse_dynamics(arm, q, np.array([0.0, np.nan]), qdd)
        with pytest.raises(ValueError, match="forward_dynamics: f_ext: expected shape"):
            jaxarm.forward_dynamics(arm, q, qd, qdd, f_ext=np.zeros(3))
        with pytest.raises(ValueError, match="jacobian: frame"):
            jaxarm.jacobian(arm, q, frame="world")
        with pytest.raises(TypeError, match="jaxarm.Arm"):
            jaxarm.mass_matrix({"links": None}, q)
        with pytest.raises(ValueError, match=r"state_derivative: x\[n:\] \(qd\): expected finite values"):
            jaxarm.linearize.state_derivative(arm, np.array([0.1, 0.2, 0.3, np.inf]), qdd)
    assert len(bad) == 0


def test_eager_vmap_and_derivatives_with_respect_to_the_state_compile_once():
    """jax.vmap, jax.jacfwd and jax.grad of a function of one state, called outside any jit with
    a known arm, run the kept program transformed (one compiled program, not one per operation):
    a second call with new values compiles nothing and equals the same transformation jitted.
    A gradient with respect to the arm (reverse mode, a loop's gradient step) runs its own kept
    program, its traced leaves the arguments, summed over a vmap's batch as a jit would sum it;
    a Jacobian with respect to it (forward mode) runs as written (op by op: XLA compiles the
    Jacobian with respect to every parameter far more slowly than it runs)."""
    arm = jaxarm.load_arm("rp_arm")
    rng = np.random.default_rng(4)
    batch = lambda: [jnp.asarray(rng.uniform(-1, 1, (64, 2))) for _ in range(3)]  # noqa: E731
    calls = {
        "vmap inverse_dynamics": lambda q, qd, qdd: jax.vmap(jaxarm.inverse_dynamics, (None, 0, 0, 0))(arm, q, qd, qdd),
        "vmap forward_dynamics": lambda q, qd, qdd: jax.vmap(jaxarm.forward_dynamics, (None, 0, 0, 0))(arm, q, qd, qdd),
        "jacfwd inverse_dynamics": lambda q, qd, qdd: jax.jacfwd(jaxarm.inverse_dynamics, argnums=(1, 2, 3))(arm, q[0], qd[0], qdd[0]),
        "grad forward_dynamics": lambda q, qd, qdd: jax.grad(lambda q: jnp.sum(jaxarm.forward_dynamics(arm, q, qd[0], qdd[0]) ** 2))(q[0]),
        "grad mass_matrix": lambda q, qd, qdd: jax.grad(lambda q: jnp.sum(jaxarm.mass_matrix(arm, q)))(q[0]),
    }
    for name, call in calls.items():
        call(*batch())
        with count_compiles() as again:
            values = batch()
            result = call(*values)
            jax.block_until_ready(result)
        assert len(again) == 0, (name, len(again))
        for e, t in zip(jax.tree_util.tree_leaves(result), jax.tree_util.tree_leaves(jax.jit(call)(*values))):
            np.testing.assert_allclose(e, t, rtol=1e-13, atol=1e-14, err_msg=name)
    from jaxarm.dynamics import eager

    q, qd, qdd = batch()[0][:3]
    kept = set(eager._PROGRAMS)
    jacobian = jax.jacfwd(lambda a: jaxarm.inverse_dynamics(a, q, qd, qdd))(arm)
    assert set(eager._PROGRAMS) == kept  # run as written: no program kept for it
    traced = jax.jit(jax.jacfwd(lambda a: jaxarm.inverse_dynamics(a, q, qd, qdd)))(arm)
    for e, t in zip(jax.tree_util.tree_leaves(jacobian), jax.tree_util.tree_leaves(traced)):
        np.testing.assert_allclose(e, t, rtol=1e-12, atol=1e-13)
    losses = {  # one state; a batch of states (summed: read per state); the links alone traced
        "one": lambda a, s: jnp.sum(jaxarm.inverse_dynamics(a, s[0][0], s[1][0], s[2][0]) ** 2),
        "batch": lambda a, s: jnp.sum(jax.vmap(jaxarm.inverse_dynamics, (None, 0, 0, 0))(a, *s) ** 2),
        "links": lambda links, s: jnp.sum(jax.vmap(jaxarm.inverse_dynamics, (None, 0, 0, 0))(arm.replace(links=links), *s) ** 2),
    }
    for name, loss in losses.items():
        x = arm.links if name == "links" else arm
        jax.grad(loss)(x, batch())
        newest = next(reversed(eager._PROGRAMS.values()))  # (the store may be full: the newest is its own)
        assert "_kept_for_traced" in repr(newest), name
        with count_compiles() as again:
            values = batch()
            gradient = jax.grad(loss)(x, values)
            jax.block_until_ready(gradient)
        assert len(again) == 0, (name, len(again))
        traced = jax.jit(jax.grad(loss))(x, values)
        for e, t in zip(jax.tree_util.tree_leaves(gradient), jax.tree_util.tree_leaves(traced)):
            np.testing.assert_allclose(e, t, rtol=1e-12, atol=1e-13, err_msg=name)


def test_the_regressor_and_torques_of_known_samples_compile_nothing():
    """A log's regressor, known torques and predicted torques are evaluated by NumPy: even the
    first call for a new arm structure compiles no XLA program (the regressor by XLA compiled for
    5-7 s for the Panda on a 2-core CPU)."""
    from jaxarm.identification import known_torques, predict_torques, random_states, regressor

    arm = jaxarm.load_arm("panda").with_payload(0.5, (0.0, 0.0, 0.05))
    q, qd, qdd = (np.asarray(x) for x in random_states(arm, 300, seed=4))
    with count_compiles() as events:
        Y = regressor(arm, q, qd, qdd)
        known = known_torques(arm, q, qd, qdd)
        tau = predict_torques(arm, q, qd, qdd)
        Y0 = regressor(arm, q[0], qd[0], qdd[0])  # one state
    assert len(events) == 0, f"{len(events)} compiles"
    np.testing.assert_array_equal(np.asarray(Y0), np.asarray(Y)[0])
    pi = np.asarray(jaxarm.identification.standard_parameters(arm))
    np.testing.assert_allclose(np.einsum("knp,p->kn", Y, pi) + known, tau, rtol=1e-10, atol=1e-10)


def test_identification_of_a_log_of_another_length_compiles_nothing_new():
    """The regressor, the torque prediction and fit_consistent on a log of another sample count
    (cross-validation folds, a log cut at a validation time) reuse what the first log compiled:
    the regressor and the torque prediction of known samples are evaluated by NumPy (nothing to
    compile at all), and the fit's compiled step depends on the parameter count only (its data
    reduced by QR)."""
    from jaxarm.consistent_identification import fit_consistent
    from jaxarm.identification import predict_torques, random_states, regressor

    arm, heavier = _arms()
    q, qd, qdd = (np.asarray(x) for x in random_states(arm, 700, seed=3))
    tau = predict_torques(heavier, q, qd, qdd)
    fit_consistent(arm, q[:400], qd[:400], qdd[:400], tau[:400], max_steps=5)
    with count_compiles() as events:
        Y = regressor(arm, q, qd, qdd)
        Y_small = regressor(arm, q[:60], qd[:60], qdd[:60])
        predict_torques(arm, q[:650], qd[:650], qdd[:650])
        fit = fit_consistent(arm, q[:550], qd[:550], qdd[:550], tau[:550], max_steps=5)
    assert len(events) == 0, f"{len(events)} new compiles"
    assert Y.shape == (700, 2, 28) and fit.iterations == 5
    np.testing.assert_array_equal(np.asarray(Y_small), np.asarray(Y)[:60])
