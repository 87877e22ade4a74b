"""Fixed-step integrators: one step against the tableau written out by hand, convergence order on
a nonlinear arm, and linear test equations against their analytic solutions.

Kutta's third-order method as corrected in the ERRATA (the seed prints c3 = qd + 2h k2 - h c1):
c3 = qd + h (2 k2 - k1), k3 = F(q + h (2 c2 - c1), c3), x+ = x + h/6 (k1 + 4 k2 + k3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm import integrators
from tests.helpers_sim import BLOCK, forward_dynamics, free_motion, kutta_rk3_step, pendulum, roll, sim_arm

# --------------------------------------------------------------------------------------
# One step by hand on a scalar-like problem (plain NumPy: the step functions are pure arithmetic)


def scalar_pendulum(t, q, qd):
    """A damped, driven pendulum: q'' = -9.81 sin q - 0.4 q' + 0.7 cos(3 t)."""
    return -9.81 * np.sin(q) - 0.4 * qd + 0.7 * np.cos(3.0 * t)


T0, Q0, QD0, H = 0.3, np.array([0.8]), np.array([-1.1]), 0.1


def test_rk3_is_kuttas_method_by_hand():
    q_next, qd_next, a = integrators.rk3(scalar_pendulum, T0, Q0, QD0, H)
    # k_i are accelerations, c_i velocities, as in the seed's notation
    c1 = QD0
    k1 = scalar_pendulum(T0, Q0, c1)
    c2 = QD0 + H / 2 * k1
    k2 = scalar_pendulum(T0 + H / 2, Q0 + H / 2 * c1, c2)
    c3 = QD0 + H * (2 * k2 - k1)  # ERRATA
    k3 = scalar_pendulum(T0 + H, Q0 + H * (2 * c2 - c1), c3)
    q_hand = Q0 + H / 6 * (c1 + 4 * c2 + c3)
    qd_hand = QD0 + H / 6 * (k1 + 4 * k2 + k3)
    np.testing.assert_allclose(q_next, q_hand, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(qd_next, qd_hand, rtol=1e-15, atol=1e-15)
    np.testing.assert_array_equal(a, k1)  # the acceleration at the start of the step
    np.testing.assert_allclose(kutta_rk3_step(scalar_pendulum, T0, Q0, QD0, H), (q_hand, qd_hand), rtol=1e-15)

    # The seed's printed c3 = qd + 2h k2 - h c1 gives a clearly different step: the test would catch it.
    c3_seed = QD0 + 2 * H * k2 - H * c1
    k3_seed = scalar_pendulum(T0 + H, Q0 + H * (2 * c2 - c1), c3_seed)
    q_seed = Q0 + H / 6 * (c1 + 4 * c2 + c3_seed)
    qd_seed = QD0 + H / 6 * (k1 + 4 * k2 + k3_seed)
    assert abs(q_seed - q_next)[0] > 1e-4 and abs(qd_seed - qd_next)[0] > 1e-4


def test_rk3_local_error_is_fourth_order():
    """One-step error against a very fine RK4 reference shrinks 16x per halving (global order 3)."""

    def fine(h, n=2000):
        q, qd, t = Q0, QD0, T0
        for _ in range(n):
            q, qd, _ = integrators.rk4(scalar_pendulum, t, q, qd, h / n)
            t += h / n
        return q, qd

    errs = []
    for h in (0.1, 0.05, 0.025):
        q, qd, _ = integrators.rk3(scalar_pendulum, T0, Q0, QD0, h)
        qr, qdr = fine(h)
        errs.append(max(abs(q - qr)[0], abs(qd - qdr)[0]))
    ratios = np.array(errs[:-1]) / np.array(errs[1:])
    assert np.all((ratios > 13) & (ratios < 19)), ratios


def test_rk4_euler_and_semi_implicit_euler_by_hand():
    a1 = scalar_pendulum(T0, Q0, QD0)
    q2, qd2 = Q0 + H / 2 * QD0, QD0 + H / 2 * a1
    a2 = scalar_pendulum(T0 + H / 2, q2, qd2)
    q3, qd3 = Q0 + H / 2 * qd2, QD0 + H / 2 * a2
    a3 = scalar_pendulum(T0 + H / 2, q3, qd3)
    q4, qd4 = Q0 + H * qd3, QD0 + H * a3
    a4 = scalar_pendulum(T0 + H, q4, qd4)
    expected = (Q0 + H / 6 * (QD0 + 2 * qd2 + 2 * qd3 + qd4), QD0 + H / 6 * (a1 + 2 * a2 + 2 * a3 + a4))
    np.testing.assert_allclose(integrators.rk4(scalar_pendulum, T0, Q0, QD0, H)[:2], expected, rtol=1e-15)
    # Craig 6.117: both updates from the values at time t
    np.testing.assert_allclose(integrators.euler(scalar_pendulum, T0, Q0, QD0, H)[:2],
                               (Q0 + QD0 * H + a1 * H**2 / 2, QD0 + a1 * H), rtol=1e-15)
    qd_new = QD0 + a1 * H  # symplectic Euler: the position uses the new velocity
    np.testing.assert_allclose(integrators.semi_implicit_euler(scalar_pendulum, T0, Q0, QD0, H)[:2],
                               (Q0 + qd_new * H, qd_new), rtol=1e-15)


def test_unknown_method_is_a_clear_error():
    arm = sim_arm(1)
    with pytest.raises(ValueError, match="method.*rk3"):
        jaxarm.rollout(arm, np.zeros(3), np.zeros(3), np.zeros((2, 3)), 0.01, method="rk5")


# --------------------------------------------------------------------------------------
# The arm: rollout's RK3 is the hand-written tableau applied to the forward dynamics


def test_rollout_rk3_equals_hand_kutta_on_the_arm():
    arm = sim_arm(1)
    rng = np.random.default_rng(0)
    u = rng.uniform(-3.0, 3.0, (BLOCK, 3))
    q, qd, dt = np.array([0.3, -0.5, 0.8]), np.array([0.5, -0.3, 0.2]), 0.01
    traj = roll(arm, q, qd, u, dt)
    for k in range(BLOCK):
        f = lambda t, qs, qds, k=k: np.asarray(forward_dynamics(arm, qs, qds, u[k], np.zeros(6)))  # noqa: E731
        q, qd = kutta_rk3_step(f, k * dt, q, qd, dt)
    np.testing.assert_allclose(traj.q[-1], q, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(traj.qd[-1], qd, rtol=1e-12, atol=1e-12)


def test_stage_loop_gradients_equal_the_written_out_method():
    """The stage loop of the Runge-Kutta methods by name evaluates the dynamics again in reverse
    mode (jax.checkpoint) instead of storing them: the gradient with respect to the inputs, the
    start state and the arm's masses equals that of the written-out method (RK3; RK4 is the same
    loop with another tableau)."""
    arm = sim_arm(1)
    rng = np.random.default_rng(4)
    u = jnp.asarray(rng.uniform(-3.0, 3.0, (6, 3)))
    q0, qd0 = jnp.array([0.3, -0.5, 0.8]), jnp.array([0.5, -0.3, 0.2])

    def cost(method):
        def f(u, q0, mass):
            a = arm.replace(links=arm.links.replace(mass=mass))
            traj = jaxarm.rollout(a, q0, qd0, u, 0.01, method=method, stops=False, on_divergence="flag")
            return jnp.sum(jnp.sin(traj.q)) + jnp.sum(traj.qd[-1] ** 2)
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

    args = (u, q0, jnp.asarray(arm.links.mass))
    for g, w in zip(cost("rk3")(*args), cost(integrators.rk3)(*args)):
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-11 * float(jnp.max(jnp.abs(w))))


def test_the_stages_share_one_traced_dynamics():
    """The Runge-Kutta steps made from a tableau call the dynamics under one ``jax.jit`` of its
    own, so the stages share one traced jaxpr: jax batches, linearizes and transposes it once for
    all stages rather than once per stage (shorter tracing; XLA inlines the calls). Forward: three
    calls of one jaxpr; reverse mode: each of its three programs (the primal part, the part
    recomputed in the reverse pass, its transpose) once, called by all three stages. The stage
    loop holds one call of each. The derivative equals that of the dynamics traced per stage."""
    arm = sim_arm(2)
    u = jnp.asarray(np.random.default_rng(1).uniform(-2.0, 2.0, (4, 3)))
    written = integrators.explicit_rk(*integrators.KUTTA3, loop=False)
    looped = integrators.explicit_rk(*integrators.KUTTA3, loop=True)

    def final(u, method):
        return jnp.sum(jaxarm.rollout(arm, jnp.zeros(3), jnp.zeros(3), u, 0.01, method=method, on_divergence="flag").q[-1] ** 2)

    def stage_calls(jaxpr):
        """(calls, distinct jaxprs) of the jitted stage dynamics in a jaxpr and its sub-jaxprs."""
        calls, programs = 0, set()

        def walk(j):
            nonlocal calls
            for e in j.eqns:
                if e.primitive.name in ("jit", "pjit") and e.params["name"] == "accel":
                    calls += 1
                    programs.add(id(e.params["jaxpr"].jaxpr))
                for p in e.params.values():
                    for sub in p if isinstance(p, (list, tuple)) else [p]:
                        if isinstance(sub, jax.extend.core.ClosedJaxpr):
                            walk(sub.jaxpr)
                        elif isinstance(sub, jax.extend.core.Jaxpr):
                            walk(sub)

        walk(jaxpr.jaxpr)
        return calls, len(programs)

    assert stage_calls(jax.make_jaxpr(lambda u: final(u, written))(u)) == (3, 1)
    assert stage_calls(jax.make_jaxpr(jax.grad(lambda u: final(u, written)))(u)) == (9, 3)
    assert stage_calls(jax.make_jaxpr(lambda u: final(u, looped))(u)) == (1, 1)
    # called eagerly (no program being staged out) a step adds no jit: it would compile per call
    seen = []

    def probe(x):
        seen.append(integrators._staged(x))
        return x

    x = jnp.ones(3)
    probe(x), jax.vmap(probe)(x[None]), jax.grad(lambda x: jnp.sum(probe(x)))(x)
    jax.jit(probe)(x), jax.jit(jax.vmap(probe))(x[None]), jax.jit(jax.grad(lambda x: jnp.sum(probe(x))))(x)
    jax.lax.scan(lambda c, _: (probe(c), None), x, None, length=1)
    assert seen == [False, False, False, True, True, True, True]
    # the same derivative as the written-out step traced stage by stage (integrators.rk3)
    g = jax.grad(lambda u: final(u, written))(u)
    w = jax.grad(lambda u: final(u, integrators.rk3))(u)
    np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12 * float(jnp.max(jnp.abs(w))))


