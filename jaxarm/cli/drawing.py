"""Pictures of the arm itself: a 3-D stick drawing at a configuration and an animated GIF of a run.

The links are drawn along the kinematic chain the arm file describes: for a DH arm the joint
offset of each row is drawn as its own segment (along z_{i-1} by d_i in the standard convention,
along x_{i-1} by a_{i-1} in the modified one), so the picture shows the DH table; for a URDF-style
arm, straight segments between the joint frames. Each segment is drawn as a shaded cylinder fixed
in the body that carries it, each joint as a drum along its axis (:func:`link_meshes`; or, with
``solid=False``, the stick figure with joints as dots); the base and tool frames are small
red/green/blue triads; optional: the tool path and a target point. matplotlib only (``jaxarm[plot]``),
drawn on its Agg canvas (no pyplot, no change to an interactive session's backend); GIF frames are
assembled with Pillow, which matplotlib depends on, and MP4 frames encoded (H.264) by the ffmpeg
that the optional ``imageio-ffmpeg`` package ships.
"""

from __future__ import annotations

import io

import numpy as np

__all__ = ["skeleton", "skeletons", "link_meshes", "draw_arm", "animate_arm"]

LINK_COLOR = "#a9bccf"  # the links' cylinders
JOINT_COLOR = "#f0a04b"  # the joints' drums


def skeleton(arm, q):
    """Points (m, 3) of the arm's stick figure at q (n,), base first, tool last, the joint
    origins (n, 3), the base frame (4, 4) and the tool frame (4, 4), in the world frame."""
    points, joints, base, tools = skeletons(arm, np.asarray(q, dtype=float)[None])
    return points[0], joints[0], base, tools[0]


def skeletons(arm, qs):
    """:func:`skeleton` at every row of qs (F, n) in one batched call: points (F, m, 3), joint
    origins (F, n, 3), the base frame (4, 4) and the tool frames (F, 4, 4)."""
    return _skeletons(arm, qs)[:4]


def _skeletons(arm, qs):
    """:func:`skeletons` and the link frames it is drawn from, (F, n+1, 4, 4) (frame 0: the base)."""
    import jax

    from ..dynamics.kinematics import forward_kinematics

    qs = np.asarray(qs, dtype=float)
    if qs.ndim != 2 or qs.shape[1] != arm.n:
        raise ValueError(f"skeletons: expected q (F, {arm.n}), got {qs.shape}")
    frames, tools = (np.asarray(x, dtype=float) for x in jax.jit(jax.vmap(forward_kinematics, (None, 0)))(arm, qs))
    points = [frames[:, 0, :3, 3]]
    kin = arm.kinematics
    for i in range(arm.n):
        prev = frames[:, i]
        if hasattr(kin, "d"):  # DH: draw the row's offset as its own segment
            if arm.convention == "standard":
                s = float(kin.d[i]) + (qs[:, i] if arm.joint_types[i] == "prismatic" else 0.0)
                points.append(prev[:, :3, 3] + np.reshape(s, (-1, 1)) * prev[:, :3, 2])
            else:
                points.append(prev[:, :3, 3] + float(kin.a[i]) * prev[:, :3, 0])
        points.append(frames[:, i + 1, :3, 3])
    points.append(tools[:, :3, 3])
    return np.stack(points, axis=1), frames[:, 1:, :3, 3], frames[0, 0], tools, frames


def _probe_configurations(arm, count: int = 3):
    """A few configurations inside the joint limits (+/-1 rad or m where a limit is infinite),
    the same every call, at which :func:`link_meshes` tells which body carries each segment."""
    lim = np.asarray(arm.limits.position, dtype=float).reshape(arm.n, 2)
    lo = np.where(np.isfinite(lim[:, 0]), lim[:, 0], -1.0)
    hi = np.where(np.isfinite(lim[:, 1]), lim[:, 1], 1.0)
    u = np.random.default_rng(12345).uniform(0.2, 0.8, (count, arm.n))
    return lo + u * (hi - lo)


