"""``jaxarm identify``: the identified arm file reproduces the fitted model, the report says what
was fitted, and a log that cannot identify the arm is refused with no file written."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import numpy as np
import pytest
from helpers import random_arm

import jaxarm
from jaxarm import cli
from jaxarm import consistent_identification as ci
from jaxarm.identification import predict_torques, torque_rmse
from jaxarm.identify.selection import with_friction_model
from jaxarm.logs import load_log, preprocess_log

RATE = 200.0  # Hz
DURATION = 3.0  # s


def _trajectory(n, t, seed=0):
    """q = sum of sines (3 harmonics per joint), with exact qd."""
    rng = np.random.default_rng(seed)
    w = 2 * np.pi * np.array([0.4, 0.9, 1.7])
    a = rng.uniform(0.2, 0.6, (n, 3)) / np.arange(1, 4)
    phase = rng.uniform(0, 2 * np.pi, (n, 3))
    arg = t[:, None, None] * w + phase
    q = np.sum(a * np.sin(arg), axis=-1)
    qd = np.sum(a * w * np.cos(arg), axis=-1)
    qdd = np.sum(-a * w**2 * np.sin(arg), axis=-1)
    return q, qd, qdd


def _write_log(path, t, q, dq=None, tau=None):
    n = q.shape[1]
    cols, names = [t[:, None], q], ["t"] + [f"q{j + 1}" for j in range(n)]
    if dq is not None:
        cols.append(dq)
        names += [f"dq{j + 1}" for j in range(n)]
    if tau is not None:
        cols.append(tau)
        names += [f"tau{j + 1}" for j in range(n)]
    np.savetxt(path, np.column_stack(cols), delimiter=",", header=",".join(names), comments="", fmt="%.17g")
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A 2-joint arm with drive friction, its file, and a noisy torque log it produced."""
    folder = tmp_path_factory.mktemp("identify")
    truth = random_arm(11, "RR", drives=True)
    t = np.arange(0.0, DURATION, 1.0 / RATE)
    q, qd, qdd = _trajectory(truth.n, t)
    tau = predict_torques(truth, q, qd, qdd) + 0.01 * np.random.default_rng(1).normal(size=q.shape)
    log = _write_log(folder / "log.csv", t, q, qd, tau)
    # the prior: the truth with every link's mass off by 20 %, friction off by 50 %
    prior = truth.replace(links=dataclasses.replace(truth.links, mass=np.asarray(truth.links.mass) * 1.2),
                          drives=dataclasses.replace(truth.drives, viscous_friction=np.asarray(truth.drives.viscous_friction) * 1.5))
    arm_file = str(jaxarm.save_arm(prior, folder / "prior.toml"))
    return {"folder": folder, "truth": truth, "prior": prior, "arm": arm_file, "log": log, "t": t, "q": q, "qd": qd, "tau": tau}


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_identified_arm_file_reproduces_the_fitted_model(setup, capsys, tmp_path):
    out, report, plot = tmp_path / "identified.toml", tmp_path / "report.json", tmp_path / "fit.png"
    code, stdout, err = _run(capsys, "identify", setup["log"], "--arm", setup["arm"], "--out", str(out),
                             "--report", str(report), "--plot", str(plot), "--fit-until", "2.2", "--steps", "60")
    assert code == 0, err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.png", "identified.toml", "report.json"]  # no temporaries
    assert "physically consistent: yes" in stdout
    fitted = jaxarm.load_arm(out)
    # the same fit in-process (deterministic) gives the same model as the file, to round-off, with
    # the cutoff and Coulomb shape the command chose from the log (and reported)
    rep = json.loads(report.read_text())
    cutoff, scale, stribeck = rep["preprocessing"]["cutoff"], rep["coulomb_velocity_scale"], rep["stribeck_velocity"]
    assert len(rep["friction_models"]) == 2
    assert rep["selection"]["candidates"] and sum(c["best_score"] for c in rep["selection"]["candidates"]) == 1
    log = load_log(setup["log"], fitted)
    order = rep["preprocessing"]["order"]
    assert order in (2, 4) and all(c["order"] in (2, 4, None) for c in rep["selection"]["candidates"])
    fit_log = preprocess_log(log.slice(None, 2.2), cutoff=cutoff, order=order)
    prior = with_friction_model(jaxarm.load_arm(setup["arm"]), scale, stribeck)
    # the regularization weight was chosen by validation (every candidate reported, the best kept)
    reg = rep["regularization"]
    assert reg["chosen"] and len(reg["candidates"]) == 4
    assert {c["friction"] for c in reg["candidates"]} == {"viscous-coulomb"}
    lowest = min(c["score"] for c in reg["candidates"])
    close = [c for c in reg["candidates"] if c["score"] <= 1.01 * lowest]
    best = min(close, key=lambda c: (c["friction"] != "viscous-coulomb", -c["weight"]))
    assert (reg["weight"], rep["friction"]) == (best["weight"], best["friction"])
    fit = ci.fit_consistent(prior, fit_log.q, fit_log.dq, fit_log.ddq, fit_log.tau, max_steps=60, regularization=reg["weight"],
                            friction=rep["friction"])
    rng = np.random.default_rng(2)
    states = rng.uniform(-2, 2, (3, 50, 2))
    f = jax.vmap(jaxarm.inverse_dynamics, (None, 0, 0, 0))
    a, b = np.asarray(f(fitted, *states)), np.asarray(f(fit.arm, *states))
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * np.abs(b).max())
    # the report's RMSE are those of the file's arm on the fit / held-out samples
    np.testing.assert_allclose(rep["rmse"]["fit"], torque_rmse(fit_log.tau, predict_torques(fitted, fit_log.q, fit_log.dq, fit_log.ddq)), rtol=1e-9)
    held = preprocess_log(log.slice(2.2, None), cutoff=cutoff, order=order, trim=0.0, filter_torque=False)
    np.testing.assert_allclose(rep["rmse"]["heldout"], torque_rmse(held.tau, predict_torques(fitted, held.q, held.dq, held.ddq)), rtol=1e-9)
    # the fit improved on the prior, and reaches the noise level (0.01 N m) within a small factor
    prior_rmse = torque_rmse(held.tau, predict_torques(prior, held.q, held.dq, held.ddq))
    assert np.all(np.asarray(rep["rmse"]["heldout"]) < 0.5 * prior_rmse)


