"""Rollouts: Swartz's Forward Arm stepped in time with ``jax.lax.scan``.

:func:`rollout` simulates one arm from one initial state; batch it with ``jax.vmap`` (over
initial states, inputs and arm parameters) or use :func:`rollout_batch`, which also shards the
batch over every visible device.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..core import tracers, xla
from ..core.xla import by_value, eager_compiled, jit
from ..dynamics import algebra, motors
from ..dynamics.forward import _forward_dynamics
from ..dynamics.newton_euler import _summed_over_states
from ..model import checks
from ..model.arm import Arm
from . import integrators
from .adjoint import scan as adjoint_scan

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

ADJOINT_DEPRECATED = (
    "{caller}: adjoint=True is deprecated and will be removed: plain reverse mode (the default, "
    "adjoint=False) gives the same gradient faster, compiles sooner and needs far less memory "
    "(Puma 560, 1000 RK3 steps, batch 16: 13 ms and 9 MB of intermediates against 175 ms and "
    "189 MB; batch 256: 0.23 s and 142 MB against 4.5 s and 3 GB). Leave adjoint out; "
    "checkpoint=True needs less memory still."
)


def warn_deprecated_adjoint(caller: str) -> None:
    """Warn that ``adjoint=True`` is deprecated, once per call site of the user's (a
    ``FutureWarning``, shown by default; calls from within jaxarm itself, e.g. a solver passing its
    own setting on, say nothing more). For ``caller`` called directly by user code."""
    frame = sys._getframe(2)  # the frame that called ``caller``
    if os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        return
    warnings.warn(ADJOINT_DEPRECATED.format(caller=caller), FutureWarning, stacklevel=3)


class Trajectory(NamedTuple):
    """Result of a rollout with T steps.

    t: (T+1,) times; q, qd: (T+1, n) states (row 0 is the initial state);
    qdd: (T, n) acceleration at the start of each step; tau: (T, n) joint torque applied at the
    start of each step (after the motor model); u: (T, n) the input held over each step
    (torque or voltage, after DAC quantization and saturation: voltages clipped at
    ``voltage_limit``, torques at ``arm.limits.torque`` when ``saturate``);
    diverged_step: () int, the first step whose result was NaN/inf or beyond the bound, -1 if none.
    From that step on the state is frozen at its last good value.
    stop_steps: (n,) int, for each joint the number of steps that ended with the joint held by
    one of its end stops (0 everywhere when ``stops=False``); see :func:`end_stops`.
    """

    t: jnp.ndarray
    q: jnp.ndarray
    qd: jnp.ndarray
    qdd: jnp.ndarray
    tau: jnp.ndarray
    u: jnp.ndarray
    diverged_step: jnp.ndarray
    stop_steps: jnp.ndarray | None = None


def end_stops(q, qd, lower, upper):
    """Rigid, perfectly plastic end stops at the joints' position limits, applied after a step.

    A joint that ends the step beyond a limit is put back on it and its velocity into the stop is
    removed (coefficient of restitution 0): ``q_j = clip(q_j, lower_j, upper_j)``, and
    ``qd_j = 0`` where the joint is on its upper stop with ``qd_j > 0`` or on its lower stop with
    ``qd_j < 0``. Velocities away from the stop are kept, so a joint leaves its stop as soon as
    the torques pull it back. The impulse acts on the stopped joint alone (an exact velocity
    reset of that joint; the reaction it would pass to the other joints through the mass matrix's
    coupling is not modelled), so the stop's effect is exact in position and velocity of the joint
    and first order in dt for the rest of the arm. Infinite limits never act.
    Returns (q, qd, held) with held (n,) bool: the joints on a stop after the step.
    """
    lower = jnp.asarray(lower, q.dtype)
    upper = jnp.asarray(upper, q.dtype)
    return _end_stops(q, qd, lower, upper)


# --------------------------------------------------------------------------- what reverse mode stores
# A rollout's time loop stores, per step, every value its reverse pass reads: the stage points
# and accelerations (integrators._recomputed), and what the derivatives of the step's piecewise
# operations read. By jax's own rules those were the weights of jnp.clip's maximum and minimum
# for the input clip (torques, or voltages at the drives' limits) and for the end stops, the end
# stops' reset mask, and one mask per array of the divergence guard's where. XLA:CPU writes each
# stored array into its own (steps, batch, n) buffer, one kernel per step each, so at small
# batches their number, more than their size, costs. The input clip's rule
# (jaxarm.dynamics.algebra.saturated, shared with the motors' voltage clip) stores one array (its
# weight); those below store two for the end stops (the clip's weight and the reset mask) and one
# mask for the guard. All give the same derivatives to the last bit, ties (a value exactly on a limit)
# included; with differentiated limits they fall back on jax's rules. The compiled gradient of 16
# rollouts of 1000 RK3 steps writes 15 arrays per step instead of 18 (Puma 560; Panda 26 instead
# of 29); the Puma's ran 6-15 % faster at batch 16, the other cases measured within the
# machine's noise (docs/benchmarks.md, "Fewer stored arrays in reverse mode").


def _velocity_reset(q, qd, lower, upper):
    """Where an end stop removes the velocity: on the upper stop moving up, or on the lower moving down."""
    return ((q >= upper) & (qd > 0)) | ((q <= lower) & (qd < 0))


def _end_stops_plain(q, qd, lower, upper):
    """:func:`end_stops` as jax differentiates it by its own rules."""
    held = (q >= upper) | (q <= lower)
    qd = jnp.where(_velocity_reset(q, qd, lower, upper), jnp.zeros_like(qd), qd)
    return jnp.clip(q, lower, upper), qd, held


@jax.custom_jvp
def _end_stops(q, qd, lower, upper):
    return _end_stops_plain(q, qd, lower, upper)


def _end_stops_jvp(primals, tangents):
    q, qd, lower, upper = primals
    tq, tqd, tlo, thi = tangents
    out = _end_stops_plain(q, qd, lower, upper)
    no_tangent = np.zeros(np.shape(out[2]), jax.dtypes.float0)
    if not (algebra.is_symbolic_zero(tlo) and algebra.is_symbolic_zero(thi)):  # differentiated limits: jax's own rules
        _, (dq, dqd, _) = jax.jvp(_end_stops_plain, primals, tuple(map(algebra.instantiated, primals, tangents)))
        return out, (dq, dqd, no_tangent)
    reset = _velocity_reset(q, qd, lower, upper)
    dq = algebra.clip_weight(q, lower, upper) * algebra.instantiated(q, tq)
    dqd = jax.lax.select(reset, jnp.zeros_like(qd), algebra.instantiated(qd, tqd))
    return out, (dq, dqd, no_tangent)


_end_stops.defjvp(_end_stops_jvp, symbolic_zeros=True)


def _selected_plain(ok, new, old):
    """``where(ok, a, b)`` for each pair of the tuples ``new`` and ``old``, ``ok`` a scalar."""
    return tuple(jnp.where(ok, a, b) for a, b in zip(new, old))


@jax.custom_jvp
def _selected(ok, new, old):
    """:func:`_selected_plain`; in reverse mode one stored mask for all of the pairs."""
    return _selected_plain(ok, new, old)


def _selected_jvp(primals, tangents):
    ok, new, old = primals
    _, tnew, told = tangents
    masks = {}
    dt = []
    for a, b, ta, tb in zip(new, old, tnew, told):
        mask = masks.setdefault(a.shape, jax.lax.broadcast_in_dim(ok, a.shape, ()))
        dt.append(jax.lax.select(mask, algebra.instantiated(a, ta), algebra.instantiated(b, tb)))
    return _selected(ok, new, old), tuple(dt)


_selected.defjvp(_selected_jvp, symbolic_zeros=True)


class DivergenceError(FloatingPointError):
    """A rollout produced NaN/inf or left the state bound."""


def check_divergence(traj: Trajectory, dt=None) -> Trajectory:
    """Raise :class:`DivergenceError` naming the step (and batch element) where a rollout diverged."""
    steps = np.asarray(traj.diverged_step)
    if not np.any(steps >= 0):
        return traj
    t = np.asarray(traj.t)
    if steps.ndim == 0:
        step, where, time = int(steps), "", float(t[int(steps) + 1])
    else:
        idx = tuple(int(i) for i in np.argwhere(steps >= 0)[0])
        step = int(steps[idx])
        where = f" (batch element {idx[0] if len(idx) == 1 else idx})"
        time = float(t[idx + (step + 1,)]) if t.ndim > 1 else float(t[step + 1])
    raise DivergenceError(
        f"rollout diverged at step {step} (t = {time:.6g} s){where}: the state became NaN/inf or "
        "exceeded the bound; reduce dt, check the arm's inertias, or pass bound= to raise the limit"
    )
    return traj


def _with_tangent(x, sources):
    """x itself, made to depend on the arrays ``sources`` through a select that never picks them.

    In forward or reverse mode, where anything in ``sources`` has a tangent, x has one too (zeros
    where it had none); without differentiation XLA folds the select away (the optimized programs
    of a rollout and of its gradient are unchanged). A rollout differentiated with respect to its
    inputs or its arm but not its start state has a state without a tangent until the first
    step, and ``jax.lax.scan``'s derivative rule then linearizes the time loop's body a second
    time (with the Runge-Kutta stage loop inside it) once the tangent appears. With the tangent
    there from the start, once: a Puma torque gradient (1000 steps, batch 16) traced in 1.5-1.9 s
    instead of 3.0-3.6 s. The select's transpose gives the sources exact zeros (no 0 * inf)."""
    firsts = [s.ravel()[0].astype(x.dtype) for s in sources if s.size]
    if not firsts:
        return x
    return jnp.where(jnp.zeros(x.shape, bool), sum(firsts), x)


