"""Fixed-step integrators for second-order systems qdd = f(t, q, qd).

Each integrator is a step function ``step(f, t, q, qd, dt) -> (q_next, qd_next, qdd)``, where
``qdd`` is the acceleration at the start of the step. Pass one to :func:`jaxarm.rollout` by name
(``method="rk3"``) or as the function itself. The Runge-Kutta methods exist twice: written out
(:func:`rk3`, :func:`rk4`, readable, the stages traced one after the other) and from their
Butcher tableaus (:func:`explicit_rk`; ``"rk3"``/``"rk4"`` by name), which on a CPU runs the stages
as a loop and so compiles the dynamics once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..core import tracers
from ..dynamics import algebra
from ..dynamics.forward import ACCELERATION


def _recomputed(f):
    """f evaluated again in reverse mode instead of storing its intermediates (``jax.checkpoint``):
    inside the time loop of a rollout, or the stage loop of a Runge-Kutta step, every stored
    intermediate of the component-wise dynamics (hundreds of scalars) would be stacked over the
    iterations and read back, one small kernel each (docs/how-it-works.md, "What makes reverse
    mode cheap"). Without differentiation, and in forward mode, it changes nothing.

    One value is kept rather than recomputed: the forward dynamics' accelerations
    (:data:`jaxarm.dynamics.forward.ACCELERATION`), n numbers per stage. The derivative of the
    forward dynamics is taken at them (inverse dynamics' reverse pass at qdd, and M^-1 from the
    Cholesky factor), so recomputing them cost a whole forward dynamics more per stage in the
    reverse pass; kept, the reverse pass evaluates the mass matrix, its factor and Newton-Euler at
    the kept qdd only. Gradients of 1000-step RK3 rollouts 7-12 % faster (Puma 560 and Panda,
    batches 1, 16 and 256), gradients with respect to a traced arm's masses 1.6-2x faster and
    compiled in about half the time, for 18 % more memory in an RK3 rollout's reverse pass
    (none in an Euler rollout's)."""
    return jax.checkpoint(f, prevent_cse=False, policy=_KEEP_ACCELERATIONS)


_KEEP_ACCELERATIONS = jax.checkpoint_policies.save_only_these_names(ACCELERATION)
# the stages of explicit_rk call the dynamics under one jax.jit of their own (see step(); False
# traces them once per stage, as experiments/gradient_first_call.py compares)
_SHARE_STAGE_TRACE = True


def rk3(f, t, q, qd, dt):
    """Kutta's third-order method (Swartz's Runge-Kutta step; Kutta 1901):
    k1 = F(x), k2 = F(x + h/2 k1), k3 = F(x + h (2 k2 - k1)), x+ = x + h/6 (k1 + 4 k2 + k3),
    applied to x = (q, qd), F = (qd, qdd)."""
    a1 = f(t, q, qd)
    q2, qd2 = q + 0.5 * dt * qd, qd + 0.5 * dt * a1
    a2 = f(t + 0.5 * dt, q2, qd2)
    q3, qd3 = q + dt * (2.0 * qd2 - qd), qd + dt * (2.0 * a2 - a1)  # c3 = qd + h (2 k2 - k1) (Kutta's third stage)
    a3 = f(t + dt, q3, qd3)
    q_next = q + dt / 6.0 * (qd + 4.0 * qd2 + qd3)
    qd_next = qd + dt / 6.0 * (a1 + 4.0 * a2 + a3)
    return q_next, qd_next, a1


def rk4(f, t, q, qd, dt):
    """Classical fourth-order Runge-Kutta."""
    a1 = f(t, q, qd)
    q2, qd2 = q + 0.5 * dt * qd, qd + 0.5 * dt * a1
    a2 = f(t + 0.5 * dt, q2, qd2)
    q3, qd3 = q + 0.5 * dt * qd2, qd + 0.5 * dt * a2
    a3 = f(t + 0.5 * dt, q3, qd3)
    q4, qd4 = q + dt * qd3, qd + dt * a3
    a4 = f(t + dt, q4, qd4)
    q_next = q + dt / 6.0 * (qd + 2.0 * qd2 + 2.0 * qd3 + qd4)
    qd_next = qd + dt / 6.0 * (a1 + 2.0 * a2 + 2.0 * a3 + a4)
    return q_next, qd_next, a1


def euler(f, t, q, qd, dt):
    """Explicit Euler as in Craig 6.117: qd+ = qd + qdd dt, q+ = q + qd dt + qdd dt^2 / 2,
    both from values at time t."""
    a = f(t, q, qd)
    return q + qd * dt + 0.5 * a * dt * dt, qd + a * dt, a


def semi_implicit_euler(f, t, q, qd, dt):
    """Symplectic (semi-implicit) Euler: qd+ = qd + qdd dt, then q+ = q + qd+ dt."""
    a = f(t, q, qd)
    qd_next = qd + a * dt
    return q + qd_next * dt, qd_next, a


def explicit_rk(c, A, b, recompute: bool = True, loop: bool | None = None, stages: bool = False):
    """The explicit Runge-Kutta step with Butcher tableau (c, A, b): stage i evaluates f at
    ``x + dt sum_j A[i][j] k_j`` (j < i), x = (q, qd), k_j = (qd_j, a_j); the step is
    x + dt sum_i b_i k_i (Hairer, Norsett & Wanner, Solving ODEs I, II.1 eq. 1.8). Equal to the
    written-out form (e.g. :func:`rk3`) up to rounding.

    loop: how the stages are traced.

    - ``True``: in a loop (``jax.lax.scan``), so the dynamics ``f`` is traced and compiled once
      instead of once per stage.
    - ``False``: one after the other, each stage's acceleration stored on a CPU
      (:func:`jaxarm.dynamics.algebra.stored_after`; without it XLA:CPU compiled every stage's
      dynamics into each fusion downstream: 2.4x slower than the loop). No loop overhead per
      stage: a 1000-step RK3 rollout of the Puma 560 or the Panda runs 8-41 % faster than with
      the loop at batches 1 to 4096, and its gradient 16-30 % faster, but the gradient's program
      holds every stage's reverse pass and takes longer to compile (the Panda's at batch 16:
      first call 7.7 s against 4.6 s; docs/benchmarks.md, "The Runge-Kutta stages written out
      on a CPU").
    - ``None`` (the default): by the platform the step is traced for (``jax.default_backend()``):
      the loop on a CPU, the stages one after the other elsewhere (on a GPU every loop iteration
      costs kernel launches and a read of the loop's predicate by the host, which made a
      1000-step RK3 rollout of the Puma at batch 1024 on an H100 3.5x slower with the loop: 83 us
      a step against 23.5; ``experiments/time_loop_shapes.py``, docs/benchmarks.md).

    With ``loop=None``, :func:`jaxarm.rollout` runs the stages one after the other (the step's
    ``written_out``) where nothing it is given is being differentiated, or where only a reverse-mode
    derivative reaches it, the arm is not differentiated and the stages times the arm's joints are
    at most :data:`WRITTEN_OUT_GRADIENT_SIZE`; by the platform otherwise. The steps ``"rk3"`` and
    ``"rk4"`` by name are made so.

    ``recompute``: in reverse mode each stage keeps its point and evaluates ``f`` again
    (:func:`_recomputed`); False stores f's intermediates instead, as before (trajectory
    optimization's own step, whose derivatives are written by hand, keeps that program).
    ``stages``: return every stage's acceleration (s, n) in place of the first one's (the
    trajectory optimizer's line search hands them to its linearization)."""
    c, A, b = (np.asarray(x, float) for x in (c, A, b))
    s = len(b)
    if A.shape != (s, s) or c.shape != (s,) or np.any(np.triu(A) != 0):
        raise ValueError(f"explicit_rk: expected c (s,), strictly lower-triangular A (s, s), b (s,); got {c.shape}, {A.shape}, {b.shape}")
    if loop not in (None, True, False):
        raise ValueError(f"explicit_rk: loop: expected None (by platform), True or False, got {loop!r}")

    def looped(f_stage, t, q, qd, dt):
        A_, c_ = jnp.asarray(A, q.dtype), jnp.asarray(c, q.dtype)

        def put(K, i, kq, ka):  # stage i's derivatives into K (elementwise selects: they fuse under vmap)
            return tuple((jnp.where(i == j, kq, Kq), jnp.where(i == j, ka, Ka)) for j, (Kq, Ka) in enumerate(K))

        def stage(carry, i):
            # K: the s pairs (qd_j, a_j) found so far (zeros after); the previous stage's pair
            # arrives through the loop's state and is put into K here, at the start of the next
            # iteration. Put into K where it is computed, the dynamics would feed s selects, and
            # XLA:CPU fuses a producer into each of its consumers: the whole forward dynamics
            # was computed s times per stage (Puma, 4096 RK3 rollouts: 2.2e6 steps/s, now 4.1e6).
            K, (kq_prev, ka_prev) = carry
            K = put(K, i - 1, kq_prev, ka_prev)
            qi, qdi = q, qd
            for j in range(s - 1):
                qi, qdi = qi + (dt * A_[i, j]) * K[j][0], qdi + (dt * A_[i, j]) * K[j][1]
            a = jnp.asarray(f_stage(t + c_[i] * dt, qi, qdi), q.dtype)
            return (K, (qdi, a)), None

        zero = jnp.zeros_like(q)
        (K, (kq, ka)), _ = jax.lax.scan(stage, (tuple((zero, zero) for _ in range(s)), (zero, zero)), jnp.arange(s))
        return put(K, s - 1, kq, ka)

    def written(f_stage, t, q, qd, dt):
        K = []
        for i in range(s):  # the same stages, one after the other (the tableau's zeros skipped)
            qi, qdi = q, qd
            for j in range(i):
                if A[i, j] != 0.0:
                    qi, qdi = qi + (dt * float(A[i, j])) * K[j][0], qdi + (dt * float(A[i, j])) * K[j][1]
            a = jnp.asarray(f_stage(t + float(c[i]) * dt, qi, qdi), q.dtype)
            K.append((qdi, algebra.stored_after(a, q)))
        return K

    def finish(K, q, qd, dt):
        q_next = q + dt * sum(float(b[j]) * K[j][0] for j in range(s))
        qd_next = qd + dt * sum(float(b[j]) * K[j][1] for j in range(s))
        return q_next, qd_next, (jnp.stack([K[j][1] for j in range(s)]) if stages else K[0][1])

    def step(f, t, q, qd, dt):
        q, qd = jnp.asarray(q), jnp.asarray(qd)
        q, qd = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.result_type(q, qd)) for v in (q, qd)))
        # the stage loop keeps each stage's point only. Under a jax.jit of its own, the stages
        # share one traced dynamics: jax batches, linearizes and transposes it once for all of
        # them (XLA inlines the calls). The Panda's gradient of a 1000-step RK3 rollout (batch
        # 16, stage loop) traced in 1.4-1.5 s instead of 2.4-2.5 s; the Puma's written-out one
        # reached its first answer in 3.3 s instead of 3.8 s (experiments/gradient_first_call.py)
        f_stage = _recomputed(f) if recompute else f
        if recompute and _SHARE_STAGE_TRACE and _staged(q):
            f_stage = jax.jit(f_stage)
        in_a_loop = stages_in_a_loop() if loop is None else loop
        return finish((looped if in_a_loop else written)(f_stage, t, q, qd, dt), q, qd, dt)

    step.recomputes_dynamics = recompute  # (read by rollout: no second jax.checkpoint around f)
    step.stages = s  # (read by rollout: the size of a written-out gradient's program)
    # the same step with its stages one after the other: what a rollout that is not differentiated
    # runs in place of a step whose form follows the platform (loop=None); a form asked for stays
    step.written_out = explicit_rk(c, A, b, recompute, False, stages) if loop is None else step
    return step


