"""The component-wise recursions (jaxarm.dynamics, in the algebra of jaxarm.dynamics.algebra)
against the independent array oracles of tests/oracles.py (rnea, composite_mass_matrix),
and the polynomial sine/cosine against NumPy.

Random arms of every convention (standard / modified DH, placements), revolute and prismatic
joints (also a prismatic first joint), drives, payload, base and tool transforms; single and
batched states, float64 and float32, values and derivatives (grad, jacfwd, hessian).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from helpers import assert_close, count_primitive, random_arm, random_state, random_wrench
import oracles
from jaxarm import drives, linalg
from jaxarm.dynamics import algebra as _kernels
from jaxarm.dynamics.composite_body import _composite_mass_matrix
from jaxarm.dynamics.forward import _forward_dynamics
from jaxarm.dynamics.newton_euler import _base_acceleration, _rnea
from jaxarm.model.arm import body_model

CASES = [(c, t) for c in ("standard", "modified", "placement") for t in ("RRPR", "PRPR")]
IDS = [f"{c}-{t}" for c, t in CASES]


def _arm(case, seed=0, joints=None):
    convention, types = case
    types = types if joints is None else types[:joints]
    return random_arm(seed, types, convention, drives=True, payload=True, base=True, tool=True, gravity=(0.3, -1.2, -9.81))


def _reference(arm, q, qd, qdd, f_ext=None):
    """tau, wrenches, M and forward dynamics from the reference functions only."""
    bodies = body_model(arm)
    dtype = jnp.result_type(bodies.mass, q)
    a0 = _base_acceleration(arm, dtype)
    tau, wrenches = oracles.rnea(arm, bodies, q, qd, qdd, a0, f_ext)
    M = oracles.composite_mass_matrix(arm, bodies, q) + jnp.diag(drives._reflected_inertia(arm))
    bias = oracles.rnea(arm, bodies, q, qd, jnp.zeros_like(qd), a0, f_ext)[0]
    return tau, wrenches, M, bias


# --------------------------------------------------------------------------------------
# sine and cosine


def test_sincos_matches_numpy_float64():
    x = np.concatenate([np.linspace(-10.0, 10.0, 20001), np.linspace(-1e6, 1e6, 20001), np.arange(-50, 51) * np.pi / 4])
    s, c = jax.jit(_kernels.sincos)(x)
    assert np.abs(np.asarray(s) - np.sin(x)).max() <= 4e-16
    assert np.abs(np.asarray(c) - np.cos(x)).max() <= 4e-16


def test_sincos_matches_numpy_float32():
    x = np.linspace(-1e3, 1e3, 20001).astype(np.float32)
    s, c = jax.jit(_kernels.sincos)(x)
    assert s.dtype == jnp.float32 and c.dtype == jnp.float32
    x64 = x.astype(np.float64)
    assert np.abs(np.asarray(s, np.float64) - np.sin(x64)).max() <= 2.5e-7
    assert np.abs(np.asarray(c, np.float64) - np.cos(x64)).max() <= 2.5e-7


def test_sincos_derivatives():
    x = np.linspace(-7.0, 7.0, 57)
    ds = jax.vmap(jax.grad(lambda t: _kernels.sincos(t)[0]))(x)
    dc = jax.vmap(jax.grad(lambda t: _kernels.sincos(t)[1]))(x)
    d2s = jax.vmap(jax.hessian(lambda t: _kernels.sincos(t)[0]))(x)
    np.testing.assert_allclose(ds, np.cos(x), atol=1e-15)
    np.testing.assert_allclose(dc, -np.sin(x), atol=1e-15)
    np.testing.assert_allclose(d2s, -np.sin(x), atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sincos_takes_the_polynomials_on_arrays_and_the_library_on_a_single_value(dtype):
    """A batch is evaluated by the vectorizable polynomials (no sine or cosine instruction in the
    program), a single value by XLA's own sine and cosine (one instruction each); both agree with
    NumPy, also eagerly and in a scalar loop (the sequential loops of the trajectory optimizers)."""
    x = np.linspace(-7.0, 7.0, 57).astype(dtype)
    tol = 4e-16 if dtype == np.float64 else 2.5e-7

    def instructions(f, *args):
        text = jax.jit(f).lower(*args).as_text()
        return text.count("stablehlo.sine"), text.count("stablehlo.cosine")

    assert instructions(_kernels.sincos, x) == (0, 0)
    assert instructions(jax.vmap(_kernels.sincos), x) == (0, 0)  # a batch of single values is a batch
    assert instructions(_kernels.sincos, x[3]) == (1, 1)

    def loop(v):  # one value at a time, as a trajectory optimizer's line search steps through its knots
        return jax.lax.scan(lambda carry, t: (carry, _kernels.sincos(t)), 0.0, v)[1]

    assert instructions(loop, x) == (1, 1)
    for s, c in (jax.jit(_kernels.sincos)(x), jax.jit(loop)(x), _kernels.sincos(x), [np.array(v) for v in zip(*[_kernels.sincos(t) for t in x[:5]])]):
        n = len(s)
        assert np.asarray(s).dtype == dtype and np.asarray(c).dtype == dtype
        assert np.abs(np.asarray(s, np.float64) - np.sin(x[:n].astype(np.float64))).max() <= tol
        assert np.abs(np.asarray(c, np.float64) - np.cos(x[:n].astype(np.float64))).max() <= tol
    # the primitive's derivative rule (sincos's only one), on a scalar and on an array
    for v in (x[3], x):
        (s, c), (ds, dc) = jax.jvp(lambda t: tuple(_kernels._sincos_p.bind(t)), (v,), (np.ones_like(v),))
        np.testing.assert_allclose(np.asarray(ds, np.float64), np.cos(np.float64(v)), atol=tol)
        np.testing.assert_allclose(np.asarray(dc, np.float64), -np.sin(np.float64(v)), atol=tol)


def test_scalar_arithmetic_traces_the_equations_of_jnp_operators():
    """mul, plus, minus and a Known's operators take lax's primitives directly where they can (a
    faster trace); the equations, dtypes and weak types must be those jnp's operators make, for
    strong and weak tracers, float32 and float64, batched or not, and mixed operands."""
    ops = [(_kernels.mul, lambda a, b: a * b), (_kernels.plus, lambda a, b: a + b), (_kernels.minus, lambda a, b: a - b)]
    f64, f32 = jnp.asarray(np.linspace(0.1, 0.5, 3)), jnp.asarray(np.linspace(0.1, 0.5, 3), jnp.float32)
    values = {"f64": f64, "f32": f32, "f64 scalar": f64[0], "f32 scalar": f32[0], "weak": jnp.asarray(0.7)}

    def same(f, g, *args):
        jf, jg = jax.make_jaxpr(f)(*args), jax.make_jaxpr(g)(*args)
        assert str(jf) == str(jg), (str(jf), str(jg))
        assert [v.aval for v in jf.jaxpr.outvars] == [v.aval for v in jg.jaxpr.outvars]
        np.testing.assert_array_equal(f(*args), g(*args))

    for helper, operator in ops:
        for x in values.values():
            for y in values.values():
                if jnp.result_type(x, y) == jnp.result_type(x) or jnp.result_type(x, y) == jnp.result_type(y):
                    same(lambda a, b: helper(a, b), lambda a, b: operator(a, b), x, y)
                    same(jax.vmap(helper), jax.vmap(operator), jnp.stack([x, x]), jnp.stack([y, y]))
    for value in (2.5, -0.25):
        known = _kernels.Known(value)
        for x in values.values():
            same(lambda a: known * a, lambda a: value * a, x)
            same(lambda a: a * known, lambda a: value * a, x)
            same(lambda a: known + a, lambda a: a + value, x)
            same(lambda a: known - a, lambda a: value - a, x)
            same(lambda a: a - known, lambda a: a - value, x)
            same(jax.vmap(lambda a: known * a), jax.vmap(lambda a: value * a), jnp.stack([x, x]))


def test_assembly_helpers():
    vals = [jnp.asarray(float(k)) for k in range(5)]
    np.testing.assert_array_equal(_kernels.vector(vals), np.arange(5.0))
    rows = [[jnp.asarray(3.0 * i + j) for j in range(3)] for i in range(4)]
    np.testing.assert_array_equal(_kernels.matrix(rows), np.arange(12.0).reshape(4, 3))
    small = [[jnp.asarray(2.0 * i + j) for j in range(2)] for i in range(2)]
    np.testing.assert_array_equal(_kernels.matrix(small), np.arange(4.0).reshape(2, 2))


# --------------------------------------------------------------------------------------
# Known scalars: a constant arm's structure folded at trace time


def test_known_scalars_fold_zeros_and_ones():
    Known, ZERO = _kernels.Known, _kernels.ZERO
    x = jnp.asarray([1.5, -2.0])
    assert (Known(0.0) * x) is ZERO and (x * Known(0.0)) is ZERO
    assert (Known(1.0) * x) is x and (Known(0.0) + x) is x and (x + Known(0.0)) is x and (x - Known(0.0)) is x
    np.testing.assert_array_equal(Known(-1.0) * x, -x)
    np.testing.assert_array_equal(Known(2.0) * x + Known(3.0), 2.0 * x + 3.0)
    np.testing.assert_array_equal(Known(3.0) - x, 3.0 - x)
    np.testing.assert_array_equal(Known(0.0) - x, -x)
    np.testing.assert_array_equal(x / Known(4.0), x / 4.0)
    np.testing.assert_array_equal(Known(2.0) / x, 2.0 / x)
    both = Known(2.0) * Known(3.0) - Known(1.0) / Known(4.0)
    assert isinstance(both, Known) and both.value == 5.75
    assert isinstance(_kernels.rsqrt(Known(4.0)), Known) and _kernels.rsqrt(Known(4.0)).value == 0.5
    assert float(np.float64(2.0) * Known(3.0)) == 6.0  # numpy scalars defer to Known, no object arrays
    # singular input fails as the same arrays would (inf, nan), not as a Python exception
    assert float(1.0 / Known(0.0)) == np.inf and np.isnan(_kernels.rsqrt(Known(-1.0)).value)
    assert np.isnan((Known(0.0) / Known(0.0)).value)
    # traced: a multiplication by a Known zero or one leaves nothing in the program
    jaxpr = jax.make_jaxpr(lambda v: Known(0.0) * v + Known(1.0) * v + Known(0.0))(1.0)
    assert len(jaxpr.jaxpr.eqns) == 0, jaxpr
    # the float32 of a program is kept (Knowns enter as weakly typed Python floats)
    assert (Known(2.5) * jnp.float32(2.0)).dtype == jnp.float32
    v = _kernels.vector([Known(1.0), jnp.float32(2.0), ZERO])
    assert v.dtype == jnp.float32
    np.testing.assert_array_equal(v, [1.0, 2.0, 0.0])
    np.testing.assert_array_equal(_kernels.matrix([[ZERO] * 3] * 3, jnp.float64), np.zeros((3, 3)))


def test_known_entries_snap_rounding_zeros_only():
    R = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(np.pi / 2), -1.0], [0.0, 1.0, np.cos(np.pi / 2)]])
    rows = _kernels._mat(R)
    assert [[k.value for k in r] for r in rows] == [[1, 0, 0], [0, 0, -1], [0, 1, 0]]
    assert [k.value for k in _kernels._vec(np.array([2.0, 1e-10, 3e-16]))] == [2.0, 1e-10, 0.0]  # relative to 2.0
    assert [k.value for k in _kernels._vec(np.array([1e-20, 2e-20, 0.0]))] == [1e-20, 2e-20, 0.0]  # tiny but not noise
    kinds = []
    jax.jit(lambda v: kinds.extend(type(k) for k in _kernels._vec(v)) or v)(jnp.ones(3))
    assert kinds and _kernels.Known not in kinds  # traced values are not folded


BUNDLED = ("puma560", "panda", "stanford_arm", "cmu_dd_arm", "rp_arm")


@pytest.mark.parametrize("name", BUNDLED)
def test_constant_arm_equals_traced_arm(name):
    """An arm closed over by the jit (its values known while tracing, structural zeros folded)
    and the same arm passed as an argument (traced) give the same dynamics; the folding removes
    a real share of the traced program."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jaxarm.PhysicalConsistencyWarning)
        arm = jaxarm.load_arm(name)
    q, qd, x = random_state(31, arm.n)
    f_ext = random_wrench(31)
    w = lambda a: f_ext.astype(a.gravity.dtype)  # noqa: E731  the wrench in the arm's precision
    funcs = {
        "inverse_dynamics": lambda a, q, qd, x: jaxarm.inverse_dynamics(a, q, qd, x, w(a)),
        "joint_wrenches": lambda a, q, qd, x: jaxarm.joint_wrenches(a, q, qd, x),
        "bias_forces": lambda a, q, qd, x: jaxarm.bias_forces(a, q, qd, w(a)),
        "mass_matrix": lambda a, q, qd, x: jaxarm.mass_matrix(a, q),
        "forward_dynamics": lambda a, q, qd, x: jaxarm.forward_dynamics(a, q, qd, x, w(a)),
    }
    for what, fn in funcs.items():
        constant = jax.jit(lambda q, qd, x: fn(arm, q, qd, x))
        traced = jax.jit(fn)
        assert_close(constant(q, qd, x), traced(arm, q, qd, x), 1e-13, f"{name} {what}")
        arm32 = arm.astype(jnp.float32)
        args32 = tuple(jnp.asarray(v, jnp.float32) for v in (q, qd, x))
        out32 = jax.jit(lambda q, qd, x: fn(arm32, q, qd, x))(*args32)
        assert out32.dtype == jnp.float32, what
        assert_close(out32, traced(arm, q, qd, x), 3e-4 if what == "forward_dynamics" else 3e-5, f"{name} {what} float32")

    def eqns(j):  # equations, those of inner jaxprs (the derivative rule's call) included
        jaxpr = getattr(j, "jaxpr", j)
        inner = [getattr(v, "jaxpr", v) for e in jaxpr.eqns for v in e.params.values()]
        return len(jaxpr.eqns) + sum(eqns(v) for v in inner if hasattr(v, "eqns"))

    folded = eqns(jax.make_jaxpr(lambda q, qd, x: _forward_dynamics(arm, q, qd, x))(q, qd, x))
    full = eqns(jax.make_jaxpr(lambda a, q, qd, x: _forward_dynamics(a, q, qd, x))(arm, q, qd, x))
    assert folded < 0.8 * full, (folded, full)


