"""Pictures of the arm itself: a 3-D stick drawing at a configuration and an animated GIF of a run.

The links are drawn along the kinematic chain the arm file describes: for a DH arm the joint
offset of each row is drawn as its own segment (along z_{i-1} by d_i in the standard convention,
along x_{i-1} by a_{i-1} in the modified one), so the picture shows the DH table; for a URDF-style
arm, straight segments between the joint frames. Joints are dots, the base and tool frames small
red/green/blue triads; optional: the tool path and a target point. matplotlib only (``jaxarm[plot]``),
drawn on its Agg canvas (no pyplot, no change to an interactive session's backend); GIF frames are
assembled with Pillow, which matplotlib depends on, and MP4 frames encoded (H.264) by the ffmpeg
that the optional ``imageio-ffmpeg`` package ships.
"""

from __future__ import annotations

import io

import numpy as np

__all__ = ["skeleton", "skeletons", "draw_arm", "animate_arm"]


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


def _draw(ax, figure, box, tool_path=None, target=None, title=None):
    """Draw a :func:`skeleton` ``figure`` (points, joints, base, tool) in the cube ``box``."""
    points, joints, base, tool = figure
    size = 0.08 * float(np.max(box[1] - box[0]))
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


def draw_arm(arm, q, file, *, format="png", tool_path=None, target=None, title=None):
    """Draw ``arm`` at q (n,) into ``file`` (a path or a binary file object)."""
    fig = _figure()
    ax = fig.add_subplot(projection="3d")
    figure = skeleton(arm, q)
    extra = [figure[0]] + ([np.asarray(tool_path)] if tool_path is not None else []) + ([np.asarray(target)[None]] if target is not None else [])
    _draw(ax, figure, _limits(np.concatenate(extra)), tool_path, target, title or f"{arm.name} at q = {np.round(np.asarray(q), 3).tolist()}")
    fig.savefig(file, format=format, dpi=100)
    return file


def animate_arm(arm, t, q, file, *, frames: int = 80, target=None, fps: float | None = None, format: str = "gif"):
    """An animation of a run: ``q`` (T+1, n) at times ``t`` (T+1,), at most ``frames`` frames
    evenly spaced in time (played at the run's speed unless ``fps`` is given), the tool path so
    far drawn behind the arm. ``format``: "gif" (assembled by Pillow) or "mp4" (H.264, encoded by
    the ffmpeg that the ``imageio-ffmpeg`` package ships: ``pip install jaxarm[video]``).
    Writes to ``file`` (a path or a binary file object)."""
    if format not in ("gif", "mp4"):
        raise ValueError(f"animate_arm: format: expected 'gif' or 'mp4', got {format!r}")
    if format == "mp4":
        _require_ffmpeg()
    t, q = np.asarray(t, dtype=float), np.asarray(q, dtype=float)
    if q.ndim != 2 or q.shape[0] != t.shape[0] or q.shape[1] != arm.n:
        raise ValueError(f"animate_arm: expected q (T+1, {arm.n}) matching t (T+1,), got q {q.shape}, t {t.shape}")
    idx = np.unique(np.linspace(0, len(t) - 1, min(frames, len(t))).round().astype(int))
    points, joints, base, tools = skeletons(arm, q[idx])  # once: the tool path and the drawing use them
    figures = [(points[j], joints[j], base, tools[j]) for j in range(len(idx))]
    tool_path = np.asarray([f[3][:3, 3] for f in figures])
    every = np.concatenate([f[0] for f in figures] + ([np.asarray(target)[None]] if target is not None else []))
    box = _limits(every)
    images = []
    for j, (k, figure) in enumerate(zip(idx, figures)):
        fig = _figure()
        ax = fig.add_subplot(projection="3d")
        _draw(ax, figure, box, tool_path[: j + 1], target, f"{arm.name}   t = {t[k]:.3f} s")
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
