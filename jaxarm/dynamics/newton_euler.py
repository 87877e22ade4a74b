"""Recursive Newton-Euler for serial arms: inverse dynamics, joint wrenches, bias and gravity
torques.

Every function takes a single state (q, qd, ... of shape (n,)); batch with ``jax.vmap``.
The loops run over the static joint count and unroll at trace time.

Frames: each body's frame has z on its joint axis (see :func:`jaxarm.model.arm.body_model`);
velocities, accelerations and wrenches are expressed in the body's own frame, about its
origin, as in Swartz's Inverse Arm and Craig 6.45-6.53. The recursion is written in the
component algebra of :mod:`jaxarm.dynamics.algebra` (every vector component a scalar).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from ..core import spatial, tracers
from ..model import checks
from ..model.arm import Arm, Bodies
from . import algebra, drives
from .algebra import (
    ZERO,
    _sym,
    _vec,
    add,
    cross,
    matrix,
    mtv,
    mv,
    per_state_entries,
    scalar,
    scale,
    sym_mv,
    vector,
)
from .eager import compiled_when_eager
from .kinematics import _bodies, joint_frames


def _base_acceleration(arm: Arm, dtype):
    """Gravity enters as an upward base acceleration (Swartz eq. 3 with vdot_0 = -g), in frame 0.
    A numpy array when base and gravity are concrete (the kernels then fold its zeros)."""
    xp = np if checks.concrete((arm.base, arm.gravity)) else jnp
    R0 = xp.asarray(arm.base, dtype=dtype)[:3, :3]
    return -(R0.T @ xp.asarray(arm.gravity, dtype=dtype))


def _tip_wrench(bodies: Bodies, f_ext):
    """External wrench (force, moment) on the tool, in tool frame -> wrench on the last body about its origin."""
    F = spatial.mv(bodies.tip_rotation, f_ext[:3])
    N = spatial.mv(bodies.tip_rotation, f_ext[3:]) + spatial.cross(bodies.tip_translation, F)
    return F, N


def outward_sweep(is_revolute, frames, qd, qdd, a0):
    """The outward recursion of Newton-Euler (Craig 6.45-6.47; prismatic joints 6.33-6.35): the
    angular velocity w, angular acceleration wd and origin acceleration a of every body, in the
    body's own frame, gravity included as the base acceleration a0 (3-tuple); qdd may be None
    (acceleration zero). Yields the n (w, wd, a) triples of 3-tuples body by body (so that
    :func:`rnea` traces each body's wrench right after its motion, as one recursion); w and wd
    are None on bodies that no revolute joint precedes (they translate only). The motion does not
    depend on the inertial parameters: :func:`rnea` forms the bodies' wrenches from it, and the
    identification regressor (:mod:`jaxarm.identify.linear_model`) the wrenches' linear maps."""
    qd, qdd = algebra.entries(qd), algebra.entries(qdd)
    w = wd = None  # the base does not rotate
    a = a0
    for i, rev in enumerate(is_revolute):
        R, p = frames[i]
        # Origin acceleration of body i in body i-1, rotated into body i (Craig 6.47).
        u = a if w is None else add(a, cross(wd, p), cross(w, cross(w, p)))
        a = mtv(R, u)
        w_rot = None if w is None else mtv(R, w)
        wd_rot = None if wd is None else mtv(R, wd)
        zero = ZERO
        if rev:
            # Craig 6.45: w = R^T w + qd z;  6.46: wd = R^T wd + (R^T w) x qd z + qdd z
            w = (zero, zero, qd[i]) if w_rot is None else (w_rot[0], w_rot[1], w_rot[2] + qd[i])
            wdz = ZERO if qdd is None else qdd[i]
            if wd_rot is None:
                wd = (zero, zero, wdz)
            else:
                wd = (wd_rot[0] + w_rot[1] * qd[i], wd_rot[1] - w_rot[0] * qd[i], wd_rot[2] + wdz)
        else:
            w, wd = w_rot, wd_rot  # Craig 6.33-6.34
            # Craig 6.35: a += 2 w x (qd z) + qdd z
            if w is not None:
                a = (a[0] + 2.0 * w[1] * qd[i], a[1] - 2.0 * w[0] * qd[i], a[2])
            if qdd is not None:
                a = (a[0], a[1], a[2] + qdd[i])
        yield w, wd, a


def rnea(bodies, is_revolute, frames, qd, qdd, a0, f_tip=None):
    """Recursive Newton-Euler in components (Craig 6.45-6.53, Swartz eqs 1-10).

    qdd may be None (acceleration zero: the bias forces). a0: base acceleration (3-tuple).
    f_tip: (F, N), the wrench the tool applies to the environment on the last body, about its
    origin, or None. Returns (taus, forces, moments): lists of n scalars / 3-tuples.
    """
    n = len(is_revolute)
    body_f, body_n = [], []
    for i, (w, wd, a) in enumerate(outward_sweep(is_revolute, frames, qd, qdd, a0)):
        m, h, I = scalar(bodies.mass[i]), _vec(bodies.first_moment[i]), _sym(bodies.inertia_origin[i])
        if w is None:  # a prismatic first joint: the body translates only
            f = scale(m, a)
            nm = cross(h, a)
        else:
            # Newton: m a + wd x h + w x (w x h); Euler about the origin: I wd + w x I w + h x a
            f = add(scale(m, a), cross(wd, h), cross(w, cross(w, h)))
            nm = add(sym_mv(I, wd), cross(w, sym_mv(I, w)), cross(h, a))
        body_f.append(f)
        body_n.append(nm)

    taus, forces, moments = [None] * n, [None] * n, [None] * n
    f_child = n_child = None
    if f_tip is not None:
        f_child, n_child = f_tip
    for i in reversed(range(n)):
        if f_child is None:
            f_tot, n_tot = body_f[i], body_n[i]
        elif i == n - 1:  # the tip wrench is already in the last body's frame
            f_tot = add(body_f[i], f_child)
            n_tot = add(body_n[i], n_child)
        else:
            R, p = frames[i + 1]
            f_in = mv(R, f_child)
            f_tot = add(body_f[i], f_in)  # Craig 6.51
            n_tot = add(body_n[i], mv(R, n_child), cross(p, f_in))  # Craig 6.52
        taus[i] = n_tot[2] if is_revolute[i] else f_tot[2]  # Craig 6.53
        forces[i], moments[i] = f_tot, n_tot
        f_child, n_child = f_tot, n_tot
    return taus, forces, moments


def _dtype_of(x):
    """x itself for jnp.result_type (an array keeps its weak type), or the dtype of entries
    already read from it (:class:`jaxarm.dynamics.algebra.Entries`)."""
    return x.dtype if isinstance(x, algebra.Entries) else x


def _rnea(arm: Arm, bodies: Bodies, q, qd, qdd, a0, f_ext=None, per_state=None):
    """Recursive Newton-Euler on arrays: :func:`rnea` at joint values q; qdd None means zero
    acceleration. Returns (tau (n,), wrenches (n, 6)). ``per_state``: read the arm's traced
    parameters in groups (:func:`_read_per_state`; :data:`STAGED`: their witness staged on the
    arm); None: where and as :func:`_reads_grouped` says."""
    if per_state is None:
        per_state = _reads_grouped(arm, (q, qd, qdd, f_ext))
    if per_state and _PER_STATE:
        bodies, a0 = _read_per_state(bodies, a0, q, staged=per_state == STAGED)
    frames = joint_frames(bodies, arm.is_revolute, q)
    dtype = jnp.result_type(_dtype_of(bodies.mass), q, qd, _dtype_of(a0))
    taus, forces, moments = rnea(bodies, arm.is_revolute, frames, qd, qdd, _vec(a0), _kernel_tip(bodies, f_ext))
    wrenches = matrix([tuple(f) + tuple(m) for f, m in zip(forces, moments)], dtype)
    # a known arm's torques are read back by one split in reverse mode (their cotangent, from
    # forward dynamics' derivative rule, is an array of selects); a traced arm's by the select
    # chain's own transpose (algebra.vector, cotangent_by_split)
    return vector(taus, dtype, cotangent_by_split=checks.concrete(arm)), wrenches


# False: an arm shared by a batch is read as unbatched scalars in reverse mode too (for
# before/after measurements: experiments/arm_gradient_batches.py)
_PER_STATE = True


def _summed_over_states(arm, states) -> bool:
    """Whether reverse mode differentiates ``arm`` across a batch of the ``states`` that leaves it
    out (:func:`jaxarm.core.tracers.shared_reversed`): ``jax.grad`` of a loss over many samples
    or experiments with respect to one arm, identification's gradient. Its cotangent is then a
    sum over the batch."""
    return _PER_STATE and tracers.shared_reversed(arm, states)


def _reads_grouped(arm, states):
    """Whether Newton-Euler and the composite-body algorithm read the arm's traced parameters in
    groups (:func:`_read_per_state`): where reverse mode sums the gradient of an arm shared by a
    batch (:func:`_summed_over_states`), and where it differentiates an arm whose kinematics are
    traced (:data:`_GROUPED_KINEMATICS`), for one state or for each state of a batch.

    With traced kinematics every body's rotation and translation entries feed the whole reverse
    sweep; read as scalars, XLA:CPU fused that sweep into the cotangent of each entry and computed
    it again for every one. Under a plain ``jax.jit``, the gradient of a Panda's squared torque
    error at one state with respect to the whole arm compiled to 41k lines of optimized HLO in
    12 s and ran in 4.5 ms; read in groups, 27k lines, 6.8 s and 0.40 ms; the same gradient for
    each of 16 states (``jax.vmap`` of ``jax.grad``) took 1.01 s a call, now 1.19 ms
    (``python experiments/arm_gradient_batches.py --single --wrt arm --plain-jit``; with the
    states closed over, constants of the program, ``--closed-over``: one state 12.7 s and 3.8 ms
    -> 6.1 s and 0.48 ms; each of 16 states 15.5 s and 1.11 s a call -> 9.1 s and 1.2 ms, with
    the witness staged, below). With the kinematics known
    (the standard parameters) the inertial scalars alone are cheaper read as they are (one state
    0.055 ms against 0.080 ms with the groups forced, a plain ``jax.jit``). Rollouts keep their own rule
    (:func:`_summed_over_states`, asked by :mod:`jaxarm.simulate.rollouts`): a single 200-step
    Panda rollout's whole-arm gradient read in groups compiled sooner but ran 24 % slower under
    a plain ``jax.jit`` (444 against 359 ms; 12 against 21 ms under ``jaxarm.jit``), and its
    standard-parameter gradient 60 % slower.

    :data:`STAGED` (true) where nothing is summed and the states are known while the function is
    traced (``jax.vmap`` over states the loss closes over, constants of the program:
    :func:`jaxarm.core.tracers.known_underneath`): the groups' witness is then staged on the arm
    (:func:`_staged_on`; forward dynamics stages its stored cotangents' wherever the states are
    known, and the groups' for a summed gradient too). With the state itself,
    a constant there, the Panda's gradients for each of 16 closed-over states compiled under a
    plain ``jax.jit`` in 30.5 s to 156k lines and ran in 1.55 ms (inverse dynamics), 127 s, 425k
    lines and 3.5 ms (forward dynamics), 28 s, 170k lines and 1.32 ms (the mass matrix); staged,
    9.1 s, 35k lines and 1.20 ms, 34.7 s, 84k lines and 1.13 ms, 9.7 s, 35k lines and 1.09 ms,
    as with the states passed as arguments (``--single --closed-over --unstaged``). Not where the
    gradient is summed over closed-over states: there XLA's folding cost nothing, and staging
    made the Panda's torque loss over 1000 samples 16 % slower (2.68 against 2.31 ms); forward
    dynamics, which gained there, asks for it itself (:func:`jaxarm.dynamics.forward.forward_dynamics`)."""
    if _summed_over_states(arm, states):
        return True
    if (_GROUPED_KINEMATICS and _PER_STATE and not checks.concrete((arm.kinematics, arm.tool))
            and tracers.reverse_differentiated(arm)):
        return STAGED if _STAGED_WITNESS and tracers.known_underneath(states[0]) else True
    return False


# _reads_grouped's answer where the groups' witness is to be staged on the arm
STAGED = "staged"


# False: an arm with traced kinematics is read in groups only where its gradient is summed over a
# batch, as before (for before/after measurements: experiments/arm_gradient_batches.py --single)
_GROUPED_KINEMATICS = True


def _read_per_state(bodies: Bodies, a0, witness, staged=False):
    """The body model and the base acceleration (gravity) with their traced entries read per
    state of the batch ``witness`` belongs to (:func:`jaxarm.dynamics.algebra.per_state_entries`):
    per body, one vector of its inertial parameters (mass, first moment, the upper triangle of the
    inertia about the origin; the lower triangle read as the upper) and one of its placement
    (rotation and translation in the parent body), and one vector for the base acceleration.

    For a gradient summed over a batch, and for one with respect to traced kinematics
    (:func:`_reads_grouped`); a single state is read as a batch of one. Read as unbatched scalars, each parameter's cotangent is
    summed over the batch by a reduction of its own, and XLA:CPU fuses into each reduction the
    deep expression it sums (Newton-Euler's reverse sweep), evaluated again for every parameter:
    a Panda's torque loss over 1000 samples, differentiated with respect to the whole arm (its
    kinematics too), compiled to 225k lines of optimized HLO in 25 s and ran in 4.4 ms; read per
    state, 26k lines, 4.2 s and 1.4 ms (``python experiments/arm_gradient_batches.py --loss
    torque --wrt arm``). Per body and per kind rather than one vector for all: a split's cotangent
    costs k^2 selects for k entries (a Puma 560's rollout gradient at batch 256 took 0.50 s with ten
    entries per body, 0.93 s with all 78 inertial entries in one vector, 0.87 s read
    unbatched). ``staged``: the groups' witness staged on the arm (:func:`_staged_on`)."""
    kinds = (("mass", "first_moment", "inertia_origin"), ("rotation", "translation"))
    fields = [f for kind in kinds for f in kind if isinstance(getattr(bodies, f), jax.core.Tracer)]
    traced_a0 = isinstance(a0, jax.core.Tracer)  # (None: no base acceleration to read)
    if not fields and not traced_a0:
        return bodies, a0
    # the inertia's symmetric part (the recursions read it): its gradient stays symmetric
    arrays = [getattr(bodies, f) for f in fields]
    arrays = [0.5 * (x + jnp.swapaxes(x, -1, -2)) if f == "inertia_origin" else x for f, x in zip(fields, arrays)]
    groups = []
    for i in range(len(bodies.mass)):
        for kind in kinds:
            group = [(a, (i,) + index) for a, (f, x) in enumerate(zip(fields, arrays)) if f in kind
                     for index in np.ndindex(*x.shape[1:]) if f != "inertia_origin" or index[0] <= index[1]]
            if group:
                groups.append(group)
    if traced_a0:
        arrays.append(a0)
        groups.append([(len(fields), (k,)) for k in range(3)])
    if staged:
        witness = _staged_on(witness, arrays)
    read = per_state_entries(arrays, witness, groups)
    for f, x in zip(fields, read):
        if f == "inertia_origin":  # the lower triangle is the upper's
            for i, r, c in np.ndindex(*x.cells.shape):
                if r > c:
                    x.cells[i, r, c] = x.cells[i, c, r]
    return bodies._replace(**dict(zip(fields, read))), (read[-1] if traced_a0 else a0)


# False: the groups' witness, and forward dynamics' stored cotangents', is the state itself where
# the states are closed over (for before/after measurements: experiments/arm_gradient_batches.py
# --single --closed-over --unstaged, and --summed-closed-over)
_STAGED_WITNESS = True


def _staged_on(witness, traced):
    """``witness`` (a state), made a value XLA cannot know before the program runs by adding zero
    times an entry of a traced array of the arm (the first non-empty floating-point one of the
    sequence ``traced``; ``0 * x`` is not simplified for floating point: x may be NaN or
    infinite). A loss may close over its states, which then are constants of the program, and
    XLA folds away the select that makes the groups per state and the stored cotangents keyed on
    the witness, and fuses the reverse sweep into every entry's cotangent again: the Panda's
    inverse dynamics, its gradient with respect to the whole arm for each of 16 closed-over
    states, compiled for 30 s to 156k lines of optimized HLO under a plain ``jax.jit``. The
    witness itself if no such array is traced."""
    for x in traced:
        if jnp.size(x) and jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            entry = lax.stop_gradient(jnp.ravel(x)[0]).astype(jnp.result_type(witness))
            return witness + jnp.zeros((), entry.dtype) * entry
    return witness


def _kernel_tip(bodies, f_ext):
    """The tool wrench as the kernels take it: the environment's wrench on the tool, negated
    (what the last body must supply), in the last body's frame, about its origin."""
    if f_ext is None:
        return None
    F, N = _tip_wrench(bodies, f_ext)
    return tuple(-F[k] for k in range(3)), tuple(-N[k] for k in range(3))


@compiled_when_eager
def inverse_dynamics(arm: Arm, q, qd, qdd, f_ext=None):
    """Joint torques/forces (n,) that produce acceleration qdd at state (q, qd).

    Recursive Newton-Euler (Swartz eqs 1-10; prismatic terms Craig 6.33-6.35) with gravity as
    base acceleration, plus drive terms: reflected rotor inertia G^2 Jm qdd, viscous B G^2 qd and
    Coulomb |G| Tc(+/-) by the sign of qd. ``f_ext`` (6,) = (force, moment) that the environment
    applies to the tool, expressed in the tool frame, moment about the tool origin.
    """
    q, qd, qdd = checks.joint_state(arm, "inverse_dynamics", q=q, qd=qd, qdd=qdd)
    f_ext = checks.wrench(f_ext, "f_ext", "inverse_dynamics")
    return _inverse_dynamics(arm, q, qd, qdd, f_ext)


def _inverse_dynamics(arm, q, qd, qdd, f_ext=None, per_state=None):
    """Inverse dynamics in components; ``per_state``: as :func:`_rnea` takes it."""
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, qdd)
    tau, _ = _rnea(arm, bodies, q, qd, qdd, _base_acceleration(arm, dtype), f_ext, per_state)
    if _FRICTION_COTANGENT_APART and not checks.concrete(arm.drives):
        # a traced drive model's friction reads qd through cotangent_once: in reverse mode its
        # share of qd's cotangent is computed into an array of its own. Otherwise XLA:CPU fused it
        # (per joint: each joint's friction parameters) with Newton-Euler's share (the same for
        # every joint: a select of the joints' deep expressions), and LLVM could no longer hoist
        # the deep part out of the loop over the joints: 1,041 operations per joint and state
        # (a Puma 560's arm gradient, 1000 RK3 steps at batch 256: 704 -> 559 ms)
        qd_friction = algebra.cotangent_once(qd, q)
    else:
        qd_friction = qd
    return tau + drives._reflected_inertia(arm) * qdd + drives._friction_torques(arm, qd_friction)