# --------------------------------------------------------------------------------------
# Kernels against the reference


MATCH = [(case, True) for case in CASES] + [(CASES[0], False), (CASES[5], False)]


@pytest.mark.parametrize("case,with_wrench", MATCH, ids=[f"{c}-{t}-{'wrench' if w else 'free'}" for (c, t), w in MATCH])
def test_kernels_match_reference(case, with_wrench):
    arm = _arm(case)
    q, qd, qdd = random_state(3, arm.n)
    f_ext = random_wrench(3) if with_wrench else None
    tau_ref, wrench_ref, M_ref, bias_ref = _reference(arm, q, qd, qdd, f_ext)
    friction = drives.friction_torques(arm, qd)
    assert_close(jaxarm.rigid_body_torques(arm, q, qd, qdd, f_ext), tau_ref, 1e-12, "rnea")
    assert_close(jaxarm.joint_wrenches(arm, q, qd, qdd, f_ext), wrench_ref, 1e-12, "wrenches")
    assert_close(jaxarm.bias_forces(arm, q, qd, f_ext), bias_ref, 1e-12, "bias")
    assert_close(jaxarm.mass_matrix(arm, q), M_ref, 1e-12, "mass matrix")
    tau = tau_ref + drives.reflected_inertia(arm) * qdd + friction
    assert_close(jaxarm.inverse_dynamics(arm, q, qd, qdd, f_ext), tau, 1e-12, "inverse dynamics")
    qdd_ref = np.linalg.solve(np.asarray(M_ref), np.asarray(tau - bias_ref - friction))
    assert_close(jaxarm.forward_dynamics(arm, q, qd, tau, f_ext), qdd_ref, 1e-10, "forward dynamics")


