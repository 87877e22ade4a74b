"""Forward dynamics (Swartz's Forward Arm): joint accelerations from joint torques."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax.ad_checkpoint import checkpoint_name
from jax.custom_derivatives import SymbolicZero

from ..core import tracers
from ..model import checks
from ..model.arm import Arm
from . import drives, linalg, newton_euler
from .algebra import _dot_identity, _vec, cotangent_once, entries, vector
from .composite_body import composite_mass_matrix
from .eager import compiled_when_eager
from .kinematics import _bodies, joint_frames
from .newton_euler import _base_acceleration, _inverse_dynamics, _kernel_tip, _reads_grouped, _staged_on, rnea


# the name of forward dynamics' accelerations in a program being differentiated (jax.ad_checkpoint)
ACCELERATION = "jaxarm_forward_dynamics_qdd"

@compiled_when_eager
def forward_dynamics(arm: Arm, q, qd, tau, f_ext=None):
    """Joint accelerations (n,) from applied joint torques tau (Swartz's Forward Arm).

    Solves M(q) qdd = tau - bias(q, qd) - friction(qd) with a Cholesky factorization of M
    (symmetric positive definite for a physically meaningful arm), unrolled over the joints.
    """
    q, qd, tau = checks.joint_state(arm, "forward_dynamics", q=q, qd=qd, tau=tau)
    f_ext = checks.wrench(f_ext, "f_ext", "forward_dynamics")
    per_state = _reads_grouped(arm, (q, qd, tau, f_ext))
    if per_state and _STAGED_GROUPS_SUMMED and newton_euler._STAGED_WITNESS and tracers.known_underneath(q):
        # states closed over: the groups' witness staged on the arm for a gradient summed over
        # them too (unlike inverse dynamics'). The Panda's squared-acceleration error over 1000
        # closed-over states, its gradient with respect to the whole arm under a plain jax.jit:
        # 9.1 ms with the bare state, 8.5 ms with only the stored cotangents staged, 4.5 ms with
        # the groups' too; 16 states 12.0, 2.5 and 1.2 ms (experiments/arm_gradient_batches.py
        # --summed-closed-over)
        per_state = newton_euler.STAGED
    return _forward_dynamics(arm, q, qd, tau, f_ext, per_state=per_state)


# False: a gradient summed over closed-over states stages only forward dynamics' own stored
# cotangents, not the groups' witness (for before/after measurements:
# experiments/arm_gradient_batches.py --summed-closed-over)
_STAGED_GROUPS_SUMMED = True


def _forward_dynamics(arm, q, qd, tau, f_ext=None, *, per_state=False):
    """Forward dynamics in components: the joint frames once, bias torques by the Newton-Euler
    kernel (qdd = 0), M by the composite-body kernel, and the unrolled Cholesky solve on scalars,
    so the whole of it is scalar arithmetic (one fused loop per state batch on XLA:CPU).

    Its derivatives (forward and reverse mode, any order) are those of inverse dynamics: from
    ID(arm, q, qd, FD(arm, q, qd, tau, f)) = tau (Carpentier & Mansard 2018, Sec. III-B),

        d qdd = M(q)^-1 (d tau - dID(arm, q, qd, qdd, f)[d arm, d q, d qd, d f]),

    the directional derivative of inverse dynamics taken at fixed qdd (one tangent pass through
    Newton-Euler, no mass matrix or Cholesky factorization differentiated), and M^-1 applied with
    the Cholesky factor the forward pass computed. Reverse mode transposes that: one reverse pass
    through Newton-Euler instead of through the composite-body algorithm and the factorization.
    The arm's leaves that are not traced (a constant arm) stay constants of the program, so XLA
    folds them as before."""
    split = checks.TracedLeaves(arm)
    rebuild = split.join
    has_ext = f_ext is not None
    # states known while tracing (a vmap over states the loss closes over: constants of the
    # program), on which XLA would fold the stored cotangents' conditionals away
    known = newton_euler._STAGED_WITNESS and tracers.known_underneath(q)

    @jax.custom_jvp
    def fd(values, q, qd, tau, f_ext):
        return _forward_dynamics_factored(rebuild(values), q, qd, tau, f_ext if has_ext else None)[0]

    def fd_jvp(primals, tangents):
        values, q, qd, tau, f_ext = primals
        qdd, L, inv_diag = _forward_dynamics_scalars(rebuild(values), q, qd, tau, f_ext if has_ext else None)
        # named, so that a rollout's reverse pass can keep it (integrators._recomputed) instead of
        # evaluating the forward dynamics again at every stage; the identity elsewhere
        qdd = checkpoint_name(qdd, ACCELERATION)
        # differentiate inverse dynamics along the inputs that have a tangent only (a zero tangent,
        # e.g. of a traced arm that is not differentiated, would otherwise be carried as numbers)
        d_values, dq, dqd, dtau, df_ext = tangents
        # the stored cotangents' witness: the state, staged on the arm (or the torques) where the
        # state is a constant of the program (newton_euler._staged_on)
        witness = _staged_on(q, [*values, tau, qd]) if known else q
        dq, dqd, dtau = (t if isinstance(t, SymbolicZero) else cotangent_once(t, witness) for t in (dq, dqd, dtau))
        inputs, d_all = [*values, q, qd, f_ext], [*d_values, dq, dqd, df_ext]
        moving = [i for i, t in enumerate(d_all) if not isinstance(t, SymbolicZero)]
        k = len(values)
        # jax.jacfwd with respect to the arm (its tangents a vmap over the parameters' basis): the
        # accelerations Newton-Euler's tangent is taken at, and that tangent, each computed once
        # into an array (eager._fenced). Without the first, XLA fused the whole forward dynamics
        # into every use of qdd by the tangents: the Puma 560's whole-arm Jacobian compiled in
        # 47-56 s to a 34-36 MB program and ran in 1.6 ms; with it 10.8-11.2 s, 9.5 MB and
        # 0.83-0.96 ms (experiments/arm_jacobian_compile.py)
        by_basis = any(i < k and isinstance(d_all[i], tracers.BatchTracer) for i in moving)
        qdd_at = _dot_identity(qdd) if by_basis else qdd

        def inverse(*chosen):
            args = list(inputs)
            for i, x in zip(moving, chosen):
                args[i] = x
            arm_ = rebuild(args[:k])
            return _inverse_dynamics(arm_, args[k], args[k + 1], qdd_at, args[k + 2] if has_ext else None,
                                     per_state=per_state if any(i < k for i in moving) else False)

        rhs = jnp.zeros_like(qdd) if isinstance(dtau, SymbolicZero) else dtau.astype(qdd.dtype)
        if moving:
            _, did = jax.jvp(inverse, tuple(inputs[i] for i in moving), tuple(d_all[i] for i in moving))
            if by_basis:  # (without it XLA fused the tangent into each of the solve's rows)
                did = _dot_identity(did)
            rhs = rhs - did.astype(qdd.dtype)
        # in reverse mode, lambda = M^-T qdd-bar (qdd-bar: the cotangent of qdd) computed once into an
        # array (the cotangent of rhs), which the torques' cotangent and Newton-Euler's reverse pass read;
        # without it XLA:CPU fused the mass matrix, its factorization and the solve into each of
        # them (plain reverse mode through 1000 RK3 steps at batch 16: Panda 43.2 -> 35.8 ms, Puma
        # 30.1 -> 28.3 ms; batch 256: 226 -> 213 and 175 -> 162 ms; batch 1 within 2 %)
        rhs = cotangent_once(rhs, witness)
        return qdd, vector(linalg.cholesky_solve_factored_scalars(L, inv_diag, entries(rhs)), qdd.dtype, cotangent_by_split=True)

    fd.defjvp(fd_jvp, symbolic_zeros=True)

    dummy = jnp.zeros((), jnp.result_type(q)) if not has_ext else f_ext
    return fd(split.traced, q, qd, tau, dummy)


def _forward_dynamics_factored(arm, q, qd, tau, f_ext=None):
    """:func:`_forward_dynamics` and the lower Cholesky factor L (n, n) of M(q) (rotor inertia
    included) it solved with, for products with M^-1 (the derivatives of forward dynamics,
    Carpentier & Mansard 2018). Where L is not used it costs nothing (dead code)."""
    qdd, L, _ = _forward_dynamics_scalars(arm, q, qd, tau, f_ext)
    n = arm.n
    factor = jnp.stack([vector([L[i][j] if j <= i else 0.0 for j in range(n)], qdd.dtype) for i in range(n)])
    return qdd, factor


def _forward_dynamics_scalars(arm, q, qd, tau, f_ext=None):
    """qdd (n,), and the Cholesky factor of M(q) (rotor inertia included) as scalars: its rows
    (None above the diagonal) and the reciprocals of its diagonal
    (:func:`jaxarm.dynamics.linalg.cholesky_factor_scalars`)."""
    bodies = _bodies(arm)
    dtype = jnp.result_type(bodies.mass, q, qd, tau)
    frames = joint_frames(bodies, arm.is_revolute, q)
    a0 = _vec(_base_acceleration(arm, dtype))
    bias, _, _ = rnea(bodies, arm.is_revolute, frames, qd, None, a0, _kernel_tip(bodies, f_ext))
    M = composite_mass_matrix(bodies, arm.is_revolute, frames)
    rotor = drives._reflected_inertia(arm).astype(dtype)
    friction = drives._friction_torques(arm, qd)
    n = arm.n
    M = [[M[i][j] + rotor[i] if i == j else M[i][j] for j in range(n)] for i in range(n)]
    tau_i, friction_i = entries(tau), entries(friction)
    rhs = [tau_i[i] - bias[i] - friction_i[i] for i in range(n)]
    L, inv_diag = linalg.cholesky_factor_scalars(M)
    qdd = vector(linalg.cholesky_solve_factored_scalars(L, inv_diag, rhs), dtype)
    return qdd, L, inv_diag
