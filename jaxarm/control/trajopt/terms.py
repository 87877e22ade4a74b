"""Cost and constraint terms of an optimal-control problem, composed by addition.

A term is a small readable function of one knot of the trajectory -- the arm, the state
x = (q, qd) (2n,), the input u (n,), the knot index k and the problem's ``params`` -- plus when it
applies. Costs come in two kinds:

- least-squares terms, weight * |r(x, u)|^2 with a residual r: the solver quadratizes them by
  Gauss-Newton, 2 w J^T J, from one forward-mode Jacobian of r (no second derivatives, which is
  most of what keeps compiles short);
- scalar terms (:func:`custom`, or the plain ``running``/``terminal`` functions of
  :func:`jaxarm.trajopt.ocp`), quadratized exactly by ``jax.hessian``;
- the input rate (:func:`input_rate`), a least-squares term on consecutive inputs.

Constraints are c(x, u) <= 0 (``inequality``) or c(x, u) = 0 (``equality``), vector-valued, handled
by the augmented Lagrangian of the solver (the input box is not a term: it is handled inside the
backward pass, see :func:`jaxarm.trajopt.ddp`).

When a term applies (``when``):

- ``"path"``: every knot k = 0..T-1; costs are multiplied by dt (a time integral, rectangle rule);
- ``"end"``: the final state x_T (u is zero there);
- ``"all"``: every knot k = 0..T (state terms; costs unweighted);
- a sequence of times in seconds (via points): the knots k = t / dt, which must lie on the grid.

Constraints on the state alone skip knot 0 (the given start cannot be changed); those that read u
apply at k = 0..T-1 under ``"path"``.

Any number (a weight, a target, an obstacle centre) may instead be a string naming an entry of
the problem's ``params`` dict: ``tool_position("goal")`` reads ``params["goal"]``, so one problem
is ``jax.vmap``-ed over many goals, and a cost or the optimal solution itself is differentiated
with respect to them (the solution by the implicit function theorem, see :func:`jaxarm.trajopt.ddp`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ...core import spatial
from ...dynamics.kinematics import _bodies, _tool_pose, body_poses

WHEN = ("path", "end", "all")
KINDS = ("residual", "scalar", "rate", "inequality", "equality")


@dataclasses.dataclass(frozen=True, eq=False)
class Term:
    """One cost or constraint term. Build them with the functions of this module; add them up.

    name: shown in reports; kind: "residual" (cost weight |fn|^2), "scalar" (cost fn), "inequality"
    (fn <= 0) or "equality" (fn = 0); fn(arm, x, u, k, data, params) -> residual, scalar or
    constraint values; when: see the module docstring; uses_input: whether fn reads u;
    data: dict of arrays (a pytree: batched and differentiated with the problem); refs: fields of
    data read from ``params`` instead, as (field, key) pairs; schedule: (T+1,) per-knot factor,
    filled in by :func:`jaxarm.trajopt.ocp`.
    """

    name: str
    kind: str
    fn: Callable
    when: object
    uses_input: bool
    data: dict
    refs: tuple = ()
    schedule: object = None
    integrated: bool = False  # a path cost: its schedule is multiplied by the problem's dt when evaluated

    def __add__(self, other):
        return Terms((self,)) + other

    def __radd__(self, other):
        if other == 0:  # sum([...])
            return Terms((self,))
        return NotImplemented

    def values(self, params):
        """This term's data with the entries named in ``params`` looked up."""
        d = dict(self.data)
        for field, key in self.refs:
            d[field] = jnp.asarray(_lookup(params, key, self.name, field))
        return d


jax.tree_util.register_dataclass(Term, data_fields=["data", "schedule"],
                                 meta_fields=["name", "kind", "fn", "when", "uses_input", "refs", "integrated"])


@dataclasses.dataclass(frozen=True, eq=False)
class Terms:
    """A sum of terms (``term_a + term_b``); iterate over ``.terms``."""

    terms: tuple

    def __add__(self, other):
        if isinstance(other, Term):
            return Terms(self.terms + (other,))
        if isinstance(other, Terms):
            return Terms(self.terms + other.terms)
        return NotImplemented

    def __radd__(self, other):
        if other == 0:
            return self
        return NotImplemented

    def __iter__(self):
        return iter(self.terms)

    def __len__(self):
        return len(self.terms)