@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_kernels_float32(case):
    arm = _arm(case)
    q, qd, qdd = random_state(4, arm.n)
    arm32 = arm.astype(jnp.float32)
    q32, qd32, qdd32 = (jnp.asarray(x, jnp.float32) for x in (q, qd, qdd))
    tau_ref, _, M_ref, _ = _reference(arm, q, qd, qdd)
    tau = jaxarm.inverse_dynamics(arm32, q32, qd32, qdd32)
    M = jaxarm.mass_matrix(arm32, q32)
    assert tau.dtype == jnp.float32 and M.dtype == jnp.float32
    assert_close(jaxarm.rigid_body_torques(arm32, q32, qd32, qdd32), tau_ref, 2e-5, "rnea float32")
    assert_close(M, M_ref, 2e-5, "mass matrix float32")
    assert jaxarm.forward_dynamics(arm32, q32, qd32, tau).dtype == jnp.float32


@pytest.mark.parametrize("case", [CASES[0], CASES[5]], ids=[IDS[0], IDS[5]])
def test_kernels_batched_equal_single(case):
    arm = _arm(case, joints=3)
    states = [random_state(10 + k, arm.n) for k in range(4)]
    Q, QD, QDD = (np.stack(x) for x in zip(*states))
    batched = jax.jit(jax.vmap(lambda q, qd, qdd: (jaxarm.inverse_dynamics(arm, q, qd, qdd), jaxarm.mass_matrix(arm, q), jaxarm.forward_dynamics(arm, q, qd, qdd))))
    tau_b, M_b, qdd_b = batched(Q, QD, QDD)
    for k in range(4):
        tau_ref, _, M_ref, _ = _reference(arm, Q[k], QD[k], QDD[k])
        assert_close(tau_b[k], tau_ref + drives.reflected_inertia(arm) * QDD[k] + drives.friction_torques(arm, QD[k]), 1e-12, "batched tau")
        assert_close(M_b[k], M_ref, 1e-12, "batched M")
        assert_close(qdd_b[k], jaxarm.forward_dynamics(arm, Q[k], QD[k], QDD[k]), 1e-12, "batched forward dynamics")


def test_kernels_batched_over_arms():
    arms = [random_arm(s, "RPR", "modified", payload=True, name="same") for s in range(3)]
    stacked = jaxarm.stack_arms(arms)
    q, qd, qdd = random_state(5, 3)
    taus = jax.vmap(lambda a: jaxarm.inverse_dynamics(a, q, qd, qdd))(stacked)
    for k, arm in enumerate(arms):
        assert_close(taus[k], _reference(arm, q, qd, qdd)[0], 1e-12, f"arm {k}")


