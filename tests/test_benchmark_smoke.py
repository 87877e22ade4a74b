"""Smoke test of the benchmark suite, benchmarks/benchmark.py. No timing is asserted.

One ``--quick --dtypes float64`` run in a subprocess (about 40 s on 2 idle cores, mostly compile
time): it must finish, print parseable JSON lines with the documented keys, write its ``--record``
file and compare itself with the repository's baseline. The peers' "same arm" checks are
asserted (they are correctness, not speed). The regression logic and the float32 check are tested
in-process on made-up rows and one small compiled program.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "benchmark.py"
KEYS = {"arm", "dtype", "quantity", "implementation", "batch", "value", "unit"}
UNITS = {
    "inverse_dynamics": "states/s",
    "mass_matrix": "states/s",
    "forward_dynamics": "states/s",
    "rollout_rk3": "steps/s",
    "rollout_rk4": "steps/s",
    "rollout_grad": "x forward",
    "compile": "s",
    "latency": "s",
}


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("jaxarm_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _installed(name):
    return importlib.util.find_spec(name) is not None


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    record = tmp_path_factory.mktemp("benchmark") / "run.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--dtypes", "float64", "--record", str(record)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"benchmark --quick failed:\n{proc.stderr[-4000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return lines, json.loads(record.read_text()), proc.stderr


def test_quick_prints_machine_then_measurements(quick):
    lines, _, _ = quick
    machine = lines[0]["machine"]
    for k in ("cpu", "cores", "python", "jax", "jaxlib", "numpy", "backend"):
        assert machine[k], k
    rows = [x for x in lines if "quantity" in x and "implementation" in x]
    references = [r for r in rows if r["quantity"] == "reference"]  # the machine's speed, for the regression check
    assert sorted(r["entry"] for r in references) == ["compile", "python"]
    assert all(r["unit"] == "s" and 0 < r["value"] < 60 for r in references)
    rows = [r for r in rows if r["quantity"] != "reference"]
    assert rows
    for r in rows:
        assert KEYS <= set(r), r
        assert r["unit"] == UNITS[r["quantity"]], r
        assert math.isfinite(r["value"]) and r["value"] > 0, r
        assert r["arm"] == "puma560" and r["dtype"] == "float64" and r["batch"] >= 1
    ours = {r["quantity"] for r in rows if r["implementation"].startswith("jaxarm ")}
    assert ours == {"inverse_dynamics", "mass_matrix", "forward_dynamics", "rollout_rk3", "compile", "latency"}
    entries = {r["entry"] for r in rows if r["quantity"] in ("compile", "latency")}
    assert {"inverse_dynamics", "rollout_rk3", "forward_dynamics_single"} <= entries


def test_quick_peers_are_labelled_and_simulate_the_same_arm(quick):
    lines, _, _ = quick
    rows = [x for x in lines if "implementation" in x]
    checks = {c["check"].split()[0]: c for c in lines if "check" in c}
    if _installed("pinocchio"):
        import pinocchio

        pin_rows = [r for r in rows if r["implementation"] == f"pinocchio {pinocchio.__version__}"]
        assert {r["quantity"] for r in pin_rows} == {"inverse_dynamics", "mass_matrix", "forward_dynamics"}
        assert checks["pinocchio"]["max_abs_diff"] < 1e-9 * max(1.0, checks["pinocchio"]["max_abs"])
        assert any(x.get("ratio", "").startswith("jaxarm inverse_dynamics / pinocchio") for x in lines)
    if _installed("mujoco"):
        import mujoco

        mj_rows = [r for r in rows if r["implementation"] == f"mujoco {mujoco.__version__}"]
        assert mj_rows and all(r["quantity"] == "rollout_rk4" and r["steps"] == 1000 for r in mj_rows)
        assert checks["mujoco.rollout"]["max_abs_diff"] < 1e-9
        assert any(x.get("ratio") == "jaxarm rk3 / mujoco rk4" for x in lines)


def test_quick_records_compares_and_reports_targets(quick):
    lines, record, stderr = quick
    rows = [x for x in lines if "quantity" in x and "implementation" in x]
    assert record["rows"] == rows and record["machine"] == lines[0]["machine"]
    assert "--quick" in record["command"]
    comparison = [x for x in lines if "comparison" in x]
    assert len(comparison) == 1
    if (ROOT / "benchmarks" / "baseline.json").exists():
        assert comparison[0]["matched"] > 0 and isinstance(comparison[0]["same_machine"], bool)
        compared = [x for x in lines if "compare" in x]
        assert len(compared) == comparison[0]["matched"]
        assert all(c["status"] in ("ok", "REGRESSION") and c["slowdown"] > 0 for c in compared)
    targets = [x for x in lines if "target" in x]
    assert any("compile" in t["target"] for t in targets)
    assert all(isinstance(t["met"], bool) for t in targets)
    assert "puma560 inverse_dynamics [states/s]" in stderr  # the summary table


def _row(quantity, library, value, unit, batch=256, dtype="float64", **extra):
    return dict(arm="puma560", dtype=dtype, quantity=quantity, implementation=f"{library} 1.0", batch=batch,
                value=value, unit=unit, **extra)


def test_regression_check_uses_the_same_run_peer_ratio():
    bench = _load_benchmark()
    base = [
        _row("inverse_dynamics", "jaxarm", 1e6, "states/s"),
        _row("inverse_dynamics", "pinocchio", 5e5, "states/s", batch=1),
        _row("mass_matrix", "jaxarm", 1e6, "states/s"),
        _row("mass_matrix", "pinocchio", 1e6, "states/s", batch=1),
        _row("compile", "jaxarm", 2.0, "s", entry="rollout_rk3", steps=1000),
    ]
    now = [
        _row("inverse_dynamics", "jaxarm", 5e5, "states/s"),  # half as fast, and so is the peer: slower machine
        _row("inverse_dynamics", "pinocchio", 2.5e5, "states/s", batch=1),
        _row("mass_matrix", "jaxarm", 5e5, "states/s"),  # half as fast while the peer is not: a regression
        _row("mass_matrix", "pinocchio", 1e6, "states/s", batch=1),
        _row("compile", "jaxarm", 2.8, "s", entry="rollout_rk3", steps=1000),  # 40 % longer, no peer
        _row("compile", "jaxarm", 9.0, "s", entry="rollout_rk3", steps=100),  # no baseline row: not compared
    ]
    out = {(c["compare"]["quantity"], c["compare"]["implementation"]): c for c in bench.compare(now, {"rows": base}, 0.30)}
    assert len(out) == 5
    idyn = out["inverse_dynamics", "jaxarm 1.0"]
    assert idyn["slowdown"] == pytest.approx(2.0) and idyn["slowdown_vs_peer"] == pytest.approx(1.0)
    assert idyn["status"] == "ok"
    assert out["mass_matrix", "jaxarm 1.0"]["status"] == "REGRESSION"
    assert out["compile", "jaxarm 1.0"]["slowdown"] == pytest.approx(1.4)
    assert out["compile", "jaxarm 1.0"]["status"] == "REGRESSION"
    assert out["inverse_dynamics", "pinocchio 1.0"]["status"] == "REGRESSION"  # peers: absolute only
    assert bench.compare(now, {"rows": base}, 1.5)[2]["status"] == "ok"


def test_mjx_rows_give_same_device_ratios_and_a_target_per_dtype():
    bench = _load_benchmark()
    rows = [
        _row("rollout_rk3", "jaxarm", 1e9, "steps/s", batch=100000, steps=1000),
        _row("rollout_rk3", "jaxarm", 2e8, "steps/s", batch=1024, steps=1000),
        _row("rollout_rk3", "jaxarm", 1.5e9, "steps/s", batch=100000, steps=1000, dtype="float32"),
        _row("rollout_rk4", "mjx", 1e7, "steps/s", batch=100000, steps=100),
        _row("rollout_rk4", "mjx", 1e8, "steps/s", batch=100000, steps=100, dtype="float32"),
        _row("rollout_rk4", "mjx", 1e6, "steps/s", batch=16384, steps=100),  # no jaxarm row at this batch
    ]
    ratios = {(r["dtype"], r["batch"]): r for r in bench.ratio_rows(rows)}
    assert set(ratios) == {("float64", 100000), ("float32", 100000)}  # same arm, dtype and batch only
    assert ratios["float64", 100000]["value"] == pytest.approx(100.0)
    assert ratios["float64", 100000]["ratio"] == "jaxarm rk3 / mjx rk4"
    cfg = argparse.Namespace(arms=["puma560"], dtypes=["float64", "float32"])
    goals = [g for g in bench.targets(rows, cfg) if "MJX" in g["target"]]
    assert [(g["achieved"], g["met"]) for g in goals] == [(pytest.approx(100.0), True), (pytest.approx(15.0), True)]
    assert all("MJX ran 100 steps" in g["note"] for g in goals)
    rows[2]["value"] = 5e8  # float32 now 5x MJX's float32 rate: that target is not met
    assert [g["met"] for g in bench.targets(rows, cfg) if "MJX" in g["target"]] == [True, False]


def test_float32_path_has_no_float64_in_the_compiled_program():
    bench = _load_benchmark()
    arm = bench.benchmark_arm("puma560").astype(jnp.float32)
    args = [jnp.zeros((4, arm.n), jnp.float32)] * 3
    compiled, timing = bench.compile_timed(jax.vmap(bench.dynamics_fn(arm, "inverse_dynamics")), *args)
    assert timing["value"] > 0 and timing["cpu_seconds"] > 0
    assert compiled(*args).dtype == jnp.float32
    assert bench.f64_ops(compiled) == 0
    arm64 = bench.benchmark_arm("puma560")
    c64, _ = bench.compile_timed(jax.vmap(bench.dynamics_fn(arm64, "inverse_dynamics")), *[np.zeros((4, arm.n))] * 3)
    assert bench.f64_ops(c64) > 0  # the counter can fail


def test_the_arm_gradient_entry_reports_its_own_forward_and_no_target(capsys):
    """``--grad-entries arm``: the gradient of the rollout cost with respect to the arm's standard
    parameters gets its own row, timed against the same cost with the arm traced, and is left out
    of the torque gradients' agreement check and of the <= 4x target."""
    bench = _load_benchmark()
    arm = bench.benchmark_arm("two_link_planar")
    cfg = argparse.Namespace(steps=5, dt=1e-3, grad_batches=[2], grad_entries=["arm"], quantities=["rollout_grad"], min_time=0.0)
    rec = bench.Recorder()
    bench.bench_jaxarm_grad(rec, "two_link_planar", arm, jnp.float64, cfg, np.random.default_rng(0))
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    (row,) = [r for r in rows if r.get("quantity") == "rollout_grad"]
    assert row["entry"] == "arm" and row["unit"] == "x forward"
    assert row["seconds"] > 0 and row["forward_seconds"] > 0 and math.isclose(row["value"], row["seconds"] / row["forward_seconds"])
    if _installed("resource"):  # the kernel's share of a call (benchmark.process_cost)
        assert row["page_faults"] >= 0 and row["system_seconds"] >= 0
    targets = bench.targets(rows, argparse.Namespace(arms=["two_link_planar"], dtypes=["float64"]))
    assert not [t for t in targets if "gradient / forward" in t["target"]]


