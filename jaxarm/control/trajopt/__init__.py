"""Trajectory optimization: any optimal-control problem written as terms or plain JAX functions,
solved by box-constrained feasibility-driven DDP; and the older point-to-point reach solvers.

**General problems** (:func:`ocp`, :func:`ddp`; docs/guide/trajopt.md). A problem is the arm, a
start state, a horizon T and step dt, an integrator, and a sum of cost and constraint terms
(:mod:`jaxarm.trajopt.terms`: effort, joint and tool targets at the end, along the path or at
via-point times, keep-out spheres and capsules, speed and joint limits, input rate, and your own
``residual``/``custom``/``inequality``/``equality`` functions of (arm, x, u, k, params))::

    minimize  sum_k l(x_k, u_k, k) + l_T(x_T)   s.t.  x_{k+1} = F(x_k, u_k),
              lower <= u_k <= upper (the arm's limits by default),  g <= 0,  h = 0

:func:`ddp` handles the input box inside the backward pass (Tassa, Mansard & Todorov 2014),
the state gaps of an infeasible start as FDDP does (Mastalli et al. 2020), the other constraints
by an augmented Lagrangian (Nocedal & Wright 2006, eqs 17.39 and 17.65), and the dynamics'
second-order terms on request (``second_order=True``). The result (:class:`OCPResult`) carries
the trajectory, cost, violation, gaps, iterations, multipliers, a per-iteration history and
``reason()`` (why it stopped, what to try). ``params`` (targets, weights, obstacles) can be
``jax.vmap``-ed and differentiated: ``jax.grad`` through :func:`ddp` uses the implicit function
theorem at the optimum, with respect to the params and the arm. :func:`mpc_step` and
:func:`shift` run it as a warm-started receding-horizon controller. Many goals on a CPU:
:func:`solve_many` (a pool that refills finished problems' slots; a ``jax.vmap`` of :func:`ddp`
iterates until its slowest member stops, which on two cores made 64 UR5 reaches about ten times
slower than the pool: `python experiments/trajopt_crocoddyl.py --arms ur5 --batches 64`).

**Point-to-point reaches** (:func:`reach_problem`, :class:`ReachProblem`): effort, a tool target
and rest, solved by :func:`shooting`, :func:`multiple_shooting` or :func:`ilqr` with the input
limit by an augmented Lagrangian or by squashing (u = u_max tanh(z)); :func:`reach_warm_start`
gives torques along a minimum-jerk joint path (:func:`minimum_jerk`) to a damped-least-squares
IK solution (:func:`position_ik`). :func:`reach_ocp` states the same reach as a general problem
for :func:`ddp`.
"""
from . import terms
from .objective import trajectory_cost
from .ocp import OCP, ocp, reach_ocp
from .problem import (
    TORQUE_LIMIT_MODES,
    IterationLog,
    ReachProblem,
    TrajoptResult,
    reach_problem,
)
from .solvers.ddp import DDPLog, OCPResult, ddp, total_cost
from .solvers.ilqr import ilqr
from .solvers.mpc import mpc_step, shift
from .solvers.pool import solve_many
from .solvers.shooting import multiple_shooting, shooting
from .warm_start import minimum_jerk, position_ik, reach_warm_start

__all__ = [
    "TORQUE_LIMIT_MODES", "IterationLog", "ReachProblem", "TrajoptResult", "reach_problem", "trajectory_cost",
    "position_ik", "minimum_jerk", "reach_warm_start", "shooting", "multiple_shooting", "ilqr",
    "terms", "OCP", "ocp", "ddp", "OCPResult", "DDPLog", "mpc_step", "shift", "reach_ocp", "total_cost", "solve_many",
]
