"""``jaxarm identify-payload``: a payload's mass, COM and inertia from a log with it attached."""

from __future__ import annotations

import json
import os
import sys

from .common import EXIT_FAILURE, EXIT_OK, CommandError, _load_arm, _one_line, _Outputs, _positive


def _cmd_identify_payload(args) -> int:
    """Load the log(s), choose the cutoff from the log unless given, fit the payload, write the arm
    holding it (and a report) atomically."""
    from ..identify.linear_model import IdentificationError
    from ..identify.logs import LogError, preprocess_log
    from ..identify.payload import PAYLOAD_PARAMETERS, identify_payload
    from ..identify.selection import select_preprocessing
    from ..model.arm_files import arm_to_toml
    from .identify import _joint_names, _read_log

    outputs = [(args.out, "--out")] + ([(args.report, "--report")] if args.report else [])
    for path, option in outputs:
        _Outputs.check(path, option, args.force)
    arm = _load_arm(args.arm)
    joint_names = _joint_names(args.joint_names, args.arm, arm.n)

    def read(path):
        log = _read_log(path, arm, args, joint_names)
        if log.tau is None:
            raise CommandError(f"{path}: no torque columns (tau1..tau{arm.n}): the payload is fitted to measured joint torques")
        return log

    raw = read(args.log)
    base_raw = read(args.baseline) if args.baseline else None
    no_filter = args.cutoff is not None and str(args.cutoff).strip().lower() == "none"
    cutoff = None if args.cutoff is None or no_filter else _positive(args.cutoff, "--cutoff", "a cutoff frequency [Hz] or 'none'")
    note, filtering = None, {}  # the filter's order: chosen with the cutoff, else preprocess_log's default
    if args.cutoff is None:
        try:
            choice = select_preprocessing(arm, raw, stribeck_velocities=(0.0,))  # only the cutoff is used here
        except (IdentificationError, ValueError) as exc:
            raise CommandError(f"cannot choose a filter cutoff from {os.path.basename(args.log)} ({_one_line(exc)}); give --cutoff HZ") from None
        cutoff, filtering = choice.cutoff, {"order": choice.order}
        note = (f"cutoff {'none' if cutoff is None else f'{cutoff:g} Hz (order {choice.order})'} chosen by blocked cross-validation "
                "of the arm's model on the log")
    try:
        log = preprocess_log(raw, cutoff=cutoff, **filtering)
        base = preprocess_log(base_raw, cutoff=cutoff, **filtering) if base_raw is not None else None
        result = identify_payload(arm, log, baseline=base)
    except (LogError, IdentificationError) as exc:
        raise CommandError(f"cannot identify the payload: {_one_line(exc)}") from None
    held = arm.with_payload(result.mass, result.com, result.inertia).replace(name=f"{arm.name}-with-payload")
    report = {"log": os.path.abspath(args.log), "baseline": os.path.abspath(args.baseline) if args.baseline else None,
              "arm": arm.name, "cutoff_hz": cutoff, **result.report(), "parameter_names": list(PAYLOAD_PARAMETERS)}
    files = _Outputs()
    try:
        text = arm_to_toml(held, comment=f"{held.name}: payload identified by 'jaxarm identify-payload' from {os.path.basename(args.log)}")
        files.write(args.out, lambda f: f.write(text.encode("utf-8")))
        if args.report:
            files.write(args.report, lambda f: f.write((json.dumps(report, indent=2) + "\n").encode("utf-8")))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write the results: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()
    if note:
        print(f"jaxarm: {os.path.basename(args.log)}: {note}", file=sys.stderr)
    c, s = result.com, result.com_std
    print(f"payload ({result.method}): mass {result.mass:.4g} +- {result.std[0]:.2g} kg, "
          f"COM ({c[0]:.4g}, {c[1]:.4g}, {c[2]:.4g}) +- ({s[0]:.2g}, {s[1]:.2g}, {s[2]:.2g}) m in the tool frame")
    print("inertia about the COM [kg m^2]: " + ", ".join(f"{x:.4g}" for x in result.inertia[[0, 1, 2, 0, 0, 1], [0, 1, 2, 1, 2, 2]])
          + " (xx, yy, zz, xy, xz, yz)")
    print("physically consistent: " + ("yes" if result.consistent else "no: moved onto the consistent set"))
    print("torque RMSE with / without the payload model: " + ", ".join(f"{a:.3g}/{b:.3g}" for a, b in zip(result.rmse, result.rmse_without)))
    print("wrote " + ", ".join(p for p, _ in outputs) + f" ({args.out}: the arm holding the payload)")
    return EXIT_OK