def test_gradient_and_forward_are_timed_in_alternation():
    """paired_best_times runs the calls in turn, round after round, so a gradient / forward ratio
    compares calls made under the same conditions; each gets its best time per call."""
    import time

    bench = _load_benchmark()
    log = []

    def call(name, seconds):
        def run():
            log.append(name)
            time.sleep(seconds)
        return run

    fwd, grad = bench.paired_best_times([call("f", 0.002), call("g", 0.006)], min_time=0.2, rounds=4)
    assert 0.002 <= fwd < 0.02 and 0.006 <= grad < 0.03
    switches = sum(a != b for a, b in zip(log, log[1:]))
    assert log[:2] == ["f", "g"] and switches >= 2 * 4 - 1, log  # warm-ups, then f..g.. four times
    del log[:]  # a warm-up longer than long_call is the measurement: no rounds follow
    long_first = bench.paired_best_times([call("f", 0.0), call("g", 0.05)], min_time=1.0, long_call=0.01)
    assert long_first[1] >= 0.05 and log == ["f", "g"]


def test_process_cost_counts_the_page_faults_of_fresh_memory():
    """The page faults a gradient row reports: a call that takes 64 MB of fresh memory from the
    kernel faults it in (4 kB pages, or 2 MB huge pages where the kernel gives them), a call
    that touches nothing new does not."""
    pytest.importorskip("resource")
    bench = _load_benchmark()
    fresh = bench.process_cost(lambda: np.ones(8 * 2**20).sum(), calls=2)
    assert set(fresh) == {"page_faults", "system_seconds"}
    assert fresh["page_faults"] >= 32 and fresh["system_seconds"] >= 0
    x = np.ones(1000)
    assert bench.process_cost(lambda: x.sum())["page_faults"] < fresh["page_faults"]
    mode = bench.machine()["transparent_hugepage"]
    assert mode is None or isinstance(mode, str)