jax.tree_util.register_dataclass(Terms, data_fields=["terms"], meta_fields=[])


def as_terms(x, what: str) -> tuple:
    """A tuple of :class:`Term` from a term, a sum of terms, a list of them or None."""
    if x is None:
        return ()
    if isinstance(x, Term):
        return (x,)
    if isinstance(x, Terms):
        return x.terms
    if isinstance(x, (list, tuple)):
        out = []
        for i, t in enumerate(x):
            if not isinstance(t, (Term, Terms)):
                raise TypeError(f"{what}[{i}]: expected a jaxarm.trajopt.terms term, got {type(t).__name__}")
            out.extend(as_terms(t, what))
        return tuple(out)
    raise TypeError(f"{what}: expected a term from jaxarm.trajopt.terms, a sum of them or a list, got {type(x).__name__}")


def _lookup(params, key, name, field):
    try:
        return params[key]
    except (KeyError, TypeError, IndexError):
        raise KeyError(f"term {name!r}: {field}: names params[{key!r}], which the problem's params do not have") from None


def _make(name, kind, fn, when, uses_input, **fields):
    if not (when in WHEN or _is_times(when)):
        raise ValueError(f"{name}: when: expected 'path', 'end', 'all' or a sequence of times in seconds, got {when!r}")
    data, refs = {}, []
    for field, v in fields.items():
        if isinstance(v, str):
            refs.append((field, v))
        else:
            a = jnp.asarray(v, dtype=jnp.result_type(float))
            if not isinstance(a, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(a)))):
                raise ValueError(f"{name}: {field}: expected finite values, got {np.asarray(a).tolist()}")
            data[field] = a
    for field in ("weight", "w"):
        if field in data and not isinstance(data[field], jax.core.Tracer) and bool(np.any(np.asarray(data[field]) < 0)):
            shown = "weight" if field == "w" else field
            raise ValueError(f"{name}: {shown}: expected non-negative weights, got {np.asarray(data[field]).tolist()}")
    when = tuple(float(t) for t in when) if _is_times(when) else when
    return Term(name=name, kind=kind, fn=fn, when=when, uses_input=uses_input, data=data, refs=tuple(refs))


def _is_times(when):
    if isinstance(when, str):
        return False
    try:
        return len(when) > 0 and all(np.ndim(t) == 0 and np.isfinite(float(t)) for t in when)
    except TypeError:
        return False


def schedule(term: Term, T: int, dt: float, where: str) -> np.ndarray:
    """The (T+1,) per-knot factor of ``term`` for a horizon of T steps of dt (path costs: 1 at
    k < T, the time step being applied when the cost is evaluated, see :func:`factor`)."""
    s = np.zeros(T + 1)
    if term.when == "path":
        s[:T] = 1.0
    elif term.when == "end":
        s[T] = 1.0
    elif term.when == "all":
        s[:] = 1.0
    else:
        for t in term.when:
            k = t / dt
            if not (-1e-9 <= k <= T + 1e-9) or abs(k - round(k)) > 1e-6:
                raise ValueError(f"{where}: term {term.name!r}: when: time {t} s is not a knot of the horizon "
                                 f"(multiples of dt = {dt} s from 0 to {T * dt:g} s)")
            s[int(round(k))] = 1.0
    if term.kind not in ("residual", "scalar") and not term.uses_input:
        s[0] = 0.0  # the start state is given
    if term.uses_input:
        s[T] = 0.0  # no input at the final knot
    if term.kind == "rate" and "previous" not in term.data and not any(f == "previous" for f, _ in term.refs):
        s[0] = 0.0  # no input before the first to compare with
    return s


def factor(term: Term, k, dt):
    """The weight of ``term`` at knot k: its schedule, times dt for a path cost (a time integral by
    the rectangle rule, with the problem's dt of the moment: ``problem.replace(dt=...)`` and a
    ``jax.vmap`` over dt keep dynamics and cost consistent)."""
    return term.schedule[k] * dt if term.integrated else term.schedule[k]


