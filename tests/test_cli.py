"""The ``jaxarm`` command, called in-process through ``main([...])`` (and once as ``python -m jaxarm``).

Simulations use the two-link planar arm and short runs: every distinct run shape compiles once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxarm
from jaxarm.arm_files import load_arm
from jaxarm.cli import main

ROOT = Path(__file__).resolve().parents[1]

MOTOR_ARM = """
name = "motor_pair"
convention = "modified"
gravity = [0.0, -9.81, 0.0]

[[joint]]
type = "revolute"
a = 0.0
alpha = 0.0
d = 0.0
theta = 0.0
mass = 2.0
com = [0.5, 0.0, 0.0]
inertia = [0.01, 0.05, 0.05]

[joint.motor]
gear_ratio = 20.0
rotor_inertia = 1e-4
viscous_friction = 1e-4
torque_constant = 0.1
resistance = 1.5
voltage_limit = 12.0

[[joint]]
type = "revolute"
a = 1.0
alpha = 0.0
d = 0.0
theta = 0.0
mass = 1.0
com = [0.4, 0.0, 0.0]
inertia = [0.005, 0.02, 0.02]

[joint.motor]
gear_ratio = -15.0
rotor_inertia = 5e-5
torque_constant = 0.08
resistance = 2.0
voltage_limit = 12.0
"""


def _column(out: str, n: int, col: int = -1) -> np.ndarray:
    """The given column of the per-joint table rows (lines starting with the joint number)."""
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(1, n + 1)), out
    return np.array([float(r[col]) for r in rows])


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------
# info / inverse / forward


def test_info_prints_dh_table_and_flags_puma_link_3(capsys):
    assert main(["info", "puma560_rtb"]) == 0
    out = capsys.readouterr().out
    assert "a_i [m]" in out and "alpha_i [rad]" in out and "d_i [m]" in out and "theta_i [rad]" in out
    assert "0.4318" in out and "0.15005" in out  # a2, d3
    assert "gear G" in out and "-62.6111" in out  # drives table
    assert "link 2: OK" in out
    link3 = out.split("link 3:")[1].split("link 4:")[0]
    assert "INCONSISTENT" in link3 and "triangle inequality" in link3
    assert "link 1: INCONSISTENT" in out  # massless link with Iyy = 0.35


def test_info_uses_the_modified_dh_headers(capsys):
    assert main(["info", "two_link_planar"]) == 0
    out = capsys.readouterr().out
    assert "a_{i-1} [m]" in out and "alpha_{i-1} [rad]" in out


def test_python_dash_m_jaxarm_info():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAXARM_CACHE_DIR="off")
    proc = subprocess.run([sys.executable, "-m", "jaxarm", "info", "puma560"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Kinematics" in proc.stdout and "link 3: OK" in proc.stdout
    assert proc.stderr == ""  # the flagship arm is physically consistent: no warning on load


def test_inverse_equals_library(capsys):  # the library call is jitted: op-by-op dispatch is slow
    # rp_arm: a revolute and a prismatic joint (the table's units say "N m | N").
    q, qd, qdd = [0.4, 0.5], [0.3, -0.2], [1.0, -0.5]
    args = ["inverse", "rp_arm", "--q", "0.4,0.5", "--qd", "0.3", "-0.2", "--qdd=1,-0.5"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tau [N m | N]" in out
    expected = jax.jit(jaxarm.inverse_dynamics)(load_arm("rp_arm"), np.array(q), np.array(qd), np.array(qdd))
    np.testing.assert_allclose(_column(out, 2), expected, rtol=1e-10, atol=1e-12)


def test_forward_equals_library_for_torque_and_voltage(tmp_path, capsys):
    arm_file = _write(tmp_path / "motor_pair.toml", MOTOR_ARM)
    arm = load_arm(arm_file)
    q, qd = np.array([-0.5, 1.0]), np.array([0.3, -0.2])
    forward = jax.jit(jaxarm.forward_dynamics)  # the library call, compiled (op-by-op is slow)

    assert main(["forward", str(arm_file), "--q", "-0.5,1", "--qd", "0.3,-0.2", "--tau", "2", "-1.5"]) == 0
    qdd = _column(capsys.readouterr().out, 2)
    expected = forward(arm, q, qd, np.array([2.0, -1.5]))
    np.testing.assert_allclose(qdd, expected, rtol=1e-10, atol=1e-12)

    V = np.array([5.0, -20.0])  # the second one saturates at 12 V
    assert main(["forward", str(arm_file), "--q", "-0.5,1", "--qd", "0.3,-0.2", "--voltage", "5,-20"]) == 0
    out = capsys.readouterr().out
    tau = jax.jit(jaxarm.motor_torque)(arm, V, qd)
    np.testing.assert_allclose(_column(out, 2, -2), tau, rtol=1e-10)
    np.testing.assert_allclose(_column(out, 2, -3), [5.0, -12.0])
    np.testing.assert_allclose(_column(out, 2), forward(arm, q, qd, tau), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# simulate / plot


def test_simulate_torque_schedule_equals_rollout(tmp_path, capsys):
    schedule = _write(tmp_path / "tau.csv", "t,tau1,tau2\n-0.5,1.0,0.5\n0.05,-2.0,0.25\n0.2,0.0,-1.0\n")
    out, csv_path, png = tmp_path / "run.npz", tmp_path / "run.csv", tmp_path / "run.png"
    # 401 steps: 4 chunks of 101 steps, the last one padded.
    code = main(["simulate", "two_link_planar", "--torque-schedule", str(schedule), "--duration", "0.401",
                 "--dt", "0.001", "--q0", "0.3,-0.2", "--out", str(out), "--csv", str(csv_path), "--plot", str(png)])
    assert code == 0, capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["run.csv", "run.npz", "run.png", "tau.csv"]

    dt, steps = 0.001, 401
    rows = [(-0.5, (1.0, 0.5)), (0.05, (-2.0, 0.25)), (0.2, (0.0, -1.0))]
    held = np.array([[v for t, v in rows if t <= k * dt + 1e-12][-1] for k in range(steps)])
    arm = load_arm("two_link_planar")
    ref = jaxarm.rollout(arm, np.array([0.3, -0.2]), np.zeros(2), held, dt)
    res = np.load(out)
    assert str(res["arm"]) == "two_link_planar" and float(res["dt"]) == dt and str(res["method"]) == "rk3"
    np.testing.assert_allclose(res["t"], np.asarray(ref.t), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(res["u"], held)
    for key in ("q", "qd", "qdd", "tau"):
        np.testing.assert_allclose(res[key], np.asarray(getattr(ref, key)), rtol=1e-9, atol=1e-12, err_msg=key)

    lines = csv_path.read_text().splitlines()
    assert lines[0] == "t,q1,q2,qd1,qd2,tau1,tau2"
    assert len(lines) == 1 + steps + 1
    np.testing.assert_allclose([float(x) for x in lines[1].split(",")], [0, 0.3, -0.2, 0, 0, 1.0, 0.5])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pd_controller_converges_to_target(tmp_path, capsys):
    out = tmp_path / "pd.npz"
    # Explicit Euler (one dynamics evaluation per step) compiles faster than the default rk3.
    assert main(["simulate", "two_link_planar", "--controller", "pd", "--target", "0.5,-0.3", "--method", "euler",
                 "--duration", "1.5", "--dt", "0.005", "--out", str(out)]) == 0
    assert "final max |q - target|" in capsys.readouterr().out
    res = np.load(out)
    assert res["q"].shape == (301, 2)
    np.testing.assert_allclose(res["q"][-1], [0.5, -0.3], atol=1e-3)
    np.testing.assert_allclose(res["qd"][-1], [0.0, 0.0], atol=1e-2)
    assert np.all(res["kp"] > 0) and np.all(res["kd"] > 0)


def test_batch_of_voltage_driven_rollouts(tmp_path, capsys):
    arm_file = _write(tmp_path / "motor_pair.toml", MOTOR_ARM)
    schedule = _write(tmp_path / "volts.csv", "t,V1,V2\n0,6.0,-3.0\n0.02,-30,1.0\n")
    out, csv_path = tmp_path / "batch.npz", tmp_path / "batch.csv"
    assert main(["simulate", str(arm_file), "--voltage-schedule", str(schedule), "--duration", "0.05", "--dt", "0.001",
                 "--method", "euler", "--batch", "3", "--perturb", "0.05", "--seed", "1", "--out", str(out), "--csv", str(csv_path)]) == 0
    res = np.load(out)
    assert res["q"].shape == (3, 51, 2) and res["tau"].shape == (3, 50, 2) and res["t"].shape == (51,)
    np.testing.assert_array_equal(res["q"][:, 0], res["q0"])
    assert len({tuple(r) for r in res["q0"]}) == 3  # three different initial positions
    assert not np.allclose(res["q"][0, -1], res["q"][1, -1])
    assert str(res["input"]) == "voltage"
    G, Kt, R = np.array([20.0, -15.0]), np.array([0.1, 0.08]), np.array([1.5, 2.0])
    V = np.clip(res["u"], -12.0, 12.0)
    np.testing.assert_allclose(res["tau"], G * Kt * (V - Kt * G * res["qd"][:, :-1]) / R, rtol=1e-12)  # Swartz eq 12
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("batch,t,q1") and len(lines) == 1 + 3 * 51


def test_plot_redraws_a_saved_run(tmp_path, capsys):
    t = np.linspace(0.0, 1.0, 11)
    q = np.stack([np.sin(t), np.cos(t)], axis=1)
    np.savez(tmp_path / "saved.npz", t=t, q=q, qd=np.gradient(q, axis=0), tau=q[:-1], arm="two_link_planar", dt=0.1)
    assert main(["plot", str(tmp_path / "saved.npz")]) == 0
    png = tmp_path / "saved.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert main(["plot", str(tmp_path / "saved.npz"), "--out", str(tmp_path / "other.png")]) == 0
    assert (tmp_path / "other.png").stat().st_size > 1000


def test_help_exits_zero(capsys):
    assert main(["--help"]) == 0
    assert "simulate" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Bad input: one line on stderr, the right exit code, no output file


def _bad_cases(tmp: Path):
    two = "two_link_planar"
    sim = ["--duration", "0.1", "--dt", "0.001", "--out", str(tmp / "out.npz"), "--csv", str(tmp / "out.csv")]
    files = {
        "cols.csv": "t,tau1,tau2,tau3\n0,1,2,3\n",
        "order.csv": "t,tau1,tau2\n0,1,2\n0.05,0,0\n0.05,1,1\n",
        "nan.csv": "t,tau1,tau2\n0,1,nan\n",
        "late.csv": "t,tau1,tau2\n0.01,1,2\n",
        "volts.csv": "t,V1,V2\n0,1,2\n",
    }
    for name, text in files.items():
        _write(tmp / name, text)
    return {
        "unknown arm": (["simulate", "no_such_arm", *sim], 2, "no_such_arm"),
        "unknown arm (info)": (["info", "no_such_arm"], 2, "no bundled arm"),
        "schedule columns": (["simulate", two, "--torque-schedule", str(tmp / "cols.csv"), *sim], 2, "columns"),
        "schedule times": (["simulate", two, "--torque-schedule", str(tmp / "order.csv"), *sim], 2, "strictly increasing"),
        "schedule NaN": (["simulate", two, "--torque-schedule", str(tmp / "nan.csv"), *sim], 2, "finite"),
        "schedule starts late": (["simulate", two, "--torque-schedule", str(tmp / "late.csv"), *sim], 2, "t <= 0"),
        "negative dt": (["simulate", two, *sim[:2], "--dt", "-0.001", *sim[4:]], 2, "--dt"),
        "zero dt": (["simulate", two, *sim[:2], "--dt", "0", *sim[4:]], 2, "--dt"),
        "zero duration": (["simulate", two, "--duration", "0", *sim[2:]], 2, "--duration"),
        "negative duration": (["simulate", two, "--duration=-1", *sim[2:]], 2, "--duration"),
        "voltage without motors": (["simulate", two, "--voltage-schedule", str(tmp / "volts.csv"), *sim], 2, "motor model"),
        "wrong q0 length": (["simulate", two, "--q0", "0,0,0", *sim], 2, "--q0"),
        "NaN in q": (["inverse", two, "--q", "0,nan"], 2, "finite"),
        "target without pd": (["simulate", two, "--target", "0,0", *sim], 2, "--controller pd"),
        "missing schedule file": (["simulate", two, "--torque-schedule", str(tmp / "nope.csv"), *sim], 2, "no such file"),
        "missing output folder": (["simulate", two, *sim[:4], "--out", str(tmp / "nodir" / "x.npz")], 2, "does not exist"),
        "unknown option": (["simulate", two, "--frobnicate", *sim], 2, "--frobnicate"),
        "diverges": (["simulate", two, "--controller", "pd", "--target", "1,1", "--kp", "1e9", "--kd", "0", "--method", "euler",
                      "--duration", "1", "--dt", "0.01", "--out", str(tmp / "out.npz"), "--plot", str(tmp / "out.png")],
                     1, "diverged"),
        "not a results file": (["plot", str(tmp / "cols.csv"), "--out", str(tmp / "out.png")], 2, "not an .npz archive"),
        "output exists": (["simulate", two, *sim[:4], "--out", str(tmp / "cols.csv")], 2, "already exists; pass --force"),
        "export over a file": (["export", two, "--urdf", str(tmp / "volts.csv")], 2, "already exists"),
    }


def test_bad_input_fails_cleanly(tmp_path, capsys):
    cases = _bad_cases(tmp_path)
    before = sorted(os.listdir(tmp_path))
    failures = []
    for name, (argv, code, needle) in cases.items():
        got = main(argv)
        captured = capsys.readouterr()
        err = captured.err.strip()
        if got != code:
            failures.append(f"{name}: exit {got}, expected {code} ({err})")
        if len(err.splitlines()) != 1 or not err.startswith("jaxarm: error: ") or needle not in err:
            failures.append(f"{name}: stderr {captured.err!r} should be one 'jaxarm: error:' line naming {needle!r}")
        if sorted(os.listdir(tmp_path)) != before:
            failures.append(f"{name}: left files {sorted(set(os.listdir(tmp_path)) - set(before))}")
    assert not failures, "\n".join(failures)


def test_missing_matplotlib_says_how_to_install(tmp_path, capsys, monkeypatch):
    import jaxarm.plotting

    def missing():
        raise ImportError(jaxarm.plotting.INSTALL_HINT)

    monkeypatch.setattr(jaxarm.plotting, "require_matplotlib", missing)
    code = main(["simulate", "two_link_planar", "--duration", "0.01", "--dt", "0.001",
                 "--out", str(tmp_path / "x.npz"), "--plot", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert code == 1 and 'pip install "jaxarm[plot]"' in err and len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_export_urdf_and_mjcf_round_trip(tmp_path, capsys):
    urdf, xml = tmp_path / "panda.urdf", tmp_path / "panda.xml"
    assert main(["export", "panda", "--urdf", str(urdf), "--mjcf", str(xml)]) == 0
    arm = load_arm("panda")
    back = load_arm(str(urdf))
    q = np.linspace(-0.5, 0.7, arm.n)
    np.testing.assert_allclose(jaxarm.mass_matrix(back, q), jaxarm.mass_matrix(arm, q), rtol=1e-12, atol=1e-12)
    mujoco = __import__("pytest").importorskip("mujoco")
    model = mujoco.MjModel.from_xml_path(str(xml))
    data = mujoco.MjData(model)
    data.qpos[:] = q
    mujoco.mj_forward(model, data)
    M = np.zeros((model.nv, model.nv))
    mujoco.mj_fullM(model, data, M)
    np.testing.assert_allclose(M, jaxarm.mass_matrix(arm, q), rtol=1e-9, atol=1e-12)


def test_export_refuses_what_mujoco_cannot_load_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "puma.xml"
    assert main(["export", "puma560_rtb", "--mjcf", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "joint 1" in err[0] and "mass" in err[0]
    assert list(tmp_path.iterdir()) == []
    assert main(["export", "puma560"]) == 2
    assert "--urdf" in capsys.readouterr().err


def test_existing_outputs_are_kept_unless_forced(tmp_path, capsys):
    out = tmp_path / "run.npz"
    out.write_bytes(b"mine")
    argv = ["simulate", "two_link_planar", "--duration", "0.01", "--dt", "0.001", "--out", str(out)]
    assert main(argv) == 2 and out.read_bytes() == b"mine"
    assert "--force" in capsys.readouterr().err
    assert main(argv + ["--force"]) == 0
    assert len(np.load(out)["t"]) == 11


def test_simulate_never_runs_past_duration_and_says_so(tmp_path, capsys):
    out = tmp_path / "run.npz"
    assert main(["simulate", "two_link_planar", "--duration", "0.25", "--dt", "0.1", "--out", str(out)]) == 0
    np.testing.assert_allclose(np.load(out)["t"], [0.0, 0.1, 0.2])
    assert "simulated 2 steps, to t = 0.2 s" in capsys.readouterr().out
    assert main(["simulate", "two_link_planar", "--duration", "0.3", "--dt", "0.1", "--out", str(out), "--force"]) == 0
    np.testing.assert_allclose(np.load(out)["t"], [0.0, 0.1, 0.2, 0.3])  # 0.3 / 0.1 = 2.9999999999999996
    assert "note:" not in capsys.readouterr().out


def test_simulate_holds_joints_at_their_end_stops_and_says_so(tmp_path, capsys):
    """The Puma falls under gravity with zero torque: joint 2 reaches its -45 degree stop and rests
    on it; with --no-stops it passes the limit and a warning says so."""
    out = tmp_path / "run.npz"
    lo = np.asarray(load_arm("puma560").limits.position)[:, 0]
    assert main(["simulate", "puma560", "--duration", "1", "--dt", "0.002", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    q, qd = np.load(out)["q"], np.load(out)["qd"]
    assert (q >= lo).all() and q[-1, 1] == lo[1] and qd[-1, 1] == 0.0
    stops = [line for line in captured.out.splitlines() if line.startswith("end stop:")]
    assert len(stops) == 1 and stops[0].startswith("end stop: joint 2 reached its lower limit (-0.7854 rad) at t = ")
    assert captured.err == ""
    assert main(["simulate", "puma560", "--duration", "1", "--dt", "0.002", "--out", str(out), "--force", "--no-stops"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    q = np.load(out)["q"]
    assert (q[:, 1] < lo[1]).any() and not (q[:, [0, 2, 3, 4, 5]] < lo[[0, 2, 3, 4, 5]]).any()
    assert len(err) == 1 and err[0].startswith("jaxarm: warning: joint 2 left its position limits [-0.7854, 3.927] rad")
    assert main(["simulate", "puma560", "--controller", "pd", "--target", "0,0.8,-0.8,0,0.5,0", "--duration", "0.2",
                 "--dt", "0.002", "--out", str(out), "--force"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "end stop:" not in captured.out  # inside the limits: nothing to say
    # A start outside the limits is refused before anything runs; --no-stops allows it.
    assert main(["simulate", "puma560", "--q0", "0,-1,0,0,0,0", "--duration", "0.01", "--dt", "0.002",
                 "--out", str(out), "--force"]) == 2
    assert "--q0: joint 2 starts at -1, outside its position limits [-0.7854, 3.927]" in capsys.readouterr().err


def test_the_progress_bar_draws_only_when_asked(capsys):
    from jaxarm.cli.simulate import _Progress

    bar = _Progress(2.0, True)
    bar.update(0.0, "  (compiling)")
    bar.update(0.5)
    bar.update(1.0)
    bar.close()
    err = capsys.readouterr().err
    assert "100%" in err and "t = 2 / 2 s" in err
    bar = _Progress(2.0, False)  # not a terminal: nothing at all
    bar.update(0.5)
    bar.close()
    assert capsys.readouterr().err == ""


def test_inverse_prints_round_off_as_zero(capsys):
    assert main(["inverse", "puma560", "--q", "0,0,0,0,0,0"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    tau = [row.split()[-1] for row in rows]
    assert tau[0] == "0" and tau[3:] == ["0", "0", "0"] and float(tau[1]) == pytest.approx(37.4837, abs=1e-4)


def test_plot_refuses_pickles_without_numpy_advice(tmp_path, capsys):
    bad = tmp_path / "objects.npz"
    np.savez(bad, t=np.array([object()], dtype=object))
    assert main(["plot", str(bad), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "never unpickles" in err and "allow_pickle" not in err


def test_arm_drawing_follows_the_kinematics():
    """The stick figure passes through every joint frame's origin and ends at the tool; each DH
    row's offset is its own segment (along z_{i-1} by d_i, standard; along x_{i-1} by a_{i-1},
    modified)."""
    pytest.importorskip("matplotlib")
    from jaxarm.cli.drawing import skeleton

    for name, q in (("puma560", [0.3, 0.8, -0.8, 0.2, 0.5, -0.4]), ("panda", [0.1, -0.7, 0.2, -2.3, 0.1, 1.5, 0.7])):
        arm = load_arm(name)
        points, joints, base, tool = skeleton(arm, np.asarray(q))
        frames, tool_ref = (np.asarray(x) for x in jaxarm.forward_kinematics(arm, np.asarray(q)))
        np.testing.assert_allclose(points[-1], tool_ref[:3, 3], atol=1e-12)
        np.testing.assert_allclose(joints, frames[1:, :3, 3], atol=1e-12)
        np.testing.assert_allclose(points[2::2][: arm.n], frames[1:, :3, 3], atol=1e-12)
        for i in range(arm.n):
            step = points[2 * i + 1] - points[2 * i]
            if arm.convention == "standard":
                np.testing.assert_allclose(step, float(arm.kinematics.d[i]) * frames[i][:3, 2], atol=1e-12)
            else:
                np.testing.assert_allclose(step, float(arm.kinematics.a[i]) * frames[i][:3, 0], atol=1e-12)


def test_simulate_animates_the_arm_into_a_gif(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from PIL import Image

    gif = tmp_path / "run.gif"
    argv = ["simulate", "two_link_planar", "--duration", "0.1", "--dt", "0.01", "--out", str(tmp_path / "run.npz")]
    assert main(argv + ["--animate", str(tmp_path / "run.png")]) == 2
    assert "expected a .gif" in capsys.readouterr().err and os.listdir(tmp_path) == []
    assert main(argv + ["--animate", str(gif)]) == 0
    with Image.open(gif) as image:
        assert image.format == "GIF" and image.n_frames == 11 and image.size[0] > 300
        first = np.asarray(image.convert("RGB"))
        image.seek(10)
        last = np.asarray(image.convert("RGB"))
    assert np.abs(first.astype(int) - last.astype(int)).sum() > 0  # the arm moved


def test_bars_and_status_lines_are_drawn_on_a_terminal_that_can_redraw_only(monkeypatch):
    """One test decides for the progress bar of ``simulate`` and the status line of ``identify``:
    a stream whose isatty() is true, unless TERM=dumb (no cursor movement); never a pipe, a file,
    a closed stream or an object without isatty."""
    import io

    from jaxarm.cli.common import on_terminal

    class Stream(io.StringIO):
        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            super().isatty()  # (a ValueError once closed, as a real stream's)
            return self.tty

    monkeypatch.setenv("TERM", "xterm-256color")
    assert on_terminal(Stream(True))
    assert not on_terminal(Stream(False)) and not on_terminal(io.StringIO()) and not on_terminal(object())
    closed = Stream(True)
    closed.close()
    assert not on_terminal(closed)
    monkeypatch.setenv("TERM", "dumb")
    assert not on_terminal(Stream(True))
    monkeypatch.delenv("TERM")
    assert on_terminal(Stream(True))
