"""Random, physically consistent arms and states for the test-suite (and two probes of traced
programs: :func:`count_primitive`, :func:`while_loop_batchings`).

``random_arm(seed, ...)`` draws a complete arm through :func:`jaxarm.make_arm`, so every test
exercises the same public construction path a user takes. Inertias are built from a positive
second moment Sigma (I = tr(Sigma) 1 - Sigma has principal moments s2+s3, s1+s3, s1+s2, which
obey the triangle inequalities), rotated by a random rotation: every link is a real body.
"""

from __future__ import annotations

import numpy as np

import jaxarm

CONVENTIONS = ("standard", "modified", "placement")


def random_rotation(rng) -> np.ndarray:
    """A uniformly random rotation matrix (QR of a Gaussian matrix, signs fixed, det +1)."""
    Q, R = np.linalg.qr(rng.normal(size=(3, 3)))
    Q = Q * np.sign(np.diag(R))
    if np.linalg.det(Q) < 0:
        Q[:, 0] = -Q[:, 0]
    return Q


def random_transform(rng, reach=0.5) -> np.ndarray:
    """A random rigid transform (4, 4) with translation in [-reach, reach]^3."""
    T = np.eye(4)
    T[:3, :3] = random_rotation(rng)
    T[:3, 3] = rng.uniform(-reach, reach, 3)
    return T


def random_inertia(rng, mass, size=0.3) -> np.ndarray:
    """A physically consistent inertia about the COM (3, 3): R diag(I1, I2, I3) R^T with
    I1 + I2 >= I3 etc., for a body of the given mass and rough size (m)."""
    sigma = mass * rng.uniform(0.02, 1.0, 3) * (size / 2.0) ** 2  # second moments, all > 0
    principal = sigma.sum() - sigma  # (s2+s3, s1+s3, s1+s2): the triangle inequalities hold
    R = random_rotation(rng)
    return R @ np.diag(principal) @ R.T


def _random_axis(rng) -> np.ndarray:
    """A unit joint axis; one time in three a signed coordinate axis (covers -z, which needs
    the special branch of the z-to-axis rotation)."""
    if rng.uniform() < 1.0 / 3.0:
        axis = np.zeros(3)
        axis[rng.integers(3)] = rng.choice([-1.0, 1.0])
        return axis
    v = rng.normal(size=3)
    return v / np.linalg.norm(v)


def random_arm(
    seed,
    joint_types="RRPRRR",
    convention="standard",
    *,
    drives=False,
    payload=False,
    base=False,
    tool=False,
    gravity=(0.0, 0.0, -9.81),
    name=None,
) -> jaxarm.Arm:
    """A random, physically consistent arm built with :func:`jaxarm.make_arm`.

    Kinematics: DH a, d in [-0.5, 0.5] m, alpha, theta in [-pi, pi] (standard / modified), or
    xyz in [-0.3, 0.3] m, rpy in [-pi, pi] and a unit axis (placement). Links: mass 0.5-5 kg,
    COM within 0.3 m of the link origin per coordinate, inertia about the COM consistent.
    ``drives``: gear ratios of either sign (|G| in 5..100), rotor inertia, motor-side viscous
    and asymmetric Coulomb friction [positive, negative], and a motor model (Kt, R, V limit).
    ``payload``: a 0.2-2 kg load with its own COM and inertia. ``base``/``tool``: random rigid
    transforms instead of the identity.
    """
    rng = np.random.default_rng(seed)
    n = len(joint_types)
    kw = {}
    if convention == "placement":
        kw["xyz"] = rng.uniform(-0.3, 0.3, (n, 3))
        kw["rpy"] = rng.uniform(-np.pi, np.pi, (n, 3))
        kw["axis"] = np.stack([_random_axis(rng) for _ in range(n)])
    elif convention in ("standard", "modified"):
        kw["a"] = rng.uniform(-0.5, 0.5, n)
        kw["alpha"] = rng.uniform(-np.pi, np.pi, n)
        kw["d"] = rng.uniform(-0.5, 0.5, n)
        kw["theta"] = rng.uniform(-np.pi, np.pi, n)
    else:
        raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
    mass = rng.uniform(0.5, 5.0, n)
    kw["mass"] = mass
    kw["com"] = rng.uniform(-0.3, 0.3, (n, 3))
    kw["inertia"] = np.stack([random_inertia(rng, m) for m in mass])
    if drives:
        kw["gear_ratio"] = rng.choice([-1.0, 1.0], n) * rng.uniform(5.0, 100.0, n)
        kw["rotor_inertia"] = rng.uniform(1e-5, 1e-4, n)
        kw["viscous_friction"] = rng.uniform(1e-4, 1e-3, n)
        kw["coulomb_friction"] = np.stack([rng.uniform(0.005, 0.05, n), -rng.uniform(0.005, 0.05, n)], axis=1)
        kw["torque_constant"] = rng.uniform(0.05, 0.3, n)
        kw["resistance"] = rng.uniform(0.5, 5.0, n)
        kw["voltage_limit"] = rng.uniform(24.0, 48.0, n)
    if base:
        kw["base"] = random_transform(rng)
    if tool:
        kw["tool"] = random_transform(rng, reach=0.2)
    arm = jaxarm.make_arm(
        joint_types,
        convention=convention,
        gravity=gravity,
        name=name or f"random-{convention}-{joint_types}-{seed}",
        **kw,
    )
    if payload:
        pm = rng.uniform(0.2, 2.0)
        arm = arm.with_payload(pm, rng.uniform(-0.1, 0.1, 3), random_inertia(rng, pm, size=0.1))
    return arm


