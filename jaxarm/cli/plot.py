"""``jaxarm plot``: draw a saved simulation."""

from __future__ import annotations

import os

from .common import EXIT_FAILURE, EXIT_OK, CommandError, _one_line, _Outputs


def _cmd_plot(args) -> int:
    from .plotting import load_results, plot_trajectory, require_matplotlib

    out = args.out or os.path.splitext(args.results)[0] + ".png"
    if os.path.abspath(out) == os.path.abspath(args.results):
        raise CommandError(f"--out: {out} would overwrite the results file")
    try:
        data = load_results(args.results)
    except ValueError as exc:
        raise CommandError(_one_line(exc)) from None
    _Outputs.check(out, "--out", args.force)
    try:
        require_matplotlib()
    except ImportError as exc:
        raise CommandError(str(exc), EXIT_FAILURE) from None
    files = _Outputs()
    fmt = os.path.splitext(out)[1].lstrip(".").lower() or "png"
    try:
        files.write(out, lambda f: plot_trajectory(data, f, format=fmt))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()
    print(f"wrote {out}")
    return EXIT_OK