# False: friction reads qd directly (for before/after measurements: experiments/arm_gradient_batches.py)
_FRICTION_COTANGENT_APART = True


@compiled_when_eager
def rigid_body_torques(arm: Arm, q, qd, qdd, f_ext=None):
    """Inverse dynamics of the links alone: no rotor inertia, no friction (n,)."""
    q, qd, qdd = checks.joint_state(arm, "rigid_body_torques", q=q, qd=qd, qdd=qdd)
    f_ext = checks.wrench(f_ext, "f_ext", "rigid_body_torques")
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, qdd)
    return _rnea(arm, bodies, q, qd, qdd, _base_acceleration(arm, dtype), f_ext)[0]


@compiled_when_eager
def joint_wrenches(arm: Arm, q, qd, qdd, f_ext=None):
    """The wrench (n, 6) = (force, moment about the joint origin) that each joint transmits from
    body i-1 to body i, in body i's frame (z along joint i's axis): the structural loads of the NASA
    report's appendix B. Rigid links only; the joint torque is component 5 (revolute) or 2 (prismatic).
    """
    q, qd, qdd = checks.joint_state(arm, "joint_wrenches", q=q, qd=qd, qdd=qdd)
    f_ext = checks.wrench(f_ext, "f_ext", "joint_wrenches")
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, qdd)
    return _rnea(arm, bodies, q, qd, qdd, _base_acceleration(arm, dtype), f_ext)[1]