def _tangent_sources(tree):
    """The floating-point arrays of ``tree`` being traced (only those can carry a tangent)."""
    return [x for x in jax.tree_util.tree_leaves(tree)
            if isinstance(x, jax.core.Tracer) and jnp.issubdtype(x.dtype, jnp.inexact)]


def _differentiated(values, functions=()) -> frozenset:
    """The kinds of differentiation around this call whose tangents reach an array in ``values``
    or one closed over by ``functions`` (a policy, a DAC): "forward" (``jax.jvp``, ``jax.jacfwd``)
    and "reverse" (``jax.grad``, ``jax.vjp``, ``jax.linearize``); empty (false) if none. Only a
    hint for the form of the program (see :func:`rollout`'s ``method``): a derivative taken
    further out (``jax.grad`` of a ``jax.jit`` or of a ``lax.scan`` whose body calls ``rollout``)
    is missed, and is then the same derivative of the other form."""
    leaves = list(jax.tree_util.tree_leaves(values))
    for fn in functions:
        leaves += jax.tree_util.tree_leaves(fn)  # a pytree function (jax.tree_util.Partial, modules)
        if isinstance(fn, functools.partial):
            leaves += jax.tree_util.tree_leaves((fn.args, fn.keywords))
            fn = fn.func
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                leaves += jax.tree_util.tree_leaves(cell.cell_contents)
            except (ValueError, TypeError):  # an empty cell; a dict whose keys do not sort
                pass
    # every tracer wrapped inside another counts (a jax.hessian holds both kinds)
    return frozenset("reverse" if isinstance(t, tracers.REVERSE_TRACERS) else "forward"
                     for x in leaves for t in tracers.wrapped(x) if isinstance(t, tracers.AD_TRACERS))


