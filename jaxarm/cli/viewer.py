"""An interactive 3-D view of an arm in the browser: one self-contained HTML file.

The page holds the arm's stick figure (the same drawing as :mod:`jaxarm.cli.drawing`: the DH
offsets as segments, joints as dots, base and tool frames as red/green/blue triads) with its
solid links around it (a URDF's meshes, or cylinders and joint drums from the kinematics) at
every frame of one or many trajectories, the tool paths and the targets, and draws them with a few
hundred lines of plain JavaScript on a 2-D canvas: drag to turn, wheel to zoom, play/pause,
a time slider, playback speed, one checkbox per trajectory. Nothing is loaded from elsewhere,
so it opens offline and can be attached to a mail or a report. The kinematics are evaluated in
Python (one batched ``forward_kinematics`` call per trajectory); the page only projects points.

A link can open the page at a time and a view angle: ``view.html#t=0.5&az=-0.9&el=0.45&zoom=1``
(``&play=1`` starts playback). After each drawing the page records what it drew on ``document.body`` (``data-links``: link
segments drawn, ``data-frame``), which is what the headless-browser test reads.
"""

from __future__ import annotations

import html
import json

import numpy as np

from .drawing import _skeletons

__all__ = ["html_view", "arm_visuals"]

MAX_FRAMES = 1000  # per trajectory; longer runs are subsampled evenly in time
MAX_RUNS = 64

_PALETTE = ["#3b3b3b", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e"]


def _round(a, digits=5):
    return np.round(np.asarray(a, dtype=float), digits).tolist()


def _run(arm, label, t, q, poses=False):
    t = np.atleast_1d(np.asarray(t, dtype=float))
    q = np.asarray(q, dtype=float)
    if q.ndim == 1:
        q = q[None]
    if q.ndim != 2 or q.shape[1] != arm.n or q.shape[0] != t.shape[0]:
        raise ValueError(f"html_view: {label}: expected q (F, {arm.n}) with one time per row, got q {q.shape}, t {t.shape}")
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(t))):
        raise ValueError(f"html_view: {label}: q and t must be finite")
    if q.shape[0] > 1 and np.any(np.diff(t) < 0):
        raise ValueError(f"html_view: {label}: times must not decrease")
    idx = np.unique(np.linspace(0, len(t) - 1, min(MAX_FRAMES, len(t))).round().astype(int))
    points, joints, base, tools, frames = _skeletons(arm, q[idx])
    tool = np.concatenate([tools[:, :3, 3], tools[:, :3, 0], tools[:, :3, 1], tools[:, :3, 2]], axis=1)
    run = {"label": str(label), "t": _round(t[idx], 6), "q": _round(q[idx]), "points": _round(points),
           "joints": _round(joints), "tool": _round(tool)}
    if poses:  # each body's frame (rotation row by row, then origin) at every frame, for the meshes
        frames = frames[:, 1:]  # (F, n, 4, 4)
        run["poses"] = _round(np.concatenate([frames[..., :3, :3].reshape(*frames.shape[:2], 9), frames[..., :3, 3]], axis=-1))
    return run, base, points


def arm_visuals(spec: str, arm, meshes: bool = True):
    """The meshes to draw for the arm the command line loaded from ``spec``: a URDF file's visual
    geometry (:func:`jaxarm.model.visuals.urdf_visuals`, the same chain as :func:`jaxarm.load_arm`
    reads); for arm files (and URDFs without visual geometry) cylinders and joint drums from the
    kinematics (:func:`jaxarm.cli.drawing.link_meshes`). ``meshes=False``: none (the stick
    figure). Returns (visuals, notes)."""
    import os

    if not meshes:
        return [], []
    notes = []
    if str(spec).lower().endswith(".urdf") and os.path.exists(spec):
        from ..model.visuals import urdf_visuals

        visuals, notes = urdf_visuals(spec)
        if any(v.body > arm.n for v in visuals):
            visuals, notes = [], ["the URDF's links do not match the arm's bodies; drew its links from the kinematics"]
        if visuals:
            return visuals, notes
    from .drawing import link_meshes

    return link_meshes(arm), notes