# --------------------------------------------------------------------------------------
# Convergence order on nonlinear arms: free motion under gravity for 1 s


def endpoint(arm, q0, qd0, method, k):
    """q(1 s) with dt = 1 / (BLOCK k) (k blocks of BLOCK steps)."""
    return free_motion(arm, q0, qd0, 1.0 / (BLOCK * k), k, method)[0][-1]


SIM = (sim_arm(1), np.array([0.3, -0.5, 0.8]), np.array([0.5, -0.3, 0.2]))


@pytest.fixture(scope="module")
def reference():
    return endpoint(*SIM, "rk4", 64)  # dt = 0.3125 ms: error ~1e-11, far below every error measured here


@pytest.mark.parametrize("method, k, lo, hi", [("rk3", 4, 7.0, 9.0), ("rk4", 4, 14.0, 18.0)])
def test_runge_kutta_global_error_order(reference, method, k, lo, hi):
    """The 3-R arm, dt 5 ms -> 2.5 ms: the error at 1 s shrinks 8x (RK3) and 16x (RK4)."""
    coarse = np.max(np.abs(endpoint(*SIM, method, k) - reference))
    fine = np.max(np.abs(endpoint(*SIM, method, 2 * k) - reference))
    ratio = coarse / fine
    print(f"{method}: error(dt = {1e3 / (BLOCK * k):.3g} ms) = {coarse:.3e}, error(dt/2) = {fine:.3e}, ratio {ratio:.3f}")
    assert lo < ratio < hi, f"{method}: error ratio {ratio:.3f} not in ({lo}, {hi})"