# the kinds of differentiation a kept rollout's program is traced for (see _kept_rollout): inside
# its jit the derivative taken outside it cannot be seen
_KINDS = threading.local()


def _kinds_of(values, functions=()) -> frozenset:
    """:func:`_differentiated`, or the kinds a kept rollout is being traced for."""
    forced = getattr(_KINDS, "value", None)
    return forced if forced is not None else _differentiated(values, functions)


def _kept_rollout(arm, arrays, settings, kinds=frozenset()):
    """:func:`rollout` with an input schedule of a known arm, called eagerly (outside any jit, vmap
    or derivative) or under transformations applied eagerly (``jax.grad``, ``jax.vmap``,
    ``jax.jacfwd`` of it outside any jit: ``kinds`` the kinds of differentiation among them),
    answered by a compiled rollout kept for the next call (:func:`jaxarm.core.xla.eager_compiled`):
    the arm (known by value) and the settings are its constants, the start state, the schedule,
    dt, t0 and the wrench its arguments. Run op by op, 1000 Puma 560 steps took 0.66-0.85 s every
    call; kept, a call after the first takes what a jitted rollout takes. Transformed eagerly, the
    transformation is applied to the kept jit, whose transformed program JAX keeps too: run op by
    op, every eager ``jax.grad`` of a 1000-step Panda rollout traced and compiled its time loops
    again (2.5 s a call). None where a setting cannot key a kept program (the rollout is then run
    as called)."""
    settings = tuple(sorted(settings.items()))
    key = ("rollout", by_value(arm), settings, tuple(a is None for a in arrays), kinds)

    def traced(q0, qd0, u, dt, t0, f_ext):
        previous = getattr(_KINDS, "value", None)
        _KINDS.value = kinds  # the form of the program for the derivative taken around it
        try:
            return rollout(arm, q0, qd0, u, dt, t0=t0, f_ext=f_ext, on_divergence="flag", **dict(settings))
        finally:
            _KINDS.value = previous

    run = eager_compiled(key, lambda: jit(traced))
    return None if run is None else run(*arrays)


