"""Layer 4, parameters from data: logs and their preprocessing, the regressor and standard
parameters, base parameters, (weighted) least squares, the physically consistent fit, motor
identification and excitation design. Uses the layers below; never :mod:`jaxarm.control`."""

from .base_params import BaseParameters, base_parameters, grouping_order
from .fit import (
    LeastSquaresResult,
    LinearIdentification,
    identify_linear,
    least_squares,
    predict_torques,
    random_states,
    structural_base_parameters,
    torque_rmse,
)
from .linear_model import (
    DRIVE_PARAMETERS,
    LINK_PARAMETERS,
    IdentificationError,
    arm_with_parameters,
    known_torques,
    num_parameters,
    parameter_names,
    regressor,
    standard_parameters,
)