# --------------------------------------------------------------------------- kinematics of a knot


def tool_frame(arm, q):
    """Tool rotation (3, 3) and position (3,) in the world frame (the kinematics of
    :func:`jaxarm.tool_pose`, without its input checks)."""
    bodies = _bodies(arm)
    rots, origins = body_poses(arm, bodies, q)
    R, p = _tool_pose(bodies, rots[-1], origins[-1])
    return jnp.asarray(R), jnp.asarray(p)


def link_point(arm, q, link: int, offset):
    """World position (3,) of a point fixed to link ``link`` (1..n; 0 is the base), given in that
    link's frame (the frame of :func:`jaxarm.forward_kinematics`)."""
    if link == 0:
        base = jnp.asarray(arm.base)
        return base[:3, :3] @ offset + base[:3, 3]
    bodies = _bodies(arm)
    rots, origins = body_poses(arm, bodies, q)
    R = spatial.mm(rots[link - 1], jnp.asarray(bodies.link_rotation)[link - 1])
    p = origins[link - 1] + spatial.mv(rots[link - 1], jnp.asarray(bodies.link_translation)[link - 1])
    return jnp.asarray(R) @ offset + jnp.asarray(p)


def _point(arm, x, d, link):
    n = arm.n
    if link is None:
        R, p = tool_frame(arm, x[:n])
        return R @ d["offset"] + p
    return link_point(arm, x[:n], link, d["offset"])


def _check_link(link, name):
    if link is not None and not (isinstance(link, (int, np.integer)) and link >= 0):
        raise ValueError(f"{name}: link: expected None (the tool) or a link number >= 0, got {link!r}")


# --------------------------------------------------------------------------- costs


def effort(weight=1.0, *, when="path"):
    """sum_i w_i u_i^2 (integrated over time on the path): w scalar or (n,) (e.g. 1 / u_max^2)."""
    def fn(arm, x, u, k, d, p):
        return jnp.sqrt(d["w"]) * u
    return _make("effort", "residual", fn, when, True, w=weight, weight=1.0)


def input_rate(weight=1.0, *, previous=None):
    """sum_k w |u_k - u_{k-1}|^2 / dt over k = 1..T-1 (smoothness: the time integral of w |du/dt|^2
    by finite differences), and over k = 0 as well with ``previous`` (n,), the input applied just
    before the horizon (in receding-horizon control: the one applied last, e.g. a ``params``
    entry). w: scalar or (n,) (e.g. 1 / u_max^2 for a rate in units of the limits).

    The term couples consecutive inputs, which no function of one knot can express: the solver
    carries the previous input as part of its state (:func:`jaxarm.trajopt.ddp`), and a problem
    holds at most one such term."""
    def fn(arm, x, u, k, d, p):  # the shape of the residual at one knot (the coupling is the solver's)
        return jnp.sqrt(d["w"]) * u
    fields = dict(w=weight, weight=1.0) if previous is None else dict(w=weight, weight=1.0, previous=previous)
    return _make("input_rate", "rate", fn, "path", True, **fields)


def joint_position(target, weight=1.0, *, when="end"):
    """w |q - q*|^2 (w scalar or (n,)): a joint-space goal, or regularization about a posture."""
    def fn(arm, x, u, k, d, p):
        return jnp.sqrt(d["w"]) * (x[: arm.n] - d["target"])
    return _make("joint_position", "residual", fn, when, False, target=target, w=weight, weight=1.0)


def joint_velocity(weight=1.0, *, target=0.0, when="end"):
    """w |qd - qd*|^2; at the end with the default target 0 it asks for rest."""
    def fn(arm, x, u, k, d, p):
        return jnp.sqrt(d["w"]) * (x[arm.n:] - d["target"])
    return _make("joint_velocity", "residual", fn, when, False, target=target, w=weight, weight=1.0)