def test_regression_check_scales_peerless_times_by_the_machines_reference_workloads():
    bench = _load_benchmark()

    def reference(entry, seconds):
        return dict(arm="machine", dtype="float64", quantity="reference", implementation="python 3.11", batch=1,
                    value=seconds, unit="s", entry=entry)

    base = [reference("python", 0.04), reference("compile", 0.25),
            _row("compile", "jaxarm", 2.0, "s", entry="rollout_rk3", steps=1000),
            _row("compile", "jaxarm", 1.0, "s", entry="inverse_dynamics"),
            _row("latency", "jaxarm", 10e-6, "s", batch=1, entry="inverse_dynamics"),
            _row("rollout_grad", "jaxarm", 3.0, "x forward", batch=16, entry="autodiff", steps=1000)]
    now = [reference("python", 0.08), reference("compile", 0.5),  # the machine runs 2x slower
           _row("compile", "jaxarm", 3.6, "s", entry="rollout_rk3", steps=1000),  # 1.8x: the machine's slowdown
           _row("compile", "jaxarm", 3.0, "s", entry="inverse_dynamics"),  # 3x: 1.5x beyond the machine's
           _row("latency", "jaxarm", 22e-6, "s", batch=1, entry="inverse_dynamics"),  # 2.2x: 1.1x
           _row("rollout_grad", "jaxarm", 4.5, "x forward", batch=16, entry="autodiff", steps=1000)]  # a ratio: as it is
    out = {(c["compare"]["quantity"], c["compare"].get("entry")): c for c in bench.compare(now, {"rows": base}, 0.30)}
    rollout = out["compile", "rollout_rk3"]
    assert rollout["slowdown"] == pytest.approx(1.8) and rollout["machine_slowdown"] == pytest.approx(2.0)
    assert rollout["slowdown_vs_machine"] == pytest.approx(0.9) and rollout["status"] == "ok"
    assert out["compile", "inverse_dynamics"]["slowdown_vs_machine"] == pytest.approx(1.5)
    assert out["compile", "inverse_dynamics"]["status"] == "REGRESSION"
    assert out["latency", "inverse_dynamics"]["machine_slowdown"] == pytest.approx(2.0)  # by the Python loop
    assert out["latency", "inverse_dynamics"]["status"] == "ok"
    grad = out["rollout_grad", "autodiff"]
    assert grad["machine_slowdown"] is None and grad["status"] == "REGRESSION"
    # a baseline recorded without reference rows: absolute, as before
    plain = {(c["compare"]["quantity"], c["compare"].get("entry")): c for c in bench.compare(now, {"rows": base[2:]}, 0.30)}
    assert plain["compile", "rollout_rk3"]["machine_slowdown"] is None
    assert plain["compile", "rollout_rk3"]["status"] == "REGRESSION"


