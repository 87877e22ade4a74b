"""Batched rollouts beside MuJoCo: the rollout part of benchmarks/benchmark.py, plus a plot.

    python experiments/batched_rollouts.py                       # Puma 560, batch 1 .. 16384, 1000 steps at 1 ms
    python experiments/batched_rollouts.py --quick               # batch 1, 64; 100 steps
    python experiments/batched_rollouts.py --arms panda --plot rollouts.png

A thin front end: it runs ``benchmark.py --quantities rollout_rk3,rollout_rk4,compile --peers
mujoco`` (jaxarm RK3 and RK4 vs ``mujoco.rollout`` RK4 with one thread per core, same arm, same dt,
in the same run; see benchmark.py for what is measured and how) and optionally plots steps per
second against the batch size. Options other than ``--plot`` go to benchmark.py unchanged, so
``--dtypes``, ``--rollout-batches``, ``--steps``, ``--peers mujoco,mjx``, ``--record`` ... all work.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import benchmark  # noqa: E402
from jaxarm.arm_files import write_atomic  # noqa: E402


def plot(rows, path):
    """Steps per second against batch size, one line per (arm, implementation, quantity, dtype)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {}
    for r in rows:
        if r["unit"] == "steps/s":
            label = f"{r['arm']} {r['implementation']} {r['quantity'].replace('rollout_', '')} {r['dtype']}"
            series.setdefault(label, []).append((r["batch"], r["value"]))
    for label, pts in series.items():
        pts.sort()
        ax.loglog(*zip(*pts), marker="o", label=label)
    ax.set_xlabel("batch size (rollouts)")
    ax.set_ylabel("simulated steps per second")
    ax.set_title("Batched rollouts, same arm, same dt")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=120))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    p.add_argument("--plot", default=None, help="write a throughput-vs-batch PNG here")
    args, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    defaults = ["--arms", "puma560", "--dtypes", "float64", "--quantities", "rollout_rk3,rollout_rk4,compile", "--peers", "mujoco"]
    run = benchmark.main(defaults + rest)  # later options win in argparse
    if args.plot:
        plot(run["rows"], args.plot)
    return run


if __name__ == "__main__":
    main()
