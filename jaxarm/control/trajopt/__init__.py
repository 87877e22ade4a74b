"""Trajectory optimization: direct single and multiple shooting through differentiable rollouts,
and iLQR on the discrete linearization of the integrator step.

A problem (:class:`ReachProblem`) is data -- start state, tool target, time step, cost weights --
so one solver call can be ``jax.vmap``-ed over many goals or many arms (:func:`jaxarm.stack_arms`).
All three solvers minimize the same objective over an input schedule u (T, n) (torque, or motor
voltage with ``input="voltage"``):

    J = sum_k [ sum_i w_i u_ki^2 + w_path |p(q_k) - p*|^2 ] dt              (effort, path)
        + s sum_k |u_k - u_{k-1}|^2 / dt                                    (smoothness)
        + w_p |p(q_T) - p*|^2 + w_R (3 - tr(R*^T R(q_T))) + w_v |qd_T|^2    (tool pose, rest)

subject to the arm's limits: |u| <= u_max (``arm.limits.torque`` or ``arm.drives.voltage_limit``),
q within ``arm.limits.position`` and |qd| <= ``arm.limits.velocity`` at every step (infinite limits
are inactive). Inequality and defect constraints are handled by the augmented Lagrangian
(Nocedal & Wright 2006, section 17.4, eqs 17.36 and 17.65, multiplier update 17.39); the input
limit by either the same augmented Lagrangian or by squashing, u = u_max tanh(z).

Warm start: :func:`reach_warm_start` gives torques that follow a minimum-jerk joint path
(:func:`minimum_jerk`) to a damped-least-squares IK solution of the target (:func:`position_ik`).

The decision variable is the dimensionless z (T, n): u = u_max tanh(z) ("squash") or u = u_max z
("augmented_lagrangian"), with u_max replaced by 1 where a joint has no limit, so all joints are
equally scaled for the optimizers and the iLQR regularization is in the same units everywhere.
The solvers simulate an internal copy of the arm with its input limits removed: the solver itself
keeps u inside them (exactly for squash, to ``tol_violation`` for the augmented Lagrangian), so the
dynamics never hide a violation behind a clip with zero gradient.
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