@compiled_when_eager
def bias_forces(arm: Arm, q, qd, f_ext=None):
    """Coriolis, centrifugal and gravity torques C(q, qd) qd + g(q) (n,): Newton-Euler with
    qdd = 0 (Swartz's bias vector, eq. 15 with theta-double-dot = 0). No friction."""
    q, qd = checks.joint_state(arm, "bias_forces", q=q, qd=qd)
    f_ext = checks.wrench(f_ext, "f_ext", "bias_forces")
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd)
    return _rnea(arm, bodies, q, qd, None, _base_acceleration(arm, dtype), f_ext)[0]


def _bias(arm, bodies, q, qd, f_ext=None):
    """Bias torques C(q, qd) qd + g(q) (n,) by the Newton-Euler kernel, no argument checks."""
    dtype = jnp.result_type(bodies.mass, q, qd)
    return _rnea(arm, bodies, q, qd, None, _base_acceleration(arm, dtype), f_ext)[0]


@compiled_when_eager
def gravity_torques(arm: Arm, q):
    """Torques (n,) that hold the arm still against gravity, g(q)."""
    (q,) = checks.joint_state(arm, "gravity_torques", q=q)
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q)
    return _rnea(arm, bodies, q, jnp.zeros_like(q), None, _base_acceleration(arm, dtype))[0]
