"""``jaxarm inverse`` and ``jaxarm forward``: one state's joint torques or accelerations."""

from __future__ import annotations

import numpy as np

from .common import (
    EXIT_OK,
    _consistency_note,
    _joint_vector,
    _load_arm,
    _require_motor_model,
    _table,
)


def _state_vectors(args, arm):
    q = _joint_vector(args.q, "--q", arm)
    qd = _joint_vector(args.qd, "--qd", arm, default=0.0)
    return q, qd


def _print_joint_table(arm, columns):
    """columns: list of (name, values (n,), unit for revolute joints, unit for prismatic joints)."""
    kinds = set(arm.joint_types)

    def unit(ur, up):
        return ur if kinds == {"revolute"} else up if kinds == {"prismatic"} else f"{ur} | {up}"

    headers = ["joint", "type"] + [f"{name} [{unit(ur, up)}]" for name, _, ur, up in columns]
    rows = [[i + 1, arm.joint_types[i], *(f"{float(v[i]):.12g}" for _, v, _, _ in columns)] for i in range(arm.n)]
    print(_table(headers, rows, indent=""))


def _cmd_inverse(args) -> int:
    from ..core import xla as _xla
    from .. import dynamics

    arm = _load_arm(args.arm, strict=args.strict)
    q, qd = _state_vectors(args, arm)
    qdd = _joint_vector(args.qdd, "--qdd", arm, default=0.0)
    # One compiled call is much faster than op-by-op dispatch (each op would compile on first use).
    tau = np.asarray(_xla.jit(dynamics.inverse_dynamics)(arm, q, qd, qdd))
    print(f"{arm.name}: inverse dynamics (rigid body + reflected rotor inertia + drive friction)")
    _print_joint_table(arm, [("q", q, "rad", "m"), ("qd", qd, "rad/s", "m/s"), ("qdd", qdd, "rad/s^2", "m/s^2"),
                             ("tau", tau, "N m", "N")])
    args._note = _consistency_note(arm, args.arm)
    return EXIT_OK


def _cmd_forward(args) -> int:
    from ..core import xla as _xla
    from ..dynamics import motors
    from .. import dynamics

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