def test_output_error_refinement_is_judged_on_the_held_out_part(setup, capsys, tmp_path):
    """--refine: the model is refined by simulation (output error) and kept only if its held-out
    simulation error falls without its held-out torque error rising more than 2 %; the report holds
    both errors before and after, and they are the errors of the arms they name."""
    from jaxarm.identify.output_error import simulation_error

    out, report = tmp_path / "refined.toml", tmp_path / "refined.json"
    code, stdout, err = _run(capsys, "identify", setup["log"], "--arm", setup["arm"], "--out", str(out), "--report", str(report),
                             "--fit-until", "2.2", "--steps", "60", "--refine")
    assert code == 0, err
    rep = json.loads(report.read_text())
    oe = rep["output_error"]
    sim, tau = oe["heldout_simulation_rmse"], oe["heldout_torque_rmse"]
    sim_ratio = np.mean(np.asarray(sim["after"]) / np.asarray(sim["before"]))
    tau_ratio = np.mean(np.asarray(tau["after"]) / np.asarray(tau["before"]))
    assert oe["kept"] == bool(sim_ratio < 1.0 and tau_ratio <= 1.02)
    assert "output-error refinement: held-out simulation error" in stdout
    assert oe["window_steps"] == 20 and 20 <= oe["windows"] <= 22  # 0.1 s windows over the 2.2 s fitted
    fitted = jaxarm.load_arm(out)
    held = preprocess_log(load_log(setup["log"], fitted).slice(2.2, None), cutoff=rep["preprocessing"]["cutoff"],
                          order=rep["preprocessing"]["order"], trim=0.0,
                          filter_torque=False)
    kept = sim["after"] if oe["kept"] else sim["before"]
    np.testing.assert_allclose(simulation_error(fitted, held), kept, rtol=1e-6)
    np.testing.assert_allclose(rep["rmse"]["heldout"], tau["after"] if oe["kept"] else tau["before"], rtol=1e-9)
    # (here, on clean data the inverse-dynamics fit already explains, the refined model simulates the
    # held-out part 4 % worse, so the file holds the inverse-dynamics fit: the check is what protects it)
    _assert_refused(capsys, tmp_path, ["identify", setup["log"], "--arm", setup["arm"], "--method", "linear", "--refine"],
                    "--method consistent")


