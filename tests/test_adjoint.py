"""jaxarm.adjoint.scan and rollout(..., adjoint=True): the discrete adjoint gives the gradient
that JAX's own reverse mode of the plain scan gives (an independent implementation), for every
input a rollout has (schedule, arm parameters, initial state, external wrench, time step) and for
costs on every output (states, accelerations, torques, inputs); and finite differences agree.
``adjoint=True`` is deprecated (plain reverse mode is faster and needs less memory): the tests that
check its gradients silence its warning, and one checks that a user is told, once, at their call."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm import adjoint
from tests.helpers import assert_close
from tests.helpers_sim import motor_arm, sim_arm

pytestmark = pytest.mark.filterwarnings("ignore:.*adjoint=True is deprecated:FutureWarning")


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def assert_trees_close(a, b, rtol, what):
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb), what
    scale = max(float(np.max(np.abs(x), initial=0.0)) for x in la)
    assert scale > 0, f"{what}: all-zero gradient proves nothing"
    for x, y in zip(la, lb):
        assert x.shape == y.shape, what
        np.testing.assert_allclose(y, x, rtol=0, atol=rtol * scale, err_msg=what)


# --------------------------------------------------------------------------------------
# The scan itself: a nonlinear recursion with matrix parameters, an integer counter in the
# carry, and outputs at every step


def _body(p, carry, x):
    A, b = p
    c, count = carry
    u, k = x
    c_next = jnp.tanh(A @ c + b * u) + 0.1 * c * k
    return (c_next, count + 1), (jnp.sum(c_next**2), c * u)


def _cost(scan, p, c0, us):
    T = us.shape[0]
    (c, count), (e, cu) = scan(_body, p, (c0, jnp.asarray(0, jnp.int32)), (us, jnp.arange(T, dtype=jnp.float64) / T))
    return jnp.sum(c**3) + jnp.sum(e * jnp.linspace(0, 1, T)) + jnp.sum(jnp.sin(cu)) + 0.0 * count


def _plain(body, p, init, xs):
    return jax.lax.scan(lambda c, x: body(p, c, x), init, xs)


def test_adjoint_scan_matches_reverse_mode_and_finite_differences():
    rng = np.random.default_rng(0)
    p = (jnp.asarray(rng.normal(size=(4, 4)) * 0.5), jnp.asarray(rng.normal(size=4)))
    c0, us = jnp.asarray(rng.normal(size=4)), jnp.asarray(rng.normal(size=40))
    args = (p, c0, us)
    value = _cost(adjoint.scan, *args)
    assert_close(value, _cost(_plain, *args), 1e-14, "primal")
    g_adj = jax.jit(jax.grad(lambda *a: _cost(adjoint.scan, *a), argnums=(0, 1, 2)))(*args)
    g_ref = jax.jit(jax.grad(lambda *a: _cost(_plain, *a), argnums=(0, 1, 2)))(*args)
    assert_trees_close(g_ref, g_adj, 1e-12, "adjoint vs reverse mode")
    # central differences along a random direction in (A, b, c0, us)
    d = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape)), args)
    h = 1e-6
    plus = jax.tree_util.tree_map(lambda x, y: x + h * y, args, d)
    minus = jax.tree_util.tree_map(lambda x, y: x - h * y, args, d)
    fd = (_cost(_plain, *plus) - _cost(_plain, *minus)) / (2 * h)
    directional = sum(jnp.vdot(g, v) for g, v in zip(jax.tree_util.tree_leaves(g_adj), jax.tree_util.tree_leaves(d)))
    assert_close(directional, fd, 1e-7, "directional derivative vs central difference")


def test_adjoint_scan_under_vmap_equals_one_by_one():
    rng = np.random.default_rng(1)
    p = (jnp.asarray(rng.normal(size=(4, 4)) * 0.5), jnp.asarray(rng.normal(size=4)))
    c0s, uss = jnp.asarray(rng.normal(size=(3, 4))), jnp.asarray(rng.normal(size=(3, 25)))
    grad = jax.grad(lambda p, c0, us: _cost(adjoint.scan, p, c0, us), argnums=(0, 2))
    batched = jax.jit(jax.vmap(grad, in_axes=(None, 0, 0)))(p, c0s, uss)
    for i in range(3):
        one = jax.jit(grad)(p, c0s[i], uss[i])
        assert_trees_close(one, jax.tree_util.tree_map(lambda x: x[i], batched), 1e-13, f"item {i}")


# --------------------------------------------------------------------------------------
# Rollouts


def _rollout_cost(arm, q0, qd0, u, f_ext, dt, *, adjoint, input, hold):
    traj = jaxarm.rollout(arm, q0, qd0, u, dt, input=input, hold=hold, f_ext=f_ext, adjoint=adjoint, on_divergence="flag")
    T = u.shape[0]
    return (jnp.sum(traj.q[-1] ** 2) + jnp.sum(jnp.cos(traj.qd[T // 2])) + 1e-4 * jnp.sum(traj.qdd**2)
            + 1e-2 * jnp.sum(traj.tau[::3] ** 2) + 1e-3 * jnp.sum(traj.u**2))


@pytest.mark.parametrize("input,hold", [("torque", 1), ("voltage", 3)])
def test_rollout_adjoint_gradient_equals_reverse_mode(input, hold):
    """Gradients w.r.t. the schedule, every arm parameter, q0, qd0, the wrench schedule and dt."""
    arm = motor_arm() if input == "voltage" else sim_arm(4)
    if input == "torque":  # saturation inside the rollout
        arm = arm.replace(limits=dataclasses.replace(arm.limits, torque=np.array([3.0, 2.0, 1.0])))
    rng = np.random.default_rng(5)
    T = 30
    q0, qd0 = jnp.asarray(rng.uniform(-1, 1, 3)), jnp.asarray(rng.uniform(-1, 1, 3))
    u = jnp.asarray(rng.uniform(-8, 8, (T, 3)) if input == "voltage" else rng.uniform(-4, 4, (T, 3)))  # some saturate
    f_ext = jnp.asarray(rng.normal(size=(T, 6)))
    args = (arm, q0, qd0, u, f_ext, jnp.asarray(0.01))
    grads = {}
    for a in (False, True):
        def f(*args, a=a):
            return _rollout_cost(*args, adjoint=a, input=input, hold=hold)
        # jaxarm.jit: jaxarm's XLA:CPU options (a plain jit compiles the adjoint's Jacobian stage
        # with the fusion emitters, several times slower to build; the numbers are the same)
        grads[a] = jaxarm.jit(jax.grad(f, argnums=tuple(range(6))))(*args)
    names = ("arm", "q0", "qd0", "u", "f_ext", "dt")
    for name, ref, adj in zip(names, grads[False], grads[True]):
        assert_trees_close(ref, adj, 1e-11, f"{input}, hold={hold}: d cost / d {name}")
    # the arm closed over (a constant: the adjoint scan closes over it and its zeros fold)
    def closed(*rest):
        return _rollout_cost(arm, *rest, adjoint=True, input=input, hold=hold)

    const = jaxarm.jit(jax.grad(closed, argnums=tuple(range(5))))(*args[1:])
    for name, ref, adj in zip(names[1:], grads[False][1:], const):
        assert_trees_close(ref, adj, 1e-11, f"{input}, hold={hold}, constant arm: d cost / d {name}")


def test_rollout_adjoint_refuses_policies_and_checkpoint():
    arm = sim_arm(0)
    z = jnp.zeros(3)
    with pytest.raises(ValueError, match="adjoint=True: expected an input schedule"):
        jaxarm.rollout(arm, z, z, lambda t, q, qd: -q, 0.01, steps=5, adjoint=True)
    with pytest.raises(ValueError, match="checkpoint must be False"):
        jaxarm.rollout(arm, z, z, jnp.zeros((5, 3)), 0.01, adjoint=True, checkpoint=True)


def test_adjoint_true_is_deprecated_once_at_the_users_call_and_not_inside_jaxarm():
    """rollout(adjoint=True) and the shooting solvers' adjoint=True warn (FutureWarning, shown by
    default) at the user's own line, naming what to use instead; the solvers' own rollout call
    (jaxarm's code) adds no second warning; adjoint=False says nothing."""
    arm = sim_arm(0)
    z, u = jnp.zeros(3), jnp.zeros((5, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.eval_shape(lambda u: jaxarm.rollout(arm, z, z, u, 0.01).q, u)
        assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
        jax.eval_shape(lambda u: jaxarm.rollout(arm, z, z, u, 0.01, adjoint=True).q, u)
        problem = jaxarm.trajopt.reach_problem(arm, z, [0.3, 0.2, 0.4], 0.01)
        jax.eval_shape(lambda u: jaxarm.trajopt.shooting(arm, problem, u, adjoint=True, max_iterations=2).cost, u)
    ours = [w for w in caught if issubclass(w.category, FutureWarning) and "adjoint=True is deprecated" in str(w.message)]
    assert [str(w.message).split(":")[0] for w in ours] == ["rollout", "trajopt.shooting"], [str(w.message) for w in ours]
    assert all(w.filename == __file__ for w in ours), [w.filename for w in ours]
    assert all("plain reverse mode" in str(w.message) and "checkpoint=True" in str(w.message) for w in ours)
