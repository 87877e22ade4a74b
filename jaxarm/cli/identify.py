"""``jaxarm identify``: identify an arm's parameters from a log."""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np

from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    _load_arm,
    _numbers,
    _one_line,
    _Outputs,
    _positive,
    _Status,
    _table,
)

IDENTIFY_METHODS = ("consistent", "linear")
VALIDATION_FRACTION = 0.25  # held out at the end of the log when no --fit-until is given


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


def _joint_names(spec, arm_spec: str, n: int):
    """--joint-names: comma-separated names or a URDF file; by default the names in --arm when it
    is a URDF file; None when neither (the log's columns are then q1..qn)."""
    from ..model.urdf import UrdfError, urdf_joint_names

    source = spec if spec is not None else (arm_spec if str(arm_spec).lower().endswith(".urdf") else None)
    if source is None:
        return None
    if str(source).lower().endswith(".urdf"):
        try:
            names = urdf_joint_names(source)
        except UrdfError as exc:
            raise CommandError(f"--joint-names: {_one_line(exc)}") from None
    else:
        names = tuple(x.strip() for x in str(source).split(",") if x.strip())
    if len(names) != n:
        raise CommandError(f"--joint-names: {len(names)} names for the arm's {n} joints")
    return names


def _read_log(path, arm, args, joint_names):
    """load_log with the command's --angles and --columns and the joint names, its errors as one
    line (for identify, identify-payload and estimate)."""
    from ..identify.logs import LogError, load_log

    try:
        return load_log(path, arm, angles=args.angles, columns=args.columns, joint_names=joint_names)
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except (LogError, OSError) as exc:
        raise CommandError(_one_line(exc)) from None


def _verdict(report: dict, rmse_held, rmse_held_start) -> dict:
    """Pass/fail per check with the threshold used, for a user's CI to gate on (``"pass"``: all).
    The conditioning threshold is the one the warnings use (:data:`jaxarm.identify.diagnostics.MAX_CONDITION`)."""
    from ..identify.diagnostics import MAX_CONDITION

    condition = float(report["linear"]["condition_number_scaled"])
    optimizer = report["optimizer"]
    checks = [
        {"check": "physically consistent (links, payload, drives)", "pass": bool(report["consistent"]),
         "failing": [k for k, v in report["consistency"].items() if not v["ok"]]},
        {"check": "held-out RMSE no worse than the starting arm's on every joint", "threshold": "ratio <= 1",
         "ratio": (np.asarray(rmse_held) / np.maximum(np.asarray(rmse_held_start), 1e-300)).round(4).tolist(),
         "pass": bool(np.all(np.asarray(rmse_held) <= np.asarray(rmse_held_start)))},
        {"check": "base regressor well conditioned (columns scaled)", "threshold": MAX_CONDITION,
         "value": condition, "pass": condition <= MAX_CONDITION},
        {"check": "no warnings about the log", "pass": not report["warnings"], "count": len(report["warnings"])},
    ]
    if optimizer is not None:
        checks.append({"check": "optimizer converged", "pass": bool(optimizer["converged"]), "message": optimizer["message"]})
    return {"pass": all(c["pass"] for c in checks), "checks": checks}


def _refine(arm, fit_log, held, where):
    """Output-error refinement of ``arm`` on ``fit_log`` (:func:`jaxarm.refine_output_error`). With a
    held-out part: its simulation (position) and torque errors before and after decide whether the
    refined arm is kept (simulation error lower on average, torque error not more than 2 % higher
    on average). Returns (the arm kept, the report's section)."""
    import time

    from ..identify.fit import predict_torques, torque_rmse
    from ..identify.linear_model import IdentificationError
    from ..identify.output_error import refine_output_error, simulation_error

    started = time.perf_counter()
    try:
        result = refine_output_error(arm, fit_log)
    except IdentificationError as exc:
        raise CommandError(f"--refine: cannot refine the model on {where}: {_one_line(exc)}") from None
    if held is None:
        return result.arm, None
    try:
        sim = [simulation_error(a, held) for a in (arm, result.arm)]
    except IdentificationError as exc:
        raise CommandError(f"--refine: the held-out part cannot be simulated: {_one_line(exc)}") from None
    tau = [torque_rmse(held.tau, predict_torques(a, held.q, held.dq, held.ddq)) for a in (arm, result.arm)]
    sim_ratio = float(np.mean(sim[1] / np.maximum(sim[0], 1e-300)))
    tau_ratio = float(np.mean(tau[1] / np.maximum(tau[0], 1e-300)))
    kept = sim_ratio < 1.0 and tau_ratio <= 1.02
    decision = (f"held-out simulation error x{sim_ratio:.3f}, torque error x{tau_ratio:.3f} (mean over joints) "
                f"after {result.iterations} Levenberg-Marquardt steps on {result.windows} windows of {result.window_steps} "
                f"samples: " + ("refined model kept" if kept else "refined model not kept (it must lower the simulation "
                                                                 "error without raising the torque error by more than 2 %)"))
    section = {"kept": kept, "decision": decision, "message": result.message, "seconds": round(time.perf_counter() - started, 1),
               "windows": result.windows, "window_steps": result.window_steps, "iterations": result.iterations,
               "heldout_simulation_rmse": {"before": sim[0].tolist(), "after": sim[1].tolist()},
               "heldout_torque_rmse": {"before": tau[0].tolist(), "after": tau[1].tolist()},
               "refined_on_whole_log": False}
    return (result.arm if kept else arm), section