@pytest.mark.parametrize("method", ["euler", "semi_implicit_euler"])
def test_first_order_methods_halve_the_error(method):
    """A pendulum (whose Euler compilation the gradient and batch tests share), dt 2.5, 1.25,
    0.625 ms: successive differences q(h) - q(h/2) shrink 2x for a first-order method."""
    arm, q0, qd0 = pendulum(viscous=0.0), np.array([1.2]), np.array([-0.5])
    ends = [endpoint(arm, q0, qd0, method, k) for k in (8, 16, 32)]
    d1, d2 = np.abs(ends[0] - ends[1])[0], np.abs(ends[1] - ends[2])[0]
    print(f"{method} (pendulum): q(h) - q(h/2) = {d1:.3e}, q(h/2) - q(h/4) = {d2:.3e}, ratio {d1 / d2:.3f}")
    assert 1.8 < d1 / d2 < 2.2


# --------------------------------------------------------------------------------------
# Linear test equations: one prismatic joint (axis x, gravity along -z does not act on it)

MASS = 2.0


def slider(viscous=0.0):
    return jaxarm.make_arm("P", convention="placement", xyz=[[0.1, 0.2, 0.3]], axis=[[1.0, 0.0, 0.0]], mass=MASS,
                           com=[[0.0, 0.05, 0.0]], inertia=[[0.01, 0.02, 0.02]], viscous_friction=viscous, name="slider")


