"""The interactive 3-D page (``jaxarm view``, ``simulate --animate x.html``): its data follow the
kinematics, it is self-contained, and a real headless browser draws the arm from it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

import jaxarm
from jaxarm.cli import main
from jaxarm.cli.viewer import html_view

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _page_data(text):
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S).group(1))


def _run(arm, seconds=1.0, frames=51, scale=1.0):
    t = np.linspace(0.0, seconds, frames)
    return t, scale * np.outer(np.sin(2.0 * t), np.linspace(0.3, 0.9, arm.n))


def test_page_holds_the_kinematics_and_nothing_from_elsewhere():
    arm = jaxarm.load_arm("panda")
    t, q = _run(arm)
    text = html_view(arm, None, [("a", t, q)], targets=[[0.4, 0.1, 0.5]])
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', text), "the page must open offline"
    assert "http://" not in text and "https://" not in text
    data = _page_data(text)
    (run,) = data["runs"]
    assert len(run["t"]) == len(t) and np.allclose(run["q"], q, atol=1e-5)
    for k in (0, 25, 50):
        tool = np.asarray(jaxarm.tool_pose(arm, q[k]))
        assert np.allclose(run["tool"][k][:3], tool[:3, 3], atol=1e-5)
        assert np.allclose(run["tool"][k][9:12], tool[:3, 2], atol=1e-5)  # the tool's z axis
        assert np.allclose(run["points"][k][-1], tool[:3, 3], atol=1e-5)
        frames, _ = jaxarm.forward_kinematics(arm, q[k])
        assert np.allclose(run["joints"][k], np.asarray(frames)[1:, :3, 3], atol=1e-5)
    assert data["targets"] == [[0.4, 0.1, 0.5]]


def test_long_runs_are_subsampled_and_bad_runs_refused():
    arm = jaxarm.load_arm("two_link_planar")
    t, q = _run(arm, frames=5001)
    data = _page_data(html_view(arm, None, [("long", t, q)]))
    assert len(data["runs"][0]["t"]) == 1000 and data["runs"][0]["t"][-1] == pytest.approx(t[-1])
    with pytest.raises(ValueError, match="expected q"):
        html_view(arm, None, [("bad", t, q[:, :1])])
    with pytest.raises(ValueError, match="finite"):
        html_view(arm, None, [("nan", t[:2], np.full((2, 2), np.nan))])
    with pytest.raises(ValueError, match="not decrease"):
        html_view(arm, None, [("back", t[::-1].copy(), q)])


def _browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium/Chrome on this machine (CI installs Debian's chromium)")


def _chromium(page, tmp_path, *args):
    out = subprocess.run([_browser(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args, page],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_a_headless_browser_draws_the_arm(tmp_path):
    """Open the page in a real browser: the script runs, draws every link of both runs at the
    requested time, and the links' colours are on the screenshot; another time shows another frame."""
    arm = jaxarm.load_arm("puma560")
    t, q = _run(arm)
    page = tmp_path / "view.html"
    page.write_text(html_view(arm, None, [("first", t, q), ("second", t, 0.5 * q)], targets=[[0.3, 0.2, 0.5]], visuals=()))
    data = _page_data(page.read_text())
    expected = 0
    for run in data["runs"]:
        pts = np.asarray(run["points"][25])
        expected += int(np.sum(np.linalg.norm(np.diff(pts, axis=0), axis=1) > 1e-9))
    dom = _chromium(f"file://{page}#t=0.5", tmp_path, "--dump-dom")
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert f'data-links="{expected}"' in body and 'data-frame="25"' in body, body
    dom_end = _chromium(f"file://{page}#t=1", tmp_path, "--dump-dom")
    assert 'data-frame="50"' in re.search(r"<body[^>]*>", dom_end).group(0)

    shot = tmp_path / "shot.png"
    _chromium(f"file://{page}#t=0.5", tmp_path, "--window-size=900,700", f"--screenshot={shot}")
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    for colour in ("#3b3b3b", "#1f77b4"):  # the two runs' link colours
        rgb = np.array([int(colour[k:k + 2], 16) for k in (1, 3, 5)])
        assert np.sum(np.all(np.abs(pixels - rgb) <= 2, axis=1)) > 500, f"no {colour} links on the screenshot"


