"""Analytical derivatives of inverse dynamics by their own recursion, measured against forward mode.

    python experiments/rnea_derivatives_analytic.py [--arms puma560,panda] [--batch 150]

Checks, then times, d tau/dq and d tau/dqd of ``jaxarm.inverse_dynamics`` computed two ways: the
analytical recursion below (Carpentier & Mansard 2018) and ``jax.jacfwd`` through the Newton-Euler
recursion (2n tangents), both batched over ``--batch`` states (the 150 Runge-Kutta stage points of a
50-knot trajectory-optimization problem), under ``jaxarm.jit`` and a plain ``jax.jit``. One JSON
line per arm, method and jit: milliseconds per batch and the first call (trace + compile).

Measured on the 2-core CPU (float64, batch 150): the recursion agrees with forward mode to 3e-15
relative on every bundled arm (revolute and prismatic joints, friction, a tool wrench), but written
in jaxarm's component algebra (scalars, unrolled) it is no faster (Puma 0.67 ms against 0.47 ms,
Panda 0.81 against 0.88 ms) and compiles 6-8x longer (9-20 s against 1.5-2.4 s): its n^2 derivative
entries and 6x6 composite matrices become thousands of scalar operations, which XLA:CPU compiles
slowly, while forward mode is one recursion with a vector of 2n tangents per scalar. The solvers
keep forward mode (``jaxarm.trajopt``'s step Jacobians); this script keeps the measurement.

The recursion, in the base frame (Featherstone 2008, ch. 2: motion vectors (w, v), force vectors
(n, f), both about the base origin):
:mod:`jaxarm.dynamics.algebra`. With spatial vectors in the base frame (Featherstone 2008,
ch. 2: motion vectors (w, v), force vectors (n, f), both about the base origin), joint j's motion
subspace S_j, velocities v_k = sum_{l<=k} S_l qd_l, accelerations a_k = a_0 + sum_{l<=k}
(S_l qdd_l + (v_l x S_l) qd_l) (a_0: gravity as an upward base acceleration), body forces
f_k = I_k a_k + v_k x* I_k v_k and the transmitted forces F_i = sum_{k>=i} f_k, tau_i = S_i . F_i.

Moving joint j turns everything beyond it rigidly about S_j, except what joint j's own motion
carries: with w_j = S_j x v_j, alpha_j = S_j x a_j and c_j = w_j x v_j - alpha_j,

    d f_k / d q_j  = S_j x* f_k + I_k c_j - L_k w_j                   (k >= j)
    d f_k / d qd_j = L_k S_j - 2 I_k w_j                                (k >= j)

where L_k w = I_k (w x v_k) + w x* (I_k v_k) + v_k x* (I_k w). Summed over the bodies beyond a
joint (composite inertia Ic_i = sum_{k>=i} I_k, Bc_i = sum_{k>=i} L_k) and projected on S_i
(S_i . (S_j x* F) = -(S_j x S_i) . F cancels the derivative of S_i itself):

    d tau_i / d q_j  = S_i . (Ic_i c_j - Bc_i w_j)                      (j <= i)
                     = S_i . (S_j x* F_j + Ic_j c_j - Bc_j w_j)         (j > i)
    d tau_i / d qd_j = S_i . (Bc_i S_j - 2 Ic_i w_j)                    (j <= i)
                     = S_i . (Bc_j S_j - 2 Ic_j w_j)                    (j > i)

plus the drives' friction, which depends on each joint's own velocity only (a diagonal). The
reflected rotor inertia G^2 Jm qdd does not depend on q or qd. In flops it is a fraction of forward
mode's, which pushes 2n tangents through the whole recursion; in compiled time, see above.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.dynamics import drives  # noqa: E402
from jaxarm.dynamics.algebra import ZERO, Known, _sym, _vec, add, cross, dot, matrix, scalar, scale, sym_mv
from jaxarm.dynamics.kinematics import _bodies, joint_frames  # noqa: E402
from jaxarm.dynamics.newton_euler import _base_acceleration, _inverse_dynamics, _kernel_tip  # noqa: E402
from jaxarm.model.arm import Arm  # noqa: E402

ONE, MINUS_ONE, TWO, MINUS_TWO = Known(1.0), Known(-1.0), Known(2.0), Known(-2.0)

# spatial vectors as pairs of 3-tuples: motion (w, v), force (n, f), about the base origin


def _mm(A, B):
    """A B for 3x3 matrices as tuples of rows."""
    return tuple(tuple(A[r][0] * B[0][c] + A[r][1] * B[1][c] + A[r][2] * B[2][c] for c in range(3)) for r in range(3))


def _crm(a, b):
    """a x b, motion on motion (Featherstone 2008, eq. 2.31)."""
    return cross(a[0], b[0]), add(cross(a[0], b[1]), cross(a[1], b[0]))


def _crf(a, f):
    """a x* f, motion on force (Featherstone 2008, eq. 2.32)."""
    return add(cross(a[0], f[0]), cross(a[1], f[1])), cross(a[0], f[1])


def _sadd(*xs):
    return add(*(x[0] for x in xs)), add(*(x[1] for x in xs))


def _sscale(s, x):
    return scale(s, x[0]), scale(s, x[1])


def _sdot(m, f):
    return dot(m[0], f[0]) + dot(m[1], f[1])


def _inertia_apply(I, v):
    """I v for a rigid-body inertia I = (m, h, Io) about the base origin (h the first moment,
    Io the rotational inertia about the origin, six entries): (Io w + h x v, m v - h x w)."""
    m, h, Io = I
    return add(sym_mv(Io, v[0]), cross(h, v[1])), add(scale(m, v[1]), cross(v[0], h))


def _body_inertia(m, h_body, I_body, R, p):
    """A body's inertia (m, h, Io) about the base origin from its mass, first moment and inertia
    about its own origin in its own frame, and its pose (R, p) in the base frame (parallel axes:
    Io = R I R^T + m (|p|^2 1 - p p^T) + 2 (p . R h) 1 - p (R h)^T - (R h) p^T)."""
    hp = tuple(R[r][0] * h_body[0] + R[r][1] * h_body[1] + R[r][2] * h_body[2] for r in range(3))
    xx, xy, xz, yy, yz, zz = I_body
    Ib = ((xx, xy, xz), (xy, yy, yz), (xz, yz, zz))
    RI = _mm(R, Ib)
    RIRt = [[RI[r][0] * R[c][0] + RI[r][1] * R[c][1] + RI[r][2] * R[c][2] for c in range(3)] for r in range(3)]
    pp, ph = dot(p, p), dot(p, hp)
    diag = m * pp + TWO * ph

    def entry(r, c):
        e = RIRt[r][c] - m * p[r] * p[c] - p[r] * hp[c] - hp[r] * p[c]
        return e + diag if r == c else e

    Io = (entry(0, 0), entry(0, 1), entry(0, 2), entry(1, 1), entry(1, 2), entry(2, 2))
    return m, add(scale(m, p), hp), Io


def _inertia_sum(a, b):
    return a[0] + b[0], add(a[1], b[1]), tuple(x + y for x, y in zip(a[2], b[2]))


_UNIT = [((ONE if k == 0 else ZERO, ONE if k == 1 else ZERO, ONE if k == 2 else ZERO), (ZERO, ZERO, ZERO)) for k in range(3)] + \
        [((ZERO, ZERO, ZERO), (ONE if k == 0 else ZERO, ONE if k == 1 else ZERO, ONE if k == 2 else ZERO)) for k in range(3)]


def _flat(x):
    return x[0] + x[1]


def _pair(x):
    return tuple(x[:3]), tuple(x[3:])


def _rnea_derivatives(arm: Arm, q, qd, qdd, f_ext=None):
    """(tau, d tau/dq, d tau/dqd) as lists: n scalars and n rows of n scalars (links only)."""
    bodies = _bodies(arm)
    n = arm.n
    dtype = jnp.result_type(bodies.mass, q, qd, qdd)
    frames = joint_frames(bodies, arm.is_revolute, q)
    a0 = _vec(_base_acceleration(arm, dtype))
    zero3 = (ZERO, ZERO, ZERO)
    v_prev, a_prev = (zero3, zero3), (zero3, a0)
    R0 = p0 = None
    S, v, a, f, I, L = [], [], [], [], [], []
    for k, rev in enumerate(arm.is_revolute):
        R, p = frames[k]
        if R0 is None:
            R0, p0 = R, p
        else:
            p0 = add(p0, tuple(R0[r][0] * p[0] + R0[r][1] * p[1] + R0[r][2] * p[2] for r in range(3)))
            R0 = _mm(R0, R)
        z = (R0[0][2], R0[1][2], R0[2][2])
        Sk = (z, cross(p0, z)) if rev else (zero3, z)
        vk = _sadd(v_prev, _sscale(qd[k], Sk))
        ak = _sadd(a_prev, _sscale(qdd[k], Sk), _sscale(qd[k], _crm(vk, Sk)))
        Ik = _body_inertia(scalar(bodies.mass[k]), _vec(bodies.first_moment[k]), _sym(bodies.inertia_origin[k]), R0, p0)
        hk = _inertia_apply(Ik, vk)
        fk = _sadd(_inertia_apply(Ik, ak), _crf(vk, hk))
        # L_k as six columns L_k e_c: I_k (e_c x v_k) + e_c x* h_k + v_k x* (I_k e_c)
        Lk = [_flat(_sadd(_inertia_apply(Ik, _crm(e, vk)), _crf(e, hk), _crf(vk, _inertia_apply(Ik, e)))) for e in _UNIT]
        S.append(Sk), v.append(vk), a.append(ak), f.append(fk), I.append(Ik), L.append(Lk)
        v_prev, a_prev = vk, ak
    tip = _kernel_tip(bodies, f_ext)
    if tip is not None:  # the tool's wrench on the last body, in the base frame about its origin
        F = tuple(R0[r][0] * tip[0][0] + R0[r][1] * tip[0][1] + R0[r][2] * tip[0][2] for r in range(3))
        N = tuple(R0[r][0] * tip[1][0] + R0[r][1] * tip[1][1] + R0[r][2] * tip[1][2] for r in range(3))
        f[-1] = _sadd(f[-1], (add(N, cross(p0, F)), F))
    # composites from the tip inwards
    Fc, Ic, Bc = [None] * n, [None] * n, [None] * n
    for k in reversed(range(n)):
        if k == n - 1:
            Fc[k], Ic[k], Bc[k] = f[k], I[k], L[k]
        else:
            Fc[k] = _sadd(f[k], Fc[k + 1])
            Ic[k] = _inertia_sum(I[k], Ic[k + 1])
            Bc[k] = [tuple(x + y for x, y in zip(c1, c2)) for c1, c2 in zip(L[k], Bc[k + 1])]
    tau = [_sdot(S[k], Fc[k]) for k in range(n)]

    def bc_apply(k, x):  # Bc_k x, x a spatial motion vector
        flat = _flat(x)
        return (add(*(scale(flat[c], Bc[k][c][:3]) for c in range(6))), add(*(scale(flat[c], Bc[k][c][3:]) for c in range(6))))

    w = [_crm(S[j], v[j]) for j in range(n)]
    c = [_sadd(_crm(w[j], v[j]), _sscale(MINUS_ONE, _crm(S[j], a[j]))) for j in range(n)]
    # per row i: Ic_i S_i and Bc_i^T S_i (the rows S_i^T Ic_i and S_i^T Bc_i)
    r1 = [_inertia_apply(Ic[i], S[i]) for i in range(n)]  # force vector; S_i . Ic_i x = (Ic_i S_i) . x
    Sflat = [_flat(S[i]) for i in range(n)]
    r2 = [tuple(sum((Sflat[i][r] * Bc[i][col][r] for r in range(1, 6)), Sflat[i][0] * Bc[i][col][0]) for col in range(6)) for i in range(n)]
    # per column j > i: Phi_j, Theta_j
    phi = [_sadd(_crf(S[j], Fc[j]), _inertia_apply(Ic[j], c[j]), _sscale(MINUS_ONE, bc_apply(j, w[j]))) for j in range(n)]
    theta = [_sadd(bc_apply(j, S[j]), _sscale(MINUS_TWO, _inertia_apply(Ic[j], w[j]))) for j in range(n)]

    def row_dot(r, x):  # r (6 numbers, a row) . x (motion vector)
        xf = _flat(x)
        return sum((r[t] * xf[t] for t in range(1, 6)), r[0] * xf[0])

    dq = [[None] * n for _ in range(n)]
    dqd = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if j <= i:
                dq[i][j] = _sdot(c[j], r1[i]) - row_dot(r2[i], w[j])
                dqd[i][j] = row_dot(r2[i], S[j]) + MINUS_TWO * _sdot(w[j], r1[i])
            else:
                dq[i][j] = _sdot(S[i], phi[j])
                dqd[i][j] = _sdot(S[i], theta[j])
    return tau, dq, dqd, dtype


def _inverse_dynamics_derivatives(arm: Arm, q, qd, qdd, f_ext=None):
    """:func:`inverse_dynamics_derivatives` without argument checks."""
    _, dq, dqd, dtype = _rnea_derivatives(arm, q, qd, qdd, f_ext)
    n = arm.n
    friction = jax.jvp(lambda v: drives._friction_torques(arm, v), (qd,), (jnp.ones_like(qd),))[1]  # elementwise: the diagonal
    dqd = [[dqd[i][j] + friction[i] if i == j else dqd[i][j] for j in range(n)] for i in range(n)]
    return matrix(dq, dtype), matrix(dqd, dtype)


def _timed(f, *args, reps=50):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    first = time.perf_counter() - t
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return first, float(np.median(times))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="puma560,panda")
    ap.add_argument("--batch", type=int, default=150)
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    for name in args.arms.split(","):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arm = jaxarm.load_arm(name)
        n = arm.n
        q, qd, qdd = rng.normal(size=(3, n))
        f_ext = rng.normal(size=6)
        dq, dqd = _inverse_dynamics_derivatives(arm, q, qd, qdd, f_ext)
        Jq, Jqd = jax.jacfwd(lambda q, qd: _inverse_dynamics(arm, q, qd, qdd, f_ext), argnums=(0, 1))(q, qd)
        err = max(float(jnp.abs(dq - Jq).max() / jnp.abs(Jq).max()), float(jnp.abs(dqd - Jqd).max() / jnp.abs(Jqd).max()))
        print(json.dumps({"arm": name, "check": "analytic vs jax.jacfwd", "max_relative_difference": err}), flush=True)
        Q, QD, QDD = rng.normal(size=(3, args.batch, n))
        methods = {
            "jacfwd": lambda q, qd, qdd: jax.jacfwd(lambda q, qd: _inverse_dynamics(arm, q, qd, qdd), argnums=(0, 1))(q, qd),
            "analytic": lambda q, qd, qdd: _inverse_dynamics_derivatives(arm, q, qd, qdd),
        }
        for method, f in methods.items():
            for jit_name, jit in (("jaxarm.jit", jaxarm.jit), ("jax.jit", jax.jit)):
                first, warm = _timed(jit(jax.vmap(f)), Q, QD, QDD)
                print(json.dumps({"arm": name, "method": method, "jit": jit_name, "batch": args.batch,
                                  "ms": round(1e3 * warm, 4), "first_call_s": round(first, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