def test_report_content(setup, capsys, tmp_path):
    out, report = tmp_path / "lin.toml", tmp_path / "lin.json"
    code, stdout, err = _run(capsys, "identify", setup["log"], "--arm", setup["arm"], "--out", str(out),
                             "--report", str(report), "--method", "linear")
    assert code == 0, err
    rep = json.loads(report.read_text())
    assert rep["method"] == "linear"
    # without --fit-until the last quarter is held out for the validation numbers, then the arm is
    # refitted on the whole log (and the report says so)
    assert rep["validation"]["refitted_on_all"] is True and 0.2 < rep["validation"]["heldout_fraction"] < 0.3
    assert rep["samples"]["heldout"] > 0 and len(rep["rmse"]["heldout"]) == 2
    assert all(r < 0.05 for r in rep["rmse"]["heldout"])  # noise 0.01
    assert rep["samples"]["fit"] > rep["samples"]["heldout"] * 3  # the refit used the whole log
    assert "refitted on the whole log" in stdout
    lin = rep["linear"]
    assert rep["condition_number"] == lin["condition_number"] > 1
    assert lin["rank"] == len(lin["base_parameters"]) > 0
    for b in lin["base_parameters"]:
        assert b["std"] > 0 and np.isfinite(b["value"])
    assert set(rep["consistency"]) == {"joint 1", "joint 2", "drive 1", "drive 2"}
    assert all(set(v) == {"ok", "problems"} for v in rep["consistency"].values())
    assert len(rep["rmse"]["fit"]) == 2 and all(r < 0.05 for r in rep["rmse"]["fit"])  # noise 0.01
    assert "rank" in stdout and "condition number" in stdout
    # identifiability in plain words and in numbers
    ident = rep["identifiability"]
    assert ident["rank"] == lin["rank"] and ident["standard_parameters"] == 2 * 14
    assert 0 <= ident["well_determined"] <= ident["rank"] and "identifiability: the log determines" in stdout
    # the machine-readable verdict: pass/fail per check, with the thresholds used
    verdict = rep["verdict"]
    assert {c["check"] for c in verdict["checks"]} >= {"physically consistent (links, payload, drives)",
                                                       "base regressor well conditioned (columns scaled)"}
    assert verdict["pass"] == all(c["pass"] for c in verdict["checks"]) and "verdict: " in stdout


def _assert_refused(capsys, tmp_path, argv, match):
    out, report = tmp_path / "x.toml", tmp_path / "x.json"
    code, stdout, err = _run(capsys, *argv, "--out", str(out), "--report", str(report))
    assert code == 2, (stdout, err)
    assert err.startswith("jaxarm: error: ") and err.count("\n") == 1, err
    assert match in err, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("x.", ".x."))) == []
    return err


def test_log_that_cannot_identify_is_refused_without_output(setup, capsys, tmp_path):
    t, q, qd, tau = setup["t"], setup["q"].copy(), setup["qd"].copy(), setup["tau"]
    arm = setup["arm"]
    # joint 2 never moves: its friction and the inertia it carries are not identifiable
    q[:, 1] = 0.3
    qd[:, 1] = 0.0
    still = _write_log(tmp_path / "still.csv", t, q, qd, tau)
    _assert_refused(capsys, tmp_path, ["identify", still, "--arm", arm], "do not move")
    # too short: fewer equations than base parameters
    short = _write_log(tmp_path / "short.csv", t[:8], setup["q"][:8], setup["qd"][:8], tau[:8])
    _assert_refused(capsys, tmp_path, ["identify", short, "--arm", arm], "too short")
    # angles in degrees, not said
    degrees = _write_log(tmp_path / "degrees.csv", t, np.degrees(setup["q"]), np.degrees(setup["qd"]), tau)
    _assert_refused(capsys, tmp_path, ["identify", degrees, "--arm", arm], "looks like degrees")
    # no torque column
    notau = _write_log(tmp_path / "notau.csv", t, setup["q"], setup["qd"])
    _assert_refused(capsys, tmp_path, ["identify", notau, "--arm", arm], "no torque columns")
    # a held-out split that leaves nothing to hold out, and a contradictory option pair
    _assert_refused(capsys, tmp_path, ["identify", setup["log"], "--arm", arm, "--fit-until", "100"], "nothing is held out")
    _assert_refused(capsys, tmp_path, ["identify", setup["log"], "--arm", arm, "--method", "linear", "--friction", "sigmoid"], "not linear")
    _assert_refused(capsys, tmp_path, ["identify", str(tmp_path / "missing.csv"), "--arm", arm], "no such file")


