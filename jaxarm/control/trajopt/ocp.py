"""An optimal-control problem for an arm: whatever costs and constraints the user writes.

    minimize    sum_{k<T} l(x_k, u_k, k) + l_T(x_T)
    subject to  x_{k+1} = F(x_k, u_k)         (one step of :func:`jaxarm.rollout`'s integrator)
                x_0 given,  lower <= u_k <= upper,
                g(x_k, u_k, k) <= 0,  h(x_k, u_k, k) = 0   (path and terminal constraints)

The costs and constraints are sums of :mod:`jaxarm.trajopt.terms` (tool position, orientation,
via points, effort, keep-out spheres, limits ... or your own functions), plus, as trajax takes
them, a plain ``running(x, u, k, params)`` and ``terminal(x, params)``. The problem is a pytree:
its arrays (start state, bounds, the terms' targets and weights, ``params``, the arm) are leaves,
the functions and the horizon are static, so one solver call can be ``jax.vmap``-ed over problems
and its solution differentiated with respect to them: ``jax.grad`` of any function of
:func:`jaxarm.trajopt.ddp`'s states and inputs (and of its cost) with respect to the problem --
``params``, start state, dt, bounds, the arm's physical parameters -- is computed by the implicit
function theorem at the optimum, not by differentiating the solver's iterations
(:mod:`jaxarm.control.trajopt.solvers.implicit`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ...model import checks
from ...model.arm import Arm
from ..linearize import _check_input_kind
from ...simulate import integrators
from ..step_jacobians import _step
from . import terms as _terms
from .problem import _arm_dtype, _input_limit, _without_input_limits


@dataclasses.dataclass(frozen=True, eq=False)
class OCP:
    """An optimal-control problem (build it with :func:`ocp`).

    arm: the arm whose dynamics are the constraint x_{k+1} = F(x_k, u_k) (its input limits are the
    default bounds; the dynamics themselves never clip); x0: (2n,) start state (q, qd); dt: ()
    step; lower, upper: (n,) input bounds (+-inf where free); params: your pytree (targets,
    weights, obstacles; read by terms that name its entries and passed to your functions);
    costs, constraints: tuples of :class:`jaxarm.trajopt.terms.Term`; T: horizon (steps);
    method: integrator ("rk3" ...); input: "torque" or "voltage".
    """

    arm: Arm
    x0: Any
    dt: Any
    lower: Any
    upper: Any
    params: Any
    costs: tuple
    constraints: tuple
    T: int
    method: Any = "rk3"
    input: str = "torque"

    @property
    def n(self) -> int:
        return self.arm.n

    def replace(self, **changes) -> "OCP":
        """A copy with some fields replaced (e.g. ``params``, ``x0``, ``dt``); checked again. A new
        ``dt`` rescales the path costs with the dynamics; via points stay at their knots (at times
        k dt of the new step)."""
        new = dataclasses.replace(self, **changes)
        _check_shapes(new, "OCP.replace")
        return new

    def step(self, x, u):
        """x_{k+1} (2n,) = F(x_k, u_k): one integrator step with u held (no clipping)."""
        return _step(solver_arm(self), x, u, self.dt, self.method, self.input)

    def __repr__(self) -> str:
        names = ", ".join(t.name for t in self.costs)
        cons = ", ".join(t.name for t in self.constraints)
        return f"OCP(arm={self.arm.name!r}, T={self.T}, costs=[{names}], constraints=[{cons}], input={self.input!r})"


jax.tree_util.register_dataclass(OCP, data_fields=["arm", "x0", "dt", "lower", "upper", "params", "costs", "constraints"],
                                 meta_fields=["T", "method", "input"])


def ocp(
    arm: Arm,
    q0,
    T: int,
    dt,
    *,
    qd0=None,
    costs=None,
    constraints=None,
    running: Callable | None = None,
    terminal: Callable | None = None,
    path_inequality: Callable | None = None,
    path_equality: Callable | None = None,
    terminal_inequality: Callable | None = None,
    terminal_equality: Callable | None = None,
    params=None,
    lower=None,
    upper=None,
    joint_limits: bool = True,
    method="rk3",
    input: str = "torque",
) -> OCP:
    """An :class:`OCP`: move the arm from (q0, qd0) over T steps of dt.

    costs, constraints: terms from :mod:`jaxarm.trajopt.terms`, added up or in a list.
    running(x, u, k, params) -> (), terminal(x, params) -> (): plain JAX cost functions (summed
    over k = 0..T-1 as they are, no dt); path_inequality(x, u, k, params) -> (m,) <= 0 and
    path_equality (= 0) at k = 0..T-1; terminal_inequality(x, params), terminal_equality at x_T.
    (Terms get the arm as their first argument; use :func:`terms.custom` when a function needs it,
    e.g. to differentiate with respect to the arm.)
    lower, upper: input bounds, scalar or (n,); default -+ the arm's torque limit (voltage limit
    with ``input="voltage"``), infinite where it has none. joint_limits: add the arm's joint
    position and velocity limits as constraints (:func:`terms.joint_limits`).

    The problem computes in the arm's precision: ``arm.astype(jnp.float32)`` makes a float32
    problem even with x64 enabled (q0, qd0 and the bounds are cast to it; the solver keeps its
    objective, quadratics and constraints in it whatever the dtype of the terms' weights).

    Every function is traced once here, on abstract values (nothing compiles), so a cost that
    returns the wrong shape, a params entry that is missing or a bound below its partner is
    reported now, by name.
    """
    func = "ocp"
    checks.check_arm(arm, func)
    _check_input_kind(arm, input, func)
    integrators.get_method(method)
    if not isinstance(T, (int, np.integer)) or isinstance(T, bool) or T < 1:
        raise ValueError(f"{func}: T: expected a whole number of steps >= 1, got {T!r}")
    T = int(T)
    try:
        dt_f = float(dt)
    except (TypeError, ValueError):
        raise ValueError(f"{func}: dt: expected a positive time step in seconds, got {dt!r}") from None
    if not (np.isfinite(dt_f) and dt_f > 0):
        raise ValueError(f"{func}: dt: expected a positive time step in seconds, got {dt!r}")
    n = arm.n
    q0 = checks.joint_vector(q0, arm, "q0", func)
    qd0 = jnp.zeros_like(q0) if qd0 is None else checks.joint_vector(qd0, arm, "qd0", func)
    _finite(q0, "q0", func)
    _finite(qd0, "qd0", func)
    # the problem computes in the arm's precision (arm.astype(jnp.float32): float32 with x64 enabled)
    x0 = jnp.concatenate([q0, qd0]).astype(_arm_dtype(arm))
    lim = jnp.asarray(_input_limit(arm, input), dtype=x0.dtype)
    lower = -lim if lower is None else _bound(lower, n, "lower", func, x0.dtype)
    upper = lim if upper is None else _bound(upper, n, "upper", func, x0.dtype)
    if not isinstance(lower, jax.core.Tracer) and not isinstance(upper, jax.core.Tracer):
        bad = np.flatnonzero(~(np.asarray(lower) <= np.asarray(upper)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{func}: lower, upper: the input bounds are infeasible at joint {i + 1}: "
                             f"lower {float(lower[i])} > upper {float(upper[i])}")
    params = {} if params is None else params

    cost_terms = list(_terms.as_terms(costs, "costs"))
    con_terms = list(_terms.as_terms(constraints, "constraints"))
    for t in cost_terms:
        if t.kind not in ("residual", "scalar", "rate"):
            raise ValueError(f"{func}: costs: term {t.name!r} is a constraint ({t.kind}); pass it in constraints=")
    if sum(t.kind == "rate" for t in cost_terms) > 1:
        raise ValueError(f"{func}: costs: more than one input_rate term; give one (its weight may be per joint)")
    for t in con_terms:
        if t.kind not in ("inequality", "equality"):
            raise ValueError(f"{func}: constraints: term {t.name!r} is a cost; pass it in costs=")
    for name, fn in (("running", running), ("terminal", terminal), ("path_inequality", path_inequality),
                     ("path_equality", path_equality), ("terminal_inequality", terminal_inequality),
                     ("terminal_equality", terminal_equality)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{func}: {name}: expected a function, got {type(fn).__name__}")
    user_running = None
    if running is not None:
        user_running = _terms._make("running", "scalar", lambda a, x, u, k, d, p, f=running: f(x, u, k, p), "path", True)
    if terminal is not None:
        cost_terms.append(_terms._make("terminal", "scalar", lambda a, x, u, k, d, p, f=terminal: f(x, p), "end", False))
    for name, fn, kind, when, uses in (
        ("path_inequality", path_inequality, "inequality", "path", True),
        ("path_equality", path_equality, "equality", "path", True),
        ("terminal_inequality", terminal_inequality, "inequality", "end", False),
        ("terminal_equality", terminal_equality, "equality", "end", False),
    ):
        if fn is None:
            continue
        if uses:
            wrapped = lambda a, x, u, k, d, p, f=fn: jnp.atleast_1d(f(x, u, k, p))  # noqa: E731
        else:
            wrapped = lambda a, x, u, k, d, p, f=fn: jnp.atleast_1d(f(x, p))  # noqa: E731
        con_terms.append(_terms._make(name, kind, wrapped, when, uses))
    if joint_limits:
        con_terms.insert(0, _terms.joint_limits())

    def scheduled(t, s=None):
        integrated = s is None and t.when == "path" and t.kind in ("residual", "scalar")
        s = _terms.schedule(t, T, dt_f, func) if s is None else s
        return dataclasses.replace(t, schedule=jnp.asarray(s, dtype=x0.dtype), integrated=integrated)

    cost_terms = [scheduled(t) for t in cost_terms]
    if user_running is not None:  # summed as written, no dt
        s = np.zeros(T + 1)
        s[:T] = 1.0
        cost_terms.append(scheduled(user_running, s))
    if not cost_terms:
        raise ValueError(f"{func}: costs: the problem has no cost; give terms (e.g. trajopt.terms.effort()) or running=/terminal=")
    problem = OCP(arm=arm, x0=x0, dt=jnp.asarray(dt_f, x0.dtype), lower=lower, upper=upper, params=params,
                  costs=tuple(cost_terms), constraints=tuple(scheduled(t) for t in con_terms), T=T, method=method,
                  input=input)
    _check_shapes(problem, func)
    return problem


def _finite(a, name, func, show_values=True):
    """Refuse NaN or inf in a concrete array (a traced one is not checked); name the values when
    they are few (``show_values``), not for whole trajectories."""
    if not isinstance(a, jax.core.Tracer) and not bool(np.all(np.isfinite(np.asarray(a)))):
        got = np.asarray(a).tolist() if show_values else "NaN or inf"
        raise ValueError(f"{func}: {name}: expected finite values, got {got}")


def _bound(b, n, name, func, dtype):
    a = jnp.asarray(b, dtype=dtype)
    if a.ndim == 0:
        a = jnp.broadcast_to(a, (n,))
    if a.shape != (n,):
        raise ValueError(f"{func}: {name}: expected a number or shape ({n},) (one per joint), got {a.shape}")
    if not isinstance(a, jax.core.Tracer) and bool(np.any(np.isnan(np.asarray(a)))):
        raise ValueError(f"{func}: {name}: expected numbers (+-inf for no bound), got NaN")
    return a


_CHECKED: dict = {}  # the abstract signatures of problems _check_shapes has passed


def _abstract_signature(problem: OCP):
    """(tree structure, leaves' shapes and dtypes) of a problem, or None where that is not
    hashable: two problems with the same signature pass or fail :func:`_check_shapes` alike."""
    leaves, treedef = jax.tree_util.tree_flatten(problem)
    try:
        key = (treedef, tuple((jnp.shape(leaf), jnp.result_type(leaf)) for leaf in leaves))
        hash(key)
    except TypeError:
        return None
    return key


def _check_shapes(problem: OCP, func: str) -> None:
    """Trace every term once on abstract values: shapes and params lookups, before any compile.
    Done once per abstract signature: ``problem.replace(params=...)`` with new values of the same
    shapes, every control step of an MPC loop, traces nothing again (it took 35 ms a call on the
    tracking problem of ``experiments/trajopt_mpc.py``, longer than the control step itself)."""
    key = _abstract_signature(problem)
    if key is not None and key in _CHECKED:
        return
    _check_terms(problem, func)
    if key is not None:
        if len(_CHECKED) >= 256:
            _CHECKED.clear()
        _CHECKED[key] = True


def _check_terms(problem: OCP, func: str) -> None:
    n = problem.n
    if jnp.shape(problem.x0) != (2 * n,):
        raise ValueError(f"{func}: x0: expected shape ({2 * n},) = (q, qd), got {jnp.shape(problem.x0)}")
    dtype = jnp.result_type(problem.x0)
    x = jax.ShapeDtypeStruct((2 * n,), dtype)
    u = jax.ShapeDtypeStruct((n,), dtype)
    k = jax.ShapeDtypeStruct((), jnp.int32)
    for group in (problem.costs, problem.constraints):
        for t in group:
            if jnp.shape(t.schedule) != (problem.T + 1,):
                raise ValueError(f"{func}: term {t.name!r}: its schedule has shape {jnp.shape(t.schedule)}, "
                                 f"expected ({problem.T + 1},) for T = {problem.T}; build the problem again with ocp() to change T")
            try:
                out = jax.eval_shape(lambda arm, x, u, k, d, p, t=t: t.fn(arm, x, u, k, t.values(p) if d is None else d, p),
                                     problem.arm, x, u, k, None, problem.params)
            except KeyError as e:
                raise KeyError(f"{func}: {e.args[0]}") from None
            except Exception as e:  # a user function that fails on abstract values: say which
                raise ValueError(f"{func}: term {t.name!r} fails when evaluated at a knot "
                                 f"(x ({2 * n},), u ({n},), k, params): {type(e).__name__}: {e}") from e
            shape = out.shape
            if t.kind == "scalar" and shape != ():
                raise ValueError(f"{func}: term {t.name!r}: a cost must return a scalar, got shape {shape}")
            if t.kind != "scalar" and len(shape) != 1:
                raise ValueError(f"{func}: term {t.name!r}: expected a vector (m,) of "
                                 f"{'residuals' if t.kind == 'residual' else 'constraint values'}, got shape {shape}")
            if not jnp.issubdtype(out.dtype, jnp.floating):
                raise ValueError(f"{func}: term {t.name!r}: expected floating-point values, got {out.dtype}")
            w = t.values(problem.params).get("weight")
            if w is not None and jnp.ndim(w) != 0:
                raise ValueError(f"{func}: term {t.name!r}: weight: expected a scalar, got shape {jnp.shape(w)}")
            if t.kind == "rate":
                for field in ("w", "previous"):
                    v = t.values(problem.params).get(field)
                    if v is not None and jnp.shape(v) not in ((), (n,)):
                        raise ValueError(f"{func}: term {t.name!r}: {field}: expected a number or shape ({n},) "
                                         f"(one per joint), got shape {jnp.shape(v)}")


def solver_arm(problem: OCP) -> Arm:
    """The arm the solver simulates: input limits removed (the bounds are the solver's job)."""
    return _without_input_limits(problem.arm, problem.input)


def _kept_key(problem: OCP):
    """An OCP as a kept program takes it (:func:`jaxarm.core.xla.eager_compiled`): (key, params,
    rebuild). Everything but ``params`` is a constant, known by value, in the key; ``params`` are
    passed (their Python ints kept, :func:`jaxarm.core.xla.passed_leaves`), and ``rebuild(params)``
    is the problem again inside the program."""
    from ...core.xla import by_value, passed_leaves

    params_key, params, rebuild = passed_leaves(problem.params)
    key = (by_value(dataclasses.replace(problem, params=None)), params_key)
    return key, params, lambda passed: problem.replace(params=rebuild(passed))


def reach_ocp(arm: Arm, problem, T: int, *, method="rk3", input: str = "torque") -> OCP:
    """The :class:`jaxarm.trajopt.ReachProblem` ``problem`` as an :class:`OCP` of T steps, written in
    terms (same objective as :func:`jaxarm.trajopt.trajectory_cost`): effort, terminal tool
    position, orientation and joint speed, running tool position; solve it with
    :func:`jaxarm.trajopt.ddp`. The input smoothness is the input-rate term
    (:func:`jaxarm.trajopt.terms.input_rate`, from the second input on)."""
    from .problem import ReachProblem

    func = "reach_ocp"
    if not isinstance(problem, ReachProblem):
        raise TypeError(f"{func}: problem: expected a jaxarm.trajopt.ReachProblem, got {type(problem).__name__}")
    costs = (_terms.effort(problem.effort) + _terms.tool_position(problem.target, problem.position)
             + _terms.tool_orientation(problem.target_rotation, problem.orientation)
             + _terms.joint_velocity(problem.velocity)
             + _terms.tool_position(problem.target, problem.path_position, when="path"))
    if isinstance(problem.smoothness, jax.core.Tracer) or float(problem.smoothness) != 0.0:
        costs = costs + _terms.input_rate(problem.smoothness)
    return ocp(arm, problem.q0, T, problem.dt, qd0=problem.qd0, costs=costs, method=method, input=input)