def tool_position(target, weight=1.0, *, when="end", link=None, offset=(0.0, 0.0, 0.0)):
    """w |p - p*|^2 for the tool's origin (or a point ``offset`` in the tool frame, or in link
    ``link``'s frame): at the end, along the path, or at via-point times. target (3,), world frame."""
    _check_link(link, "tool_position")

    def fn(arm, x, u, k, d, p):
        return _point(arm, x, d, link) - d["target"]
    return _make("tool_position", "residual", fn, when, False, target=target, offset=offset, weight=weight)


def tool_orientation(target_rotation, weight=1.0, *, when="end"):
    """w |R - R*|_F^2 / 2 = w (3 - tr(R*^T R)) for the tool rotation R (3, 3); a target R* (3, 3)."""
    def fn(arm, x, u, k, d, p):
        R, _ = tool_frame(arm, x[: arm.n])
        return (R - d["target"]).reshape(-1) / jnp.sqrt(2.0)
    return _make("tool_orientation", "residual", fn, when, False, target=target_rotation, weight=weight)


def tool_axis(axis, direction, weight=1.0, *, when="path"):
    """w |R a - d|^2: the tool's axis a (3,) (tool frame, e.g. (0, 0, 1)) along the world direction d
    (3,) -- e.g. a gripper kept upright while it may turn about the vertical."""
    def fn(arm, x, u, k, d, p):
        R, _ = tool_frame(arm, x[: arm.n])
        return R @ d["axis"] - d["direction"]
    return _make("tool_axis", "residual", fn, when, False, axis=axis, direction=direction, weight=weight)


def tool_pose(target, weight_position=1.0, weight_orientation=1.0, *, when="end"):
    """Tool position and orientation together, from a (4, 4) target pose."""
    T = target if isinstance(target, str) else jnp.asarray(target, dtype=jnp.result_type(float))
    if isinstance(T, str):
        raise ValueError("tool_pose: target: a params reference is not supported here; use tool_position and tool_orientation")
    return tool_position(T[:3, 3], weight_position, when=when) + tool_orientation(T[:3, :3], weight_orientation, when=when)


def custom(fn, *, when="path", uses_input=True, name="custom", **data):
    """A scalar cost fn(arm, x, u, k, params, **data) -> () of your own, quadratized exactly by
    ``jax.hessian``; ``data`` entries (arrays, or names of params entries) are passed by keyword."""
    def wrapped(arm, x, u, k, d, p):
        return fn(arm, x, u, k, p, **d)
    return _make(name, "scalar", wrapped, when, uses_input, **data)


def residual(fn, weight=1.0, *, when="path", uses_input=True, name="residual", **data):
    """A least-squares cost w |fn(arm, x, u, k, params, **data)|^2 of your own (Gauss-Newton)."""
    def wrapped(arm, x, u, k, d, p):
        extra = {key: v for key, v in d.items() if key != "weight"}
        return jnp.atleast_1d(fn(arm, x, u, k, p, **extra))
    return _make(name, "residual", wrapped, when, uses_input, weight=weight, **data)


# --------------------------------------------------------------------------- constraints


def keep_out_sphere(center, radius, *, link=None, offset=(0.0, 0.0, 0.0), margin=0.0, when="all"):
    """The tool point (or a point ``offset`` on link ``link``) stays outside the sphere
    (center (3,), radius) by ``margin``: radius + margin - |p - c| <= 0 (a signed distance)."""
    _check_link(link, "keep_out_sphere")

    def fn(arm, x, u, k, d, p):
        r = _point(arm, x, d, link) - d["center"]
        dist = jnp.sqrt(jnp.sum(r**2) + 1e-12)
        return jnp.atleast_1d(d["radius"] + d["margin"] - dist)
    return _make("keep_out_sphere", "inequality", fn, when, False, center=center, radius=radius, margin=margin, offset=offset)