# A rollout differentiated in reverse mode only, its arm held constant (a gradient with respect to
# the start state, the inputs or a policy's parameters), runs the written-out stages of a step made
# with loop=None when its stages times the arm's joints are at most this: RK3 up to 6 joints, RK4 up
# to 4. Written out, the gradient of a 1000-step RK3 rollout of the Puma 560 ran 1.2-1.7x faster
# than with the stage loop and its first call took 2.5-3.9 s (batches 1 to 256); the 7-joint
# Panda's took 4.8-6.5 s, and an RK4 Puma gradient's 4.9 s (docs/benchmarks.md, "Gradients with
# the stages written out"). Pass explicit_rk(..., loop=False) or loop=True to choose either form.
WRITTEN_OUT_GRADIENT_SIZE = 18

# Larger programs are written out too where the rollouts differentiated together are at least this
# many (a jax.vmap around the rollout, seen while it is traced): the stage loop's overhead per
# stage (its dozens of small kernels, the copies of its carried arrays) then costs more than the
# longer compile of three reverse passes. The Panda's gradient of 1000 RK3 steps under a plain
# jax.jit (2-core Intel Xeon, float64, alternating runs): batch 16 24.7-24.8 ms written out against
# 46.2-47.3 ms with the loop, batch 256 268-270 against 357-366 ms; batch 1 8.2 against 9.3 ms in
# one process, too little for the second of compile it costs, so a single rollout keeps the loop.
# The gradient's compile 1.3-1.5 s longer (docs/benchmarks.md, "Batches of gradients written out").
WRITTEN_OUT_GRADIENT_BATCH = 16
# ... and at least this many where small loops are compiled as single kernels (jaxarm.jit,
# jaxarm.core.xla.loop_kernels_active): there the stage loop of a batch of up to about a hundred
# rollouts runs as one kernel, without that overhead. The Panda under jaxarm.jit: batch 64 77 ms
# with the loop against 90 written out, batch 128 196 against 150, batch 256 318-331 against
# 251-258 (compile 3.0-3.2 against 5.1 s).
WRITTEN_OUT_GRADIENT_BATCH_LOOP_KERNELS = 128