@pytest.mark.parametrize("case", [CASES[1], CASES[4]], ids=[IDS[1], IDS[4]])
def test_kernel_derivatives_match_reference(case):
    arm = _arm(case, joints=3)
    q, qd, qdd = random_state(6, arm.n)
    bodies = body_model(arm)
    a0 = _base_acceleration(arm, jnp.float64)

    def kernel(x):
        return _rnea(arm, bodies, x, qd, qdd, a0)[0]

    def reference(x):
        return oracles.rnea(arm, bodies, x, qd, qdd, a0)[0]

    assert_close(jax.jacfwd(kernel)(q), jax.jacfwd(reference)(q), 1e-11, "d tau / d q")
    hk = jax.hessian(lambda x: kernel(x)[0])(q)
    hr = jax.hessian(lambda x: reference(x)[0])(q)
    assert_close(hk, hr, 1e-10, "hessian")

    def M_of(mass, fn):
        links = arm.links.__class__(mass=mass, com=arm.links.com, inertia=arm.links.inertia)
        a = arm.replace(links=links)
        return fn(a, body_model(a), q)

    gk = jax.jacfwd(lambda m: M_of(m, _composite_mass_matrix))(arm.links.mass)
    gr = jax.jacfwd(lambda m: M_of(m, oracles.composite_mass_matrix))(arm.links.mass)
    assert_close(gk, gr, 1e-11, "d M / d mass")
    g_fd = jax.grad(lambda x: jnp.sum(jaxarm.forward_dynamics(arm, x, qd, qdd) ** 2))(q)
    M_ref = lambda x: oracles.composite_mass_matrix(arm, body_model(arm), x) + jnp.diag(drives._reflected_inertia(arm))  # noqa: E731
    bias_ref = lambda x: oracles.rnea(arm, bodies, x, qd, jnp.zeros_like(qd), a0)[0]  # noqa: E731
    g_ref = jax.grad(lambda x: jnp.sum(linalg.cholesky_solve(M_ref(x), qdd - bias_ref(x) - drives._friction_torques(arm, qd)) ** 2))(q)
    assert_close(g_fd, g_ref, 1e-10, "grad of forward dynamics")


@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=[IDS[0], IDS[4]])
def test_forward_dynamics_kernel_matches_reference_with_derivatives(case):
    """The component-wise forward dynamics (used by every rollout) against the reference
    (array Newton-Euler, array composite-body M, array Cholesky): values, d/dq, d/dqd, d/dtau and
    the gradient with respect to the arm's inertial and drive parameters."""
    arm = _arm(case)
    q, qd, tau = random_state(21, arm.n)
    f_ext = random_wrench(21)
    fast = lambda a, x, v, t: _forward_dynamics(a, x, v, t, f_ext)  # noqa: E731
    ref = lambda a, x, v, t: oracles.forward_dynamics(a, x, v, t, f_ext)  # noqa: E731
    assert_close(fast(arm, q, qd, tau), ref(arm, q, qd, tau), 1e-12, "forward dynamics")
    # forward and reverse mode of its derivative rule (through inverse dynamics) against the reference
    want = jax.jacfwd(ref, (1, 2, 3))(arm, q, qd, tau)
    for mode in (jax.jacfwd, jax.jacrev):
        for argnum, got, w in zip((1, 2, 3), mode(fast, (1, 2, 3))(arm, q, qd, tau), want):
            assert_close(got, w, 1e-10, f"{mode.__name__} d/d arg {argnum}")
    cost = lambda f: lambda a: jnp.sum(jnp.sin(f(a, q, qd, tau)))  # noqa: E731
    g_fast, g_ref = jax.grad(cost(fast))(arm), jax.grad(cost(ref))(arm)
    for name in ("mass", "com"):
        assert_close(getattr(g_fast.links, name), getattr(g_ref.links, name), 1e-10, f"d/d links.{name}")
    # Only the symmetric part of d/dI is defined by the physics (I is symmetric); the kernel reads
    # both triangles evenly, so its gradient is symmetric itself.
    sym = lambda G: 0.5 * (G + jnp.swapaxes(G, -1, -2))  # noqa: E731
    assert_close(g_fast.links.inertia, sym(g_fast.links.inertia), 1e-14, "kernel d/dI symmetric")
    assert_close(g_fast.links.inertia, sym(g_ref.links.inertia), 1e-10, "d/d links.inertia (symmetric part)")
    for name in ("rotor_inertia", "viscous_friction", "gear_ratio"):
        assert_close(getattr(g_fast.drives, name), getattr(g_ref.drives, name), 1e-10, f"d/d drives.{name}")
    # and to second order, in q and qd
    second = lambda f: jax.hessian(lambda x, v: jnp.sum(jnp.sin(f(arm, x, v, tau))), argnums=(0, 1))(q, qd)  # noqa: E731
    for got, w, name in zip(jax.tree_util.tree_leaves(second(fast)), jax.tree_util.tree_leaves(second(ref)), ("qq", "qv", "vq", "vv")):
        assert_close(got, w, 1e-9, f"second derivative d2/d{name}")


def test_cholesky_on_scalars_matches_numpy():
    rng = np.random.default_rng(3)
    A = rng.normal(size=(7, 7))
    M = A @ A.T + 7 * np.eye(7)
    b = rng.normal(size=7)
    x = linalg.cholesky_solve_scalars([[jnp.asarray(M[i, j]) for j in range(7)] for i in range(7)], [jnp.asarray(v) for v in b])
    assert_close(jnp.stack(x), np.linalg.solve(M, b), 1e-13, "scalar Cholesky")
    assert_close(linalg.cholesky_solve(jnp.asarray(M), jnp.asarray(b)), np.linalg.solve(M, b), 1e-13, "array Cholesky")


def test_reverse_mode_gathers_a_vectors_cotangents_by_selects_and_reads_them_by_one_split():
    """The recursions read a joint vector's entries by one split (algebra.entries) and assemble
    their results with algebra.vector. In reverse mode the cotangents of the entries are put back
    by a chain of selects (no concatenate: XLA:CPU re-derives a concatenate's operands for every
    entry it writes; no pads: one slice per use transposed to a pad each, 27 for the Puma's
    inverse dynamics, each a loop of its own), and the cotangent of a vector's array is read by
    one split (no select-and-sum per entry). Numbers, lists and numpy arrays pass through
    unchanged (their entries fold as before)."""
    arm = jaxarm.load_arm("puma560")
    q, qd, x = random_state(5, arm.n)
    loss = lambda q, qd, x: jnp.sum(jaxarm.inverse_dynamics(arm, q, qd, x))  # noqa: E731
    grad = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, qd, x)
    assert count_primitive(grad, "pad") == 0 and count_primitive(grad, "concatenate") == 0
    assert count_primitive(grad, "reduce_sum") == count_primitive(jax.make_jaxpr(loss)(q, qd, x), "reduce_sum")  # the loss's own sum only
    assert count_primitive(grad, "jaxarm_entries") >= 1  # the torques' cotangent, read by one split
    parts = _kernels.entries(jnp.asarray([1.0, 2.0, 3.0]))
    assert [float(p) for p in parts] == [1.0, 2.0, 3.0] and all(jnp.shape(p) == () for p in parts)
    constant = np.array([1.0, 2.0])
    assert _kernels.entries(constant) is constant and _kernels.entries(None) is None