def _rot(axis, angle):
    """Rodrigues: rotation by angle about a unit axis."""
    k = np.asarray(axis, dtype=float)
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K


def _hom(R=np.eye(3), p=(0.0, 0.0, 0.0)):
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = R, p
    return T


def reference_frames(arm, q):
    """Link frames (n + 1, 4, 4) and tool (4, 4) in the world, straight from the parameter table
    in NumPy (independent of jaxarm's canonical body model):
    standard  T_i = T_{i-1} Rz(theta_i [+ q_i]) Tz(d_i [+ q_i]) Tx(a_i) Rx(alpha_i)       (Ch.10)
    modified  T_i = T_{i-1} Rx(alpha_{i-1}) Tx(a_{i-1}) Rz(theta_i [+ q_i]) Tz(d_i [+ q_i]) (Craig 3.6)
    placement T_i = T_{i-1} [rpy_i, xyz_i] Rot(axis_i, q_i) or Trans(axis_i q_i)        (URDF)
    """
    x, z = np.array([1.0, 0, 0]), np.array([0, 0, 1.0])
    kin = arm.kinematics
    T = np.asarray(arm.base, dtype=float)
    frames = [T]
    for i, rev in enumerate(arm.is_revolute):
        qi = float(q[i])
        if arm.convention == "placement":
            r, p, y = np.asarray(kin.rpy[i], dtype=float)
            place = _hom(_rot(z, y) @ _rot([0, 1.0, 0], p) @ _rot(x, r), np.asarray(kin.xyz[i], dtype=float))
            axis = np.asarray(kin.axis[i], dtype=float)
            motion = _hom(_rot(axis, qi)) if rev else _hom(p=axis * qi)
            A = place @ motion
        else:
            th = float(kin.theta[i]) + (qi if rev else 0.0)
            d = float(kin.d[i]) + (0.0 if rev else qi)
            a, al = float(kin.a[i]), float(kin.alpha[i])
            if arm.convention == "standard":
                A = _hom(_rot(z, th)) @ _hom(p=(0, 0, d)) @ _hom(p=(a, 0, 0)) @ _hom(_rot(x, al))
            else:
                A = _hom(_rot(x, al)) @ _hom(p=(a, 0, 0)) @ _hom(_rot(z, th)) @ _hom(p=(0, 0, d))
        T = T @ A
        frames.append(T)
    return np.stack(frames), T @ np.asarray(arm.tool, dtype=float)


def random_state(seed, n):
    """A random state (q, qd, qdd), each (n,) float64, all velocities non-zero."""
    rng = np.random.default_rng(10_000 + seed)
    q = rng.uniform(-np.pi, np.pi, n)
    qd = rng.choice([-1.0, 1.0], n) * rng.uniform(0.1, 2.0, n)
    qdd = rng.uniform(-3.0, 3.0, n)
    return q, qd, qdd


def random_wrench(seed):
    """A random external wrench (force N, moment N m) (6,)."""
    rng = np.random.default_rng(20_000 + seed)
    return np.concatenate([rng.uniform(-20.0, 20.0, 3), rng.uniform(-5.0, 5.0, 3)])


def assert_close(actual, desired, rtol, what=""):
    """max |actual - desired| <= rtol * max(|desired|), i.e. relative to the array's scale, so
    entries that happen to be near zero are judged against the size of the whole result."""
    actual = np.asarray(actual, dtype=float)
    desired = np.asarray(desired, dtype=float)
    assert actual.shape == desired.shape, f"{what}: shape {actual.shape} != {desired.shape}"
    scale = max(float(np.max(np.abs(desired))) if desired.size else 0.0, 1e-300)
    err = float(np.max(np.abs(actual - desired))) if desired.size else 0.0
    assert err <= rtol * scale, f"{what}: max error {err:.3e} > {rtol:.1e} * scale {scale:.3e} (relative {err / scale:.3e})"


def central_differences(loss, problem, get, put, h):
    """Central differences of ``loss(problem)[0]`` with respect to the array ``get(problem)``,
    entry by entry with step h; ``put(problem, value)`` gives the problem with that array replaced."""
    base = np.asarray(get(problem), float)
    out = np.zeros(base.size)
    for i in range(base.size):
        e = np.zeros(base.size)
        e[i] = h
        e = e.reshape(base.shape)
        out[i] = (float(loss(put(problem, base + e))[0]) - float(loss(put(problem, base - e))[0])) / (2 * h)
    return out.reshape(base.shape)


def count_primitive(jaxpr, name: str) -> int:
    """How many equations of primitive ``name`` a jaxpr (or a closed jaxpr, as ``jax.make_jaxpr``
    returns) holds, those of its sub-jaxprs (loop bodies, branches, calls) included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # a closed jaxpr's own
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a closed jaxpr's own
                if hasattr(sub, "eqns"):
                    count += count_primitive(sub, name)
    return count


def while_loop_batchings(monkeypatch) -> list:
    """A list that grows by one entry at each call of jax's while-loop batching rule (a jax
    internal, wrapped for the test through ``monkeypatch``): one per loop body jax.vmap batches."""
    from jax._src.interpreters import batching
    from jax._src.lax.control_flow import loops

    calls = []
    rule = batching.fancy_primitive_batchers[loops.while_p]
    monkeypatch.setitem(batching.fancy_primitive_batchers, loops.while_p, lambda *a, **k: calls.append(1) or rule(*a, **k))
    return calls