def html_view(arm, q=None, runs=(), *, targets=(), title=None, visuals=None) -> str:
    """The page (a string) showing ``arm`` at ``q`` (n,) and/or along ``runs``: a sequence of
    ``(label, t, q)`` with t (F,) in seconds and q (F, n). ``targets``: points (3,) in the world
    frame to mark. ``visuals``: the links' meshes (:func:`jaxarm.model.visuals.urdf_visuals`),
    drawn as shaded surfaces around the stick figure; None (the default): cylinders and joint
    drums from the kinematics (:func:`jaxarm.cli.drawing.link_meshes`); ``()``: the stick figure
    alone. At most 64 runs; each is subsampled to at most 1000 frames."""
    runs = list(runs)
    if visuals is None:
        from .drawing import link_meshes

        visuals = link_meshes(arm)
    if q is None and not runs:
        q = np.zeros(arm.n)
    if q is not None:
        runs.insert(0, ("configuration", [0.0], np.asarray(q, dtype=float)[None]))
    if len(runs) > MAX_RUNS:
        raise ValueError(f"html_view: at most {MAX_RUNS} trajectories, got {len(runs)}")
    data, every = [], []
    visuals = list(visuals)
    for v in visuals:
        if not 0 <= v.body <= arm.n:
            raise ValueError(f"html_view: visuals: link {v.link!r} is on body {v.body}, but the arm has bodies 0..{arm.n}")
    for label, t, qs in runs:
        run, base, points = _run(arm, label, t, qs, poses=bool(visuals))
        data.append(run)
        every.append(points.reshape(-1, 3))
    targets = [np.asarray(p, dtype=float).reshape(3) for p in targets]
    every = np.concatenate(every + ([np.stack(targets)] if targets else []))
    lo, hi = every.min(axis=0), every.max(axis=0)
    payload = {
        "title": title or arm.name, "arm": arm.name, "n": arm.n, "base": _round(base),
        "center": _round(0.5 * (lo + hi)), "half": float(0.5 * np.max(hi - lo) + 0.05),
        "runs": data, "targets": [_round(p) for p in targets], "palette": _PALETTE,
        "meshes": [{"body": int(v.body), "v": _round(np.asarray(v.vertices).reshape(-1), 4),
                    "f": np.asarray(v.faces, dtype=int).reshape(-1).tolist(), "c": v.color or "#b4b4b4"} for v in visuals],
    }
    text = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
    return _PAGE.replace("__TITLE__", html.escape(payload["title"])).replace("__DATA__", text)