def _columns_read(hlo, shape):
    """For every parameter of shape ``shape`` (B, n) of a fused computation in the compiled HLO text
    that the computation slices column by column: the set of columns it reads."""
    import re

    rows, n = shape
    found = []
    for comp in re.split(r"\n(?=\S)", hlo):
        if not comp.startswith("%fused"):
            continue
        for name in re.findall(r"(%param_[\w.]+) = [a-z0-9]+\[" + f"{rows},{n}" + r"\]\{1,0\} parameter", comp):
            cols = set()
            for a, b in re.findall(re.escape(name) + r"\), slice=\{\[0:" + str(rows) + r"\], \[(\d+):(\d+)\]\}", comp):
                cols.update(range(int(a), int(b)))
            if cols:
                found.append(cols)
    return found


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_batched_dynamics_read_the_first_and_last_joint_angle_on_a_cpu(monkeypatch, dtype):
    """Batched on a CPU, every fusion that reads the joint angles column by column also reads the
    first and the last column (algebra.entries(whole=True) in joint_frames). The Puma 560's first
    joint turns about gravity, so its angle drops out of the dynamics; read without it, LLVM ran the
    last vector's worth of the batch as scalar code (at batch 16 in float32, half of it: a 1000-step
    RK3 rollout 2.7x slower). The values are those of the plain split; a NaN first angle, which the
    dynamics never needed, now gives NaN accelerations rather than finite ones."""
    arm = jaxarm.load_arm("puma560").astype(dtype)
    rng = np.random.default_rng(3)
    q, qd, tau = (jnp.asarray(rng.uniform(-1, 1, (16, arm.n)), dtype) for _ in range(3))
    fd = jax.vmap(lambda q, qd, tau: jaxarm.forward_dynamics(arm, q, qd, tau))
    # the first angle (and the last, the wrist's roll) drops out: its column of the Jacobian is zero
    J = np.asarray(jax.jacfwd(lambda q0: jaxarm.forward_dynamics(arm, q0, qd[0], tau[0]))(q[0]))
    assert np.all(J[:, 0] == 0) and np.any(J[:, 1] != 0)

    def compiled_columns():
        return _columns_read(jax.jit(fd, compiler_options=jaxarm.compiler_options()).lower(q, qd, tau).compile().as_text(), q.shape)

    whole = fd(q, qd, tau)
    if jax.default_backend() == "cpu":
        columns = compiled_columns()
        assert columns and all({0, arm.n - 1} <= cols for cols in columns), columns
        nan_first = fd(q.at[:, 0].set(jnp.nan), qd, tau)
        assert bool(jnp.all(jnp.isnan(nan_first)))

    plain_entries = _kernels.entries
    monkeypatch.setattr(_kernels, "entries", lambda x, whole=False, stored=False: plain_entries(x))
    fd = jax.vmap(lambda q, qd, tau: jaxarm.forward_dynamics(arm, q, qd, tau))
    np.testing.assert_array_equal(np.asarray(whole), np.asarray(fd(q, qd, tau)))
    if jax.default_backend() == "cpu":  # the plain split leaves the first column unread: the case above
        assert any(0 not in cols for cols in compiled_columns())


@pytest.mark.parametrize("witness", [False, True], ids=["own-entry", "witness"])
def test_entries_vector_and_cotangent_once_transform_as_the_plain_operations(witness):
    """The three primitives of the algebra (entries, vector with cotangent_by_split, cotangent_once) give the values and
    derivatives of a split, a stack and the identity under jit, vmap (either axis), jvp, grad,
    jacfwd, jacrev and hessian; cotangent_once's reverse mode holds one stored copy (on a CPU, a
    conditional: XLA:CPU fuses nothing into one) and its forward mode none. With a witness the
    stored copy is stored_after's, whose predicate reads the witness."""
    from jaxarm.dynamics.algebra import cotangent_once, vector

    once = (lambda x: cotangent_once(x, witness=x)) if witness else cotangent_once  # the primal: at hand in reverse mode

    def ours(v):
        e = _kernels.entries(once(v))
        by_split = vector([e[0] * e[1], jnp.sin(e[2]), e[0] ** 3], cotangent_by_split=True)
        by_selects = vector([e[2], e[1] * e[1], e[0]])
        s = _kernels.entries(v, stored=True)  # its cotangents stored (a single vector only)
        return (jnp.sum(by_split * jnp.asarray([1.0, 2.0, 3.0])) + jnp.sum(by_selects ** 2)
                + jnp.cos(s[1]) * s[0] * s[2])

    def plain(v):
        return (jnp.sum(jnp.stack([v[0] * v[1], jnp.sin(v[2]), v[0] ** 3]) * jnp.asarray([1.0, 2.0, 3.0]))
                + jnp.sum(jnp.stack([v[2], v[1] * v[1], v[0]]) ** 2) + jnp.cos(v[1]) * v[0] * v[2])

    v = jnp.asarray([0.3, -1.2, 0.7])
    V = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)))
    second_reverse = lambda f: jax.grad(lambda v: jnp.sum(jax.grad(f)(v) ** 2))  # noqa: E731
    for transform in (lambda f: f, jax.grad, jax.jacfwd, jax.jacrev, jax.hessian, second_reverse):
        assert_close(jax.jit(transform(ours))(v), transform(plain)(v), 1e-14, "one vector")
        assert_close(jax.vmap(transform(ours))(V), jax.vmap(transform(plain))(V), 1e-14, "vmapped, axis 0")
        assert_close(jax.vmap(transform(ours), in_axes=1)(V.T), jax.vmap(transform(plain))(V), 1e-14, "vmapped, axis 1")
    t = jnp.asarray([1.0, 0.5, -2.0])
    assert_close(jax.jvp(ours, (v,), (t,))[1], jax.jvp(plain, (v,), (t,))[1], 1e-14, "jvp")
    # a vector of scalars some of which are batched and some not
    w = jax.vmap(lambda a: vector([a, jnp.asarray(2.0), a * a], cotangent_by_split=True))(jnp.asarray([1.0, 3.0]))
    assert_close(w, jnp.asarray([[1.0, 2.0, 1.0], [3.0, 2.0, 9.0]]), 0.0, "vector with an unbatched entry")
    stored, other = ("jaxarm_stored_after", "jaxarm_materialized") if witness else ("jaxarm_materialized", "jaxarm_stored_after")
    reverse = jax.make_jaxpr(jax.grad(ours))(v)
    assert count_primitive(reverse, stored) == 1 and count_primitive(reverse, other) == 0
    forward = jax.make_jaxpr(lambda v, t: jax.jvp(ours, (v,), (t,)))(v, t)
    assert count_primitive(forward, "jaxarm_materialized") == 0 and count_primitive(forward, "jaxarm_stored_after") == 0
    # the stored entries' cotangents: for a single vector's reverse mode only
    assert count_primitive(reverse, "jaxarm_stored_scalars") == 1 and count_primitive(forward, "jaxarm_stored_scalars") == 0
    assert count_primitive(jax.make_jaxpr(jax.vmap(jax.grad(ours)))(V), "jaxarm_stored_scalars") == 0
    assert count_primitive(jax.make_jaxpr(jax.grad(lambda V: jnp.sum(jax.vmap(ours)(V))))(V), "jaxarm_stored_scalars") == 0
    if jax.default_backend() == "cpu":  # lowered as a conditional on a CPU only
        assert " conditional(" in jax.jit(jax.vmap(jax.grad(ours))).lower(V).compile().as_text()
        assert " conditional(" not in jax.jit(jax.vmap(jax.grad(plain))).lower(V).compile().as_text()
        single = jax.jit(jax.grad(ours)).lower(v).compile().as_text().count(" conditional(")
        assert single == 2, single  # cotangent_once's and the stored entries'