def _cmd_identify(args) -> int:
    """Fit an arm's parameters to a torque log; write the arm file (and report, plot) atomically.
    On a terminal, a status line says which step is running (the Panda's 21 s log takes about a
    minute on two cores, most of it choosing the filter and the regularization)."""
    status = _Status()
    try:
        return _identify(args, status)
    finally:
        status.stop()


def _identify(args, status) -> int:
    import json

    from ..identify import consistent as ci
    from ..identify.fit import identify_linear, predict_torques, torque_rmse
    from ..identify.linear_model import IdentificationError
    from ..identify.logs import Log, LogError, preprocess_log
    from ..identify.diagnostics import conditioning_warning, identifiability, log_warnings
    from ..identify.export import check_export
    from ..identify.selection import REGULARIZATION_WEIGHTS, select_preprocessing, select_regularization, with_friction_model
    from ..model.arm_files import arm_to_toml
    from ..model.consistency import consistency_report

    outputs = [(args.out, "--out")] + [(p, o) for p, o in ((args.report, "--report"), (args.plot, "--plot"),
                                                           (args.html, "--html"), (args.urdf, "--urdf"), (args.mjcf, "--mjcf")) if p]
    paths = [os.path.abspath(p) for p, _ in outputs]
    if len(set(paths)) != len(paths) or any(os.path.abspath(p) in paths for p in args.log):
        raise CommandError("--out, --report, --plot: expected distinct files, none of them the log")
    for path, option in outputs:
        _Outputs.check(path, option, args.force)
    if args.method == "linear" and args.friction == "sigmoid":
        raise CommandError("--friction sigmoid: the sigmoid model is not linear in its parameters; use --method consistent "
                           "(--method linear keeps the arm's own sigmoid friction as known)")
    if args.refine and args.method == "linear":
        raise CommandError("--refine: output-error refinement keeps every link physically consistent; use --method consistent "
                           "(the default)")
    steps = int(_positive(args.steps, "--steps", "a number of iterations")) if args.steps is not None else 2000
    regularization = _numbers(args.regularization, "--regularization")[0] if args.regularization is not None else None
    if regularization is not None and regularization < 0:
        raise CommandError(f"--regularization: expected a weight >= 0, got {regularization:g}")
    rate = _positive(args.rate, "--rate", "a sample rate [Hz]") if args.rate is not None else None
    no_filter = args.cutoff is not None and str(args.cutoff).strip().lower() == "none"
    cutoff = None if args.cutoff is None or no_filter else _positive(args.cutoff, "--cutoff", "a cutoff frequency [Hz] or 'none'")
    fit_until = _numbers(args.fit_until, "--fit-until")[0] if args.fit_until is not None else None
    fit_from = _numbers(args.fit_from, "--fit-from")[0] if args.fit_from is not None else None
    if fit_until is not None and fit_from is not None:
        raise CommandError("--fit-until, --fit-from: give one of them (fit before T, or fit from T on)")
    if args.plot or args.html:
        from .plotting import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as exc:
            raise CommandError(str(exc), EXIT_FAILURE) from None

    status("reading the arm and the log")
    arm = _load_arm(args.arm)
    joint_names = _joint_names(args.joint_names, args.arm, arm.n)
    logs = []
    for path in args.log:
        logs.append(_read_log(path, arm, args, joint_names))
    try:
        raw = Log.concatenate(logs)  # several experiments: each one preprocessed on its own
    except LogError as exc:
        raise CommandError(_one_line(exc)) from None
    where = " + ".join(os.path.basename(p) for p in args.log)
    for path, log in zip(args.log, logs):
        if "columns" in log.info:
            print(f"jaxarm: {os.path.basename(path)}: {log.info['columns']}", file=sys.stderr)
    if raw.tau is None:
        raise CommandError(f"{where}: no torque columns (tau1..tau{arm.n}): identification fits the parameters to measured joint torques")
    # Without --fit-until the last quarter is held out to report validation errors, and the arm
    # file is then refitted on the whole log with the same choices.
    refit = fit_until is None and fit_from is None
    if fit_from is not None:
        split_at = fit_from
        held_raw, fit_raw = raw.split(fit_from)
        if len(held_raw) == 0:
            raise CommandError(f"--fit-from: {fit_from:g} s is at or before the log's first sample (t = {raw.t[0]:g} s): nothing is held out")
    else:
        split_at = raw.t[0] + (1.0 - VALIDATION_FRACTION) * raw.duration if refit else fit_until
        fit_raw, held_raw = raw.split(split_at)
        if len(held_raw) == 0:
            raise CommandError(f"--fit-until: {fit_until:g} s is after the log's last sample (t = {raw.t[-1]:g} s): nothing is held out")
    if refit and min(len(fit_raw), len(held_raw)) < 3:
        raise CommandError(f"cannot identify from {where}: the log is too short ({len(raw)} samples) to hold out its last "
                           "quarter for validation; log a longer motion")
    if len(fit_raw) < 3:
        raise CommandError(f"cannot identify from {where}: only {len(fit_raw)} samples to fit (split at t = {split_at:g} s): too short")

    start = arm
    choice = None
    notes = []  # printed once the identification has succeeded (a refusal is one line)
    if args.cutoff is None:  # chosen from the data (the training part only)
        try:
            # the Stribeck term is fitted by the consistent method only (its static level is not in
            # the linear method's parameter vector)
            stribeck = {} if args.method == "consistent" and args.friction != "sigmoid" else {"stribeck_velocities": (0.0,)}
            status("choosing the filter cutoff and friction models by cross-validation")
            choice = select_preprocessing(arm, fit_raw, rate=rate, **stribeck)
        except (IdentificationError, ValueError) as exc:
            notes.append(f"no filter: the log cannot choose a cutoff by cross-validation ({_one_line(exc)}); give --cutoff HZ")
        else:
            cutoff = choice.cutoff
            start = with_friction_model(arm, choice.coulomb_scales, choice.stribeck_velocities)
            notes.append(choice.reason())
    friction = args.friction or "viscous-coulomb"
    preprocessing = dict(rate=rate, cutoff=cutoff, velocity="auto")
    if choice is not None:
        preprocessing["order"] = choice.order  # chosen with the cutoff (else preprocess_log's default)

    def preprocess(part, **extra):
        try:
            return preprocess_log(part, **preprocessing, **extra)
        except LogError as exc:
            raise CommandError(f"cannot identify from {where}: {_one_line(exc)}") from None

    said = set()

    def fit(log):
        """The linear fit (identifiability, condition number, standard deviations), then the method's fit."""
        try:
            linear = identify_linear(start, log)
        except IdentificationError as exc:
            raise CommandError(f"cannot identify {arm.name} from {where}: {_one_line(exc)}") from None
        if args.method == "linear":
            if linear.active_bounds:
                line = ("jaxarm: note: the plain least-squares friction or rotor inertia was unphysical; held at its bound: "
                        + ", ".join(linear.active_bounds))
                if line not in said:
                    said.add(line)
                    print(line, file=sys.stderr)
            return linear, linear.arm, None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ci.PriorNudgedWarning)
            result = ci.fit_consistent(start, log.q, log.dq, log.ddq, log.tau, friction=friction,
                                       regularization=regularization, max_steps=steps, repair=True)
        for w in caught:
            line = f"jaxarm: warning: {_one_line(w.message)}"
            if line not in said:  # the refit on the whole log starts from the same arm
                said.add(line)
                print(line, file=sys.stderr)
        optimizer = {"iterations": result.iterations, "converged": result.converged, "message": result.message,
                     "regularization": regularization,
                     "loss_history_first_last": [float(result.loss_history[0]), float(result.loss_history[-1])]}
        return linear, result.arm, optimizer

    fit_log = preprocess(fit_raw)
    held = preprocess(held_raw, trim=0.0, filter_torque=False)
    reg_choice = None
    if args.method == "consistent":
        # whatever the user did not give is chosen by validation on the fitted part only
        weights = REGULARIZATION_WEIGHTS if regularization is None else (regularization,)
        # The sigmoid model is not a default candidate: its offset torque (Gaz et al.'s, beside the
        # sigmoid, with the Coulomb level held at 0) reads as Coulomb friction pushing along the
        # motion on one side, so a file that won on validation would fail the drive check.
        frictions = ("viscous-coulomb",) if args.friction is None else (args.friction,)
        if len(weights) * len(frictions) > 1:
            try:
                status(f"choosing the regularization by cross-validation ({len(weights) * len(frictions)} candidates)")
                reg_choice = select_regularization(start, fit_log, weights=weights, frictions=frictions, max_steps=min(steps, 200))
            except (IdentificationError, ValueError) as exc:
                notes.append(f"{friction} friction, regularization 1e-3 (the log is too short to choose them by validation: "
                             f"{_one_line(exc)})")
                regularization = 1e-3 if regularization is None else regularization
            else:
                regularization, friction = reg_choice.weight, reg_choice.friction
                notes.append(reg_choice.reason())
    elif regularization is None:
        regularization = 0.0
    status(f"fitting the {args.method} model on t < {split_at:.4g} s" if fit_from is None else
           f"fitting the {args.method} model on t >= {split_at:.4g} s")
    linear, fitted, optimizer = fit(fit_log)
    refinement = None
    if args.refine:
        # output-error refinement, judged on the held-out part (simulation and torque error)
        status("refining the model by simulation (output error)")
        fitted, refinement = _refine(fitted, fit_log, held, where)
    validated = fitted  # the model the held-out numbers and figures are about (fitted without them)
    predicted_held = predict_torques(validated, held.q, held.dq, held.ddq)
    rmse_held = torque_rmse(held.tau, predicted_held)
    rmse_held_start = torque_rmse(held.tau, predict_torques(arm, held.q, held.dq, held.ddq))
    if refit:
        status("fitting again on the whole log for the arm file")
        fit_log = preprocess(raw)
        linear, fitted, optimizer = fit(fit_log)
        if refinement is not None and refinement["kept"]:  # the same choice for the arm file, on the whole log
            fitted = _refine(fitted, fit_log, None, where)[0]
            refinement["refined_on_whole_log"] = True
    fitted = fitted.replace(name=f"{arm.name}-identified")
    # each experiment on its own (the joins between several logs are not gaps in any of them)
    warned = [w for log in logs for w in log_warnings(log)]
    warned += [w for w in [conditioning_warning(linear.condition_number_scaled)] if w]
    for note in notes:
        print(f"jaxarm: {where}: {note}", file=sys.stderr)
    for note in warned:
        print(f"jaxarm: warning: {where}: {note}", file=sys.stderr)

    rmse_fit = torque_rmse(fit_log.tau, predict_torques(fitted, fit_log.q, fit_log.dq, fit_log.ddq))
    consistency = consistency_report(fitted, drives=True)
    report = {
        "log": [os.path.abspath(p) for p in args.log] if len(args.log) > 1 else os.path.abspath(args.log[0]),
        "arm": arm.name,
        "method": args.method,
        "friction": friction if args.method == "consistent" else "viscous-coulomb (linear)",
        "coulomb_velocity_scale": np.asarray(start.drives.coulomb_velocity_scale, dtype=float).tolist(),
        "stribeck_velocity": np.asarray(start.drives.stribeck_velocity, dtype=float).tolist(),
        "friction_models": None if choice is None else choice.friction_models(),
        "fit_until": fit_until,
        "fit_from": fit_from,
        "validation": {"split_at": float(split_at), "heldout": "before" if fit_from is not None else "after",
                       "heldout_fraction": float(len(held_raw) / len(raw)),
                       "refitted_on_all": refit,
                       "how": ("default: the last quarter held out, then the arm refitted on the whole log" if refit
                               else "--fit-from: fitted on t >= T only" if fit_from is not None else "--fit-until: fitted on t < T only")},
        "selection": None if choice is None else {"reason": choice.reason(), "folds": choice.folds, "candidates": choice.table()},
        "regularization": {"weight": regularization, "chosen": reg_choice is not None,
                           "reason": None if reg_choice is None else reg_choice.reason(),
                           "candidates": None if reg_choice is None else list(reg_choice.rows)},
        "preprocessing": {k: (v if isinstance(v, (int, float, str, bool, type(None), list)) else str(v)) for k, v in fit_log.info.items()},
        "samples": {"fit": len(fit_log), "heldout": len(held)},
        "rmse": {"fit": rmse_fit.tolist(), "heldout": rmse_held.tolist(),
                 "heldout_torque": "measured (not filtered)", "fit_torque": "filtered like q and dq" if cutoff else "as logged"},
        "linear": linear.report(),
        "condition_number": linear.condition_number,
        "optimizer": optimizer,
        "consistency": {label: {"ok": bool(r.ok), "problems": list(r.problems)} for label, r in consistency.items()},
        "consistent": all(r.ok or r.massless for r in consistency.values()),
        "warnings": warned,
        "identifiability": identifiability(linear),
        "output_error": refinement,
    }
    exports = []
    for path, fmt in ((args.urdf, "urdf"), (args.mjcf, "mjcf")):
        if path:
            try:
                exports.append((path, check_export(fitted, fit_log.q, fit_log.dq, fit_log.ddq, fmt)))
            except ValueError as exc:
                hint = "; --method consistent keeps every link physical" if args.method == "linear" else ""
                raise CommandError(f"--{fmt}: the identified arm cannot be written: {_one_line(exc)}{hint} (nothing was written)",
                                   EXIT_FAILURE) from None
    report["exports"] = {os.path.abspath(path): c.report() for path, c in exports}
    report["verdict"] = _verdict(report, rmse_held, rmse_held_start)
    comment = (f"{fitted.name}: identified by 'jaxarm identify' ({args.method}) from {where}"
               + (f" (t < {fit_until:g} s)" if fit_until is not None else f" (t >= {fit_from:g} s)" if fit_from is not None else ""))
    text = arm_to_toml(fitted, comment=comment)
    status("writing the results")
    files = _Outputs()
    try:
        files.write(args.out, lambda f: f.write(text.encode("utf-8")))
        if args.report:
            files.write(args.report, lambda f: f.write((json.dumps(report, indent=2) + "\n").encode("utf-8")))
        for path, c in exports:
            files.write(path, lambda f, c=c: f.write(c.text.encode("utf-8")))
        if args.plot:
            shown = held
            fmt = os.path.splitext(args.plot)[1].lstrip(".").lower() or "png"
            files.write(args.plot, _identify_plot(fmt, shown.t, shown.tau, predicted_held,
                                                  "held-out part" + (", model fitted before it" if refit else "")))
        if args.html:
            from .report_html import identify_html

            page = identify_html(report, fitted, fit_log, held, predict_torques(fitted, fit_log.q, fit_log.dq, fit_log.ddq),
                                 predicted_held)
            files.write(args.html, lambda f: f.write(page.encode("utf-8")))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write the results: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()
    status.stop()

    print(f"{arm.name}: identified from {where} ({args.method}, {friction} friction; {len(fit_log)} samples)")
    if refit:
        print(f"validation: fitted on t < {split_at:.4g} s, held out t >= {split_at:.4g} s ({len(held)} samples); "
              "the arm file is then refitted on the whole log (give --fit-until T to fit on t < T only)")
    elif fit_from is not None:
        print(f"validation: fitted on t >= {split_at:.4g} s, held out t < {split_at:.4g} s ({len(held)} samples)")
    else:
        print(f"validation: fitted on t < {split_at:.4g} s, held out t >= {split_at:.4g} s ({len(held)} samples)")
    rows = [[j + 1, f"{rmse_fit[j]:.4g}", f"{rmse_held[j]:.4g}"] for j in range(arm.n)]
    print(_table(["joint", "RMSE fit", "RMSE held-out"], rows, indent=""))
    if refinement is not None:
        print("output-error refinement: " + refinement["decision"])
    print(f"base regressor: rank {linear.rank}, condition number {linear.condition_number:.4g}")
    print("identifiability: " + report["identifiability"]["summary"])
    bad = [label for label, r in consistency.items() if not (r.ok or r.massless)]
    print("physically consistent: " + ("yes" if not bad else "NO (" + ", ".join(bad) + ")"))
    failed = [c["check"] for c in report["verdict"]["checks"] if not c["pass"]]
    print("verdict: " + ("pass" if not failed else "FAIL (" + "; ".join(failed) + ")"))
    for path, c in exports:
        print(f"{os.path.basename(path)}: {c.summary()}")
    print("wrote " + ", ".join(p for p, _ in outputs))
    return EXIT_OK
