"""``jaxarm forward``: one state's joint accelerations from torques or motor voltages."""

from __future__ import annotations

import numpy as np

from .common import (
    EXIT_OK,
    _consistency_note,
    _joint_vector,
    _load_arm,
    _print_joint_table,
    _require_motor_model,
    _state_vectors,
)


def _cmd_forward(args) -> int:
    from .. import dynamics
    from ..core import xla as _xla
    from ..dynamics import motors

    arm = _load_arm(args.arm, strict=args.strict)
    q, qd = _state_vectors(args, arm)
    columns = [("q", q, "rad", "m"), ("qd", qd, "rad/s", "m/s")]
    if args.voltage is not None:
        _require_motor_model(arm, "--voltage")
        V = _joint_vector(args.voltage, "--voltage", arm)

        def through_motors(arm, q, qd, V):
            tau = motors.motor_torque(arm, V, qd)
            return motors.saturate_voltage(arm, V), tau, dynamics.forward_dynamics(arm, q, qd, tau)

        V_applied, tau, qdd = (np.asarray(x) for x in _xla.jit(through_motors)(arm, q, qd, V))
        columns.append(("V", V_applied, "V", "V"))
    else:
        tau = _joint_vector(args.tau, "--tau", arm)
        qdd = np.asarray(_xla.jit(dynamics.forward_dynamics)(arm, q, qd, tau))
    columns += [("tau", tau, "N m", "N"), ("qdd", qdd, "rad/s^2", "m/s^2")]
    print(f"{arm.name}: forward dynamics" + (" (voltage through the motor model, saturated)" if args.voltage is not None else ""))
    _print_joint_table(arm, columns)
    args._note = _consistency_note(arm, args.arm)
    return EXIT_OK
