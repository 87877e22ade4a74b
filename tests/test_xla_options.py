"""XLA compiler options (jaxarm.core.xla) and the inputs a rollout records (Trajectory.u)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm.core import xla as _xla
from tests.helpers import count_primitive, random_arm
from tests.helpers_sim import BLOCK, roll, sim_arm, with_drives


def test_options_only_on_a_cpu_backend_that_accepts_them():
    everything = set(_xla.CPU_OPTIONS)
    assert _xla.options_for("cpu", everything) == {**_xla.YNN_OFF, **_xla.FUSION_EMITTERS_OFF}
    for platform in ("gpu", "cuda", "rocm", "tpu", "METAL"):
        assert _xla.options_for(platform, everything) == {}
    assert _xla.options_for("cpu", set()) == {}
    # a jaxlib that knows only one of them gets only that one
    assert _xla.options_for("cpu", {"xla_cpu_use_fusion_emitters"}) == _xla.FUSION_EMITTERS_OFF
    assert _xla.options_for("cpu", {"xla_cpu_experimental_ynn_fusion_type"}) == _xla.YNN_OFF


def test_options_match_the_running_backend():
    opts = _xla.compiler_options()
    if jax.default_backend() != "cpu":
        assert opts == {}
    else:  # each option this jaxlib accepts is returned, the others left out
        assert set(opts) <= set(_xla.CPU_OPTIONS)
        assert all(_xla.CPU_OPTIONS[name] == value for name, value in opts.items())
        if opts:
            jax.jit(lambda x: 2.0 * x, compiler_options=opts).lower(jnp.ones(3)).compile()
    opts["mutated"] = 1  # a fresh dict each call
    assert "mutated" not in _xla.compiler_options()


def test_rollouts_with_and_without_the_options_agree():
    arm = sim_arm(4)
    rng = np.random.default_rng(0)
    B = 8
    q0, qd0 = rng.uniform(-1, 1, (2, B, arm.n))
    u = rng.uniform(-2, 2, (B, 40, arm.n))

    def final(q0, qd0, u):
        traj = jaxarm.rollout(arm, q0, qd0, u, 2e-3, on_divergence="flag")
        return jnp.concatenate([traj.q[-1], traj.qd[-1]])

    fn = jax.vmap(final)
    plain = jax.jit(fn)(q0, qd0, u)
    tuned = jax.jit(fn, compiler_options=_xla.compiler_options())(q0, qd0, u)
    wrapped = jaxarm.jit(fn)(q0, qd0, u)  # the public name of _xla.jit
    assert jaxarm.jit is _xla.jit and jaxarm.compiler_options is _xla.compiler_options
    assert float(jnp.max(jnp.abs(plain - q0[:, 0, None]))) > 1e-3  # it moves
    np.testing.assert_allclose(tuned, plain, rtol=0, atol=1e-12)
    np.testing.assert_allclose(wrapped, plain, rtol=0, atol=1e-12)
    # inside the user's own jit the wrapper must not pass options (jax allows them top-level only)
    nested = jax.jit(lambda *a: _xla.jit(fn)(*a) + 0.0)(q0, qd0, u)
    np.testing.assert_allclose(nested, plain, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------
# Trajectory.u is the input after saturation (the voltage clip used to act only inside the
# torque computation, so u recorded voltages beyond voltage_limit)


def test_recorded_voltage_is_clipped_at_the_limit():
    limit = np.array([3.0, 24.0, 5.0])
    arm = with_drives(sim_arm(2), gear_ratio=[20.0, -15.0, 10.0], torque_constant=[0.05, 0.04, 0.06],
                      resistance=[1.0, 1.5, 2.0], voltage_limit=limit, rotor_inertia=[1e-5, 2e-5, 3e-5])
    rng = np.random.default_rng(1)
    U = rng.uniform(-8.0, 8.0, (BLOCK, arm.n))
    q0, qd0 = rng.uniform(-0.5, 0.5, (2, arm.n))
    traj = roll(arm, q0, qd0, U, 2e-3, input="voltage")
    assert np.any(np.abs(U) > limit)  # the case exercises the clip
    np.testing.assert_array_equal(np.asarray(traj.u), np.clip(U, -limit, limit))
    # the recorded voltage is the one acting: unsaturated motor torque of u is the applied torque
    tau = jax.vmap(lambda v, w: jaxarm.motor_torque(arm, v, w, saturate=False))(traj.u, traj.qd[:-1])
    np.testing.assert_allclose(traj.tau, tau, rtol=1e-13, atol=1e-13)
    # and replaying the recorded voltages reproduces the rollout
    again = roll(arm, q0, qd0, traj.u, 2e-3, input="voltage")
    np.testing.assert_array_equal(np.asarray(again.q), np.asarray(traj.q))


def test_recorded_torque_is_clipped_at_the_torque_limit():
    arm = sim_arm(2)
    limit = np.array([0.5, 4.0, 0.2])
    arm = arm.replace(limits=dataclasses.replace(arm.limits, torque=limit))
    rng = np.random.default_rng(2)
    U = rng.uniform(-1.0, 1.0, (BLOCK, arm.n))
    q0, qd0 = rng.uniform(-0.5, 0.5, (2, arm.n))
    traj = roll(arm, q0, qd0, U, 2e-3)
    assert np.any(np.abs(U) > limit)
    np.testing.assert_array_equal(np.asarray(traj.u), np.clip(U, -limit, limit))
    np.testing.assert_array_equal(np.asarray(traj.tau), np.asarray(traj.u))


# --------------------------------------------------------------------------------------
# The Runge-Kutta stages in a loop (what rollout uses by name) against the written-out steps


def _damped_driven_pendulum(t, q, qd):
    return -9.81 * jnp.sin(q) - 0.3 * qd + jnp.cos(3.0 * t)


def test_rolled_runge_kutta_equals_the_written_out_steps():
    from jaxarm import integrators

    q, qd = jnp.array([0.4, -1.2, 2.0]), jnp.array([0.3, 0.0, -1.5])
    tableaus = ((integrators.rk3, integrators.KUTTA3), (integrators.rk4, integrators.CLASSICAL_RK4))
    for written, tableau in tableaus:
        # the stages in a loop (a CPU's default) and one after the other (a GPU's), both forced here
        for loop in (True, False):
            rolled = integrators.explicit_rk(*tableau, loop=loop)
            for h in (1e-3, 0.05, 0.3):
                for a, b in zip(written(_damped_driven_pendulum, 0.7, q, qd, h), rolled(_damped_driven_pendulum, 0.7, q, qd, h)):
                    np.testing.assert_allclose(b, a, rtol=1e-14, atol=1e-15)
    assert integrators.get_method("rk3") is integrators.rk3_rolled
    assert integrators.get_method("rk4") is integrators.rk4_rolled
    with np.testing.assert_raises(ValueError):
        integrators.explicit_rk((0.0, 1.0), ((0.0, 1.0), (1.0, 0.0)), (0.5, 0.5))  # implicit: A not strictly lower
    with np.testing.assert_raises(ValueError):
        integrators.explicit_rk(*integrators.KUTTA3, loop="gpu")


def test_runge_kutta_stages_run_written_out_unless_a_derivative_needs_the_loop_on_a_cpu(monkeypatch):
    """By name, "rk3" traces its stages one after the other in a rollout that is not
    differentiated, on every platform, and in one differentiated in reverse mode only with the arm
    held constant while stages x joints <= WRITTEN_OUT_GRADIENT_SIZE (faster gradients that still
    compile quickly). A forward-mode derivative, a differentiated arm, or a larger program gets a
    loop over the stages on a CPU (one dynamics to compile), and the stages one after the other on
    a GPU or TPU (no loop iterations to launch and synchronize)."""
    from jaxarm import integrators

    arm = sim_arm(3)
    u = jnp.zeros((5, arm.n))
    gain = jnp.ones(arm.n)

    def final(u, gain, method="rk3", arm=arm):
        return jnp.sum(jaxarm.rollout(arm, jnp.zeros(arm.n), jnp.zeros(arm.n), u * gain, 0.01, method=method,
                                      on_divergence="flag").q[-1])

    def policy_final(gain, method="rk3"):  # differentiated through the policy's closure only
        policy = lambda t, q, qd: -gain * qd  # noqa: E731
        return jnp.sum(jaxarm.rollout(arm, jnp.ones(arm.n), jnp.zeros(arm.n), policy, 0.01, steps=5, method=method,
                                      on_divergence="flag").q[-1])

    def arm_final(a, method="rk3"):  # differentiated with respect to the arm (identification)
        return final(u + 1.0, gain, method, arm=a)

    def scans(f, *args):
        return count_primitive(jax.make_jaxpr(f)(*args).jaxpr, "scan")

    written = integrators.explicit_rk(*integrators.KUTTA3, loop=False)
    looped = integrators.explicit_rk(*integrators.KUTTA3, loop=True)
    assert scans(final, u, gain) == 1  # the time loop only
    assert scans(jax.vmap(final), u[None], gain[None]) == 1

    # a vmap over stacked arms, every leaf traced (the kinematics too): the form by platform
    def on_arm(a, u):
        return jnp.sum(jaxarm.rollout(a, jnp.zeros(arm.n), jnp.zeros(arm.n), u, 0.01, on_divergence="flag").q[-1])

    stacked = (jaxarm.stack_arms([arm, arm]), jnp.stack([u, u]))
    assert scans(jax.vmap(on_arm), *stacked) == (2 if jax.default_backend() == "cpu" else 1)
    on_cpu = jax.default_backend() == "cpu"
    # each program traced once (tracing a 7-joint gradient takes seconds): a count by its integrator
    counts = {}

    def counted(key, program):
        return lambda m: counts[(key, m)] if (key, m) in counts else counts.setdefault((key, m), program(m))

    # reverse mode only, the arm constant, 3 stages x 3 joints: written out on every platform
    gradients = [counted(key, program) for key, program in enumerate([
        lambda m: scans(jax.grad(lambda u, g: final(u, g, m)), u, gain),
        lambda m: scans(jax.grad(lambda g: policy_final(g, m)), gain),
        lambda m: scans(jax.vmap(jax.grad(lambda u, g: final(u, g, m))), u[None], gain[None]),
        lambda m: scans(jax.grad(lambda u, g: jnp.sum(jax.vmap(lambda u: final(u, g, m))(u))), u[None], gain),
    ])]
    for count in gradients:
        assert count("rk3") == count(written) and count(looped) > count(written)
    # forward mode, or the arm differentiated: the stage loop on a CPU, written out elsewhere
    form, other = (looped, written) if on_cpu else (written, looped)
    others = [counted(("others", key), program) for key, program in enumerate([
        lambda m: scans(lambda g: jax.jvp(lambda g: final(u, g, m), (g,), (g,)), gain),
        lambda m: scans(jax.jacfwd(lambda g: final(u, g, m)), gain),
        lambda m: scans(jax.grad(lambda a: arm_final(a, m)), arm),
        lambda m: scans(jax.hessian(lambda g: final(u, g, m)), gain),  # forward over reverse
    ])]
    for count in others:
        assert count("rk3") == count(form)
    assert others[0](looped) > others[0](written)  # the two forms tell apart (one program suffices)
    # the program's size: RK4 (4 stages) written out up to 4 joints; RK3 up to 6. A larger arm's
    # gradient holds as many loops as the 3-joint arm's of the same form (the joints are written
    # out either way), so that arm's counts are the references
    assert integrators.WRITTEN_OUT_GRADIENT_SIZE == 18
    for joints, method, written_out in ((4, "rk4", True), (5, "rk4", False), (6, "rk3", True), (7, "rk3", False)):
        big = random_arm(joints, "R" * joints, "placement")
        uu, gg = jnp.zeros((3, joints)), jnp.ones(joints)
        expect = gradients[0](written if written_out or not on_cpu else looped)
        assert scans(jax.grad(lambda u, g: final(u, g, method, arm=big)), uu, gg) == expect, (joints, method)
    # a larger program differentiated for a batch of rollouts (a vmap around the rollout): written
    # out from 16 rollouts, from 128 where small loops are single kernels (jaxarm.jit); the batch
    # seen through the vmap inside the gradient (as gradients[3]) and through a vmap of the
    # gradient (as gradients[2]) alike
    assert (integrators.WRITTEN_OUT_GRADIENT_BATCH, integrators.WRITTEN_OUT_GRADIENT_BATCH_LOOP_KERNELS) == (16, 128)
    big = random_arm(7, "R" * 7, "placement")
    gg = jnp.ones(7)

    def batched(m, B, inside=True):
        uu = jnp.zeros((B, 3, 7))
        if inside:  # the vmap inside the gradient
            return scans(jax.grad(lambda u, g: jnp.sum(jax.vmap(lambda u: final(u, g, m, arm=big))(u))), uu, gg)
        return scans(jax.vmap(jax.grad(lambda u, g: final(u, g, m, arm=big))), uu, jnp.ones((B, 7)))

    on = {True: gradients[3](written), False: gradients[3](looped)}
    assert batched("rk3", 15) == on[not on_cpu]
    assert batched("rk3", 16) == on[True]
    assert batched("rk3", 16, inside=False) == gradients[2](written)
    kernels = on_cpu and _xla.loop_kernels_status().get("loop_kernel_bytes") is not None
    with _xla.loop_kernels():
        assert _xla.loop_kernels_active() == kernels
        assert batched("rk3", 127) == on[not kernels]
        assert batched("rk3", 128) == on[True]
    # small loops made single kernels for every compile by the user's XLA_FLAGS count the same
    flag = "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold="
    for value, active in (("524288", True), ("1024", False)):
        monkeypatch.setenv("XLA_FLAGS", flag + value)
        assert _xla.loop_kernels_active() == active
        with _xla.loop_kernels(0):  # jaxarm's own setting, where one is made, comes first
            assert not _xla.loop_kernels_active() or not kernels
    assert not _xla.loop_kernels_active()
    for platform in ("gpu", "tpu"):
        monkeypatch.setattr(integrators.jax, "default_backend", lambda: platform)
        counts.clear()  # traced again for this platform
        assert not integrators.stages_in_a_loop()
        assert scans(final, u, gain) == 1
        assert scans(jax.vmap(on_arm), *stacked) == 1
        assert others[0]("rk3") == others[0](written)


def test_written_out_stages_store_their_accelerations_on_a_cpu_and_equal_the_loop():
    """Written out, each stage's acceleration is the result of a conditional on a CPU (stored once,
    not compiled into every fusion downstream); the values are the stage loop's."""
    from jaxarm import integrators

    arm = sim_arm(4)
    rng = np.random.default_rng(5)
    q0, qd0 = rng.uniform(-1, 1, (2, arm.n))
    u = jnp.asarray(rng.uniform(-2, 2, (40, arm.n)))

    def run(method):
        return jax.jit(jax.vmap(lambda u: jaxarm.rollout(arm, q0, qd0, u, 2e-3, method=method, on_divergence="flag").q))

    by_name = run("rk3")
    if jax.default_backend() == "cpu":
        text = by_name.lower(u[None]).compile().as_text()
        assert text.count(" conditional(") == 3  # one per stage
    looped = run(integrators.explicit_rk(*integrators.KUTTA3, loop=True))
    for batch in (u[None], jnp.stack([u, -u, 0.5 * u])):
        np.testing.assert_allclose(by_name(batch), looped(batch), rtol=1e-13, atol=1e-14)

    # differentiated written out (asked for), forward and reverse mode: the loop's derivatives
    def cost(u, loop):
        method = integrators.explicit_rk(*integrators.KUTTA3, loop=loop)
        q = jaxarm.rollout(arm, q0, qd0, u, 2e-3, method=method, on_divergence="flag").q
        return jnp.sum(q[-1] ** 2) + jnp.sum(jnp.sin(q[len(q) // 2]))

    grads = [jax.jit(jax.grad(lambda u, loop=loop: cost(u, loop)))(u) for loop in (False, True)]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-10, atol=1e-13)
    assert float(jnp.max(jnp.abs(grads[1]))) > 1e-6
    direction = jnp.asarray(rng.normal(size=u.shape))
    tangents = [jax.jvp(lambda u, loop=loop: cost(u, loop), (u,), (direction,))[1] for loop in (False, True)]
    np.testing.assert_allclose(tangents[0], tangents[1], rtol=1e-10)
    np.testing.assert_allclose(tangents[1], jnp.sum(grads[1] * direction), rtol=1e-10)


def test_rolled_rk3_rollout_equals_the_written_out_one_with_gradients():
    from jaxarm import integrators

    arm = sim_arm(5)
    rng = np.random.default_rng(3)
    q0, qd0 = rng.uniform(-1, 1, (2, arm.n))
    u = jnp.asarray(rng.uniform(-2, 2, (30, arm.n)))

    def cost(u, method):
        traj = jaxarm.rollout(arm, q0, qd0, u, 2e-3, method=method, on_divergence="flag")
        return jnp.sum(traj.q[-1] ** 2 + traj.qd[-1] ** 2)

    by_name = jax.jit(jax.value_and_grad(lambda u: cost(u, "rk3")))(u)
    written = jax.jit(jax.value_and_grad(lambda u: cost(u, integrators.rk3)))(u)
    np.testing.assert_allclose(by_name[0], written[0], rtol=1e-13)
    np.testing.assert_allclose(by_name[1], written[1], rtol=1e-10, atol=1e-13)
    assert float(jnp.max(jnp.abs(by_name[1]))) > 1e-6


def _expensive(x):
    """A long elementwise chain (a stand-in for an unrolled forward dynamics)."""
    y = x
    for k in range(60):
        y = jnp.sin(y) * (1.0 + 0.01 * k) + jnp.cos(y * y)
    return y


def _consumers(y, x):
    """Many cheap consumers of y, each mixing in another input: XLA fuses y into each of them."""
    return tuple(y * x[:, j] + j for j in range(x.shape[1]))


def test_computed_once_gives_fn_and_keeps_it_out_of_its_consumers():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(50, 8)))
    plain = lambda x: _consumers(_expensive(x[:, 0]), x)  # noqa: E731
    once = lambda x: _consumers(_xla.computed_once(_expensive, x[:, 0]), x)  # noqa: E731
    np.testing.assert_allclose(jax.jit(once)(x), jax.jit(plain)(x), rtol=1e-14, atol=0)
    # pytrees in and out, vmap (a batched predicate) and non-finite inputs (NaN out, as documented)
    pair = lambda a, b: {"s": a + b["u"], "p": a * b["u"]}  # noqa: E731
    out = jax.jit(jax.vmap(lambda a, b: _xla.computed_once(pair, a, {"u": b})))(x[:, 0], x[:, 1])
    np.testing.assert_allclose(out["s"], x[:, 0] + x[:, 1], rtol=1e-15)
    np.testing.assert_allclose(out["p"], x[:, 0] * x[:, 1], rtol=1e-15)
    # derivatives, reverse and forward, with respect to the inputs and to a closed-over value
    def cost(x, c, once):
        y = _xla.computed_once(lambda v: _expensive(v) * c, x[:, 0]) if once else _expensive(x[:, 0]) * c
        return jnp.sum(jnp.stack(_consumers(y, x)) ** 2)

    for argnums in (0, 1):
        for diff in (jax.grad, jax.jacfwd):
            np.testing.assert_allclose(diff(cost, argnums)(x, 1.3, True), diff(cost, argnums)(x, 1.3, False), rtol=1e-8)  # a chain of 60 sines: ill-conditioned
    bad = x.at[3, 0].set(jnp.inf)
    assert bool(jnp.all(jnp.isnan(jax.jit(lambda x: _xla.computed_once(_expensive, x[:, 0]))(bad))))
    if jax.default_backend() == "cpu":  # the point of it: the chain compiled once, not once per consumer
        def sines(f):
            return jax.jit(f, compiler_options=_xla.compiler_options()).lower(x).compile().as_text().count(" sine(")

        assert sines(once) == 60 and sines(plain) >= 4 * 60, (sines(once), sines(plain))


