"""``jaxarm identify``: identify an arm's parameters from a log."""

from __future__ import annotations

import os
import sys
import warnings

from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    _load_arm,
    _numbers,
    _one_line,
    _Outputs,
    _positive,
    _table,
)

IDENTIFY_METHODS = ("consistent", "linear")


def _identify_plot(fmt, t, measured, predicted, label):
    """A writer (file -> None) drawing measured vs predicted torques per joint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = measured.shape[1]
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.6 * n + 0.8), sharex=True, squeeze=False)
    for j, ax in enumerate(axes[:, 0]):
        ax.plot(t, measured[:, j], color="0.55", lw=0.8, label="measured")
        ax.plot(t, predicted[:, j], color="C0", lw=0.9, label="identified model")
        ax.set_ylabel(f"tau{j + 1}")
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=2)
    axes[-1, 0].set_xlabel(f"t [s] ({label})")
    fig.tight_layout()

    def write(f):
        fig.savefig(f, format=fmt, dpi=110)
        plt.close(fig)

    return write


def _cmd_identify(args) -> int:
    """Fit an arm's parameters to a torque log; write the arm file (and report, plot) atomically."""
    import json

    from ..identify import consistent as ci
    from ..identify.fit import identify_linear, predict_torques, torque_rmse
    from ..identify.linear_model import IdentificationError
    from ..identify.logs import LogError, load_log, preprocess_log
    from ..model.arm_files import arm_to_toml
    from ..model.consistency import consistency_report

    outputs = [(args.out, "--out")] + [(p, o) for p, o in ((args.report, "--report"), (args.plot, "--plot")) if p]
    paths = [os.path.abspath(p) for p, _ in outputs]
    if len(set(paths)) != len(paths) or os.path.abspath(args.log) in paths:
        raise CommandError("--out, --report, --plot: expected distinct files, none of them the log")
    for path, option in outputs:
        _Outputs.check(path, option)
    if args.method == "linear" and args.friction == "sigmoid":
        raise CommandError("--friction sigmoid: the sigmoid model is not linear in its parameters; use --method consistent "
                           "(--method linear keeps the arm's own sigmoid friction as known)")
    steps = int(_positive(args.steps, "--steps", "a number of iterations")) if args.steps is not None else 500
    regularization = _numbers(args.regularization, "--regularization")[0]
    if regularization < 0:
        raise CommandError(f"--regularization: expected a weight >= 0, got {regularization:g}")
    rate = _positive(args.rate, "--rate", "a sample rate [Hz]") if args.rate is not None else None
    cutoff = _positive(args.cutoff, "--cutoff", "a cutoff frequency [Hz]") if args.cutoff is not None else None
    fit_until = _numbers(args.fit_until, "--fit-until")[0] if args.fit_until is not None else None
    if args.plot:
        from .plotting import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as exc:
            raise CommandError(str(exc), EXIT_FAILURE) from None

    arm = _load_arm(args.arm)
    try:
        raw = load_log(args.log, arm)
    except FileNotFoundError:
        raise CommandError(f"{args.log}: no such file") from None
    except (LogError, OSError) as exc:
        raise CommandError(_one_line(exc)) from None
    where = os.path.basename(args.log)
    if raw.tau is None:
        raise CommandError(f"{where}: no torque columns (tau1..tau{arm.n}): identification fits the parameters to measured joint torques")
    fit_raw, held_raw = (raw, None) if fit_until is None else raw.split(fit_until)
    if held_raw is not None and len(held_raw) == 0:
        raise CommandError(f"--fit-until: {fit_until:g} s is after the log's last sample (t = {raw.t[-1]:g} s): nothing is held out")
    preprocessing = dict(rate=rate, cutoff=cutoff, velocity="auto")
    try:
        if len(fit_raw) < 3:
            raise LogError(f"{where}: only {len(fit_raw)} samples before --fit-until {fit_until:g} s")
        fit_log = preprocess_log(fit_raw, **preprocessing)
        held = None if held_raw is None else preprocess_log(held_raw, **preprocessing, trim=0.0, filter_torque=False)
    except LogError as exc:
        raise CommandError(f"cannot identify from {where}: {_one_line(exc)}") from None

    # The linear (base-parameter) fit: identifiability check, condition number, standard deviations.
    try:
        linear = identify_linear(arm, fit_log)
    except IdentificationError as exc:
        raise CommandError(f"cannot identify {arm.name} from {where}: {_one_line(exc)}") from None
    if args.method == "linear":
        fitted, optimizer = linear.arm, None
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ci.PriorNudgedWarning)
            fit = ci.fit_consistent(arm, fit_log.q, fit_log.dq, fit_log.ddq, fit_log.tau, friction=args.friction,
                                    regularization=regularization, max_steps=steps)
        for w in caught:
            print(f"jaxarm: warning: {_one_line(w.message)}", file=sys.stderr)
        fitted = fit.arm
        optimizer = {"iterations": fit.iterations, "converged": fit.converged, "message": fit.message,
                     "regularization": regularization, "loss_history_first_last": [float(fit.loss_history[0]), float(fit.loss_history[-1])]}
    fitted = fitted.replace(name=f"{arm.name}-identified")

    rmse_fit = torque_rmse(fit_log.tau, predict_torques(fitted, fit_log.q, fit_log.dq, fit_log.ddq))
    rmse_held = None if held is None else torque_rmse(held.tau, predict_torques(fitted, held.q, held.dq, held.ddq))
    consistency = consistency_report(fitted)
    report = {
        "log": os.path.abspath(args.log),
        "arm": arm.name,
        "method": args.method,
        "friction": args.friction if args.method == "consistent" else "viscous-coulomb (linear)",
        "fit_until": fit_until,
        "preprocessing": {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in fit_log.info.items()},
        "samples": {"fit": len(fit_log), "heldout": 0 if held is None else len(held)},
        "rmse": {"fit": rmse_fit.tolist(), "heldout": None if rmse_held is None else rmse_held.tolist(),
                 "heldout_torque": "measured (not filtered)", "fit_torque": "filtered like q and dq" if cutoff else "as logged"},
        "linear": linear.report(),
        "condition_number": linear.condition_number,
        "optimizer": optimizer,
        "consistency": {label: {"ok": bool(r.ok), "problems": list(r.problems)} for label, r in consistency.items()},
        "consistent": all(r.ok or r.massless for r in consistency.values()),
    }
    comment = (f"{fitted.name}: identified by 'jaxarm identify' ({args.method}) from {where}"
               + (f" (t < {fit_until:g} s)" if fit_until is not None else ""))
    text = arm_to_toml(fitted, comment=comment)
    files = _Outputs()
    try:
        files.write(args.out, lambda f: f.write(text.encode("utf-8")))
        if args.report:
            files.write(args.report, lambda f: f.write((json.dumps(report, indent=2) + "\n").encode("utf-8")))
        if args.plot:
            shown = held if held is not None else fit_log
            fmt = os.path.splitext(args.plot)[1].lstrip(".").lower() or "png"
            files.write(args.plot, _identify_plot(fmt, shown.t, shown.tau,
                                                  predict_torques(fitted, shown.q, shown.dq, shown.ddq),
                                                  "held-out part" if held is not None else "fitted part"))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write the results: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()

    print(f"{arm.name}: identified from {where} ({args.method}; {len(fit_log)} samples"
          + (f", held out t >= {fit_until:g} s" if fit_until is not None else "") + ")")
    rows = [[j + 1, f"{rmse_fit[j]:.4g}", "-" if rmse_held is None else f"{rmse_held[j]:.4g}"] for j in range(arm.n)]
    print(_table(["joint", "RMSE fit", "RMSE held-out"], rows, indent=""))
    print(f"base regressor: rank {linear.rank}, condition number {linear.condition_number:.4g}")
    bad = [label for label, r in consistency.items() if not (r.ok or r.massless)]
    print("physically consistent: " + ("yes" if not bad else "NO (" + ", ".join(bad) + ")"))
    print("wrote " + ", ".join(p for p, _ in outputs))
    return EXIT_OK
