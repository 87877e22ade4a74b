"""``jaxarm view`` (a picture or an interactive page of an arm and its runs) and ``jaxarm arms``."""

from __future__ import annotations

import os

import numpy as np

from .common import EXIT_FAILURE, EXIT_OK, CommandError, _joint_vector, _load_arm, _numbers, _one_line, _Outputs

VIEW_FORMATS = (".html", ".png", ".gif", ".mp4")
MAX_BATCH_SHOWN = 16  # rollouts of a batched results file drawn in the page


def _targets(tokens, option: str):
    if tokens is None:
        return []
    values = _numbers(tokens, option)
    if len(values) % 3:
        raise CommandError(f"{option}: expected x,y,z (m) for each target point, got {len(values)} numbers")
    return [np.asarray(values[k:k + 3], dtype=float) for k in range(0, len(values), 3)]


def _runs_from(path: str, arm):
    from .plotting import load_results

    try:
        data = load_results(path, motion_only=True)
    except ValueError as exc:
        raise CommandError(f"--traj: {_one_line(exc)}") from None
    t, q = np.asarray(data["t"], dtype=float), np.asarray(data["q"], dtype=float)
    if q.shape[-1] != arm.n:
        raise CommandError(f"--traj: {path}: q has {q.shape[-1]} joints, {arm.name} has {arm.n}")
    saved = str(data["arm"]) if "arm" in data and np.ndim(data["arm"]) == 0 else None
    goal = np.asarray(data["target"], dtype=float) if "target" in data else None
    name = os.path.basename(path)
    if q.ndim == 3:
        shown = min(q.shape[0], MAX_BATCH_SHOWN)
        runs = [(f"{name} [{b}]", t, q[b]) for b in range(shown)]
        note = f" (the first {shown} of {q.shape[0]} rollouts)" if shown < q.shape[0] else ""
    else:
        runs, note = [(name, t, q)], ""
    return runs, saved, note, goal


def _cmd_view(args) -> int:
    ext = os.path.splitext(args.out)[1].lower()
    if ext not in VIEW_FORMATS:
        raise CommandError(f"--out: {args.out}: expected a .html (interactive page), .png (picture), .gif or .mp4 (animation) file")
    _Outputs.check(args.out, "--out", args.force)
    arm = _load_arm(args.arm)
    targets = _targets(args.target, "--target")
    runs, notes = [], []
    for path in args.traj or []:
        got, saved, note, goal = _runs_from(path, arm)
        if saved is not None and saved != arm.name:
            notes.append(f"{path} was simulated with arm {saved!r}, drawn here on {arm.name!r}")
        runs += got
        if note:
            notes.append(f"{path}: drawing{note}")
        if goal is not None and not args.target:
            from ..dynamics.kinematics import tool_pose

            if goal.shape == (arm.n,):  # a joint-space target (simulate --controller pd): mark its tool position
                targets.append(np.asarray(tool_pose(arm, goal))[:3, 3])
    q = _joint_vector(args.q, "--q", arm) if args.q is not None else (None if runs else np.zeros(arm.n))
    if ext != ".html" and len(runs) > 1:
        raise CommandError(f"--out: {args.out}: a picture or an animation shows one run; got {len(runs)} (write .html to see them all)")
    if ext != ".html":
        from .plotting import require_matplotlib

        try:
            require_matplotlib()
            if ext == ".mp4":
                from .drawing import _require_ffmpeg

                _require_ffmpeg()
        except ImportError as exc:
            raise CommandError(f"--out: {exc}", EXIT_FAILURE) from None
    if ext in (".gif", ".mp4") and not runs:
        raise CommandError(f"--out: {args.out}: an animation needs a trajectory (--traj RESULTS.npz)")

    files = _Outputs()
    try:
        if ext == ".html":
            from .viewer import arm_visuals, html_view

            visuals, mesh_notes = arm_visuals(args.arm, arm, not args.no_meshes)
            notes += mesh_notes
            if visuals and visuals[0].source != "kinematics":
                notes.append(f"drew {len(visuals)} meshes ({sum(len(v.faces) for v in visuals)} triangles) from {os.path.basename(args.arm)}")
            elif visuals:
                notes.append("drew the links as cylinders from the kinematics (--no-meshes: the stick figure)")
            page = html_view(arm, q, runs, targets=targets, title=args.title, visuals=visuals)
            files.write(args.out, lambda f: f.write(page.encode("utf-8")))
        elif ext == ".png":
            from .drawing import draw_arm

            qs = runs[0][2] if runs else None
            at = q if q is not None else qs[-1]
            path = None if qs is None else _tool_path(arm, qs)
            files.write(args.out, lambda f: draw_arm(arm, at, f, tool_path=path, target=targets[0] if targets else None,
                                                     title=args.title, solid=not args.no_meshes))
        else:
            from .drawing import animate_arm

            _, t, qs = runs[0]
            files.write(args.out, lambda f: animate_arm(arm, t, qs, f, target=targets[0] if targets else None, format=ext[1:],
                                                       solid=not args.no_meshes))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write {args.out}: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()
    for note in notes:
        print(f"jaxarm: note: {note}")
    what = f"{len(runs)} trajector{'y' if len(runs) == 1 else 'ies'}" if runs else "q = " + ", ".join(f"{v:g}" for v in q)
    print(f"wrote {args.out} ({arm.name}, {what}{', ' + str(len(targets)) + ' target(s)' if targets else ''})")
    return EXIT_OK


def _tool_path(arm, qs):
    from .drawing import skeletons

    return skeletons(arm, qs)[3][:, :3, 3]


def _first_sentence(text: str, limit: int = 110) -> str:
    """The first sentence of an arm file's opening comment."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line.lstrip("#").strip()
        if not body:
            if words:
                break
            continue
        words.append(body)
    para = " ".join(words)
    end = next((k + 1 for k, c in enumerate(para) if c == "." and (k + 1 == len(para) or para[k + 1] == " ")), len(para))
    para = para[:end]
    return para if len(para) <= limit else para[: limit - 3].rsplit(" ", 1)[0] + " ..."


def _cmd_arms(args) -> int:
    """One line per bundled arm: name, joints, and the first line of its file's description."""
    from ..model.arm_files import _resolve, bundled_arms

    rows = []
    for name in bundled_arms():
        arm = _load_arm(name)
        text = _resolve(name).read_text(encoding="utf-8")
        first = _first_sentence(text)
        rows.append((name, f"{arm.n} ({''.join('R' if k == 'revolute' else 'P' for k in arm.joint_types)})", first))
    width = max(len(r[0]) for r in rows)
    jw = max(len(r[1]) for r in rows)
    print(f"{'arm':<{width}}  {'joints':<{jw}}  description")
    for name, joints, first in rows:
        print(f"{name:<{width}}  {joints:<{jw}}  {first}")
    print("Use a name wherever ARM is asked (jaxarm info puma560), or a path to your own .toml or .urdf file.")
    return EXIT_OK
