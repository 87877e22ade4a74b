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
from .batch import rollout_batch
from .controllers import computed_torque_controller, pd_controller
from .integrators import euler, rk3, rk4, semi_implicit_euler
from .motors import DAC, motor_current, motor_torque, motor_voltage, saturate_voltage
from .simulate import DivergenceError, Trajectory, check_divergence, rollout
from .consistency import LinkConsistency, check_link, consistency_report, pseudo_inertia
from . import parts
from .arm_files import ArmFileError, PhysicalConsistencyWarning, bundled_arms, load_arm, save_arm
from .mjcf import save_mjcf, to_mjcf
from .urdf import UrdfError, load_urdf, save_urdf
