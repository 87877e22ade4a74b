"""Fourier excitation trajectories (Swevers et al. 1997) and their design.

Oracles: jax.jacfwd and central finite differences for the derivatives, the period for
periodicity, an independent numpy evaluation of the series on a dense grid for the limits, and a
numpy SVD of the base regressor (``jaxarm.identification.regressor``) for the condition number.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxarm
from jaxarm import excitation, identification
from jaxarm.excitation import FourierTrajectory, design_excitation, fourier_trajectory

from helpers import random_arm


def random_params(seed, n=3, H=4, T=3.0):
    rng = np.random.default_rng(seed)
    return FourierTrajectory(rng.normal(size=n), rng.normal(size=(n, H)), rng.normal(size=(n, H)), np.asarray(T))


def numpy_series(params, t):
    """Swevers 1997 eq. 7, written out term by term in numpy (independent of the module)."""
    q0, a, b, T = (np.asarray(x, float) for x in params)
    wf = 2 * np.pi / T
    q = np.tile(q0, (len(t), 1))
    qd = np.zeros_like(q)
    qdd = np.zeros_like(q)
    for k in range(1, a.shape[1] + 1):
        w = wf * k
        s, c = np.sin(w * t)[:, None], np.cos(w * t)[:, None]
        q += a[:, k - 1] / w * s - b[:, k - 1] / w * c
        qd += a[:, k - 1] * c + b[:, k - 1] * s
        qdd += -a[:, k - 1] * w * s + b[:, k - 1] * w * c
    return q, qd, qdd


def test_series_matches_the_formula_and_its_derivatives():
    params = random_params(0)
    t = np.linspace(-1.0, 4.0, 37)
    q, qd, qdd = fourier_trajectory(params, t)
    for got, want in zip((q, qd, qdd), numpy_series(params, t)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # derivatives in time: forward-mode autodiff and central differences
    for ti in (0.0, 0.37, 2.9):
        dq = jax.jacfwd(lambda s: fourier_trajectory(params, s)[0])(jnp.asarray(ti))
        ddq = jax.jacfwd(lambda s: fourier_trajectory(params, s)[1])(jnp.asarray(ti))
        q1, qd1, qdd1 = fourier_trajectory(params, ti)
        np.testing.assert_allclose(dq, qd1, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ddq, qdd1, rtol=1e-12, atol=1e-12)
        h = 1e-5
        qp, qdp, _ = fourier_trajectory(params, ti + h)
        qm, qdm, _ = fourier_trajectory(params, ti - h)
        np.testing.assert_allclose((qp - qm) / (2 * h), qd1, rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose((qdp - qdm) / (2 * h), qdd1, rtol=1e-7, atol=1e-7)
    assert q.shape == (37, 3) and fourier_trajectory(params, 0.5)[0].shape == (3,)


def test_series_is_periodic():
    params = random_params(1, T=2.5)
    t = np.array([0.0, 0.3, 1.7])
    for x0, x1 in zip(fourier_trajectory(params, t), fourier_trajectory(params, t + 2.5)):
        np.testing.assert_allclose(x0, x1, rtol=1e-12, atol=1e-11)
    for x0, xT in zip(fourier_trajectory(params, 0.0), fourier_trajectory(params, 2.5)):
        np.testing.assert_allclose(x0, xT, rtol=1e-12, atol=1e-11)


def test_bad_parameters_raise():
    p = random_params(2)
    with pytest.raises(TypeError, match="FourierTrajectory"):
        fourier_trajectory((p.q0, p.a, p.b, p.period), 0.0)
    with pytest.raises(ValueError, match="period"):
        fourier_trajectory(p._replace(period=np.asarray(0.0)), 0.0)
    with pytest.raises(ValueError, match="a, b"):
        fourier_trajectory(p._replace(b=p.b[:, :2]), 0.0)
    with pytest.raises(ValueError, match="t: expected"):
        fourier_trajectory(p, np.zeros((2, 2)))


POSITION = np.array([[-1.0, 0.6], [-0.5, 2.0]])
VELOCITY = np.array([1.2, 0.8])
ACCELERATION = 3.0


def limited_arm():
    arm = random_arm(3, "RR", "standard", drives=True)
    limits = jaxarm.Limits(position=POSITION, velocity=VELOCITY, torque=np.full(2, np.inf))
    return arm.replace(limits=limits)


@pytest.fixture(scope="module")
def design():
    return design_excitation(
        limited_arm(), harmonics=3, period=4.0, samples=30, acceleration_limit=ACCELERATION, steps=60, seed=0, grid=512
    )


def assert_within_limits(params):
    t = np.linspace(0.0, float(params.period), 40001)  # dense, independent of the design's grid
    q, qd, qdd = numpy_series(params, t)
    assert np.all(q >= POSITION[:, 0]) and np.all(q <= POSITION[:, 1])
    assert np.all(np.abs(qd) <= VELOCITY)
    assert np.all(np.abs(qdd) <= ACCELERATION)


def test_designed_and_initial_trajectories_respect_the_limits(design):
    assert_within_limits(design.params)
    assert_within_limits(design.params_initial)
    for name in ("position", "velocity", "acceleration"):
        assert np.all(design.ratios[name] <= 1.0 + 1e-12)
    # the design uses the limits it was given (it is not trivially small)
    assert max(np.max(design.ratios["velocity"]), np.max(design.ratios["acceleration"])) > 0.9


def condition_numpy(arm, params, columns, samples=157):
    t = np.linspace(0.0, float(params.period), samples, endpoint=False)
    q, qd, qdd = numpy_series(params, t)
    Y = np.asarray(identification.regressor(arm, q, qd, qdd))[..., columns].reshape(samples * arm.n, -1)
    return np.linalg.cond(Y / np.linalg.norm(Y, axis=0))


def test_design_lowers_the_condition_number(design):
    arm = limited_arm()
    before = condition_numpy(arm, design.params_initial, design.base_columns)
    after = condition_numpy(arm, design.params, design.base_columns)
    assert after < before / 3.0, (before, after)
    assert design.condition < design.condition_initial / 3.0
    # the base columns span the regressor: the full regressor has the same rank on random states
    rng = np.random.default_rng(5)
    Y = np.asarray(identification.regressor(arm, *rng.normal(size=(3, 50, 2)))).reshape(100, -1)
    assert np.linalg.matrix_rank(Y) == np.linalg.matrix_rank(Y[:, design.base_columns]) == design.base_columns.size


def test_design_rejects_unbounded_joints_and_bad_options():
    arm = limited_arm()
    free = arm.replace(limits=jaxarm.Limits(position=POSITION, velocity=np.full(2, np.inf), torque=np.full(2, np.inf)))
    with pytest.raises(ValueError, match="acceleration_limit"):
        design_excitation(free, steps=0)
    with pytest.raises(ValueError, match="harmonics"):
        design_excitation(arm, harmonics=0, acceleration_limit=1.0)
    with pytest.raises(ValueError, match="period"):
        design_excitation(arm, period=-1.0, acceleration_limit=1.0)
    with pytest.raises(ValueError, match="acceleration_limit"):
        design_excitation(arm, acceleration_limit=-2.0)
    with pytest.raises(ValueError, match="samples"):
        design_excitation(arm, samples=2, acceleration_limit=1.0, steps=0)
    for bad in (0.0, -0.1, float("nan"), "fast", None):
        with pytest.raises(ValueError, match="learning_rate: expected a positive number"):
            design_excitation(arm, acceleration_limit=1.0, learning_rate=bad)


def test_fit_to_limits_bounds_hold_between_grid_points():
    """The curvature bound makes a coarse grid safe: fit to limits on 64 points, check on 40001."""
    params = random_params(7, n=2, H=5, T=4.0)
    params = params._replace(a=params.a * 3.0, b=params.b * 3.0)
    fitted, s = excitation._fit_to_limits(
        params, jnp.linspace(0.0, 4.0, 64, endpoint=False), POSITION[:, 0], POSITION[:, 1], VELOCITY, np.full(2, ACCELERATION)
    )
    assert np.all(np.asarray(s) < 1.0)
    assert_within_limits(jax.tree_util.tree_map(np.asarray, fitted))


def test_a_second_design_on_the_same_arm_compiles_nothing_and_reads_its_own_options(design):
    """The optimizer's step is compiled once per arm (and drives, base columns) and kept: another
    seed, period, acceleration limit or learning rate is an argument of the kept program, not a
    constant of a new one. Its answer equals a freshly compiled step's."""
    from test_recompiles import count_compiles

    options = dict(harmonics=3, period=5.0, samples=30, acceleration_limit=2.5, steps=8, seed=1, grid=512, learning_rate=0.03)
    before = {key: (step, step._cache_size()) for key, step in excitation._STEPS.items()}
    assert before  # (the fixture's design compiled and kept its step)
    with count_compiles() as events:
        kept = design_excitation(limited_arm(), **options)
    # the same kept steps, and nothing new in any; nothing else of any size compiled either (the
    # step takes seconds; a small eager operation that JAX's caches let go of since the fixture
    # ran could compile in milliseconds)
    assert {key: (step, step._cache_size()) for key, step in excitation._STEPS.items()} == before
    assert sum(events) < 0.5, f"{len(events)} compiles, {sum(events):.2f} s"
    excitation._STEPS.clear()
    fresh = design_excitation(limited_arm(), **options)
    for got, want in zip(kept.params, fresh.params):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(kept.history, fresh.history, rtol=1e-13)
    assert float(kept.params.period) == 5.0 and np.max(kept.ratios["acceleration"]) <= 1.0 + 1e-12
    assert not np.allclose(kept.params.a, design.params.a)  # its own seed and options, not the fixture's