def test_existing_output_untouched_on_error(setup, capsys, tmp_path):
    out = tmp_path / "keep.toml"
    out.write_text("old\n")
    q = setup["q"].copy()
    q[:, 0] = 0.0
    qd = setup["qd"].copy()
    qd[:, 0] = 0.0
    still = _write_log(tmp_path / "still.csv", setup["t"], q, qd, setup["tau"])
    code = cli.main(["identify", still, "--arm", setup["arm"], "--out", str(out)])
    assert code == 2 and "--force" in capsys.readouterr().err  # not replaced without asking
    code = cli.main(["identify", still, "--arm", setup["arm"], "--out", str(out), "--force"])
    assert code == 2 and "do not move" in capsys.readouterr().err  # nor by a failed identification
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.toml", "still.csv"]


def test_several_logs_are_identified_together(setup, capsys, tmp_path):
    """Two experiments of one arm, in two files: each is preprocessed on its own (the join is a
    gap), and the fit uses both."""
    t, q, qd, tau = setup["t"], setup["q"], setup["qd"], setup["tau"]
    half = len(t) // 2
    first = _write_log(tmp_path / "run1.csv", t[:half], q[:half], qd[:half], tau[:half])
    second = _write_log(tmp_path / "run2.csv", t[half:] + 100.0, q[half:], qd[half:], tau[half:])
    out, report = tmp_path / "both.toml", tmp_path / "both.json"
    code, stdout, err = _run(capsys, "identify", first, second, "--arm", setup["arm"], "--out", str(out),
                             "--report", str(report), "--method", "linear", "--cutoff", "none")
    assert code == 0, err
    rep = json.loads(report.read_text())
    assert rep["log"] == [first, second] and rep["preprocessing"]["segments"] == 2
    assert all(r < 0.05 for r in rep["rmse"]["heldout"])  # noise 0.01
    assert "run1.csv + run2.csv" in stdout
    assert not any("gap" in w for w in rep["warnings"])  # the join of two experiments is not a gap in either


def test_inconsistent_arm_file_is_repaired_and_said(setup, capsys, tmp_path):
    """A published model can be physically impossible (the literature Puma 560 is): the fit starts
    from its links clipped into the consistent set, says so on stderr, and the result is consistent."""
    inertia = np.asarray(setup["prior"].links.inertia).copy()
    inertia[1] = np.diag([1.0, 0.1, 0.1]) * np.trace(inertia[1]) / 1.2  # I2 + I3 < I1: no body has this
    bad = setup["prior"].replace(links=dataclasses.replace(setup["prior"].links, inertia=inertia))
    arm_file = str(jaxarm.save_arm(bad, tmp_path / "bad.toml"))
    out = tmp_path / "fixed.toml"
    code, stdout, err = _run(capsys, "identify", setup["log"], "--arm", arm_file, "--out", str(out), "--cutoff", "20")
    assert code == 0, err
    assert err.count("link 2: physically inconsistent, repaired") == 1 and "repair=True" not in err + stdout
    assert "physically consistent: yes" in stdout
    fitted = jaxarm.load_arm(str(out), strict=True)
    assert fitted.n == 2


def test_identified_arm_written_as_urdf_and_mjcf_and_checked(setup, capsys, tmp_path):
    """--urdf / --mjcf write the identified arm in both formats; each file holds the arm's
    inertials and joint friction (checked here by reading the URDF back independently of the
    command), and the report says how far each file's torques are from the identified arm's and
    what the format lost (the drives' rotor inertia has no URDF field)."""
    out, report = tmp_path / "id.toml", tmp_path / "id.json"
    urdf, mjcf = tmp_path / "id.urdf", tmp_path / "id.xml"
    code, stdout, err = _run(capsys, "identify", setup["log"], "--arm", setup["arm"], "--out", str(out), "--report", str(report),
                             "--steps", "60", "--cutoff", "none", "--urdf", str(urdf), "--mjcf", str(mjcf))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["id.json", "id.toml", "id.urdf", "id.xml"]
    arm = jaxarm.load_arm(out)
    assert np.any(np.asarray(arm.drives.rotor_inertia) > 0)  # so the URDF must lose something
    back = jaxarm.load_urdf(urdf, gravity=np.asarray(arm.gravity))
    # what URDF holds: the arm without rotor inertia, with symmetric Coulomb friction
    tc = np.asarray(arm.drives.coulomb_friction)
    level = (tc[:, 0] - tc[:, 1]) / 2
    held = arm.replace(drives=dataclasses.replace(arm.drives, rotor_inertia=np.zeros(arm.n),
                                                  coulomb_friction=np.stack([level, -level], axis=1)))
    states = np.random.default_rng(5).uniform(-2, 2, (3, 40, arm.n))
    np.testing.assert_allclose(predict_torques(back, *states), predict_torques(held, *states), rtol=1e-9, atol=1e-9)
    rep = json.loads(report.read_text())["exports"]
    u, m = rep[str(urdf.resolve())], rep[str(mjcf.resolve())]
    assert u["checked_by"] == "jaxarm.load_urdf" and max(u["torque_difference_rms"]) > 0
    assert any("rotor inertia" in x for x in u["lost"])
    assert "URDF read back" in stdout and "id.xml" in stdout
    if m["checked_by"] is not None:  # mujoco installed: MJCF keeps the rotor inertia (armature)
        assert max(m["torque_difference_rms"]) < max(u["torque_difference_rms"])
        assert not any("rotor inertia" in x for x in m["lost"])
    # an identified arm the format cannot hold (linear least squares leaves a link inconsistent
    # here) is refused with the reason and a hint, and nothing is written
    lin = tmp_path / "lin"
    lin.mkdir()
    code, _, err = _run(capsys, "identify", setup["log"], "--arm", setup["arm"], "--out", str(lin / "a.toml"),
                        "--method", "linear", "--cutoff", "none", "--mjcf", str(lin / "a.xml"))
    assert code != 0 and "--method consistent" in err and "nothing was written" in err
    assert list(lin.iterdir()) == []