def gradient_written_out(stages: int, joints: int, batch: int = 1, loop_kernels: bool = False) -> bool:
    """Whether a rollout differentiated in reverse mode only, its arm held constant, runs the
    written-out stages of a step with ``stages`` stages for an arm of ``joints`` joints on a CPU
    (where no platform rule writes them out anyway): stages x joints <=
    :data:`WRITTEN_OUT_GRADIENT_SIZE`, or ``batch`` rollouts differentiated together (the sizes of
    the vmaps around it) at least :data:`WRITTEN_OUT_GRADIENT_BATCH`, and at least
    :data:`WRITTEN_OUT_GRADIENT_BATCH_LOOP_KERNELS` where its program's small loops are compiled as
    single kernels (``loop_kernels``: :func:`jaxarm.jit`)."""
    if stages * joints <= WRITTEN_OUT_GRADIENT_SIZE:
        return True
    return batch >= (WRITTEN_OUT_GRADIENT_BATCH_LOOP_KERNELS if loop_kernels else WRITTEN_OUT_GRADIENT_BATCH)


def _staged(x) -> bool:
    """Whether x is traced into a program being staged out (a jit, a scan's body), possibly under
    vmap or differentiation. Called eagerly (concrete values, or only vmap/grad tracers around
    them), a step does not put its dynamics under a jax.jit of its own: that jit would be a new
    function each call, compiled again every time."""
    return any(isinstance(t, tracers.StagingTracer) for t in tracers.wrapped(x))