def _as_schedule(x, T, width, name):
    x = jnp.asarray(x)
    if x.ndim == 1:
        x = jnp.broadcast_to(x, (T, width))
    if x.shape != (T, width):
        raise ValueError(f"rollout: {name}: expected shape ({T}, {width}) (one row per step) or ({width},), got {x.shape}")
    return x


def _stages_written_out(step_fn, arm, kinds, batch=1) -> bool:
    """Whether a rollout whose arm has known kinematics runs the written-out form of a Runge-Kutta
    step made with ``loop=None`` (``"rk3"``, ``"rk4"``) rather than its form by platform (on a CPU,
    the stage loop), given the kinds of differentiation that reach it (:func:`_differentiated`)
    and ``batch``, the number of rollouts traced together (:func:`jaxarm.core.tracers.vmapped_size`).

    - Nothing differentiated: written out. No loop overhead per stage: 8-41 % faster on a CPU.
    - Reverse mode only, the arm not differentiated (a gradient with respect to the start state,
      the inputs or a policy's parameters), and at most
      :data:`jaxarm.integrators.WRITTEN_OUT_GRADIENT_SIZE` stages x joints (RK3 up to 6 joints,
      RK4 up to 4): written out. The gradient of a 1000-step RK3 rollout of the Puma 560 ran
      1.2-1.7x faster than with the stage loop (batch 16: 13.1 against 21.6 ms), and its first
      call took 2.5-3.9 s at batches 1 to 256 against 2.0-2.9 s. For the 7-joint Panda the
      written-out gradient's first call took 4.8-6.5 s, so a single rollout of it keeps the loop;
      a batch of at least :data:`jaxarm.integrators.WRITTEN_OUT_GRADIENT_BATCH` (16) is written
      out, or of at least ``WRITTEN_OUT_GRADIENT_BATCH_LOOP_KERNELS`` (128) where small loops
      are compiled as single kernels (:func:`jaxarm.jit`; :func:`jaxarm.integrators.gradient_written_out`
      has the measurements).
    - Otherwise the loop. In forward mode (``jax.jvp``, ``jax.jacfwd``; a ``jax.hessian`` is
      forward over reverse), or with the arm
      differentiated (identification), the written-out derivative was slower to compile and to
      run: a 1000-step Puma rollout at batch 16, gradient with respect to the standard parameters
      109 ms (first call 16.3 s) against 86 ms (7.4 s); eight forward-mode directions 311 ms
      (7.3 s) against 196 ms (2.8 s).

    An arm whose kinematics are traced (a vmap over stack_arms with every leaf traced) keeps the
    loop (this is not called): nothing of its dynamics folds, and written out its rollouts were
    no faster (4096 perturbed arms: Panda within 2 %, Puma 560 3 % faster to 16 % slower in three
    runs) and took 0.8-1.8 s longer to compile."""
    if not kinds:
        return True
    stages = getattr(step_fn, "stages", None)
    return (kinds == {"reverse"} and stages is not None and not _differentiated(arm)
            and integrators.gradient_written_out(stages, arm.n, batch, xla.loop_kernels_active()))