def test_jacobians_once_equal_jacfwd_and_evaluate_the_primal_once():
    """jacobians_once: the Jacobians of jax.jacfwd (two arguments, a traced closed-over value,
    under vmap), with the primal chain and the values its tangents read evaluated once, not fused
    into every Jacobian entry."""
    def fn(x, w, c):
        y = _expensive(x[:3] * c + w[0])
        return jnp.concatenate([y * x[3:], y[:2] * w[1:]])

    rng = np.random.default_rng(0)
    x, w = jnp.asarray(rng.normal(size=(20, 6))), jnp.asarray(rng.normal(size=(20, 3)))
    once = jax.vmap(lambda x, w, c: _xla.jacobians_once(lambda a, b: fn(a, b, c), x, w), in_axes=(0, 0, None))
    plain = jax.vmap(lambda x, w, c: (fn(x, w, c), jax.jacfwd(fn, argnums=(0, 1))(x, w, c)), in_axes=(0, 0, None))
    (y1, (F1, G1)), (y2, (F2, G2)) = jax.jit(once)(x, w, 0.7), jax.jit(plain)(x, w, 0.7)
    assert F1.shape == (20, 5, 6) and G1.shape == (20, 5, 3)
    for a, b in ((y1, y2), (F1, F2), (G1, G2)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert float(jnp.max(jnp.abs(G1))) > 1e-3
    if jax.default_backend() == "cpu":
        # each of the 60 stages: sin(y) and sin(y^2) (the derivative of cos(y^2)), once
        def sines(f):
            return jax.jit(f).lower(x, w, 0.7).compile().as_text().count(" sine(")

        assert sines(once) == 120 and sines(plain) >= 4 * 120, (sines(once), sines(plain))


def test_linearization_equals_jvp_and_stores_fewer_residuals_than_jax_linearize():
    """linearization: fn's value and its Jacobian-vector products as jax.jvp gives them, for the
    Panda's Newton-Euler (first-order primitives: the equations sorted by hand, values that are
    negations or entries of others made again by the map), for a function with a nested jit and
    a custom derivative (the jit inlined) and for a loop that carries tangents (JAX's partial
    evaluation); the Newton-Euler map reads fewer stored values than jax.linearize's does."""
    from jaxarm.dynamics.newton_euler import _inverse_dynamics

    arm = jaxarm.load_arm("panda")
    n = arm.n
    rng = np.random.default_rng(3)
    q, qd, qdd = (jnp.asarray(rng.normal(size=n)) for _ in range(3))
    tangents = [tuple(jnp.asarray(rng.normal(size=n)) for _ in range(3)) for _ in range(2)]

    def rnea(q, qd, qdd):
        return _inverse_dynamics(arm, q, qd, qdd, None)

    @jax.custom_jvp
    def soft(x):
        return jnp.log1p(jnp.exp(x))

    soft.defjvp(lambda p, t: (soft(p[0]), jax.nn.sigmoid(p[0]) * t[0]))

    def nested(q, qd, qdd):
        return jax.jit(lambda a: soft(a) * jnp.sin(qd))(q) + 2.0 * qdd - q[::-1]

    def looped(q, qd, qdd):  # a loop that carries tangents: JAX's partial evaluation
        return jax.lax.fori_loop(0, 3, lambda i, x: jnp.sin(x) * qd + qdd, q)

    for fn in (rnea, nested, looped):
        y, residuals, apply = _xla.linearization(fn, q, qd, qdd)
        np.testing.assert_allclose(y, fn(q, qd, qdd), rtol=1e-13, atol=1e-12)
        for t in tangents:
            np.testing.assert_allclose(apply(residuals, *t), jax.jvp(fn, (q, qd, qdd), t)[1], rtol=1e-12, atol=1e-10)
        # under jit and vmap over tangents, as the step Jacobians use it
        mapped = jax.jit(lambda r, T: jax.vmap(lambda t: apply(r, *t))(T))(residuals, tuple(jnp.stack(c) for c in zip(*tangents)))
        np.testing.assert_allclose(mapped[1], jax.jvp(fn, (q, qd, qdd), tangents[1])[1], rtol=1e-12, atol=1e-10)

    def stored(fn):
        return sum(int(np.size(r)) for r in jax.eval_shape(lambda *a: fn(rnea, *a)[1], q, qd, qdd))

    def by_jax(fn, *args):
        _, lin = jax.linearize(fn, *args)
        return None, [c for c in jax.make_jaxpr(lin)(*args).consts if isinstance(c, jax.core.Tracer)]

    ours, theirs = stored(_xla.linearization), stored(by_jax)
    assert 0 < ours < theirs, (ours, theirs)


def test_runge_kutta_stage_loop_computes_the_dynamics_once_per_stage():
    """The stage loop hands each stage's acceleration to the next iteration through the loop's
    state: put into the stage table where it was computed, it fed one select per stage and
    XLA:CPU fused the whole dynamics into each (three forward dynamics per RK3 stage)."""
    from jaxarm import integrators

    step = integrators.explicit_rk(*integrators.KUTTA3, loop=True)
    written = integrators.explicit_rk(*integrators.KUTTA3, loop=False)
    f = lambda t, q, qd: _expensive(q) - 0.5 * qd  # noqa: E731  (a stand-in for forward dynamics)

    def steps(method, q, qd):
        def body(c, _):
            q, qd, _ = method(f, 0.0, c[0], c[1], 1e-2)
            return (q, qd), None

        return jax.lax.scan(body, (q, qd), None, length=5)[0]

    rng = np.random.default_rng(1)
    q, qd = (jnp.asarray(rng.uniform(-1, 1, (16, 3))) for _ in range(2))
    loop = jax.vmap(lambda q, qd: steps(step, q, qd))
    np.testing.assert_allclose(jax.jit(loop)(q, qd), jax.jit(jax.vmap(lambda q, qd: steps(written, q, qd)))(q, qd), rtol=1e-13)
    if jax.default_backend() == "cpu":
        for options in ({}, _xla.compiler_options()):
            text = jax.jit(loop, compiler_options=options).lower(q, qd).compile().as_text()
            assert text.count(" sine(") == 60, text.count(" sine(")  # the dynamics once, in the stage loop's body


# --------------------------------------------------------------------------------------
# Whole loops as single kernels (jaxarm.core.xla.loop_kernels)


def _loop_program(scale):
    """A 200-iteration loop over 20000 numbers (160 kB: above XLA's default threshold of 1 kB,
    below LOOP_KERNEL_BYTES), a new function each call so that no compiled program is reused."""
    return jax.jit(lambda x: jax.lax.fori_loop(0, 200, lambda i, x: jnp.sin(x) * scale + 0.1, x))


def _single_kernel_loops(compiled) -> int:
    return compiled.as_text().count('xla_cpu_small_call="true"')


def test_loop_kernels_compile_a_small_loop_as_one_kernel_and_nothing_else():
    """Inside loop_kernels() the loop compiles as one kernel (a call XLA tags xla_cpu_small_call)
    with the same result; outside it, at threshold 0, below the loop's size, and on another
    thread while this one is inside it, it compiles as XLA's default does."""
    import threading

    if jax.default_backend() != "cpu":
        assert _xla.loop_kernels_status()["loop_kernel_bytes"] is None
        return
    if _xla.LOOP_KERNEL_BYTES is None:
        pytest.skip("JAXARM_LOOP_KERNEL_BYTES is off")
    assert _xla.loop_kernels_status() == {"loop_kernel_bytes": _xla.LOOP_KERNEL_BYTES}
    x = jnp.linspace(0.0, 1.0, 20000)
    plain = _loop_program(1.01).lower(x).compile()
    with _xla.loop_kernels():
        one = _loop_program(1.01).lower(x).compile()
        other = {}
        worker = threading.Thread(target=lambda: other.setdefault("c", _loop_program(1.01).lower(x).compile()))
        worker.start()
        worker.join()
    with _xla.loop_kernels(0):
        off = _loop_program(1.01).lower(x).compile()
    with _xla.loop_kernels(1000):  # smaller than the loop's buffers
        small = _loop_program(1.01).lower(x).compile()
    assert _single_kernel_loops(one) == 1
    assert [_single_kernel_loops(c) for c in (plain, other["c"], off, small)] == [0, 0, 0, 0]
    np.testing.assert_array_equal(np.asarray(one(x)), np.asarray(plain(x)))
    assert getattr(_xla._extra, "options", None) is None  # nothing left behind


def test_jaxarm_jit_compiles_inside_loop_kernels_and_a_nested_call_adds_nothing():
    seen = []

    def f(x):
        seen.append(dict(getattr(_xla._extra, "options", None) or {}))
        return jax.lax.fori_loop(0, 50, lambda i, x: jnp.cos(x), x)

    jitted = _xla.jit(f)
    y = jitted(jnp.ones(3000))
    on = jax.default_backend() == "cpu" and _xla.LOOP_KERNEL_BYTES is not None
    expected = {"xla_cpu_small_while_loop_byte_threshold": _xla.LOOP_KERNEL_BYTES} if on else {}
    assert seen == [expected]
    np.testing.assert_allclose(np.asarray(y), np.asarray(jax.jit(f)(jnp.ones(3000))), rtol=0, atol=0)
    with _xla.loop_kernels(0):  # inside a user's jit, the user's compile (and its setting) applies
        jax.jit(lambda x: jitted(x) + 1.0)(jnp.ones(2000))
    assert len(seen) == 2 and seen[-1] == ({"xla_cpu_small_while_loop_byte_threshold": 0} if jax.default_backend() == "cpu" else {})


def test_backend_options_are_added_to_the_serialized_compile_options():
    from jax._src.lib import xla_client

    base = xla_client.CompileOptions()
    base.num_partitions = 3
    base.executable_build_options.debug_options.xla_llvm_disable_expensive_passes = True
    added = _xla.with_backend_options(base, {"xla_cpu_small_while_loop_byte_threshold": 12345})
    blob = added.SerializeAsString()
    assert b"xla_cpu_small_while_loop_byte_threshold" in blob and b"12345" in blob
    assert b"xla_cpu_small_while_loop_byte_threshold" not in base.SerializeAsString()
    assert added.num_partitions == 3  # the rest kept
    assert added.executable_build_options.debug_options.xla_llvm_disable_expensive_passes is True
    with np.testing.assert_raises(ValueError):
        with _xla.loop_kernels(-1):
            pass


def test_a_compile_options_failure_compiles_without_the_option_and_says_why(monkeypatch):
    """Where the option cannot be added to a compile's options (a jaxlib whose CompileOptions
    serialize differently), the compile goes on without it and loop_kernels_status() says why."""
    if jax.default_backend() != "cpu" or _xla.LOOP_KERNEL_BYTES is None:
        pytest.skip("loop kernels apply on a CPU only")
    assert _xla._install_backend_options()

    def broken(options, extra):
        raise RuntimeError("no such field")

    monkeypatch.setattr(_xla, "with_backend_options", broken)
    monkeypatch.setitem(_xla._patch, "error", None)
    x = jnp.linspace(0.0, 1.0, 20000)
    with _xla.loop_kernels():
        compiled = _loop_program(1.03).lower(x).compile()
    assert _single_kernel_loops(compiled) == 0
    np.testing.assert_array_equal(np.asarray(compiled(x)), np.asarray(_loop_program(1.03)(x)))
    assert _xla.loop_kernels_status() == {"loop_kernel_bytes": None, "reason": "RuntimeError: no such field"}
    monkeypatch.setitem(_xla._patch, "error", None)
    assert _xla.loop_kernels_status() == {"loop_kernel_bytes": _xla.LOOP_KERNEL_BYTES}