def test_a_traced_arms_joint_angle_cotangents_are_stored_in_a_single_rollouts_gradient(monkeypatch):
    """Where the bodies' placements are traced (the whole arm differentiated), the joint angles'
    cotangents in a rollout's reverse pass (each the reverse sweep through the traced parameters)
    are stored before they are put together (algebra.entries(stored=True)), for a single rollout
    only: not for a constant arm, nor under a jax.vmap (the per-state and summed batch gradients
    keep their own forms), and on a CPU as a conditional only where XLA's fusion emitters compile
    the program (a plain jax.jit; jaxarm.jit turns them off). The gradients are the same."""
    from jaxarm.core import xla
    from jaxarm.dynamics import kinematics
    from jaxarm.identify.linear_model import arm_with_parameters, standard_parameters

    arm = random_arm(2, "RR", "placement", drives=True)
    traced = jax.tree_util.tree_map(jnp.asarray, arm)
    rng = np.random.default_rng(3)
    q, qd = (jnp.asarray(rng.uniform(-1.0, 1.0, arm.n)) for _ in range(2))
    tau = jnp.asarray(rng.uniform(-1.0, 1.0, (5, arm.n)))
    Q = jnp.asarray(rng.uniform(-1.0, 1.0, (2, arm.n)))

    def loss(a, q):
        return jnp.sum(jaxarm.rollout(a, q, qd, tau, 0.01, method="rk3").q ** 2)

    def stored(f, *args):
        return count_primitive(jax.make_jaxpr(f)(*args), "jaxarm_stored_scalars")

    assert stored(jax.grad(loss), traced, q) > 0  # the arm differentiated
    assert stored(jax.grad(loss, argnums=1), traced, q) > 0  # a traced arm, the state differentiated
    assert stored(jax.grad(lambda q: loss(arm, q)), q) == 0  # a constant arm
    # the kinematics known, the inertial parameters traced (measured slower stored)
    parameters = jnp.asarray(standard_parameters(arm))
    assert stored(jax.grad(lambda p: loss(arm_with_parameters(arm, p), q)), parameters) == 0
    assert stored(jax.vmap(jax.grad(loss), in_axes=(None, 0)), traced, Q) == 0
    assert stored(jax.grad(lambda a: jnp.sum(jax.vmap(loss, in_axes=(None, 0))(a, Q))), traced) == 0
    # lowered for XLA's fusion emitters (a plain jax.jit) as a conditional on a CPU; for the
    # classic loop emitter (jaxarm.jit's) as the identity: the gradients agree
    gradient = jax.grad(loss, argnums=(0, 1))
    plain = jax.jit(gradient).lower(traced, q).compile()
    with xla.fusion_emitters_off():
        classic = jax.jit(lambda a, q: gradient(a, q)).lower(traced, q).compile(compiler_options=xla.compiler_options())
    if jax.default_backend() == "cpu":
        assert plain.as_text().count(" conditional(") > classic.as_text().count(" conditional(")
    for (path, u), v in zip(jax.tree_util.tree_leaves_with_path(plain(traced, q)), jax.tree_util.tree_leaves(classic(traced, q))):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-13, err_msg=jax.tree_util.keystr(path))
    assert xla.fusion_emitters_active()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")
    assert not xla.fusion_emitters_active()
    monkeypatch.setattr(kinematics, "_STORED_ANGLE_COTANGENTS", False)
    assert stored(jax.grad(loss), traced, q) == 0


def test_cholesky_by_batch_uses_the_library_only_where_jaxlib_would_not_split_the_batch():
    """linalg.cholesky_factor_by_batch: the factors of jnp.linalg.cholesky (NaN where a matrix is
    not positive definite), by LAPACK for a small batch and unrolled for one jaxlib would split over
    its thread pool (a wait there deadlocked programs run at once) and under jax.vmap."""
    rng = np.random.default_rng(3)
    A = rng.normal(size=(4000, 6, 6))
    H = A @ np.swapaxes(A, 1, 2) + 0.1 * np.eye(6)
    H[7] = -np.eye(6)  # not positive definite
    ref = np.linalg.cholesky(H[np.arange(4000) != 7])

    def factored(fn, x):
        lowered = jax.jit(fn).lower(x)
        return np.asarray(lowered.compile()(x)), "lapack" in lowered.as_text()

    small, small_lapack = factored(linalg.cholesky_factor_by_batch, jnp.asarray(H[:16]))
    large, large_lapack = factored(linalg.cholesky_factor_by_batch, jnp.asarray(H))
    mapped, mapped_lapack = factored(jax.vmap(linalg.cholesky_factor_by_batch), jnp.asarray(H[:16]))
    assert small_lapack and not large_lapack and not mapped_lapack
    for L, k in ((small, 16), (large, 4000), (mapped, 16)):
        keep = np.arange(k) != 7
        assert_close(L[keep], ref[: keep.sum()], 1e-12, "factor")
        assert np.all(np.isnan(np.diag(L[7])))
    # derivatives: those of the factorization, in reverse mode too (the batching rule has none)
    W = jnp.asarray(rng.normal(size=(16, 6, 6)))
    Hs = jnp.asarray(np.delete(H[:17], 7, axis=0))

    def loss(fn):
        return lambda x: jnp.sum(W * jnp.tril(fn(0.5 * (x + jnp.swapaxes(x, 1, 2)))))

    g_ref = jax.grad(loss(jnp.linalg.cholesky))(Hs)
    assert_close(jax.grad(loss(linalg.cholesky_factor_by_batch))(Hs), g_ref, 1e-10, "gradient")
    assert_close(jax.grad(loss(jax.vmap(linalg.cholesky_factor_by_batch)))(Hs), g_ref, 1e-10, "gradient under vmap")
    t_ref = jax.jvp(jnp.linalg.cholesky, (Hs,), (W + jnp.swapaxes(W, 1, 2),))[1]
    t = jax.jvp(jax.vmap(linalg.cholesky_factor_by_batch), (Hs,), (W + jnp.swapaxes(W, 1, 2),))[1]
    assert_close(t, t_ref, 1e-10, "tangent under vmap")