def keep_out_capsule(link, start, end, center, radius, *, margin=0.0, when="all"):
    """A segment of link ``link`` (from ``start`` to ``end``, link frame: a capsule around the link
    with the link's own radius folded into ``radius``) stays out of a sphere (center, radius):
    radius + margin - distance(segment, center) <= 0."""
    _check_link(link, "keep_out_capsule")

    def fn(arm, x, u, k, d, p):
        a = link_point(arm, x[: arm.n], link, d["start"])
        b = link_point(arm, x[: arm.n], link, d["end"])
        ab = b - a
        s = jnp.clip(jnp.dot(d["center"] - a, ab) / jnp.maximum(jnp.dot(ab, ab), 1e-12), 0.0, 1.0)
        r = a + s * ab - d["center"]
        return jnp.atleast_1d(d["radius"] + d["margin"] - jnp.sqrt(jnp.sum(r**2) + 1e-12))
    return _make("keep_out_capsule", "inequality", fn, when, False, start=start, end=end, center=center,
                 radius=radius, margin=margin)


def tool_speed_limit(speed, *, when="all"):
    """|v_tool| <= speed (m/s), v = J(q) qd the tool origin's linear velocity: (|v|^2 - s^2) / s^2 <= 0."""
    def fn(arm, x, u, k, d, p):
        n = arm.n
        q, qd = x[:n], x[n:]
        v = jax.jvp(lambda q: tool_frame(arm, q)[1], (q,), (qd,))[1]
        return jnp.atleast_1d(jnp.sum(v**2) / d["speed"] ** 2 - 1.0)
    return _make("tool_speed_limit", "inequality", fn, when, False, speed=speed)


def tool_position_constraint(target, *, when="end", link=None, offset=(0.0, 0.0, 0.0)):
    """p(q) - p* = 0 (3 equalities): reach exactly, at the end or at via-point times."""
    _check_link(link, "tool_position_constraint")

    def fn(arm, x, u, k, d, p):
        return _point(arm, x, d, link) - d["target"]
    return _make("tool_position_constraint", "equality", fn, when, False, target=target, offset=offset)


def joint_velocity_constraint(target=0.0, *, when="end"):
    """qd - qd* = 0 (n equalities): e.g. stop exactly at the end."""
    def fn(arm, x, u, k, d, p):
        return x[arm.n:] - d["target"]
    return _make("joint_velocity_constraint", "equality", fn, when, False, target=target)


def inequality(fn, *, when="path", uses_input=True, name="inequality", **data):
    """Your own g(arm, x, u, k, params, **data) <= 0 (a scalar or a vector)."""
    def wrapped(arm, x, u, k, d, p):
        return jnp.atleast_1d(fn(arm, x, u, k, p, **d))
    return _make(name, "inequality", wrapped, when, uses_input, **data)


def equality(fn, *, when="path", uses_input=True, name="equality", **data):
    """Your own h(arm, x, u, k, params, **data) = 0 (a scalar or a vector)."""
    def wrapped(arm, x, u, k, d, p):
        return jnp.atleast_1d(fn(arm, x, u, k, p, **d))
    return _make(name, "equality", wrapped, when, uses_input, **data)


def joint_limits():
    """The arm's joint position and velocity limits (``arm.limits``) as inequalities at every knot
    after the start, scaled to be comparable: position in rad (or m), velocity as a fraction of the
    limit; infinite limits are inactive. Read from the arm at each knot, so a batched or
    differentiated arm brings its own limits. :func:`jaxarm.trajopt.ocp` adds this term unless
    told not to."""
    def fn(arm, x, u, k, d, p):
        n = arm.n
        q, qd = x[:n], x[n:]
        lim = jnp.asarray(arm.limits.position, x.dtype)
        v = jnp.asarray(arm.limits.velocity, x.dtype)
        lo, hi = lim[:, 0], lim[:, 1]
        fin = lambda a: jnp.where(jnp.isfinite(a), a, 0.0)  # noqa: E731
        vs = jnp.where(jnp.isfinite(v), v, 1.0)
        g = jnp.concatenate([q - fin(hi), fin(lo) - q, qd / vs - 1.0, -qd / vs - 1.0])
        active = jnp.concatenate([jnp.isfinite(hi), jnp.isfinite(lo), jnp.isfinite(v), jnp.isfinite(v)])
        return jnp.where(active, g, -1.0)
    return _make("joint_limits", "inequality", fn, "all", False)
