"""Output-error refinement on the real Panda log: does simulating the identified arm under the
logged torques, and refining it so the simulation follows the measured motion, improve what the
model predicts on data it has not seen?

Data: ``panda_excitation_traj1.csv`` (Gaz et al. 2019), read from ``../shared/data/panda/`` beside
the repository (or ``--log PATH``). For each contiguous 70/30 split:

1. ``jaxarm identify LOG --arm panda --out x.toml --fit-until T`` (or ``--fit-from T``), as a user
   types it: the inverse-dynamics fit, cutoff and Coulomb shape chosen from the log.
2. :func:`jaxarm.identify.output_error.refine_output_error` from that arm on the fitted part,
   preprocessed the same way (windows of ``--window`` s, the logged torques as input).
3. On the held-out part, for the inverse-dynamics fit, the refined arm and the published model
   (Gaz et al.'s links and sigmoid friction): the torque RMSE (accelerations from the velocity
   low-passed at the chosen cutoff, against the measured torques) and the position RMSE of
   open-loop simulations of ``--window`` s driven by the measured torques.

Prints one JSON line per split.

    python experiments/identify_output_error.py [--log PATH] [--window 0.1] [--iterations 15]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.identify.output_error import refine_output_error, simulation_error  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from identify_defaults import identify_split, splits  # noqa: E402
from identify_panda import DATA, published_arm  # noqa: E402


def run_split(log_path: Path, split: str, at: float, folder: Path, window: float, iterations: int) -> dict:
    _, out, rep, _, identify_seconds = identify_split(log_path, split, at, folder)
    cutoff = rep["preprocessing"]["cutoff"]
    identified = jaxarm.load_arm(out)
    raw = jaxarm.load_log(log_path, identified)
    before, after = raw.split(at)
    fit_raw, held_raw = (before, after) if split == "last" else (after, before)
    fit_log = jaxarm.preprocess_log(fit_raw, cutoff=cutoff)
    started = time.perf_counter()
    refined = refine_output_error(identified, fit_log, window=window, iterations=iterations)
    refine_seconds = time.perf_counter() - started
    # held out: torques against the measured (unfiltered) torques; simulations from filtered states
    held_tau = jaxarm.preprocess_log(held_raw, cutoff=cutoff, trim=0.0, filter_torque=False)
    held_sim = jaxarm.preprocess_log(held_raw, cutoff=cutoff)
    row = {"split": f"{split} 30 % held out", "cutoff_hz": cutoff, "window_s": window, "iterations": iterations,
           "windows": refined.windows, "identify_seconds": round(identify_seconds, 1), "refine_seconds": round(refine_seconds, 1),
           "refine_message": refined.message}
    for label, arm in (("inverse_dynamics_fit", identified), ("output_error_refined", refined.arm), ("published", published_arm())):
        tau = jaxarm.torque_rmse(held_tau.tau, jaxarm.predict_torques(arm, held_tau.q, held_tau.dq, held_tau.ddq))
        pos = simulation_error(arm, held_sim, window=window)
        row[label] = {"heldout_torque_rmse": np.round(tau, 4).tolist(), "heldout_position_rmse_mrad": np.round(1e3 * pos, 4).tolist(),
                      "consistent": all(r.ok or r.massless for r in jaxarm.consistency_report(arm, drives=True).values())}
    for what in ("heldout_torque_rmse", "heldout_position_rmse_mrad"):
        a, b = np.array(row["output_error_refined"][what]), np.array(row["inverse_dynamics_fit"][what])
        row[f"{what}_refined_over_fit_mean_ratio"] = round(float(np.mean(a / b)), 3)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", default=str(DATA), help="the Panda log (default: ../shared/data/panda/...)")
    p.add_argument("--window", type=float, default=0.1, help="seconds per simulated window (default 0.1)")
    p.add_argument("--iterations", type=int, default=15, help="Levenberg-Marquardt iterations (default 15)")
    args = p.parse_args(argv)
    log = Path(args.log)
    with tempfile.TemporaryDirectory() as tmp:
        for split, at in splits(log):
            print(json.dumps(run_split(log, split, at, Path(tmp), args.window, args.iterations)), flush=True)


if __name__ == "__main__":
    main()