def rollout(
    arm: Arm,
    q0,
    qd0,
    inputs,
    dt,
    *,
    steps: int | None = None,
    method="rk3",
    input: str = "torque",
    hold: int = 1,
    dac: motors.DAC | None = None,
    f_ext=None,
    t0=0.0,
    bound=1e6,
    checkpoint: bool = False,
    adjoint: bool = False,
    saturate: bool = True,
    on_divergence: str = "raise",
    unroll: int = 1,
    stops: bool = True,
) -> Trajectory:
    """Simulate T steps of length dt from (q0, qd0).

    inputs: a schedule (T, n) of joint torques (``input="torque"``) or motor voltages
        (``input="voltage"``, through :func:`jaxarm.motor_torque`), one row per step, or a policy
        ``u = policy(t, q, qd)`` (then ``steps`` gives T), e.g. :func:`jaxarm.pd_controller`.
    hold: the input is updated every ``hold`` steps and held in between (zero-order hold of a DAC
        with period ``hold * dt``); ``dac`` optionally quantizes/clips it (as Swartz's DACOut routine).
    f_ext: optional wrench on the tool, (6,) constant or (T, 6) schedule (see inverse_dynamics).
    method: "rk3" (default, Kutta), "rk4", "euler" (Craig 6.117), "semi_implicit_euler" or a
        step function (see :mod:`jaxarm.integrators`). A Runge-Kutta step by name (or one made
        by :func:`jaxarm.integrators.explicit_rk` with ``loop=None``) runs its stages one after
        the other where the arm's kinematics are known (not traced) and either nothing given here
        (arm, states, inputs, a policy's or DAC's closure, dt) is being differentiated by a
        ``jax.grad``/``jax.jvp`` around this call, or only a reverse-mode derivative (``jax.grad``)
        reaches the states, inputs or policy, not the arm, and the method's stages times the
        arm's joints are at most ``jaxarm.integrators.WRITTEN_OUT_GRADIENT_SIZE`` (18: RK3 up to
        6 joints) or a vmap around this call differentiates at least 16 rollouts together (128
        under :func:`jaxarm.jit`; ``jaxarm.integrators.gradient_written_out``). Otherwise in the
        form it was made with (a loop over the stages on a CPU, whose derivative program compiles
        sooner: the 7-joint Panda's 1000-step gradient in 2.9-4.1 s against 4.8-6.5 s written
        out). The two give the same values to rounding.
    bound: a step whose |q| or |qd| exceeds this, or is not finite, counts as divergence.
    saturate: clip torque inputs at the joints' torque limits (``arm.limits.torque``, infinite by
        default) as a real drive would; voltage inputs are always clipped at ``voltage_limit``.
    checkpoint: rematerialize each step in reverse mode (``jax.checkpoint``) so gradients through
        long rollouts need memory for the states only. Every integrator already evaluates the
        dynamics again in reverse mode instead of storing their intermediates, which is what
        makes plain reverse mode fast to compile and run (docs/how-it-works.md); this recomputes
        the whole step on top, for memory, and is otherwise slower (Panda, 40 RK3 steps, gradient
        with respect to the masses: 15.6 ms instead of 9.4 ms).
    adjoint: deprecated (a ``FutureWarning``), to be removed: reverse-mode derivatives by the
        discrete adjoint (:func:`jaxarm.adjoint.scan`): the step Jacobians for all steps at once
        in forward mode, then one small matrix-vector product per step backwards. Same gradient
        as plain autodiff (to rounding). It was about 10x faster for one rollout on a CPU before
        plain reverse mode got cheap; now it is slower at every batch size, compiles longer and
        stores 20x more (1000 RK3 steps, ``python experiments/rollout_gradients.py --arms
        puma560 panda --batches 1 16 256``; Puma 560, batch 1: 7.7 against 1.8 ms, 11.8 against
        0.56 MB of intermediates, compile 8.3 against 2.6 s; batch 256: 4.5 against 0.23 s,
        3 GB against 142 MB). It needs an input
        schedule (not a policy), stores T x 2n x 3n Jacobian entries per rollout, and has no forward-mode rule
        (``jax.jvp``/``jacfwd``/``hessian`` of such a rollout raise; leave it off for those).
        On a CPU compile the gradient with :func:`jaxarm.jit` (``jax.jit`` with jaxarm's compiler
        options): under a plain ``jax.jit`` XLA's CPU fusion emitters make its Jacobian stage
        ~100x slower (Puma, 1000 steps: 1.56 s instead of 0.030 s, slower than plain autodiff).
    on_divergence: "raise" raises :class:`DivergenceError` when the result is concrete (outside
        jit); "flag" only sets ``Trajectory.diverged_step`` (always the case under jit/vmap).

    Called eagerly (outside any jit, vmap or derivative) with an input schedule, a rollout
    compiles once and keeps the program, the arm and the settings its constants, the start state,
    schedule, dt, t0 and wrench its arguments: the next eager call of the same arm, settings and
    shapes runs it at once (1000 Puma 560 steps: 0.67 s for the first call, then 2.8 ms, where
    every call took 0.66-0.85 s run op by op). So does a ``jax.grad``, ``jax.jacfwd``,
    ``jax.hessian`` or ``jax.vmap`` of it applied outside any jit with the arm known: the kept
    program is transformed, and JAX keeps the transformed program (an eager gradient of 1000
    Panda steps: 2.3 s every call op by op, 17 ms after the first kept). With a policy or a DAC,
    or the arm differentiated, it runs as called.
    unroll: steps per iteration of the compiled time loop (``jax.lax.scan``'s ``unroll``).
    stops: the joints' position limits (``arm.limits.position``) act as rigid end stops
        (:func:`end_stops`, applied after every step); ``Trajectory.stop_steps`` counts, per
        joint, the steps that ended on a stop. On by default; joints with infinite limits are
        never stopped, and an arm whose limits are all infinite (and known while tracing) pays
        nothing. A concrete ``q0`` outside the limits is refused. ``stops=False`` lets the joints
        pass their limits, as before.
    """
    checks.check_arm(arm, "rollout")
    q0 = checks.joint_vector(q0, arm, "q0", "rollout")
    qd0 = checks.joint_vector(qd0, arm, "qd0", "rollout")
    if adjoint:
        warn_deprecated_adjoint("rollout")
    if adjoint and callable(inputs):
        raise ValueError("rollout: adjoint=True: expected an input schedule (T, n), got a policy function; "
                         "differentiate closed-loop rollouts with adjoint=False")
    if adjoint and checkpoint:
        raise ValueError("rollout: adjoint=True stores only the states already; checkpoint must be False with it")
    if input not in ("torque", "voltage"):
        raise ValueError(f"rollout: input: expected 'torque' or 'voltage', got {input!r}")
    if on_divergence not in ("raise", "flag"):
        raise ValueError(f"rollout: on_divergence: expected 'raise' or 'flag', got {on_divergence!r}")
    if not isinstance(unroll, (int, np.integer)) or isinstance(unroll, bool) or unroll < 1:
        raise ValueError(f"rollout: unroll: expected a positive whole number of steps, got {unroll!r}")
    if not isinstance(hold, (int, np.integer)) or hold < 1:
        raise ValueError(f"rollout: hold: expected a positive whole number of steps, got {hold!r}")
    if not isinstance(dt, jax.core.Tracer) and not float(dt) > 0:
        raise ValueError(f"rollout: dt: expected a positive time step, got {dt!r}")
    step_fn = integrators.get_method(method)
    if (not adjoint and not checkpoint and checks.concrete((arm.kinematics, arm.tool))
            and _stages_written_out(step_fn, arm, _kinds_of((arm, q0, qd0, inputs, dt, t0, f_ext), (inputs, dac)),
                                    tracers.vmapped_size((q0, qd0, inputs, f_ext)))):
        step_fn = getattr(step_fn, "written_out", step_fn)
    # in reverse mode the time loop keeps each step's states and evaluates the dynamics again
    # rather than stacking their intermediates step by step (the stage loop of the Runge-Kutta
    # methods by name does this itself; the adjoint differentiates each step on its own)
    recompute = not adjoint and not getattr(step_fn, "recomputes_dynamics", False)
    n = arm.n
    # a jax.grad around a jax.vmap of rollouts that leaves the arm out (identification from several
    # experiments) sums the arm's cotangent over the batch: forward dynamics then reads the arm per
    # state (newton_euler._read_per_state). adjoint=True differentiates each step on its own, as it
    # was measured
    per_state = not adjoint and _summed_over_states(arm, (q0, qd0, inputs, f_ext))
    if not isinstance(stops, (bool, np.bool_)):
        raise ValueError(f"rollout: stops: expected True or False, got {stops!r}")
    use_stops = bool(stops)
    if use_stops and checks.concrete(arm.limits.position):
        limits = np.asarray(arm.limits.position, dtype=np.float64)
        use_stops = bool(np.any(np.isfinite(limits)))
        if use_stops and checks.concrete(q0):
            q0_np = np.asarray(q0, dtype=np.float64)
            out = np.flatnonzero((q0_np < limits[:, 0]) | (q0_np > limits[:, 1]))
            if out.size:
                j = int(out[0])
                raise ValueError(
                    f"rollout: q0[{j}] = {q0_np[j]:.6g} is outside joint {j + 1}'s position limits "
                    f"[{limits[j, 0]:.6g}, {limits[j, 1]:.6g}] (arm.limits.position); start inside them, "
                    "or pass stops=False to simulate without end stops")
    policy: Callable | None = inputs if callable(inputs) else None
    if policy is None:
        schedule = jnp.asarray(inputs)
        if schedule.ndim != 2 or schedule.shape[1] != n:
            raise ValueError(f"rollout: inputs: expected a schedule of shape (T, {n}) or a policy function, got shape {schedule.shape}")
        T = schedule.shape[0]
        if steps is not None and steps != T:
            raise ValueError(f"rollout: steps={steps} disagrees with the schedule's {T} rows")
        # numpy, not jnp: inside a jit even a concrete (closed-over) schedule's jnp result is traced
        if not isinstance(schedule, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(schedule))):
            raise ValueError("rollout: inputs: the schedule contains NaN or inf")
    else:
        if steps is None:
            raise ValueError("rollout: steps: required when inputs is a policy function")
        T = int(steps)
        schedule = None
    if input == "voltage":
        motors._require_motor_model(arm, "rollout")
    ext = None if f_ext is None else _as_schedule(f_ext, T, 6, "f_ext")

    dtype = jnp.result_type(q0, qd0, float)
    dt = jnp.asarray(dt, dtype)
    t0 = jnp.asarray(t0, dtype)
    arrays = (q0, qd0, schedule, dt, t0, ext)
    # called eagerly, or transformed eagerly with the arm known: one compiled rollout, kept
    if policy is None and dac is None and tracers.kept_program_answers(arm, arrays):
        settings = dict(method=method, input=input, hold=hold, bound=bound, checkpoint=checkpoint, adjoint=adjoint,
                        saturate=saturate, unroll=unroll, stops=stops)
        traj = _kept_rollout(arm, arrays, settings, _differentiated(arrays))
        if traj is not None:
            if on_divergence == "raise" and not isinstance(traj.diverged_step, jax.core.Tracer):
                check_divergence(traj)
            return traj

    def command(arm, k, t, q, qd, u_row):
        """The input applied over step k: DAC, then saturation (what Trajectory.u records)."""
        u = policy(t, q, qd) if policy is not None else u_row
        u = jnp.asarray(u, dtype)
        if dac is not None:
            u = dac(u)
        if input == "voltage":  # clipped at the drives' voltage limits, as motors.saturate_voltage does
            return algebra.saturated(u, jnp.asarray(arm.drives.voltage_limit, dtype))
        if not saturate:
            return u
        tau_limit = jnp.asarray(arm.limits.torque, dtype)
        return algebra.saturated(u, tau_limit)

    def torque_of(arm, u, qd):  # u is already saturated by command()
        if input == "voltage":
            return motors._motor_torque(arm, u, qd, saturate=False)
        return u

    # One step as a function of (parameters, carry, this step's inputs), so that the adjoint
    # scan can differentiate it with respect to each; u_held is empty unless hold > 1.
    def body(params, carry, xs):
        arm, dt, t0 = params
        q, qd, u_held, diverged, held_steps = carry
        k, u_row, fe = xs
        t = t0 + k * dt
        u_new = command(arm, k, t, q, qd, u_row)
        u = jnp.where(k % hold == 0, u_new, u_held) if hold > 1 else u_new

        def accel(ts, qs, qds):
            return _forward_dynamics(arm, qs, qds, torque_of(arm, u, qds), fe, per_state=per_state)

        q_next, qd_next, qdd = step_fn(integrators._recomputed(accel) if recompute else accel, t, q, qd, dt)
        if use_stops:
            lims = arm.limits.position
            q_next, qd_next, held = end_stops(q_next, qd_next, lims[:, 0], lims[:, 1])
        bad = ~(jnp.all(jnp.isfinite(q_next)) & jnp.all(jnp.isfinite(qd_next)))
        bad = bad | (jnp.max(jnp.abs(q_next)) > bound) | (jnp.max(jnp.abs(qd_next)) > bound)
        newly = bad & (diverged < 0)
        diverged = jnp.where(newly, k.astype(diverged.dtype), diverged)
        ok = diverged < 0
        q_next, qd_next = _selected(ok, (q_next, qd_next), (q, qd))
        if use_stops:
            held_steps = held_steps + (held & ok).astype(held_steps.dtype)
        out = (q_next, qd_next, qdd, torque_of(arm, u, qd), u)
        return (q_next, qd_next, u if hold > 1 else u_held, diverged, held_steps), out

    init = (q0.astype(dtype), qd0.astype(dtype), jnp.zeros(n if hold > 1 else 0, dtype), jnp.asarray(-1, jnp.int32),
            jnp.zeros(n, jnp.int32))
    if not adjoint:  # the float carries have a tangent from the first step: the time loop's body is linearized once
        sources = _tangent_sources((arm, dt, t0, schedule, ext))
        init = tuple(_with_tangent(x, sources) for x in init[:3]) + init[3:]
    xs = (jnp.arange(T, dtype=jnp.int32), schedule, ext)
    params = (arm, dt, t0)
    if adjoint:
        if checks.concrete(arm):
            # A constant arm (not differentiated) is closed over rather than passed as a parameter
            # of the adjoint scan: its values stay known while tracing and its structural zeros
            # fold (jaxarm.dynamics.algebra.Known), in the forward sweep and the step Jacobians alike.
            def scan_body(p, carry, xs_k):
                return body((arm,) + p, carry, xs_k)

            scan_params = (dt, t0)
        else:
            scan_body, scan_params = body, params
        (_, _, _, diverged, held_steps), (qs, qds, qdds, taus, us) = adjoint_scan(scan_body, scan_params, init, xs)
    else:
        step = functools.partial(body, params)
        if checkpoint:
            step = jax.checkpoint(step)
        (_, _, _, diverged, held_steps), (qs, qds, qdds, taus, us) = jax.lax.scan(step, init, xs, unroll=int(unroll))
    traj = Trajectory(
        t=t0 + dt * jnp.arange(T + 1, dtype=dtype),
        q=jnp.concatenate([q0[None].astype(dtype), qs]),
        qd=jnp.concatenate([qd0[None].astype(dtype), qds]),
        qdd=qdds,
        tau=taus,
        u=us,
        diverged_step=diverged,
        stop_steps=held_steps,
    )
    if on_divergence == "raise" and not isinstance(diverged, jax.core.Tracer):
        check_divergence(traj)
    return traj
