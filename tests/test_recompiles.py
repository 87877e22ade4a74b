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
        return jnp.sum(jaxarm.rollout(a, q0, jnp.zeros_like(q0), u, dt, adjoint=True).q[-1] ** 2)

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


def test_eager_kinematics_compile_one_program_per_arm_structure_and_equal_the_traced_ones():
    """Called outside any jit, tool_pose, forward_kinematics and jacobian run as one compiled
    program each (op by op, the Panda's first tool_pose compiled about a hundred small programs);
    another arm of the same structure, other joint angles or a list for q compile nothing new;
    the results are those of the same functions traced inside a jit, and bad input is still
    reported by name."""
    arm = jaxarm.load_arm("puma560")
    q = np.array([0.1, -0.4, 0.3, 0.2, -0.5, 0.6])
    calls = [lambda a, q: jaxarm.tool_pose(a, q), lambda a, q: jaxarm.forward_kinematics(a, q),
             lambda a, q: jaxarm.jacobian(a, q), lambda a, q: jaxarm.jacobian(a, q, frame="tool")]
    heavier, q_list = arm.with_payload(1.5), list(q + 0.2)  # (made outside the counts)
    jnp.asarray(q_list)  # (a list's first conversion compiles a program of its own)
    for call in calls:
        with count_compiles() as first:
            eager = call(arm, q)
        assert 1 <= len(first) <= 3, len(first)
        with count_compiles() as again:
            call(heavier, q_list)
        assert len(again) == 0
        traced = jax.jit(call)(arm, jnp.asarray(q))
        for e, t in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(traced)):
            np.testing.assert_allclose(e, t, rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="tool_pose: q"):
        jaxarm.tool_pose(arm, np.zeros(5))
    with pytest.raises(ValueError, match="jacobian: frame"):
        jaxarm.jacobian(arm, q, frame="world")
