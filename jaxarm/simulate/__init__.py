"""Layer 3, time: integrators, rollouts (``lax.scan``), their discrete adjoint, batched and
sharded rollouts, and feedback controllers."""

from .batch import rollout_batch
from .controllers import computed_torque_controller, pd_controller
from .integrators import euler, explicit_rk, rk3, rk3_rolled, rk4, rk4_rolled, semi_implicit_euler
from .rollouts import DivergenceError, Trajectory, check_divergence, rollout
