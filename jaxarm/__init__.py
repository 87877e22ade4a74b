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
from .logs import Log, LogError, load_log, preprocess_log, save_log
from .identification import (
    BaseParameters,
    IdentificationError,
    LeastSquaresResult,
    LinearIdentification,
    arm_with_parameters,
    base_parameters,
    grouping_order,
    identify_linear,
    known_torques,
    least_squares,
    parameter_names,
    predict_torques,
    regressor,
    standard_parameters,
    structural_base_parameters,
    torque_rmse,
)
from .consistent_identification import (
    ComBox,
    ComSphere,
    ConsistentFit,
    PriorNudgedWarning,
    fit_consistent,
    log_cholesky_to_parameters,
    log_cholesky_to_pseudo_inertia,
    parameters_to_log_cholesky,
)
from .excitation import ExcitationDesign, FourierTrajectory, design_excitation, fourier_trajectory, voltage_tracking_policy
from .motor_identification import (
    MotorIdentification,
    MotorIdentificationError,
    add_sensor_noise,
    identify_electrical,
    identify_motors,
    preprocess_motor_log,
    simulated_motor_log,
)
from .linearize import (
    LinearModel,
    SecondOrderForm,
    discrete_dynamics,
    discretize_zoh,
    linearize_continuous,
    linearize_trajectory,
    second_order_form,
    state_derivative,
    state_space_from_second_order,
)
from .lqr import TVLQR, tvlqr, tvlqr_controller, tvlqr_tracking
from . import resolved_rate  # the module: jaxarm.resolved_rate.resolved_rate(...), .resolved_rate_motion(...)
from . import trajopt  # jaxarm.trajopt.shooting / multiple_shooting / ilqr / reach_problem
from .integrators import explicit_rk, rk3_rolled, rk4_rolled
from ._xla import compiler_options, jit  # jax.jit with jaxarm's CPU compiler options (see jaxarm/_xla.py)