_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__ - jaxarm</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{margin:0;font:14px system-ui,sans-serif;color:#222;background:#fafafa}
header{padding:8px 12px;display:flex;flex-wrap:wrap;gap:10px;align-items:center;border-bottom:1px solid #ddd;background:#fff}
header h1{font-size:16px;margin:0 12px 0 0}
#slider{flex:1;min-width:160px}
#runs{padding:4px 12px;display:flex;flex-wrap:wrap;gap:10px}
#runs label{white-space:nowrap}
canvas{display:block;width:100%;cursor:grab;background:#fff}
#readout{margin:0;padding:6px 12px;font:12px ui-monospace,monospace;color:#444}
</style></head>
<body data-links="0" data-frame="-1" data-triangles="0">
<noscript><p>This page draws the arm with JavaScript; please enable it.</p></noscript>
<header><h1>__TITLE__</h1>
<button id="play" title="play / pause (space)">play</button>
<input id="slider" type="range" min="0" max="1000" value="0" aria-label="time">
<span id="clock"></span>
<label>speed <select id="speed"><option>0.1</option><option>0.25</option><option>0.5</option><option selected>1</option><option>2</option></select></label>
<label><input id="path" type="checkbox" checked> tool path</label>
<button id="reset">reset view</button>
</header>
<div id="runs"></div>
<canvas id="view"></canvas>
<pre id="readout"></pre>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const cv = document.getElementById("view"), ctx = cv.getContext("2d");
const slider = document.getElementById("slider"), clock = document.getElementById("clock");
const playBtn = document.getElementById("play"), speedSel = document.getElementById("speed");
const pathBox = document.getElementById("path"), readout = document.getElementById("readout");
const C = D.center, HALF = D.half;
const T0 = Math.min(...D.runs.map(r => r.t[0])), T1 = Math.max(...D.runs.map(r => r.t[r.t.length - 1]));
const AZ0 = -0.9, EL0 = 0.45;
let az = AZ0, el = EL0, zoom = 1, time = T0, playing = false, last = null;
const shown = D.runs.map(() => true);
if (T1 <= T0) { playBtn.disabled = true; slider.disabled = true; }

const runsDiv = document.getElementById("runs");
if (D.runs.length > 1) D.runs.forEach((r, i) => {
  const l = document.createElement("label"), b = document.createElement("input");
  b.type = "checkbox"; b.checked = true; b.onchange = () => { shown[i] = b.checked; draw(); };
  l.appendChild(b); l.append(" "); const s = document.createElement("span");
  s.textContent = r.label; s.style.color = colour(i); l.appendChild(s); runsDiv.appendChild(l);
});

function colour(i) { return D.palette[i % D.palette.length]; }
function size() {
  const w = cv.clientWidth || window.innerWidth, h = Math.max(320, Math.min(window.innerHeight - 120, w * 0.75));
  cv.width = w * (window.devicePixelRatio || 1); cv.height = h * (window.devicePixelRatio || 1); cv.style.height = h + "px";
}
function project(p) {
  // z up; turn about z by az, tilt by el; returns [screen x, screen y, closeness to the camera]
  const x = p[0] - C[0], y = p[1] - C[1], z = p[2] - C[2];
  const ca = Math.cos(az), sa = Math.sin(az), ce = Math.cos(el), se = Math.sin(el);
  const xr = ca * x - sa * y, yr = sa * x + ca * y;
  const s = zoom * 0.38 * Math.min(cv.width, cv.height) / HALF;
  return [cv.width / 2 + s * xr, cv.height / 2 - s * (se * yr + ce * z), -ce * yr + se * z];
}
function frameAt(r, t) {  // last frame with r.t[k] <= t (binary search)
  let lo = 0, hi = r.t.length - 1;
  if (t <= r.t[0]) return 0;
  while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (r.t[mid] <= t) lo = mid; else hi = mid - 1; }
  return lo;
}
function segment(list, a, b, style, width, extra) {
  const pa = project(a), pb = project(b);
  list.push({ depth: 0.5 * (pa[2] + pb[2]), kind: "seg", pa, pb, style, width, extra });
}
function rgb(hex) { return [1, 3, 5].map(k => parseInt(hex.slice(k, k + 2), 16)); }
function meshes(list, poses, tint, alpha) {
  // each body's mesh in the world: x = R v + p (body 0: the base frame); flat shading by the
  // angle between the triangle's normal and the direction to the viewer
  const ca = Math.cos(az), sa = Math.sin(az), ce = Math.cos(el), se = Math.sin(el);
  const eye = [-sa * ce, -ca * ce, se];  // unit vector towards the camera (world frame)
  let count = 0;
  for (const m of D.meshes) {
    let R, p;
    if (m.body === 0) { const B = D.base; R = [B[0][0], B[0][1], B[0][2], B[1][0], B[1][1], B[1][2], B[2][0], B[2][1], B[2][2]]; p = [B[0][3], B[1][3], B[2][3]]; }
    else { const f = poses[m.body - 1]; R = f.slice(0, 9); p = f.slice(9, 12); }
    const v = m.v, nv = v.length / 3, world = new Array(nv), screen = new Array(nv);
    for (let a = 0; a < nv; a++) {
      const x = v[3 * a], y = v[3 * a + 1], z = v[3 * a + 2];
      const w = [R[0] * x + R[1] * y + R[2] * z + p[0], R[3] * x + R[4] * y + R[5] * z + p[1], R[6] * x + R[7] * y + R[8] * z + p[2]];
      world[a] = w; screen[a] = project(w);
    }
    const base = rgb(m.c), t = tint ? rgb(tint) : null;
    for (let f = 0; f < m.f.length; f += 3) {
      const A = world[m.f[f]], Bw = world[m.f[f + 1]], Cw = world[m.f[f + 2]];
      const u = [Bw[0] - A[0], Bw[1] - A[1], Bw[2] - A[2]], s = [Cw[0] - A[0], Cw[1] - A[1], Cw[2] - A[2]];
      const n = [u[1] * s[2] - u[2] * s[1], u[2] * s[0] - u[0] * s[2], u[0] * s[1] - u[1] * s[0]];
      const len = Math.hypot(n[0], n[1], n[2]) || 1;
      const light = 0.35 + 0.65 * Math.abs((n[0] * eye[0] + n[1] * eye[1] + n[2] * eye[2]) / len);
      const c = base.map((b, j) => Math.round(Math.min(255, (t ? 0.5 * (b + t[j]) : b) * light)));
      const a = screen[m.f[f]], b = screen[m.f[f + 1]], cc = screen[m.f[f + 2]];
      list.push({ depth: (a[2] + b[2] + cc[2]) / 3 - 1e-3 * HALF, kind: "tri", a, b, c: cc, fill: "rgb(" + c.join(",") + ")", alpha });
      count++;
    }
  }
  return count;
}
function draw() {
  const px = window.devicePixelRatio || 1, unit = 0.38 * Math.min(cv.width, cv.height) / HALF * zoom;
  ctx.clearRect(0, 0, cv.width, cv.height);
  // floor grid at the base's height
  ctx.strokeStyle = "#e4e4e4"; ctx.lineWidth = px;
  const z0 = D.base[2][3], g = HALF, step = Math.pow(10, Math.floor(Math.log10(g)));
  for (let v = -Math.ceil(g / step) * step; v <= g + 1e-9; v += step) {
    let a = project([C[0] + v, C[1] - g, z0]), b = project([C[0] + v, C[1] + g, z0]);
    ctx.beginPath(); ctx.moveTo(a[0], a[1]); ctx.lineTo(b[0], b[1]); ctx.stroke();
    a = project([C[0] - g, C[1] + v, z0]); b = project([C[0] + g, C[1] + v, z0]);
    ctx.beginPath(); ctx.moveTo(a[0], a[1]); ctx.lineTo(b[0], b[1]); ctx.stroke();
  }
  const prims = [], axisColours = ["#d62728", "#2ca02c", "#1f77b4"], triad = 0.08 * HALF;
  const B = D.base, bo = [B[0][3], B[1][3], B[2][3]];
  for (let a = 0; a < 3; a++) segment(prims, bo, [bo[0] + triad * B[0][a], bo[1] + triad * B[1][a], bo[2] + triad * B[2][a]], axisColours[a], 2 * px);
  let links = 0, lines = [], triangles = 0;
  const first = D.runs.findIndex((_, j) => shown[j]);
  D.runs.forEach((r, i) => {
    if (!shown[i]) return;
    const k = frameAt(r, time), P = r.points[k], col = colour(i);
    const w = D.meshes.length ? Math.max(1.5 * px, 0.012 * unit) : Math.max(3 * px, 0.035 * unit);
    if (D.meshes.length) triangles += meshes(prims, r.poses[k], i === first ? null : col, i === first ? 1 : 0.35);
    for (let j = 0; j + 1 < P.length; j++) {
      const d = Math.hypot(P[j + 1][0] - P[j][0], P[j + 1][1] - P[j][1], P[j + 1][2] - P[j][2]);
      if (d > 1e-9) { segment(prims, P[j], P[j + 1], col, w, "link"); links++; }
    }
    r.joints[k].forEach(p => { const s = project(p); prims.push({ depth: s[2] + 1e-6, kind: "dot", s, style: "#ff7f0e", r: 0.45 * w }); });
    const tl = r.tool[k], o = tl.slice(0, 3);
    for (let a = 0; a < 3; a++) segment(prims, o, [o[0] + triad * tl[3 + 3 * a], o[1] + triad * tl[4 + 3 * a], o[2] + triad * tl[5 + 3 * a]], axisColours[a], 2 * px);
    if (pathBox.checked && r.t.length > 1) lines.push({ pts: r.tool.slice(0, k + 1).map(x => project(x)), col });
    if (i === first)
      readout.textContent = r.label + "   t = " + r.t[k].toFixed(3) + " s   q = [" + r.q[k].map(v => v.toFixed(3)).join(", ") + "]";
  });
  // tool paths under the arms, thin
  lines.forEach(l => {
    ctx.strokeStyle = l.col; ctx.globalAlpha = 0.7; ctx.lineWidth = 1.5 * px; ctx.beginPath();
    l.pts.forEach((p, j) => j ? ctx.lineTo(p[0], p[1]) : ctx.moveTo(p[0], p[1])); ctx.stroke(); ctx.globalAlpha = 1;
  });
  D.targets.forEach(p => { const s = project(p); prims.push({ depth: s[2], kind: "target", s }); });
  prims.sort((a, b) => a.depth - b.depth);  // far first (painter's algorithm)
  ctx.lineCap = "round";
  for (const p of prims) {
    if (p.kind === "seg") {
      ctx.strokeStyle = p.style; ctx.lineWidth = p.width; ctx.beginPath();
      ctx.moveTo(p.pa[0], p.pa[1]); ctx.lineTo(p.pb[0], p.pb[1]); ctx.stroke();
    } else if (p.kind === "tri") {
      ctx.globalAlpha = p.alpha; ctx.fillStyle = p.fill; ctx.strokeStyle = p.fill; ctx.lineWidth = 0.5 * px;
      ctx.beginPath(); ctx.moveTo(p.a[0], p.a[1]); ctx.lineTo(p.b[0], p.b[1]); ctx.lineTo(p.c[0], p.c[1]); ctx.closePath();
      ctx.fill(); ctx.stroke(); ctx.globalAlpha = 1;
    } else if (p.kind === "dot") {
      ctx.fillStyle = p.style; ctx.beginPath(); ctx.arc(p.s[0], p.s[1], p.r, 0, 2 * Math.PI); ctx.fill();
    } else {
      const r = 7 * px; ctx.strokeStyle = "#000"; ctx.lineWidth = 2 * px; ctx.beginPath();
      ctx.moveTo(p.s[0] - r, p.s[1] - r); ctx.lineTo(p.s[0] + r, p.s[1] + r);
      ctx.moveTo(p.s[0] - r, p.s[1] + r); ctx.lineTo(p.s[0] + r, p.s[1] - r); ctx.stroke();
    }
  }
  clock.textContent = "t = " + time.toFixed(3) + " s / " + T1.toFixed(3) + " s";
  document.body.dataset.links = String(links);
  document.body.dataset.triangles = String(triangles);
  document.body.dataset.frame = String(D.runs.length ? frameAt(D.runs[0], time) : -1);
}
function setTime(t) { time = Math.min(Math.max(t, T0), T1); slider.value = T1 > T0 ? Math.round(1000 * (time - T0) / (T1 - T0)) : 0; draw(); }
function tick(now) {
  if (!playing) return;
  if (last !== null) { let t = time + (now - last) / 1000 * parseFloat(speedSel.value); if (t > T1) t = T0 + (t - T1) % Math.max(T1 - T0, 1e-9); setTime(t); }
  last = now; requestAnimationFrame(tick);
}
function toggle() { if (T1 <= T0) return; playing = !playing; playBtn.textContent = playing ? "pause" : "play"; last = null; if (playing) requestAnimationFrame(tick); }
playBtn.onclick = toggle;
window.addEventListener("keydown", e => { if (e.code === "Space") { e.preventDefault(); toggle(); } });
slider.oninput = () => setTime(T0 + (T1 - T0) * slider.value / 1000);
pathBox.onchange = draw;
document.getElementById("reset").onclick = () => { az = AZ0; el = EL0; zoom = 1; draw(); };
let drag = null;
cv.addEventListener("pointerdown", e => { drag = [e.clientX, e.clientY]; cv.setPointerCapture(e.pointerId); });
cv.addEventListener("pointermove", e => {
  if (!drag) return;
  az += 0.01 * (e.clientX - drag[0]); el = Math.max(-1.5, Math.min(1.5, el + 0.01 * (e.clientY - drag[1])));
  drag = [e.clientX, e.clientY]; draw();
});
cv.addEventListener("pointerup", () => { drag = null; });
cv.addEventListener("wheel", e => { e.preventDefault(); zoom *= Math.exp(-0.001 * e.deltaY); draw(); }, { passive: false });
window.addEventListener("resize", () => { size(); draw(); });
// a link can open at a time and a view: view.html#t=0.5&az=-0.9&el=0.45&zoom=1&play=1
const H = new URLSearchParams(location.hash.slice(1));
if (H.has("az")) az = parseFloat(H.get("az")) || AZ0;
if (H.has("el")) el = parseFloat(H.get("el")) || EL0;
if (H.has("zoom")) zoom = parseFloat(H.get("zoom")) || 1;
size(); setTime(H.has("t") ? parseFloat(H.get("t")) || T0 : T0);
if (H.get("play") === "1") toggle();
</script>
</body></html>
"""
