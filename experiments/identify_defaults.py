"""``jaxarm identify`` with no tuning flags on the real Panda log, on both contiguous 70/30 splits.

Data: ``panda_excitation_traj1.csv`` (Gaz et al. 2019, "Trajectory_1"), read from
``../shared/data/panda/`` beside the repository (or ``--log PATH``); never copied.

For each split -- last 30 % held out (``--fit-until``) and first 30 % held out (``--fit-from``) --
the command runs exactly as a user types it (``jaxarm identify LOG --arm panda --out x.toml
--fit-until T --report r.json``: the filter cutoff and the Coulomb shape chosen from the log), and
the published model (the bundled arm, Gaz et al.'s consistent links, plus their sigmoid friction)
is evaluated on the same held-out part the same way (accelerations from the logged velocity
low-passed at the chosen cutoff, compared with the measured torques). Prints JSON lines: one per
split with both models' held-out RMSE per joint, their ratio, the wall time of the command, and a
verdict for the targets (every joint no worse than the published model; mean ratio <= 0.8).

    python experiments/identify_defaults.py [--log PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.cli import main as jaxarm_main  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the log's place, Gaz et al.'s friction and their reported held-out errors: one copy, there
from identify_panda import DATA, PUBLISHED as PUBLISHED_LAST, published_arm  # noqa: E402

def identify_split(log: Path, split: str, at: float, folder: Path):
    """``jaxarm identify LOG --arm panda --out X.toml --report X.json --fit-until|--fit-from T`` as a
    user types it: (argv, the arm file, the report, its stdout, seconds)."""
    out, report = folder / f"{split}.toml", folder / f"{split}.json"
    flag = "--fit-until" if split == "last" else "--fit-from"
    argv = ["identify", str(log), "--arm", "panda", "--out", str(out), "--report", str(report), flag, str(at)]
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as text, contextlib.redirect_stderr(io.StringIO()) as notes:
        code = jaxarm_main(argv)
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"jaxarm {' '.join(argv)} failed ({code}): {notes.getvalue()}")
    return argv, out, json.loads(report.read_text()), text.getvalue(), seconds


def splits(log: Path):
    """The two contiguous 70/30 splits of the log: ("last", T) fits before T, ("first", T) from T."""
    if not log.exists():
        raise SystemExit(f"{log}: not found (the Panda log lives in ../shared/data/panda/ beside the repository)")
    raw = jaxarm.load_log(log, jaxarm.load_arm("panda"))
    t0, T = raw.t[0], raw.duration
    return [("last", float(t0 + 0.7 * T)), ("first", float(t0 + 0.3 * T))]


def run_split(log: Path, split: str, at: float, folder: Path) -> dict:
    argv, _, rep, stdout, seconds = identify_split(log, split, at, folder)
    cutoff = rep["preprocessing"]["cutoff"]
    raw = jaxarm.load_log(log, jaxarm.load_arm("panda"))
    before, after = raw.split(at)
    held_raw = after if split == "last" else before
    order = rep["preprocessing"]["order"]
    held = jaxarm.preprocess_log(held_raw, cutoff=cutoff, order=order, trim=0.0, filter_torque=False)
    published = jaxarm.torque_rmse(held.tau, jaxarm.predict_torques(published_arm(), held.q, held.dq, held.ddq))
    ours = np.array(rep["rmse"]["heldout"])
    ratio = ours / published
    row = {
        "split": f"{split} 30 % held out", "command": "jaxarm " + " ".join(argv[:1] + ["LOG"] + argv[2:]),
        "seconds": round(seconds, 1), "cutoff_hz": cutoff, "filter_order": order, "coulomb_velocity_scale": rep["coulomb_velocity_scale"], "friction_models": rep.get("friction_models"), "regularization": rep["regularization"]["weight"],
        "heldout_rmse": np.round(ours, 4).tolist(), "published_rmse_same_evaluation": np.round(published, 4).tolist(),
        "ratio": np.round(ratio, 3).tolist(), "mean_ratio": round(float(np.mean(ratio)), 3),
        "every_joint_no_worse": bool(np.all(ratio <= 1.0)), "mean_ratio_at_most_0.8": bool(np.mean(ratio) <= 0.8),
        "consistent": rep["consistent"], "stdout": stdout.splitlines()[-12:],
    }
    if split == "last":
        row["ratio_to_published_as_reported"] = np.round(ours / PUBLISHED_LAST, 3).tolist()
        row["mean_ratio_to_published_as_reported"] = round(float(np.mean(ours / PUBLISHED_LAST)), 3)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", default=str(DATA), help="the Panda log (default: ../shared/data/panda/...)")
    args = p.parse_args(argv)
    log = Path(args.log)
    with tempfile.TemporaryDirectory() as tmp:
        for split, at in splits(log):
            print(json.dumps(run_split(log, split, at, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