def _along(v, start, end):
    """Vertices v (V, 3) of a shape built along z, centred at 0, turned onto the segment start -> end."""
    d = end - start
    z = d / np.linalg.norm(d)
    helper = np.array([1.0, 0.0, 0.0]) if abs(z[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    x = np.cross(helper, z)
    x /= np.linalg.norm(x)
    R = np.stack([x, np.cross(z, x), z], axis=1)
    return v @ R.T + 0.5 * (start + end)


def link_meshes(arm, radius: float | None = None):
    """Solid links drawn from the kinematics alone, for arms without meshes (arm files): a
    cylinder along each segment of the stick figure (:func:`skeletons`), fixed in the body that
    carries it, a drum along each revolute joint's axis (a block for a prismatic joint) and a
    pedestal under the base. Returns a list of :class:`jaxarm.model.visuals.Visual` in the body
    frames, as :func:`jaxarm.model.visuals.urdf_visuals` does for a URDF's meshes.

    Which body carries a segment is read off the kinematics: the segment whose end points stay
    put in body b's frame over a few configurations belongs to body b. A segment that changes
    length (a prismatic joint's stroke) belongs to no body and stays a line. ``radius``: the
    links' radius in metres (default 3.5 % of the arm's reach, between 5 mm and 8 cm)."""
    from ..model.visuals import Visual, _box, _cylinder

    qs = _probe_configurations(arm)
    points, _, _, _, frames = _skeletons(arm, qs)  # (F, m, 3), (F, n+1, 4, 4)
    inv = np.linalg.inv(frames)
    seg_len = np.linalg.norm(np.diff(points, axis=1), axis=2)  # (F, m-1)
    if radius is None:
        radius = float(np.clip(0.035 * np.max(np.sum(seg_len, axis=1)), 0.005, 0.08))
    out = []
    for j in range(points.shape[1] - 1):
        if seg_len[0, j] < 1e-6 or np.ptp(seg_len[:, j]) > 1e-9 * max(1.0, seg_len[0, j]):
            continue
        ends = np.stack([points[:, j], points[:, j + 1]], axis=1)  # (F, 2, 3)
        local = np.einsum("fbij,fkj->fbki", inv[:, :, :3, :3], ends) + inv[:, :, None, :3, 3]  # (F, n+1, 2, 3)
        still = np.all(np.abs(local - local[:1]) < 1e-9 * max(1.0, seg_len[0, j]), axis=(0, 2, 3))
        if not still.any():
            continue
        b = int(np.flatnonzero(still)[0])
        v, f = _cylinder(radius, seg_len[0, j], segments=16)
        out.append(Visual(b, _along(v, local[0, b, 0], local[0, b, 1]), f, LINK_COLOR, f"segment {j}", "kinematics"))
    for i in range(arm.n):  # body i+1's frame has z on joint i+1's axis, at the joint
        if arm.joint_types[i] == "revolute":
            v, f = _cylinder(1.45 * radius, 3.2 * radius, segments=18)
        else:
            v, f = _box(2.4 * radius, 2.4 * radius, 3.2 * radius)
        out.append(Visual(i + 1, v, f, JOINT_COLOR, f"joint {i + 1}", "kinematics"))
    v, f = _cylinder(2.2 * radius, 1.5 * radius, segments=24)
    out.append(Visual(0, v - [0.0, 0.0, 0.75 * radius], f, "#7f8c99", "base", "kinematics"))
    return out


def _mesh_polygons(visuals, frames):
    """The triangles of ``visuals`` placed by ``frames`` (n+1, 4, 4) (frame 0: the base) in the
    world: (K, 3, 3) and their face colours (K, 4), flat-shaded by the angle to a fixed light."""
    tris, colours = [], []
    light = np.array([-0.4, -0.6, 0.7]) / np.linalg.norm([-0.4, -0.6, 0.7])
    for vis in visuals:
        T = frames[vis.body]
        w = np.asarray(vis.vertices) @ T[:3, :3].T + T[:3, 3]
        tri = w[np.asarray(vis.faces)]
        nrm = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
        nrm /= np.maximum(np.linalg.norm(nrm, axis=1, keepdims=True), 1e-300)
        shade = 0.45 + 0.55 * np.abs(nrm @ light)
        base = np.array([int((vis.color or "#b4b4b4")[k:k + 2], 16) for k in (1, 3, 5)]) / 255.0
        colours.append(np.c_[np.clip(shade[:, None] * base, 0, 1), np.ones(len(tri))])
        tris.append(tri)
    return np.concatenate(tris), np.concatenate(colours)


def _limits(points):
    center = 0.5 * (points.max(axis=0) + points.min(axis=0))
    half = 0.5 * float(np.max(points.max(axis=0) - points.min(axis=0))) + 0.05
    return center - half, center + half


def _triad(ax, T, size):
    for axis, color in zip(range(3), ("r", "g", "b")):
        end = T[:3, 3] + size * T[:3, axis]
        ax.plot(*np.stack([T[:3, 3], end]).T, color=color, lw=1.2)


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from .plotting import require_matplotlib

    fig = require_matplotlib()(figsize=(5.5, 5.0))
    FigureCanvasAgg(fig)
    return fig


def _draw(ax, figure, box, tool_path=None, target=None, title=None, solids=None):
    """Draw a :func:`skeleton` ``figure`` (points, joints, base, tool) in the cube ``box``;
    ``solids``: the links as (triangles, colours) of :func:`_mesh_polygons` (the stick figure
    then only shows where no solid is, e.g. a prismatic stroke)."""
    points, joints, base, tool = figure
    size = 0.08 * float(np.max(box[1] - box[0]))
    if solids is not None:
        from mpl_toolkits.mplot3d.art3d import Poly3DCollection

        ax.add_collection3d(Poly3DCollection(solids[0], facecolors=solids[1], edgecolors="none", linewidths=0))
        ax.plot(*points.T, color="0.25", lw=1.2)
    else:
        ax.plot(*points.T, color="0.25", lw=4, solid_capstyle="round")
        ax.scatter(*joints.T, color="C1", s=25, depthshade=False)
    _triad(ax, base, size)
    _triad(ax, tool, size)
    if tool_path is not None:
        ax.plot(*np.asarray(tool_path).T, color="C0", lw=1, label="tool path")
    if target is not None:
        ax.scatter(*np.asarray(target, dtype=float), color="k", marker="x", s=40, label="target")
    ax.set_xlim(box[0][0], box[1][0])
    ax.set_ylim(box[0][1], box[1][1])
    ax.set_zlim(box[0][2], box[1][2])
    ax.set_box_aspect((1, 1, 1))
    ax.set_xlabel("x [m]")
    ax.set_ylabel("y [m]")
    ax.set_zlabel("z [m]")
    if title:
        ax.set_title(title, fontsize=10)


def _solids_at(arm, frames, solid):
    """The (triangles, colours) of the arm's links at each of ``frames`` (F, n+1, 4, 4), or Nones
    when ``solid`` is false; ``solid`` may also be a list of visuals to draw instead."""
    if not solid:
        return [None] * len(frames)
    visuals = link_meshes(arm) if solid is True else list(solid)
    return [_mesh_polygons(visuals, fr) for fr in frames]


def draw_arm(arm, q, file, *, format="png", tool_path=None, target=None, title=None, solid=True):
    """Draw ``arm`` at q (n,) into ``file`` (a path or a binary file object). ``solid``: draw the
    links as shaded cylinders and the joints as drums (:func:`link_meshes`); False: the stick figure."""
    fig = _figure()
    ax = fig.add_subplot(projection="3d")
    points, joints, base, tools, frames = _skeletons(arm, np.asarray(q, dtype=float)[None])
    figure = (points[0], joints[0], base, tools[0])
    extra = [figure[0]] + ([np.asarray(tool_path)] if tool_path is not None else []) + ([np.asarray(target)[None]] if target is not None else [])
    _draw(ax, figure, _limits(np.concatenate(extra)), tool_path, target, title or f"{arm.name} at q = {np.round(np.asarray(q), 3).tolist()}",
          _solids_at(arm, frames, solid)[0])
    fig.savefig(file, format=format, dpi=100)
    return file


def animate_arm(arm, t, q, file, *, frames: int = 80, target=None, fps: float | None = None, format: str = "gif",
                solid=True):
    """An animation of a run: ``q`` (T+1, n) at times ``t`` (T+1,), at most ``frames`` frames
    evenly spaced in time (played at the run's speed unless ``fps`` is given), the tool path so
    far drawn behind the arm. ``format``: "gif" (assembled by Pillow) or "mp4" (H.264, encoded by
    the ffmpeg that the ``imageio-ffmpeg`` package ships: ``pip install jaxarm[video]``).
    ``solid`` as in :func:`draw_arm`. Writes to ``file`` (a path or a binary file object)."""
    if format not in ("gif", "mp4"):
        raise ValueError(f"animate_arm: format: expected 'gif' or 'mp4', got {format!r}")
    if format == "mp4":
        _require_ffmpeg()
    t, q = np.asarray(t, dtype=float), np.asarray(q, dtype=float)
    if q.ndim != 2 or q.shape[0] != t.shape[0] or q.shape[1] != arm.n:
        raise ValueError(f"animate_arm: expected q (T+1, {arm.n}) matching t (T+1,), got q {q.shape}, t {t.shape}")
    idx = np.unique(np.linspace(0, len(t) - 1, min(frames, len(t))).round().astype(int))
    points, joints, base, tools, link_frames = _skeletons(arm, q[idx])  # once: the tool path and the drawing use them
    figures = [(points[j], joints[j], base, tools[j]) for j in range(len(idx))]
    solids = _solids_at(arm, link_frames, solid)
    tool_path = np.asarray([f[3][:3, 3] for f in figures])
    every = np.concatenate([f[0] for f in figures] + ([np.asarray(target)[None]] if target is not None else []))
    box = _limits(every)
    images = []
    for j, (k, figure) in enumerate(zip(idx, figures)):
        fig = _figure()
        ax = fig.add_subplot(projection="3d")
        _draw(ax, figure, box, tool_path[: j + 1], target, f"{arm.name}   t = {t[k]:.3f} s", solids[j])
        fig.canvas.draw()
        images.append(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
    span = float(t[idx[-1]] - t[idx[0]]) if len(idx) > 1 else 0.0
    duration_ms = 1000.0 / fps if fps else (1000.0 * span / max(len(idx) - 1, 1) if span > 0 else 100.0)
    data = _gif(images, duration_ms) if format == "gif" else _mp4(images, duration_ms)
    if hasattr(file, "write"):
        file.write(data)
    else:
        with open(file, "wb") as f:
            f.write(data)
    return file


def _gif(images, duration_ms: float) -> bytes:
    from PIL import Image

    frames = [Image.fromarray(im).quantize(colors=64) for im in images]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=max(20, int(duration_ms)), loop=0)
    return buffer.getvalue()


def _require_ffmpeg():
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as exc:
        raise ImportError("an MP4 needs ffmpeg, which the imageio-ffmpeg package ships: pip install 'jaxarm[video]' "
                          f"(or write a .gif) [{type(exc).__name__}]") from None


def _mp4(images, duration_ms: float) -> bytes:
    """H.264 in an MP4 container (yuv420p, which every player opens), at the frames' own rate."""
    import os
    import tempfile

    import imageio_ffmpeg

    h, w = images[0].shape[:2]
    h2, w2 = h - h % 2, w - w % 2  # yuv420p needs even sides
    fps = max(1.0, 1000.0 / max(duration_ms, 1.0))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.mp4")
        writer = imageio_ffmpeg.write_frames(path, (w2, h2), fps=fps, codec="libx264", pix_fmt_out="yuv420p",
                                             macro_block_size=1, ffmpeg_log_level="error")
        writer.send(None)  # start ffmpeg
        for im in images:
            writer.send(np.ascontiguousarray(im[:h2, :w2]))
        writer.close()
        with open(path, "rb") as f:
            return f.read()