@jax.jit
def spring_rollout(arm, x0, v0, kp, kd, dt):
    """The slider under a PD 'spring' u = -kp x - kd v (a policy: sampled once per step, then held)."""
    policy = jaxarm.pd_controller(kp, kd, jnp.zeros(1))
    return jaxarm.rollout(arm, x0, v0, policy, dt, steps=BLOCK, method="rk3", on_divergence="flag")


def test_viscous_decay_is_the_rk3_stability_polynomial_and_the_exponential():
    """m v' = -c v: RK3 multiplies v by 1 + z + z^2/2 + z^3/6 (z = -h c / m) per step and advances
    x by h v (1 + z/2 + z^2/6) -- Kutta's tableau; the exact solution is v0 exp(-c t / m)."""
    c, h, x0, v0 = 3.0, 0.02, 0.25, 1.5
    traj = spring_rollout(slider(viscous=c), jnp.array([x0]), jnp.array([v0]), 0.0, 0.0, h)
    z = -h * c / MASS
    r = 1 + z + z**2 / 2 + z**3 / 6
    k = np.arange(BLOCK + 1)
    v_rk3 = v0 * r**k
    x_rk3 = x0 + h * v0 * (1 + z / 2 + z**2 / 6) * (1 - r**k) / (1 - r)
    np.testing.assert_allclose(traj.qd[:, 0], v_rk3, rtol=1e-13)
    np.testing.assert_allclose(traj.q[:, 0], x_rk3, rtol=1e-13)
    t = np.asarray(traj.t)
    v_exact = v0 * np.exp(-c * t / MASS)
    x_exact = x0 + v0 * MASS / c * (1 - np.exp(-c * t / MASS))
    err = max(np.max(np.abs(traj.qd[:, 0] - v_exact)), np.max(np.abs(traj.q[:, 0] - x_exact)))
    bound = BLOCK * abs(v0) * z**4 / 24  # sum of the local errors |v| |z|^4 / 4!: O(h^3) globally
    assert err < bound, (err, bound)


def test_pd_spring_is_the_zero_order_hold_recurrence():
    """The policy is evaluated at the start of each step and held (Trajectory.u), so over a step the
    slider sees a constant force, which RK3 integrates exactly: x+ = x + h v + h^2/2 a, v+ = v + h a."""
    kp, kd, h = 40.0, 3.0, 0.01
    traj = spring_rollout(slider(), jnp.array([0.2]), jnp.array([-0.5]), kp, kd, h)
    A = np.array([[0.0, 1.0], [-kp / MASS, -kd / MASS]])
    Phi = np.array([[1.0, h], [0.0, 1.0]]) + np.outer([h * h / 2, h], A[1])
    x = np.array([0.2, -0.5])
    states = [x]
    for _ in range(BLOCK):
        x = Phi @ x
        states.append(x)
    states = np.array(states)
    np.testing.assert_allclose(traj.q[:, 0], states[:, 0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(traj.qd[:, 0], states[:, 1], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(traj.u[:, 0], -kp * states[:-1, 0] - kd * states[:-1, 1], rtol=1e-12, atol=1e-13)


def test_pd_spring_converges_to_the_damped_oscillator():
    """Against m x'' + kd x' + kp x = 0: the held input makes the error first order in h."""
    kp, kd, x0, v0 = 40.0, 3.0, 0.2, -0.5
    w0, zeta = np.sqrt(kp / MASS), kd / (2 * np.sqrt(kp * MASS))
    wd = w0 * np.sqrt(1 - zeta**2)

    def exact(t):
        return np.exp(-zeta * w0 * t) * (x0 * np.cos(wd * t) + (v0 + zeta * w0 * x0) / wd * np.sin(wd * t))

    errs = []
    for blocks in (2, 4, 8):  # 1 s with h = 10, 5, 2.5 ms
        h = 1.0 / (BLOCK * blocks)
        x, v, err = jnp.array([x0]), jnp.array([v0]), 0.0
        for b in range(blocks):
            traj = spring_rollout(slider(), x, v, kp, kd, h)
            t = b * BLOCK * h + np.asarray(traj.t)
            err = max(err, float(np.max(np.abs(traj.q[:, 0] - exact(t)))))
            x, v = traj.q[-1], traj.qd[-1]
        errs.append(err)
    ratios = np.array(errs[:-1]) / np.array(errs[1:])
    print(f"PD spring vs analytic: max errors {errs}, ratios {ratios}")
    assert errs[-1] < 5e-3
    assert np.all((ratios > 1.8) & (ratios < 2.2)), ratios
