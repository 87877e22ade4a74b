"""jaxarm: differentiable, batched robot-arm dynamics in JAX."""

from .arm import DH, Arm, Drives, Limits, Links, Payload, Placements, body_model, make_arm, stack_arms, validate_arm
from .drives import friction_torques, reflected_inertia
from .dynamics import (
    bias_forces,
    coriolis_matrix,
    forward_dynamics,
    gravity_torques,
    inverse_dynamics,
    joint_wrenches,
    kinetic_energy,
    mass_matrix,
    mass_matrix_by_columns,
    potential_energy,
    rigid_body_torques,
)
from .kinematics import forward_kinematics, jacobian, tool_pose

__version__ = "0.1.0"