def stages_in_a_loop() -> bool:
    """Whether :func:`explicit_rk` steps (``method="rk3"``/``"rk4"``) run their stages in a loop when
    traced now: on a CPU yes, on other platforms (GPU, TPU) no (see :func:`explicit_rk`)."""
    return jax.default_backend() == "cpu"


# Kutta's third-order tableau (Kutta 1901): the stages of :func:`rk3`.
KUTTA3 = ((0.0, 0.5, 1.0), ((0.0, 0.0, 0.0), (0.5, 0.0, 0.0), (-1.0, 2.0, 0.0)), (1 / 6, 4 / 6, 1 / 6))
rk3_rolled = explicit_rk(*KUTTA3)
rk3_rolled.__doc__ = "Kutta's third-order method (as :func:`rk3`) with its three stages in a loop on a CPU (one dynamics to compile), written out on a GPU."
# The classical fourth-order tableau: the stages of :func:`rk4`.
CLASSICAL_RK4 = ((0.0, 0.5, 0.5, 1.0), ((0, 0, 0, 0), (0.5, 0, 0, 0), (0, 0.5, 0, 0), (0, 0, 1.0, 0)), (1 / 6, 1 / 3, 1 / 3, 1 / 6))
rk4_rolled = explicit_rk(*CLASSICAL_RK4)
rk4_rolled.__doc__ = "Classical fourth-order Runge-Kutta (as :func:`rk4`) with its four stages in a loop on a CPU, written out on a GPU."

# By name, "rk3" and "rk4" are the rolled forms: on a CPU their stage loop compiles the dynamics
# once (a rollout's derivative compiles 30-40 % sooner than with the stages written out); on a GPU
# they trace their stages one after the other (tests/test_xla_options.py checks both forms against
# rk3, rk4). A rollout that is not differentiated runs their written-out form (``step.written_out``,
# 8-41 % faster on a CPU) on every platform, and so does a small one differentiated in reverse mode
# with its arm held constant (WRITTEN_OUT_GRADIENT_SIZE).
METHODS = {"rk3": rk3_rolled, "rk4": rk4_rolled, "euler": euler, "semi_implicit_euler": semi_implicit_euler}
ORDER = {"rk3": 3, "rk4": 4, "euler": 1, "semi_implicit_euler": 1}


def get_method(method):
    """An integrator step by name, or the callable itself."""
    if callable(method):
        return method
    try:
        return METHODS[method]
    except KeyError:
        raise ValueError(f"method: expected one of {sorted(METHODS)} or a step function, got {method!r}") from None
