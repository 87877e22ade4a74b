"""``jaxarm inverse``: one state's joint torques (Newton-Euler with the drive terms)."""

from __future__ import annotations

import numpy as np

from .common import (
    EXIT_OK,
    _consistency_note,
    _joint_vector,
    _load_arm,
    _print_joint_table,
    _state_vectors,
)


def _cmd_inverse(args) -> int:
    from .. import dynamics
    from ..core import xla as _xla

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