def test_log_read_by_joint_name(setup, capsys, tmp_path):
    """A log whose columns are named after the joints is read with --joint-names, and the command
    says how it matched the columns; a wrong count of names is refused before any work."""
    t, q, qd, tau = setup["t"], setup["q"], setup["qd"], setup["tau"]
    path = tmp_path / "named.csv"
    cols = {"time": t, "elbow": q[:, 1], "shoulder": q[:, 0], "shoulder_velocity": qd[:, 0], "elbow_velocity": qd[:, 1],
            "shoulder_effort": tau[:, 0], "elbow_effort": tau[:, 1]}
    np.savetxt(path, np.column_stack(list(cols.values())), delimiter=",", header=",".join(cols), comments="", fmt="%.17g")
    code, stdout, err = _run(capsys, "identify", str(path), "--arm", setup["arm"], "--out", str(tmp_path / "a.toml"),
                             "--method", "linear", "--cutoff", "none", "--joint-names", "shoulder,elbow")
    assert code == 0, err
    assert "matched by joint name" in err
    ref = tmp_path / "ref"
    ref.mkdir()
    code, _, err = _run(capsys, "identify", setup["log"], "--arm", setup["arm"], "--out", str(ref / "b.toml"),
                        "--method", "linear", "--cutoff", "none")
    assert code == 0, err
    a, b = jaxarm.load_arm(tmp_path / "a.toml"), jaxarm.load_arm(ref / "b.toml")
    np.testing.assert_allclose(np.asarray(a.links.mass), np.asarray(b.links.mass), rtol=1e-9)
    code, _, err = _run(capsys, "identify", str(path), "--arm", setup["arm"], "--out", str(tmp_path / "c.toml"),
                        "--joint-names", "shoulder")
    assert code == 2 and "1 names for the arm's 2 joints" in err and not (tmp_path / "c.toml").exists()


