"""``jaxarm export``: an arm as URDF or MJCF."""

from __future__ import annotations

import sys
import warnings

from .common import EXIT_FAILURE, EXIT_OK, CommandError, _load_arm, _one_line, _Outputs


def _cmd_export(args) -> int:
    from ..model.mjcf import to_mjcf
    from ..model.urdf import to_urdf

    if not (args.urdf or args.mjcf):
        raise CommandError("export: expected --urdf FILE and/or --mjcf FILE")
    targets = [(path, flag) for path, flag in ((args.urdf, "--urdf"), (args.mjcf, "--mjcf")) if path]
    for path, flag in targets:
        _Outputs.check(path, flag, args.force)
    arm = _load_arm(args.arm, strict=args.strict)
    texts = []
    for path, flag in targets:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                text = to_urdf(arm) if flag == "--urdf" else to_mjcf(arm, timestep=float(args.timestep))
        except ValueError as exc:
            raise CommandError(f"{flag}: {_one_line(exc)}") from None
        for w in caught:
            print(f"jaxarm: warning: {_one_line(w.message)}", file=sys.stderr)
        texts.append((path, text))
    files = _Outputs()
    try:
        for path, text in texts:
            files.write(path, lambda f, text=text: f.write(text.encode("utf-8")))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()
    for path, _ in texts:
        print(f"wrote {path}")
    return EXIT_OK
