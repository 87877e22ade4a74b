"""Physically consistent identification of the Franka Emika Panda from its real excitation log.

Data: ``panda_excitation_traj1.csv`` (Gaz et al. 2019, "Trajectory_1"), read from
``../shared/data/panda/`` beside the repository (or ``--log PATH``); never copied.

1. Start: ``arms/panda.toml`` (Gaz et al.'s physically consistent link parameters) plus the paper's
   sigmoid friction (phi1..phi3 per joint, Gaz et al. 2019, supplementary Table I): the published model.
2. Fit part (t < ``--fit-until``, default 14.7 s), preprocessed ON ITS OWN (so no held-out sample
   reaches the fit through the filter) as the log's authors prescribe:
   ``preprocess_log(rate=1000, cutoff=10, velocity="logged")`` -- resampled to 1 kHz, zero-phase
   4th-order Butterworth at 10 Hz on q, the logged dq and the torques, ddq by central differences,
   0.4 s trimmed at both ends -- then decimated by ``--decimate`` for speed (the signals are
   band-limited to 10 Hz, so 500 Hz keeps all their content). The torques ARE filtered for
   fitting: the same zero-phase filter on tau as on dq/ddq keeps model and measurement on equal
   footing and removes sensor noise that no model can predict (the residual is then model error).
3. ``jaxarm.consistent_identification.fit_consistent``: log-Cholesky link parameters (consistent by
   construction), Ia, fv, fo and the sigmoid friction per joint (``--friction sigmoid``), each
   joint's residual weighted by 1 / (its starting RMSE)^2, regularized towards the published
   model (log-det divergence, weight ``--regularization``).
4. Held-out part (t >= 14.7 s), computed the way the published numbers are: the whole log
   resampled to 1 kHz, the logged velocity low-passed (zero phase, 4th order, 10 Hz), central
   differences for ddq, no trimming; compared with the MEASURED (resampled, unfiltered) torques.
   The published model is evaluated the same way here (for reference) beside the numbers its authors report.
5. For comparison: the linear base-parameter least squares (``identify_linear``) on the same
   fit data, the sigmoid friction of the published model kept as known.

Prints JSON lines (one per joint, then a summary and the consistency verdicts), then a table.
``--plot fit.png`` draws measured vs predicted torques on the held-out part (written atomically).
Run: python experiments/identify_panda.py [--quick] [--plot fit.png] [--save identified.toml]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import consistent_identification as ci  # noqa: E402
from jaxarm.arm_files import write_atomic  # noqa: E402
from jaxarm.identification import IdentificationError, identify_linear, predict_torques, torque_rmse  # noqa: E402
from jaxarm.logs import load_log, preprocess_log  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "panda" / "panda_excitation_traj1.csv"
# Gaz et al. 2019 RA-L, supplementary Table I: sigmoid friction per joint.
SIGMOID = np.array([
    [0.54615, 5.1181, 0.039533],
    [0.87224, 9.0657, 0.025882],
    [0.64068, 10.136, -0.04607],
    [1.2794, 5.5903, 0.036194],
    [0.83904, 8.3469, 0.026226],
    [0.30301, 17.133, -0.021047],
    [0.56489, 10.336, 0.0035526],
])
# Held-out RMSE of the published model (as its authors report it), N m.
PUBLISHED = np.array([0.350, 0.726, 0.312, 0.471, 0.140, 0.130, 0.062])
PREPROCESSING = dict(rate=1000.0, cutoff=10.0, velocity="logged")


def published_arm():
    arm = jaxarm.load_arm("panda")
    return arm.replace(drives=dataclasses.replace(arm.drives, sigmoid_friction=SIGMOID.copy()))


def save_figure_atomic(fig, path):
    """Save a matplotlib figure to a temporary file beside ``path``, then rename it into place."""
    write_atomic(path, lambda f: fig.savefig(f, format=Path(path).suffix.lstrip(".") or "png", dpi=110))


def plot_heldout(path, t, measured, predictions):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = measured.shape[1]
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.7 * n), sharex=True)
    for j, ax in enumerate(axes):
        ax.plot(t, measured[:, j], color="0.6", lw=0.8, label="measured")
        for (label, tau), style in zip(predictions.items(), ("C0", "C3--", "C2:")):
            ax.plot(t, tau[:, j], style, lw=0.9, label=label)
        ax.set_ylabel(f"tau{j + 1} [N m]")
    axes[0].legend(loc="upper right", ncol=len(predictions) + 1, fontsize=8)
    axes[-1].set_xlabel("t [s] (held-out part)")
    fig.suptitle("Panda: measured vs predicted joint torques on the held-out part")
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", default=str(DATA), help=f"the Panda log (default {DATA})")
    parser.add_argument("--fit-until", type=float, default=14.7, help="fit on t < T, evaluate on t >= T (default 14.7 s)")
    parser.add_argument("--friction", choices=ci.FRICTION_MODELS, default="sigmoid")
    parser.add_argument("--regularization", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=1000, help="L-BFGS iterations (default 1000)")
    parser.add_argument("--decimate", type=int, default=2, help="keep every k-th fit sample (default 2: 500 Hz)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 40 iterations on 100 Hz fit data")
    parser.add_argument("--no-linear", action="store_true", help="skip the linear least-squares comparison")
    parser.add_argument("--plot", metavar="FILE.png", help="measured vs predicted torques on the held-out part")
    parser.add_argument("--save", metavar="FILE.toml", help="write the identified arm file")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.decimate = 40, 10

    path = Path(args.log)
    if not path.exists():
        print(f"identify_panda: {path}: no such file (give --log PATH)", file=sys.stderr)
        return 2
    prior = published_arm()
    raw = load_log(path, prior)
    fit_log = preprocess_log(raw.slice(None, args.fit_until), **PREPROCESSING, decimate=args.decimate)
    whole = preprocess_log(raw, **PREPROCESSING, trim=0.0, filter_torque=False)
    held = whole.slice(args.fit_until, None)

    t0 = time.perf_counter()
    fit = ci.fit_consistent(prior, fit_log.q, fit_log.dq, fit_log.ddq, fit_log.tau, friction=args.friction,
                            regularization=args.regularization, max_steps=args.steps)
    seconds = time.perf_counter() - t0

    predictions = {"consistent fit": predict_torques(fit.arm, held.q, held.dq, held.ddq),
                   "published model": predict_torques(prior, held.q, held.dq, held.ddq)}
    rmse = {k: torque_rmse(held.tau, v) for k, v in predictions.items()}
    linear = None
    if not args.no_linear:
        try:
            linear = identify_linear(prior, fit_log)
            predictions["linear LS (base parameters)"] = predict_torques(linear.arm, held.q, held.dq, held.ddq)
            rmse["linear LS (base parameters)"] = torque_rmse(held.tau, predictions["linear LS (base parameters)"])
        except IdentificationError as exc:
            print(json.dumps({"linear": "failed", "reason": str(exc)}))

    n = prior.n
    fitted = rmse["consistent fit"]
    for j in range(n):
        row = {"joint": j + 1, "rmse_fit": float(fitted[j]), "rmse_published_readme": float(PUBLISHED[j]),
               "rmse_published_model_here": float(rmse["published model"][j]),
               "rmse_fit_data": float(fit.rmse[j]), "rms_measured": float(np.sqrt(np.mean(held.tau[:, j] ** 2))),
               "at_or_below_published": bool(fitted[j] <= PUBLISHED[j])}
        if linear is not None:
            row["rmse_linear"] = float(rmse["linear LS (base parameters)"][j])
        print(json.dumps(row))
    consistent = {label: bool(r.ok) for label, r in fit.consistency.items()}
    summary = {"summary": "identify_panda", "all_joints_at_or_below_published": bool(np.all(fitted <= PUBLISHED)),
               "all_links_consistent": all(consistent.values()), "friction": args.friction,
               "regularization": args.regularization, "iterations": fit.iterations, "converged": fit.converged,
               "message": fit.message, "fit_seconds": round(seconds, 1), "fit_samples": len(fit_log),
               "heldout_samples": len(held), "quick": args.quick}
    if linear is not None:
        bad = [label for label, r in jaxarm.consistency_report(linear.arm).items() if not r.ok]
        summary["linear_inconsistent_links"] = bad
        summary["linear_condition_number"] = linear.condition_number
    print(json.dumps(summary))
    print(json.dumps({"consistency": {k: ("ok" if v else "; ".join(fit.consistency[k].problems)) for k, v in consistent.items()}}))
    print(json.dumps({"sigmoid_friction": np.asarray(fit.arm.drives.sigmoid_friction).round(5).tolist()}))

    header = f"{'joint':>5}  {'fit':>7}  {'published':>9}  {'published*':>10}" + ("  {:>7}".format("linear") if linear is not None else "")
    print("\nHeld-out RMSE [N m] (t >= %.1f s; published = as its authors report it, * = evaluated here)" % args.fit_until)
    print(header)
    for j in range(n):
        line = f"{j + 1:>5}  {fitted[j]:7.3f}  {PUBLISHED[j]:9.3f}  {rmse['published model'][j]:10.3f}"
        if linear is not None:
            line += f"  {rmse['linear LS (base parameters)'][j]:7.3f}"
        print(line)
    if args.plot:
        plot_heldout(args.plot, held.t, held.tau, predictions)
        print(f"wrote {args.plot}")
    if args.save:
        jaxarm.save_arm(fit.arm, args.save, comment=f"Panda identified by experiments/identify_panda.py from {path.name} (t < {args.fit_until} s)")
        print(f"wrote {args.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