def test_view_command_writes_page_picture_and_animation(tmp_path, capsys):
    results = tmp_path / "run.npz"
    assert main(["simulate", "two_link_planar", "--controller", "pd", "--target", "0.5,-0.5", "--duration", "0.2",
                 "--dt", "0.01", "--out", str(results), "--batch", "3", "--perturb", "0.1",
                 "--animate", str(tmp_path / "sim.html")]) == 0
    sim = _page_data((tmp_path / "sim.html").read_text())
    assert len(sim["runs"]) == 3 and len(sim["targets"]) == 1
    page = tmp_path / "view.html"
    assert main(["view", "two_link_planar", "--traj", str(results), "--out", str(page)]) == 0
    data = _page_data(page.read_text())
    saved = np.load(results)
    assert len(data["runs"]) == 3 and np.allclose(data["runs"][2]["q"], saved["q"][2], atol=1e-5)
    assert len(data["targets"]) == 1  # the PD target's tool position
    assert main(["view", "two_link_planar", "--traj", str(results), "--out", str(page)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["view", "two_link_planar", "--q", "0.1,0.2", "--out", str(tmp_path / "q.png")]) == 0
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one = tmp_path / "one.npz"
    np.savez(one, t=saved["t"], q=saved["q"][0])
    assert main(["view", "two_link_planar", "--traj", str(one), "--out", str(tmp_path / "one.gif")]) == 0
    assert (tmp_path / "one.gif").read_bytes()[:6] == b"GIF89a"
    capsys.readouterr()
    for argv, message in (
        (["--out", str(tmp_path / "x.txt")], "expected a .html"),
        (["--traj", str(results), "--out", str(tmp_path / "x.png")], "shows one run"),
        (["--out", str(tmp_path / "x.gif")], "needs a trajectory"),
        (["--q", "1", "--out", str(tmp_path / "x.html")], "expected 2 values"),
        (["--target", "1,2", "--out", str(tmp_path / "x.html")], "x,y,z"),
        (["--traj", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "x.html")], "no such file"),
    ):
        assert main(["view", "two_link_planar", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp_path / "x.html").exists()
    panda = tmp_path / "panda.npz"
    np.savez(panda, t=np.zeros(1), q=np.zeros((1, 7)))
    assert main(["view", "two_link_planar", "--traj", str(panda), "--out", str(tmp_path / "x.html")]) == 2
    assert "7 joints" in capsys.readouterr().err


def test_arms_lists_every_bundled_arm(capsys):
    assert main(["arms"]) == 0
    out = capsys.readouterr().out
    for name in jaxarm.bundled_arms():
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert len(line.split(None, 2)[2]) > 20, line  # a description, not just the name


def test_an_mp4_holds_every_frame_of_the_animation(tmp_path, capsys):
    """The MP4 is decoded back by ffmpeg: one frame per animation frame, the arm's picture in it
    (each decoded frame close to the same frame of the GIF, up to H.264's loss), and it changes as
    the arm moves."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg", reason="MP4 needs imageio-ffmpeg (pip install 'jaxarm[video]')")
    pytest.importorskip("matplotlib")
    from PIL import Image

    from jaxarm.cli.drawing import animate_arm

    arm = jaxarm.load_arm("two_link_planar")
    t, q = _run(arm, seconds=1.0, frames=21)
    video, gif = tmp_path / "run.mp4", tmp_path / "run.gif"
    animate_arm(arm, t, q, str(video), format="mp4")
    animate_arm(arm, t, q, str(gif))
    assert video.read_bytes()[4:8] == b"ftyp"
    reader = imageio_ffmpeg.read_frames(str(video))
    meta = reader.__next__()
    w, h = meta["size"]
    frames = [np.frombuffer(f, np.uint8).reshape(h, w, 3).astype(float) for f in reader]
    assert len(frames) == 21 and meta["fps"] == pytest.approx(20.0, rel=1e-3)
    with Image.open(gif) as im:
        reference = []
        for k in range(im.n_frames):
            im.seek(k)
            reference.append(np.asarray(im.convert("RGB"), float)[:h, :w])
    assert len(reference) == 21
    for a, b in zip(frames, reference):
        assert np.mean(np.abs(a - b)) < 4.0  # lossy, but the same picture
    # The arm moved, and each end of the video is the matching end of the GIF, not the other one.
    for k, other in ((0, -1), (-1, 0)):
        assert np.mean(np.abs(frames[k] - reference[k])) < 0.7 * np.mean(np.abs(frames[k] - reference[other]))
    # From the command line, and refused with one line for a non-animation name.
    results = tmp_path / "run.npz"
    assert main(["simulate", "two_link_planar", "--duration", "0.1", "--dt", "0.01", "--out", str(results),
                 "--animate", str(tmp_path / "sim.mp4")]) == 0
    assert (tmp_path / "sim.mp4").read_bytes()[4:8] == b"ftyp"
    assert main(["view", "two_link_planar", "--traj", str(results), "--out", str(tmp_path / "view.mp4")]) == 0
    assert (tmp_path / "view.mp4").read_bytes()[4:8] == b"ftyp"
    capsys.readouterr()
    assert main(["simulate", "two_link_planar", "--duration", "0.1", "--dt", "0.01", "--out", str(tmp_path / "x.npz"),
                 "--animate", str(tmp_path / "x.avi")]) == 2
    assert "expected a .gif or .mp4 file" in capsys.readouterr().err and not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize("name", ["puma560", "panda", "stanford_arm", "rp_arm"])
def test_solid_links_follow_the_kinematics(name):
    """Each link cylinder of an arm file, carried by its body through a new configuration, still
    joins the two stick-figure points it was built on; each joint drum sits on its joint's axis."""
    from jaxarm.cli.drawing import _skeletons, link_meshes

    arm = jaxarm.load_arm(name)
    visuals = link_meshes(arm)
    q = np.random.default_rng(0).uniform(-0.5, 0.5, arm.n) + 0.3
    points, _, _, _, frames = _skeletons(arm, q[None])
    points, frames = points[0], frames[0]
    links = [v for v in visuals if v.link.startswith("segment")]
    strokes = sum(kind == "prismatic" for kind in arm.joint_types)
    lengths = np.linalg.norm(np.diff(points, axis=0), axis=1)
    assert len(links) >= int(np.sum(lengths > 1e-6)) - strokes
    assert len(links) >= (3 if arm.n >= 6 else 0)
    for v in links:
        T = frames[v.body]
        caps = np.asarray(v.vertices)[-2:] @ T[:3, :3].T + T[:3, 3]  # the cylinder's two cap centres
        j = int(v.link.split()[1])
        assert np.allclose(caps, points[j:j + 2], atol=1e-9) or np.allclose(caps[::-1], points[j:j + 2], atol=1e-9), v.link
    drums = [v for v in visuals if v.link.startswith("joint")]
    assert len(drums) == arm.n
    for v in drums:
        T = frames[v.body]
        centre = np.asarray(v.vertices).mean(axis=0) @ T[:3, :3].T + T[:3, 3]
        assert np.allclose(centre, T[:3, 3], atol=1e-9)


def test_arm_files_are_drawn_solid_in_every_format(tmp_path, capsys):
    """`jaxarm view` draws an arm file's links as shaded cylinders in the page and the picture;
    --no-meshes keeps the stick figure."""
    from PIL import Image

    from jaxarm.cli.drawing import JOINT_COLOR

    q = "0,0.5,-0.8,0,0.6,0"
    assert main(["view", "puma560", "--q", q, "--out", str(tmp_path / "p.html")]) == 0
    assert "cylinders from the kinematics" in capsys.readouterr().out
    data = _page_data((tmp_path / "p.html").read_text())
    assert len(data["meshes"]) >= 6 + 1 + 3 and all(len(m["f"]) > 0 for m in data["meshes"])
    assert main(["view", "puma560", "--q", q, "--out", str(tmp_path / "s.html"), "--no-meshes"]) == 0
    assert _page_data((tmp_path / "s.html").read_text())["meshes"] == []
    drum = np.array([int(JOINT_COLOR[k:k + 2], 16) for k in (1, 3, 5)])
    counts = []
    for flag in ([], ["--no-meshes"]):
        out = tmp_path / f"p{len(flag)}.png"
        assert main(["view", "puma560", "--q", q, "--out", str(out), *flag]) == 0
        px = np.asarray(Image.open(out).convert("RGB"), dtype=float).reshape(-1, 3)
        # shaded drum colour: a multiple of the base colour between 0.45 and 1
        ratio = px / drum
        shaded = (np.ptp(ratio, axis=1) < 0.06) & (ratio.mean(axis=1) > 0.45) & (ratio.mean(axis=1) < 1.01)
        counts.append(int(shaded.sum()))
    assert counts[0] > 2000 and counts[1] < 200, counts


def test_a_headless_browser_draws_solid_links(tmp_path, capsys):
    assert main(["view", "panda", "--q", "0,-0.785,0,-2.356,0,1.571,0.785", "--out", str(tmp_path / "p.html")]) == 0
    capsys.readouterr()
    faces = sum(len(m["f"]) // 3 for m in _page_data((tmp_path / "p.html").read_text())["meshes"])
    dom = _chromium(f"file://{tmp_path / 'p.html'}", tmp_path, "--dump-dom")
    assert f'data-triangles="{faces}"' in re.search(r"<body[^>]*>", dom).group(0)
