"""JAX transformations of the public API: jit, vmap (over states and over arms), grad with respect
to the Arm pytree (checked against finite differences), float32, and input validation.

Compilation dominates the run time, so the jit/vmap/grad checks use one small two-joint arm
(revolute + prismatic, standard DH, drives, payload, base and tool; float32 adds a placement arm)
and the jitted functions are the library functions themselves, so jax reuses their compilations
across tests.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import jaxarm
from helpers import assert_close, random_arm, random_state, random_wrench

ARM = random_arm(11, "RP", "standard", drives=True, payload=True, base=True, tool=True)
N = ARM.n
Q, QD, QDD = random_state(11, N)
F_EXT = random_wrench(11)
V = np.array([5.0, -70.0])  # motor voltages, the second beyond its limit
TAU = np.array([3.0, -8.0])


def jacobian_tool(arm, q):
    return jaxarm.jacobian(arm, q, frame="tool")


# name -> (function, arguments after the arm)
CALLS = {
    "forward_kinematics": (jaxarm.forward_kinematics, (Q,)),
    "tool_pose": (jaxarm.tool_pose, (Q,)),
    "jacobian": (jaxarm.jacobian, (Q,)),
    "jacobian_tool": (jacobian_tool, (Q,)),
    "inverse_dynamics": (jaxarm.inverse_dynamics, (Q, QD, QDD, F_EXT)),
    "rigid_body_torques": (jaxarm.rigid_body_torques, (Q, QD, QDD, F_EXT)),
    "joint_wrenches": (jaxarm.joint_wrenches, (Q, QD, QDD, F_EXT)),
    "bias_forces": (jaxarm.bias_forces, (Q, QD, F_EXT)),
    "gravity_torques": (jaxarm.gravity_torques, (Q,)),
    "mass_matrix": (jaxarm.mass_matrix, (Q,)),
    "mass_matrix_by_columns": (jaxarm.mass_matrix_by_columns, (Q,)),
    "forward_dynamics": (jaxarm.forward_dynamics, (Q, QD, TAU, F_EXT)),
    "coriolis_matrix": (jaxarm.coriolis_matrix, (Q, QD)),
    "kinetic_energy": (jaxarm.kinetic_energy, (Q, QD)),
    "potential_energy": (jaxarm.potential_energy, (Q,)),
    "friction_torques": (jaxarm.friction_torques, (QD,)),
    "reflected_inertia": (jaxarm.reflected_inertia, ()),
    "motor_torque": (jaxarm.motor_torque, (V, QD)),
    "motor_current": (jaxarm.motor_current, (V, QD)),
    "motor_voltage": (jaxarm.motor_voltage, (TAU, QD)),
    "saturate_voltage": (jaxarm.saturate_voltage, (V,)),
}


def assert_trees_close(actual, expected, rtol, what=""):
    a_leaves, a_def = jax.tree_util.tree_flatten(actual)
    e_leaves, e_def = jax.tree_util.tree_flatten(expected)
    assert a_def == e_def, f"{what}: structure {a_def} != {e_def}"
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        assert jnp.asarray(a).dtype == jnp.asarray(e).dtype, f"{what}[{k}]: dtype {jnp.asarray(a).dtype} != {jnp.asarray(e).dtype}"
        assert_close(a, e, rtol, f"{what}[{k}]")


# --------------------------------------------------------------------------------------
# jit / no jit


class VariantsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*[(name, name) for name in CALLS])
    def test_variant_equals_plain_call(self, name):
        fn, args = CALLS[name]
        expected = fn(ARM, *args)
        got = self.variant(fn)(ARM, *args)
        assert_trees_close(got, expected, 1e-12, name)


def test_jitted_call_does_not_recompile_for_new_values():
    """Values are leaves: a new arm with other masses and a new state reuse the compilation."""
    f = jax.jit(jaxarm.inverse_dynamics)
    f(ARM, Q, QD, QDD, F_EXT)
    size = f._cache_size()
    heavier = ARM.replace(links=dataclasses.replace(ARM.links, mass=np.asarray(ARM.links.mass) * 2.0))
    q, qd, qdd = random_state(12, N)
    f(heavier, q, qd, qdd, F_EXT)
    assert f._cache_size() == size


# --------------------------------------------------------------------------------------
# vmap over states and over arms

BATCH = 64


def _batch_states():
    states = [random_state(1000 + k, N) for k in range(BATCH)]
    q, qd, qdd = (np.stack(x) for x in zip(*states))
    f = np.stack([random_wrench(1000 + k) for k in range(BATCH)])
    return q, qd, qdd, f


@pytest.mark.parametrize(
    "name, fn, nargs",
    [
        ("inverse_dynamics", jaxarm.inverse_dynamics, 4),
        ("forward_dynamics", jaxarm.forward_dynamics, 4),
        ("forward_kinematics", jaxarm.forward_kinematics, 1),
    ],
)
def test_vmap_over_states_equals_loop(name, fn, nargs):
    q, qd, x, f = _batch_states()
    args = (q, qd, x, f)[:nargs]
    batched = jax.jit(jax.vmap(fn, in_axes=(None,) + (0,) * nargs))(ARM, *args)
    single = jax.jit(fn)
    for k in range(BATCH):
        expected = single(ARM, *(a[k] for a in args))
        got = jax.tree_util.tree_map(lambda b, k=k: b[k], batched)
        assert_trees_close(got, expected, 1e-12, f"{name}[{k}]")


def _arm_family(count=4):
    """Arms of one structure whose masses, COMs and gear ratios differ."""
    arms = []
    for k in range(count):
        L, D = ARM.links, ARM.drives
        links = dataclasses.replace(L, mass=np.asarray(L.mass) * (1.0 + 0.5 * k), com=np.asarray(L.com) * (1.0 - 0.2 * k))
        drives = dataclasses.replace(D, gear_ratio=np.asarray(D.gear_ratio) * (1.0 + k))
        arms.append(ARM.replace(links=links, drives=drives).with_payload(0.3 * k, (0.01 * k, 0.0, 0.02)))
    return arms


def test_vmap_over_arms_equals_loop():
    arms = _arm_family()
    stacked = jaxarm.stack_arms(arms)
    assert np.shape(stacked.links.mass) == (len(arms), N)
    tau = jax.jit(jax.vmap(jaxarm.inverse_dynamics, in_axes=(0, None, None, None, None)))(stacked, Q, QD, QDD, F_EXT)
    M = jax.jit(jax.vmap(jaxarm.mass_matrix, in_axes=(0, None)))(stacked, Q)
    single_tau, single_M = jax.jit(jaxarm.inverse_dynamics), jax.jit(jaxarm.mass_matrix)
    for k, arm in enumerate(arms):
        assert_close(tau[k], single_tau(arm, Q, QD, QDD, F_EXT), 1e-12, f"tau[{k}]")
        assert_close(M[k], single_M(arm, Q), 1e-12, f"M[{k}]")
    # the arms really differ
    assert np.abs(np.asarray(tau[0]) - np.asarray(tau[-1])).max() > 1e-3


def test_stack_arms_rejects_mixed_structure():
    other = random_arm(3, "PR", "placement")
    with pytest.raises(ValueError, match=r"arms\[1\]"):
        jaxarm.stack_arms([ARM, other])


# --------------------------------------------------------------------------------------
# grad with respect to the arm


def _objective(arm, weights):
    return jnp.dot(weights, jaxarm.inverse_dynamics(arm, Q, QD, QDD, F_EXT))


def _with_leaf(arm, path, index, value):
    """A copy of arm with one entry of one leaf (by attribute path) replaced."""
    obj = arm
    parents = []
    for attr in path:
        parents.append(obj)
        obj = getattr(obj, attr)
    leaf = np.array(obj, dtype=float)
    leaf[index] = value
    new = leaf
    for parent, attr in zip(reversed(parents), reversed(path)):
        new = dataclasses.replace(parent, **{attr: new})
    return new


def test_grad_wrt_arm_matches_finite_differences():
    """jax.grad of a weighted sum of joint torques w.r.t. the Arm pytree, against central finite
    differences on mass, COM, DH lengths, gear ratio, rotor inertia and payload mass."""
    arm = ARM
    weights = np.random.default_rng(21).normal(size=arm.n)
    grad = jax.jit(jax.grad(_objective))(arm, jnp.asarray(weights))
    tau = jax.jit(jaxarm.inverse_dynamics)

    def f(a, w):
        return w @ np.asarray(tau(a, Q, QD, QDD, F_EXT))

    probes = [
        (("links", "mass"), 1),
        (("links", "com"), (0, 2)),
        (("links", "com"), (1, 0)),
        (("kinematics", "a"), 0),
        (("kinematics", "d"), 1),
        (("drives", "gear_ratio"), 0),
        (("drives", "rotor_inertia"), 1),
        (("payload", "mass"), ()),
    ]
    h = 1e-6
    for path, index in probes:
        x0 = float(np.asarray(getattr(getattr(arm, path[0]), path[1]))[index])
        fp = float(f(_with_leaf(arm, path, index, x0 + h), weights))
        fm = float(f(_with_leaf(arm, path, index, x0 - h), weights))
        fd = (fp - fm) / (2 * h)
        g = float(np.asarray(getattr(getattr(grad, path[0]), path[1]))[index])
        assert abs(g - fd) <= 1e-6 * max(abs(fd), 1.0), f"{'.'.join(path)}[{index}]: grad {g} vs finite difference {fd}"


def test_jacobian_with_respect_to_the_whole_arm_is_computed_once_under_jit():
    """jax.jit(jax.jacfwd(f)) with respect to every leaf of the arm equals the op-by-op Jacobian
    to round-off (the identity product that ends the expression is exact), and the compiled program
    computes the expression once, not once per arm leaf: the undecorated function's program is
    several times larger (the two-link arm's inverse dynamics: 4.1 MB of optimized HLO against
    0.34 MB)."""
    arm = jaxarm.load_arm("two_link_planar")
    q, qd, qdd = random_state(12, arm.n)
    f = jaxarm.inverse_dynamics
    jac = jax.jit(jax.jacfwd(lambda a: f(a, q, qd, qdd)))
    compiled = jac.lower(arm).compile()
    unfenced = jax.jit(jax.jacfwd(lambda a: f.__wrapped__(a, q, qd, qdd))).lower(arm).compile()
    op_by_op = jax.jacfwd(lambda a: f.__wrapped__(a, q, qd, qdd))(arm)
    for got, want in zip(jax.tree_util.tree_leaves(compiled(arm)), jax.tree_util.tree_leaves(op_by_op)):
        assert_close(got, want, 1e-13, "d tau / d arm")
    assert 4 * len(compiled.as_text()) < len(unfenced.as_text()), (len(compiled.as_text()), len(unfenced.as_text()))
    # reverse mode, vmap over arms and derivatives with respect to the state are left as they are
    fence = "precision = [HIGHEST, HIGHEST]"
    assert fence in jac.lower(arm).as_text()
    for g, x in ((jax.grad(lambda a: jnp.sum(f(a, q, qd, qdd))), arm), (jax.jacfwd(lambda v: f(arm, v, qd, qdd)), q),
                 (jax.vmap(lambda a: f(a, q, qd, qdd)), jaxarm.stack_arms([arm, arm]))):
        assert fence not in jax.jit(g).lower(x).as_text()


def test_forward_dynamics_jacobian_with_respect_to_the_whole_arm_computes_its_tangent_once(monkeypatch):
    """Under jax.jacfwd with respect to the arm, forward dynamics' derivative rule computes the
    accelerations Newton-Euler's tangent is taken at, and that tangent, once into arrays: the same
    Jacobian as op by op, and a program 2.8 times smaller than with those products left out
    (the two-link arm: 0.51 MB of optimized HLO against 1.45 MB; the Puma 560's compile 11 s
    against 47-56 s)."""
    from jaxarm.dynamics import forward

    arm = jaxarm.load_arm("two_link_planar")
    q, qd, tau = random_state(13, arm.n)
    f = jaxarm.forward_dynamics
    compiled = jax.jit(jax.jacfwd(lambda a: f(a, q, qd, tau))).lower(arm).compile()
    op_by_op = jax.jacfwd(lambda a: f.__wrapped__(a, q, qd, tau))(arm)
    for got, want in zip(jax.tree_util.tree_leaves(compiled(arm)), jax.tree_util.tree_leaves(op_by_op)):
        assert_close(got, want, 1e-12, "d qdd / d arm")
    monkeypatch.setattr(forward, "_dot_identity", lambda x: x)
    without = jax.jit(jax.jacfwd(lambda a: f(a, q, qd, tau))).lower(arm).compile()
    assert 2.5 * len(compiled.as_text()) < len(without.as_text()), (len(compiled.as_text()), len(without.as_text()))


# --------------------------------------------------------------------------------------
# float32

# placement arms run the most code (the z-to-axis rotation); the DH conventions are spot-checked
FLOAT32_CALLS = {
    "placement": ("inverse_dynamics", "tool_pose"),
    "standard": ("inverse_dynamics",),
}
_FLOAT32 = {}


def _float32_run(convention):
    """(float64 reference outputs, float32 outputs) per function name, computed once."""
    if convention not in _FLOAT32:
        arm = random_arm(31, "RP", convention, drives=True, payload=True, base=True, tool=True)
        arm32 = arm.astype(jnp.float32)
        assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(arm32))
        out = {}
        for name in FLOAT32_CALLS[convention]:
            fn, args = CALLS[name]
            out[name] = (fn(arm, *args), jax.jit(fn)(arm32, *[jnp.asarray(a, jnp.float32) for a in args]))
        _FLOAT32[convention] = out
    return _FLOAT32[convention]


@pytest.mark.parametrize("convention", list(FLOAT32_CALLS))
def test_float32_close_to_float64(convention):
    for name, (expected, got) in _float32_run(convention).items():
        for e, g in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)):
            assert_close(np.asarray(g, dtype=np.float64), e, 1e-3, f"{name} float32")


@pytest.mark.parametrize("convention", list(FLOAT32_CALLS))
def test_float32_in_float32_out(convention):
    for name, (_, got) in _float32_run(convention).items():
        for leaf in jax.tree_util.tree_leaves(got):
            assert leaf.dtype == jnp.float32, f"{name}: float32 arm and inputs gave {leaf.dtype}"


@pytest.mark.parametrize("axis", [(0.0, 1.0, 0.0), (0.0, 0.0, -1.0)])
def test_float32_axis_rotation_stays_float32(axis):
    """The z-to-axis rotation of placement arms (both of its branches) keeps float32."""
    from jaxarm import spatial

    assert spatial.rotation_to_axis(jnp.asarray(axis, jnp.float32)).dtype == jnp.float32


# --------------------------------------------------------------------------------------
# Bad input: ValueError / TypeError naming the argument and the expected shape

# (function, argument names after the arm) for every state-taking function that validates
VALIDATED = {
    "forward_kinematics": ("q",),
    "tool_pose": ("q",),
    "jacobian": ("q",),
    "inverse_dynamics": ("q", "qd", "qdd"),
    "rigid_body_torques": ("q", "qd", "qdd"),
    "joint_wrenches": ("q", "qd", "qdd"),
    "bias_forces": ("q", "qd"),
    "gravity_torques": ("q",),
    "mass_matrix": ("q",),
    "mass_matrix_by_columns": ("q",),
    "forward_dynamics": ("q", "qd", "tau"),
    "coriolis_matrix": ("q", "qd"),
    "kinetic_energy": ("q", "qd"),
    "potential_energy": ("q",),
    "friction_torques": ("qd",),
    "motor_torque": ("V", "qd"),
    "motor_current": ("V", "qd"),
    "motor_voltage": ("tau", "qd"),
}
TAKES_F_EXT = ["inverse_dynamics", "rigid_body_torques", "joint_wrenches", "bias_forces", "forward_dynamics"]


def _good_args(names):
    values = {"q": Q, "qd": QD, "qdd": QDD, "tau": TAU, "V": V}
    return [values[k] for k in names]


@pytest.mark.parametrize("name", list(VALIDATED))
def test_wrong_length_names_argument_and_shape(name):
    fn = CALLS[name][0]
    names = VALIDATED[name]
    for k, arg in enumerate(names):
        args = _good_args(names)
        args[k] = np.zeros(N + 1)
        with pytest.raises(ValueError, match=rf"{arg}: expected shape \({N},\).*got \({N + 1},\)"):
            fn(ARM, *args)
        with pytest.raises(ValueError, match=rf"{arg}: expected shape \({N},\)"):
            jax.jit(fn)(ARM, *args)  # at trace time too


@pytest.mark.parametrize("name", ["inverse_dynamics", "mass_matrix", "forward_dynamics", "jacobian"])
def test_batched_input_without_vmap(name):
    fn = CALLS[name][0]
    args = _good_args(VALIDATED[name])
    args[0] = np.zeros((5, N))
    with pytest.raises(ValueError, match=r"q: expected shape .*vmap"):
        fn(ARM, *args)


@pytest.mark.parametrize("name", ["inverse_dynamics", "mass_matrix", "forward_dynamics", "potential_energy"])
def test_nan_input(name):
    fn = CALLS[name][0]
    args = _good_args(VALIDATED[name])
    bad = np.array(args[0], dtype=float)
    bad[1] = np.nan
    args[0] = bad
    with pytest.raises(ValueError, match=r"q: expected finite values.*joint\(s\) \[2\]"):
        fn(ARM, *args)


@pytest.mark.parametrize("name", list(CALLS))
def test_not_an_arm(name):
    fn, args = CALLS[name]
    with pytest.raises(TypeError, match=r"arm: expected a jaxarm.Arm.*got dict"):
        fn({"links": ARM.links, "drives": ARM.drives}, *args)


@pytest.mark.parametrize("name", TAKES_F_EXT)
def test_f_ext_wrong_shape(name):
    fn = CALLS[name][0]
    args = _good_args(VALIDATED[name])
    for bad in (np.zeros(3), np.zeros((2, 6))):
        with pytest.raises(ValueError, match=r"f_ext: expected shape \(6,\)"):
            fn(ARM, *args, bad)


def test_batched_arm_without_vmap():
    stacked = jaxarm.stack_arms(_arm_family(2))
    with pytest.raises(ValueError, match=r"arm: leaves have a batch axis.*vmap"):
        jaxarm.inverse_dynamics(stacked, Q, QD, QDD)