def test_html_report_is_self_contained_and_renders(setup, capsys, tmp_path):
    """--html writes one page with no external resource: its figures are PNGs embedded as data
    URIs that decode to real, non-blank images (torques on both parts, residual histograms and
    spectra), its tables hold the verdict and the parameters, and it embeds the same report as
    --report writes."""
    import base64
    import html.parser
    import io

    from PIL import Image

    out, report, page = tmp_path / "id.toml", tmp_path / "id.json", tmp_path / "id.html"
    code, _, err = _run(capsys, "identify", setup["log"], "--arm", setup["arm"], "--out", str(out), "--report", str(report),
                        "--html", str(page), "--steps", "60", "--cutoff", "none")
    assert code == 0, err

    class Page(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.images, self.links, self.json, self.headings, self._in = [], [], None, [], None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "img":
                self.images.append((a.get("alt"), a.get("src", "")))
            if tag in ("link", "script") and (a.get("href") or a.get("src")):
                self.links.append(a)
            self._in = "json" if tag == "script" and a.get("id") == "report" else "h2" if tag == "h2" else None

        def handle_data(self, data):
            if self._in == "json":
                self.json = (self.json or "") + data
            elif self._in == "h2":
                self.headings.append(data.strip())

    parsed = Page()
    parsed.feed(page.read_text(encoding="utf-8"))
    assert parsed.links == []  # nothing loaded from elsewhere
    alts = [alt for alt, _ in parsed.images]
    assert alts == ["torques on the fitted part", "torques on the held-out part", "residual histograms", "residual spectra"]
    for alt, src in parsed.images:
        assert src.startswith("data:image/png;base64,"), alt
        image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        image.load()
        pixels = np.asarray(image.convert("L"), dtype=float)
        assert image.size[0] >= 400 and image.size[1] >= 150, (alt, image.size)
        assert pixels.std() > 5, alt  # drawn, not blank
    assert any(h.startswith("Verdict") for h in parsed.headings)
    for heading in ("Decisions made from the data", "Torque errors", "Parameters", "Physical consistency", "Warnings"):
        assert heading in parsed.headings, parsed.headings
    assert json.loads(parsed.json) == json.loads(report.read_text())

    # A real headless browser decodes every figure of the page as written: a copy with one
    # script appended records on <body> how many images loaded with a size (after the load event).
    from test_viewer import _chromium

    text = page.read_text(encoding="utf-8")
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", "<script>window.addEventListener('load', () => {"
                                  "const ok = [...document.images].filter(i => i.complete && i.naturalWidth >= 400);"
                                  "document.body.setAttribute('data-images', ok.length + '/' + document.images.length);"
                                  "});</script></body>"), encoding="utf-8")
    dom = _chromium(f"file://{probe}", tmp_path, "--dump-dom")
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-images="4/4"' in body, body
    # and the page itself, unchanged, paints its figures: a screenshot is far from blank
    shot = tmp_path / "report.png"
    _chromium(f"file://{page}", tmp_path, "--window-size=1000,3000", f"--screenshot={shot}")
    gray = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert np.mean(gray < 200) > 0.02, np.mean(gray < 200)


class _Terminal:
    """A stand-in for a terminal's stderr: text written to it is kept, and it says it is a tty."""

    def __init__(self):
        import io

        self.buffer = io.StringIO()

    def write(self, text):
        return self.buffer.write(text)

    def flush(self):
        pass

    def isatty(self):
        return True

    def fileno(self):  # (not a real file: rich asks, and falls back when it cannot have one)
        raise OSError("not a real terminal")


def test_status_line_shows_each_step_on_a_terminal_and_nothing_elsewhere(monkeypatch):
    """On a terminal, a long command's status line names the step running and the seconds spent;
    anywhere else (a pipe, a file, capsys) nothing is written."""
    import io
    import sys
    import time

    from jaxarm.cli.common import _Status

    monkeypatch.delenv("TERM", raising=False)
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    status = _Status()
    status("choosing the filter cutoff")
    # rich redraws the line from a thread of its own, the seconds counting on between updates
    seconds = lambda: [int(x) for x in re.findall(r"choosing the filter cutoff \((\d+) s so far\)", tty.buffer.getvalue())]  # noqa: E731
    deadline = time.perf_counter() + 20.0
    while max(seconds(), default=0) < 1 and time.perf_counter() < deadline:
        time.sleep(0.1)
    status.stop()
    shown = seconds()
    assert shown and shown[0] == 0 and max(shown) >= 1, tty.buffer.getvalue()
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    status = _Status()
    status("choosing the filter cutoff")
    status.stop()
    assert pipe.getvalue() == ""


def test_a_refusal_on_a_terminal_ends_with_its_one_error_line(setup, monkeypatch, tmp_path):
    """The status line is taken down before the error is printed: the refusal's line stands whole
    at the end of what the terminal shows."""
    import sys

    monkeypatch.delenv("TERM", raising=False)
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    notau = _write_log(tmp_path / "notau.csv", setup["t"], setup["q"], setup["qd"])
    code = cli.main(["identify", notau, "--arm", setup["arm"], "--out", str(tmp_path / "out.toml")])
    assert code == 2
    shown = tty.buffer.getvalue()
    assert "reading the arm and the log" in shown, repr(shown)
    # what stands after the status line is erased (ESC [2K: erase the line the cursor is on)
    after = shown.rsplit("\x1b[2K", 1)[-1]
    assert after.startswith("jaxarm: error: ") and after.count("\n") == 1 and "no torque columns" in after, repr(shown[-400:])
    assert not (tmp_path / "out.toml").exists()