def _run(cpu, cores=2, backend="cpu", value=1.0):
    return {"machine": {"cpu": cpu, "cores": cores, "backend": backend}, "rows": [_row("compile", "jaxarm", value, "s", entry="x")]}


def test_the_baseline_is_the_run_recorded_on_the_same_machine():
    bench = _load_benchmark()
    amd, intel = _run("AMD EPYC", value=1.0), _run("Intel Xeon", value=2.0)
    record = {"runs": [amd, intel]}
    assert bench.baseline_for(intel["machine"], record) == (intel, True)
    assert bench.baseline_for(amd["machine"], record) == (amd, True)
    # the same CPU with other cores, or another backend, is another machine: the file's first run
    assert bench.baseline_for({"cpu": "Intel Xeon", "cores": 16, "backend": "cpu"}, record) == (amd, False)
    assert bench.baseline_for({"cpu": "Intel Xeon", "cores": 2, "backend": "gpu"}, record) == (amd, False)
    # a file holding one run (what --record writes into a new file)
    assert bench.baseline_for(intel["machine"], amd) == (amd, False)
    with pytest.raises(ValueError, match=r"runs\[1\]"):
        bench.baseline_for(amd["machine"], {"runs": [amd, {"machine": {}}]})


def test_recording_keeps_the_other_machines_runs_and_replaces_this_ones():
    bench = _load_benchmark()
    amd, intel, intel2 = _run("AMD EPYC"), _run("Intel Xeon"), _run("Intel Xeon", value=3.0)
    assert bench.merged_record(None, intel) == intel  # a new file: the run alone
    assert bench.merged_record(intel, intel2) == intel2  # the same machine's single run: replaced
    assert bench.merged_record(amd, intel) == {"runs": [amd, intel]}  # another machine's: both kept
    assert bench.merged_record({"runs": [amd, intel]}, intel2) == {"runs": [amd, intel2]}  # in its place
    gpu = _run("Intel Xeon", backend="gpu")
    assert bench.merged_record({"runs": [intel, amd]}, gpu) == {"runs": [intel, amd, gpu]}


def test_a_file_that_is_not_a_record_stops_the_run_before_anything_is_measured(tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for flags in (["--record", str(notes)], ["--baseline", str(notes)]):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", *flags], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode != 0 and "notes.json: expected a benchmark record" in proc.stderr
        assert '"quantity"' not in proc.stdout  # nothing measured
    assert notes.read_text() == '{"my": "notes"}'  # and nothing overwritten
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--record", str(broken)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "broken.json: not a readable benchmark record" in proc.stderr
    assert broken.read_text() == "{"