def test_large_batched_factorizations_run_in_two_threads_at_once():
    """Two threads running one compiled program that factors 4000 mass-matrix-sized matrices per
    loop iteration both return (in a subprocess with a time limit: with jaxlib's batched LAPACK
    kernel the same program never returned)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import threading, jax, jax.numpy as jnp
        jax.config.update("jax_enable_x64", True)
        from jaxarm.dynamics import linalg
        def f(x):
            body = lambda i, x: x + 1e-9 * linalg.cholesky_factor_by_batch(x @ jnp.swapaxes(x, -1, -2) + jnp.eye(6))
            return jax.lax.fori_loop(0, 20, body, x)
        g = jax.jit(f)
        x = jnp.ones((4000, 6, 6)) * 0.1
        jax.block_until_ready(g(x))
        threads = [threading.Thread(target=lambda: jax.block_until_ready(g(x))) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print("returned")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "returned" in proc.stdout, proc.stderr[-2000:]


def _grouped_reads_counted(monkeypatch, joints, convention):
    """A list that newton_euler's grouped reads (per_state_entries) append to, and a random 7-joint
    arm with drives, payload, base and tool, as numpy and as jnp arrays (every leaf traced)."""
    from jaxarm.dynamics import newton_euler

    calls = []
    real = newton_euler.per_state_entries
    monkeypatch.setattr(newton_euler, "per_state_entries", lambda *a, **k: calls.append(1) or real(*a, **k))
    arm = random_arm(7, joints, convention, drives=True, payload=True, base=True, tool=True)
    return calls, arm, jax.tree_util.tree_map(jnp.asarray, arm)


@pytest.mark.parametrize("joints, convention", [("RRR", "placement"), ("PRR", "standard")])
def test_a_whole_arm_shared_by_a_batch_is_read_per_state_in_reverse_mode(monkeypatch, joints, convention):
    """jax.grad of a loss over a vmapped batch of samples with respect to the one arm they share,
    every leaf traced (kinematics, base, tool, gravity, drives, payload: identification and
    calibration by gradient) reads the body model's inertial parameters and placements and the
    base acceleration per state (newton_euler._read_per_state), for inverse dynamics, the bias
    forces, forward dynamics and the mass matrix alike. The gradient is the sum of the samples'
    own gradients (each without vmap, its kinematics read as scalars: _GROUPED_KINEMATICS off) and,
    for inverse dynamics, the one read as unbatched scalars; the program is a fraction of that
    one's size. With traced
    kinematics read as scalars, a vmap of grad reads nothing per state (nothing is summed; the
    next test has the groups that traced kinematics get there)."""
    from jaxarm.dynamics import newton_euler

    calls, arm, traced = _grouped_reads_counted(monkeypatch, joints, convention)
    rng = np.random.default_rng(11)
    B = 4
    q, qd, x = (jnp.asarray(rng.uniform(-1.0, 1.0, (B, arm.n))) for _ in range(3))
    w = jnp.asarray(rng.uniform(0.5, 1.5, (B, arm.n)))
    functions = {"inverse_dynamics": lambda a, q, qd, x: jaxarm.inverse_dynamics(a, q, qd, x),
                 "bias_forces": lambda a, q, qd, x: jaxarm.bias_forces(a, q, qd) + x,
                 "forward_dynamics": lambda a, q, qd, x: jaxarm.forward_dynamics(a, q, qd, 5.0 * x),
                 "mass_matrix": lambda a, q, qd, x: jaxarm.mass_matrix(a, q) @ x}
    if joints != "RRR":  # (the other functions take the same per-state reads: one arm suffices for them)
        functions = {"inverse_dynamics": functions["inverse_dynamics"]}
    for name, f in functions.items():
        def one(a, q, qd, x, w):
            return jnp.sum(w * f(a, q, qd, x) ** 2)

        def batch_loss(a):
            return jnp.sum(jax.vmap(one, in_axes=(None, 0, 0, 0, 0))(a, q, qd, x, w))

        calls.clear()
        lowered = jax.jit(jax.grad(batch_loss)).lower(traced)
        assert calls, f"{name}: the batched gradient did not read the arm per state"
        compiled = lowered.compile()
        g = compiled(traced)
        calls.clear()
        monkeypatch.setattr(newton_euler, "_GROUPED_KINEMATICS", False)
        one_grad = jax.jit(jax.grad(lambda *v: one(*v)))
        parts = [one_grad(traced, q[i], qd[i], x[i], w[i]) for i in range(B)]
        jax.make_jaxpr(jax.vmap(jax.grad(one), in_axes=(None, 0, 0, 0, 0)))(traced, q, qd, x, w)
        monkeypatch.setattr(newton_euler, "_GROUPED_KINEMATICS", True)
        assert not calls, f"{name}: read per state where nothing is summed over a batch"
        references = [jax.tree_util.tree_map(lambda *xs: sum(xs), *parts)]
        if name == "inverse_dynamics":  # the batch read as unbatched scalars (the Panda's: 225k lines against 26k)
            monkeypatch.setattr(newton_euler, "_PER_STATE", False)
            scalars = jax.jit(jax.grad(lambda a: batch_loss(a))).lower(traced)
            monkeypatch.setattr(newton_euler, "_PER_STATE", True)
            assert not calls
            compiled_scalars = scalars.compile()
            references.append(compiled_scalars(traced))
            lines_now, lines_scalars = (c.as_text().count("\n") for c in (compiled, compiled_scalars))
            assert lines_now < 0.8 * lines_scalars, (lines_now, lines_scalars)
        for reference in references:
            for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree_util.tree_leaves(reference)):
                scale = max(1.0, float(np.max(np.abs(b)))) if np.size(b) else 1.0
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * scale, err_msg=f"{name} {jax.tree_util.keystr(path)}")
        assert all(np.max(np.abs(np.asarray(k))) > 0 for k in jax.tree_util.tree_leaves(g.kinematics))  # calibration


@pytest.mark.parametrize("joints, convention", [("RRR", "placement"), ("PRR", "standard")])
def test_traced_kinematics_are_read_in_groups_by_the_gradient_of_one_state(monkeypatch, joints, convention):
    """jax.grad of one state's loss with respect to an arm whose kinematics are traced (a whole-arm
    gradient, kinematic calibration), and a jax.vmap of such gradients (one per state, nothing
    summed), read the body model in groups (newton_euler._reads_grouped; read as scalars, the
    Panda's took 5-9 ms per state and 1.25 s for 16): for inverse dynamics, forward dynamics and
    the mass matrix, with gradients equal to those read as scalars, through jax.grad called
    eagerly too (its kept program). With the kinematics known (only the links traced) and in
    forward mode (jax.jacfwd) nothing is read in groups."""
    from jaxarm.dynamics import newton_euler

    calls, arm, traced = _grouped_reads_counted(monkeypatch, joints, convention)
    rng = np.random.default_rng(5)
    B = 3
    q, qd, x = (jnp.asarray(rng.uniform(-1.0, 1.0, (B, arm.n))) for _ in range(3))
    functions = {"inverse_dynamics": lambda a, q, qd, x: jaxarm.inverse_dynamics(a, q, qd, x),
                 "forward_dynamics": lambda a, q, qd, x: jaxarm.forward_dynamics(a, q, qd, 5.0 * x),
                 "mass_matrix": lambda a, q, qd, x: jaxarm.mass_matrix(a, q) @ x}
    if joints != "RRR":
        functions = {"inverse_dynamics": functions["inverse_dynamics"]}

    def close(a, b, what):
        for (path, u), v in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
            scale = max(1.0, float(np.max(np.abs(v)))) if np.size(v) else 1.0
            np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12 * scale, err_msg=f"{what} {jax.tree_util.keystr(path)}")

    for name, f in functions.items():
        def one(a, q, qd, x):
            return jnp.sum(f(a, q, qd, x) ** 2)

        each = jax.vmap(jax.grad(one), in_axes=(None, 0, 0, 0))
        calls.clear()
        g_one = jax.jit(jax.grad(one))(traced, q[0], qd[0], x[0])
        assert calls, f"{name}: one state's gradient did not read the traced kinematics in groups"
        calls.clear()
        g_each = jax.jit(each)(traced, q, qd, x)
        assert calls, f"{name}: the per-state gradients did not read the traced kinematics in groups"
        calls.clear()
        g_eager = jax.grad(one)(traced, q[1], qd[1], x[1])  # eagerly: the kept program reads them so too
        assert calls, f"{name}: the eager gradient's kept program did not read the kinematics in groups"
        monkeypatch.setattr(newton_euler, "_GROUPED_KINEMATICS", False)
        calls.clear()
        # read as scalars: one state's program, called for each state
        s_grad = jax.jit(jax.grad(lambda *v: one(*v)))
        s_one = s_grad(traced, q[0], qd[0], x[0])
        s_each = jax.tree_util.tree_map(lambda *v: jnp.stack(v), *(s_grad(traced, q[i], qd[i], x[i]) for i in range(B)))
        monkeypatch.setattr(newton_euler, "_GROUPED_KINEMATICS", True)
        assert not calls
        close(g_one, s_one, f"{name} one state")
        close(g_each, s_each, f"{name} each state")
        close(g_eager, jax.tree_util.tree_map(lambda v: v[1], s_each), f"{name} eager")
        assert all(np.max(np.abs(np.asarray(k))) > 0 for k in jax.tree_util.tree_leaves(g_one.kinematics))

        # the kinematics known: the links' scalars are read as they are; forward mode reads nothing
        def links_loss(links, q, qd, x):
            return one(arm.replace(links=links), q, qd, x)

        calls.clear()
        jax.make_jaxpr(jax.grad(links_loss))(traced.links, q[0], qd[0], x[0])
        jax.make_jaxpr(jax.jacfwd(lambda a: f(a, q[0], qd[0], x[0])))(traced)
        assert not calls, f"{name}: read in groups with the kinematics known, or in forward mode"


@pytest.mark.parametrize("function", ["inverse_dynamics", "forward_dynamics"])
def test_states_closed_over_by_the_loss_keep_the_groups_stored(monkeypatch, function):
    """A jax.vmap of jax.grad over states that the jitted loss closes over (constants of the
    program, as NumPy data usually is) reads traced kinematics in groups with their witness staged
    on the arm (newton_euler._staged_on): XLA keeps the groups' stored cotangents (its
    conditionals) as for states passed as arguments, where with the bare state as witness it
    folded every one away (the Panda's inverse dynamics at 16 states compiled in 30 s to 156k
    lines; its forward dynamics, 127 s and 425k lines: its own stored cotangents are staged too).
    The gradients are those of the states passed as arguments, which keep the bare state. A
    gradient summed over closed-over states stages them for forward dynamics only (inverse
    dynamics' ran slower so)."""
    from jaxarm.dynamics import newton_euler

    staged = []
    real = newton_euler._staged_on
    monkeypatch.setattr(newton_euler, "_staged_on", lambda *a: staged.append(1) or real(*a))
    arm = random_arm(3, "RRR", "placement", drives=True, base=True, tool=True)
    traced = jax.tree_util.tree_map(jnp.asarray, arm)
    rng = np.random.default_rng(8)
    q, qd, x = (jnp.asarray(rng.uniform(-1.0, 1.0, (4, arm.n))) for _ in range(3))

    f = getattr(jaxarm, function)

    def one(a, q, qd, x):
        return jnp.sum((f(a, q, qd, x) - 0.3) ** 2)

    each = jax.vmap(jax.grad(one), in_axes=(None, 0, 0, 0))

    def conditionals(compiled):
        return compiled.as_text().count(" conditional(")

    closed = jax.jit(lambda a: each(a, q, qd, x)).lower(traced).compile()
    assert staged, "states closed over: the groups' witness was not staged"
    staged.clear()
    given = jax.jit(each).lower(traced, q, qd, x).compile()
    assert not staged, "staged for states passed as arguments"
    jax.make_jaxpr(jax.grad(lambda a: jnp.sum(jax.vmap(one, in_axes=(None, 0, 0, 0))(a, q, qd, x))))(traced)
    assert bool(staged) == (function == "forward_dynamics"), "a gradient summed over closed-over states"
    assert conditionals(closed) == conditionals(given) > 0
    for (path, u), v in zip(jax.tree_util.tree_leaves_with_path(closed(traced)),
                            jax.tree_util.tree_leaves(given(traced, q, qd, x))):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-13, err_msg=jax.tree_util.keystr(path))
    if function == "inverse_dynamics":  # (without the staging: one compile, the cheaper function)
        monkeypatch.setattr(newton_euler, "_STAGED_WITNESS", False)
        bare = jax.jit(lambda a: each(a, q, qd, x)).lower(traced).compile()
        assert conditionals(bare) < conditionals(given)
