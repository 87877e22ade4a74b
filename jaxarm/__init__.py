"""jaxarm: differentiable, batched robot-arm dynamics in JAX.

The package is layered (``ARCHITECTURE.md``): :mod:`jaxarm.core` -> :mod:`jaxarm.model` ->
:mod:`jaxarm.dynamics` -> :mod:`jaxarm.simulate` -> :mod:`jaxarm.identify` and
:mod:`jaxarm.control` -> :mod:`jaxarm.cli`. Everything a user needs is importable from here.
"""

import importlib as _importlib
import sys as _sys

__version__ = "0.1.0"

from .model import (
    DH,
    Arm,
    ArmFileError,
    Drives,
    Limits,
    LinkConsistency,
    Links,
    Payload,
    PhysicalConsistencyWarning,
    Placements,
    UrdfError,
    body_model,
    bundled_arms,
    check_link,
    consistency_report,
    load_arm,
    load_urdf,
    urdf_joint_names,
    make_arm,
    pseudo_inertia,
    save_arm,
    save_mjcf,
    save_urdf,
    stack_arms,
    to_mjcf,
    validate_arm,
)
from .model import parts
from .dynamics import (
    DAC,
    bias_forces,
    coriolis_matrix,
    forward_dynamics,
    forward_kinematics,
    friction_torques,
    gravity_torques,
    inverse_dynamics,
    jacobian,
    joint_wrenches,
    kinetic_energy,
    mass_matrix,
    mass_matrix_by_columns,
    motor_current,
    motor_torque,
    motor_voltage,
    potential_energy,
    reflected_inertia,
    rigid_body_torques,
    saturate_voltage,
    tool_pose,
)
from .simulate import (
    DivergenceError,
    Trajectory,
    check_divergence,
    computed_torque_controller,
    euler,
    explicit_rk,
    pd_controller,
    rk3,
    rk3_rolled,
    rk4,
    rk4_rolled,
    rollout,
    rollout_batch,
    semi_implicit_euler,
)
from .identify.logs import Log, LogError, load_log, preprocess_log, save_log
from .identify import (
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
from .identify.consistent import (
    ComBox,
    ComSphere,
    ConsistentFit,
    PriorNudgedWarning,
    fit_consistent,
    log_cholesky_to_parameters,
    log_cholesky_to_pseudo_inertia,
    parameters_to_log_cholesky,
)
from .estimate import (
    KalmanEstimate,
    MomentumObserver,
    contact_link,
    detect_contact,
    detection_threshold,
    extended_kalman_filter,
    kalman_filter,
    momentum_observer,
    unscented_kalman_filter,
)
from .identify.output_error import OutputErrorFit, refine_output_error, simulation_error
from .identify.export import ExportCheck, check_export
from .identify.payload import PayloadIdentification, identify_payload
from .identify.excitation import ExcitationDesign, FourierTrajectory, design_excitation, fourier_trajectory, voltage_tracking_policy
from .identify.motors import (
    MotorIdentification,
    MotorIdentificationError,
    add_sensor_noise,
    identify_electrical,
    identify_motors,
    preprocess_motor_log,
    simulated_motor_log,
)
from .control.linearize import (
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
from .control.lqr import TVLQR, tvlqr, tvlqr_controller, tvlqr_tracking
from .control.inverse_kinematics import IKResult, inverse_kinematics, rotation_vector
from .control import resolved_rate  # the module: jaxarm.resolved_rate.resolved_rate(...), .resolved_rate_motion(...)
from .control import trajopt  # jaxarm.trajopt.shooting / multiple_shooting / ilqr / reach_problem
from .core.xla import compiler_options, enable_compilation_cache, jit  # jax.jit with jaxarm's CPU compiler options (see jaxarm/core/xla.py)

# Module paths of the flat layout before the layers (``jaxarm.arm_files``, ``jaxarm.identification``,
# ...) name the same modules as before: each is an alias of its module in the layered tree.
_ALIASES = {
    "arm": "model.arm",
    "arm_files": "model.arm_files",
    "checks": "model.checks",
    "consistency": "model.consistency",
    "mjcf": "model.mjcf",
    "parts": "model.parts",
    "urdf": "model.urdf",
    "spatial": "core.spatial",
    "drives": "dynamics.drives",
    "kinematics": "dynamics.kinematics",
    "linalg": "dynamics.linalg",
    "motors": "dynamics.motors",
    "adjoint": "simulate.adjoint",
    "batch": "simulate.batch",
    "controllers": "simulate.controllers",
    "integrators": "simulate.integrators",
    "identification": "identify",
    "consistent_identification": "identify.consistent",
    "excitation": "identify.excitation",
    "logs": "identify.logs",
    "motor_identification": "identify.motors",
    "linearize": "control.linearize",
    "lqr": "control.lqr",
    "resolved_rate": "control.resolved_rate",
    "trajopt": "control.trajopt",
    "plotting": "cli.plotting",
}


def _alias(old: str, new: str) -> None:
    module = _importlib.import_module(f"{__name__}.{new}")
    _sys.modules[f"{__name__}.{old}"] = module
    globals()[old] = module


for _old, _new in _ALIASES.items():
    _alias(_old, _new)
