"""``jaxarm simulate``: schedules, chunked compiled rollouts with progress, and atomic outputs."""

from __future__ import annotations

import csv
import functools
import io
import math
import os
import sys

import numpy as np

from .common import (
    EXIT_FAILURE,
    EXIT_OK,
    MAX_RESULT_BYTES,
    PD_BANDWIDTH,
    CommandError,
    _consistency_note,
    _finite_number,
    _fmt,
    _joint_vector,
    _load_arm,
    _numbers,
    _one_line,
    _Outputs,
    _positive,
    _require_motor_model,
    on_terminal,
)


def read_schedule(path, kind: str, n: int, arm_name: str = "arm"):
    """Read a schedule CSV: header ``t,V1,..,Vn`` (kind "voltage") or ``t,tau1,..,taun`` (kind
    "torque"), then one row per change of input. Blank lines and lines starting with # are
    skipped. Returns (times (K,), values (K, n)); raises CommandError naming line and column."""
    option = f"--{kind}-schedule"
    prefix = "V" if kind == "voltage" else "tau"
    expected = ["t"] + [f"{prefix}{j}" for j in range(1, n + 1)]
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise CommandError(f"{option}: {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{option}: {path}: cannot read: {_one_line(exc)}") from None
    lines = [(k + 1, row) for k, row in enumerate(csv.reader(io.StringIO(text)))
             if row and any(c.strip() for c in row) and not row[0].lstrip().startswith("#")]
    where = f"{option}: {path}"
    if not lines:
        raise CommandError(f"{where}: empty; expected a header {','.join(expected)} and rows of numbers")
    line, header = lines[0]
    header = [h.strip() for h in header]
    if len(header) != n + 1:
        raise CommandError(
            f"{where}: line {line}: {len(header)} columns, expected {n + 1} (t and one per joint of the "
            f"{n}-joint arm {arm_name}): {','.join(expected)}"
        )
    if [h.lower() for h in header] != [e.lower() for e in expected]:
        raise CommandError(f"{where}: line {line}: header {','.join(header)}; expected {','.join(expected)}")
    if len(lines) < 2:
        raise CommandError(f"{where}: no data rows after the header")
    times, values = [], []
    for line, row in lines[1:]:
        if len(row) != n + 1:
            raise CommandError(f"{where}: line {line}: {len(row)} columns, expected {n + 1} ({','.join(expected)})")
        numbers = [_finite_number(cell, f"{where}: line {line}: {col}") for col, cell in zip(expected, row)]
        if times and not numbers[0] > times[-1]:
            raise CommandError(
                f"{where}: line {line}: t = {numbers[0]:g} s does not increase (previous row t = {times[-1]:g} s); "
                "times must be strictly increasing"
            )
        times.append(numbers[0])
        values.append(numbers[1:])
    if times[0] > 0:
        raise CommandError(
            f"{where}: the first row is at t = {times[0]:g} s, so there is no input before it; "
            "the first row must have t <= 0"
        )
    return np.asarray(times), np.asarray(values, dtype=np.float64)


def hold_schedule(times, values, steps: int, dt: float) -> np.ndarray:
    """Zero-order hold: the (steps, n) input of each step k (time k dt) is the row with the
    latest t <= k dt; row k applies from t_k until t_{k+1}, the last one to the end."""
    step_times = np.arange(steps) * dt
    index = np.searchsorted(times, step_times + 1e-9 * dt, side="right") - 1  # tolerate k*dt rounding
    return values[index]


@functools.lru_cache(maxsize=None)
def _chunk_function(steps: int, method: str, input_kind: str, controller: str | None, gravity_comp: bool, batched: bool,
                    stops: bool = True):
    """A jitted rollout of ``steps`` steps from (q0, qd0) at time t0, compiled once per structure.

    dt, the divergence bound and the controller gains are traced arguments, so repeated calls
    (every chunk of a run, and runs in the same process) reuse the compiled code. Default PD
    gains come from the mass matrix at q_ref, computed inside the compiled function.
    """
    import jax.numpy as jnp

    from ..core import xla as _xla
    from ..dynamics.composite_body import mass_matrix
    from ..simulate.batch import rollout_batch
    from ..simulate.controllers import pd_controller
    from ..simulate.rollouts import rollout

    def run(arm, q0, qd0, u, t0, dt, bound, ctrl):
        gains = None
        if controller == "pd":
            kp_abs, kp_rel, kd_abs, kd_rel, target, q_ref = ctrl
            m = jnp.diag(mass_matrix(arm, q_ref))  # effective inertia of each joint at the start
            kp, kd = kp_abs + kp_rel * m, kd_abs + kd_rel * m
            inputs = pd_controller(kp, kd, target, gravity_compensation=arm if gravity_comp else None)
            gains = (kp, kd)
        else:
            inputs = u
        kwargs = dict(method=method, input=input_kind, t0=t0, bound=bound, steps=steps if controller else None, stops=stops)
        if batched:
            traj = rollout_batch(arm, q0, qd0, inputs, dt, inputs_batched=False, on_divergence="flag", **kwargs)
        else:
            traj = rollout(arm, q0, qd0, inputs, dt, on_divergence="flag", **kwargs)
        return traj, gains

    return _xla.jit(run)


class _Progress:
    """A progress bar on stderr (rich's ``Progress``): ``simulating ━━━━━━━╸━━━  50%  t = 1 / 2 s  0:00:03``,
    redrawn in place; only on a terminal that can redraw (``common.on_terminal``: a pipe, a log file
    or ``TERM=dumb`` gets nothing)."""

    def __init__(self, total_time: float, enabled: bool):
        self.total = total_time
        self.bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("simulating"), BarColumn(), TaskProgressColumn(),
                            TextColumn("t = {task.fields[t]} / " + f"{total_time:.3g} s" + "{task.fields[note]}"),
                            TimeElapsedColumn(), console=Console(file=sys.stderr), transient=False)
        self.task = self.bar.add_task("simulate", total=1.0, t="0", note="")
        self.bar.start()

    def update(self, fraction: float, note: str = "") -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=fraction, t=f"{fraction * self.total:.3g}", note=note)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def run_chunked(arm, q0, qd0, *, steps: int, dt: float, method: str = "rk3", inputs=None, input_kind: str = "torque",
             controller=None, bound: float = 1e6, chunks: int | None = None, progress: bool = False,
             stops: bool = True) -> dict:
    """Run the rollout in chunks (compiled once for the chunk length, carrying the state).

    q0, qd0: (n,) or (B, n) for a batch (then :func:`jaxarm.rollout_batch`). inputs: (steps, n)
    schedule, or None with controller = dict(kp_abs, kp_rel, kd_abs, kd_rel, target, q_ref,
    gravity_compensation). Returns numpy arrays t (steps+1,), q, qd ([B,] steps+1, n), qdd, tau,
    u ([B,] steps, n) and kp, kd for a controller. ``stops``: the joints' position limits act as
    end stops (:func:`jaxarm.rollout`'s ``stops``). Raises jaxarm.DivergenceError.
    """
    from ..simulate.rollouts import Trajectory, check_divergence

    q0 = np.asarray(q0, dtype=np.float64)
    qd0 = np.asarray(qd0, dtype=np.float64)
    batched = q0.ndim == 2
    if chunks is None:
        chunks = max(1, min(20, steps // 100))
    length = -(-steps // chunks)
    chunks = -(-steps // length)
    if inputs is not None:
        inputs = np.asarray(inputs, dtype=np.float64)
        pad = chunks * length - steps
        if pad:
            inputs = np.concatenate([inputs, np.repeat(inputs[-1:], pad, axis=0)])  # trimmed afterwards
    ctrl = None
    if controller is not None:
        ctrl = tuple(np.asarray(controller[k], dtype=np.float64)
                     for k in ("kp_abs", "kp_rel", "kd_abs", "kd_rel", "target", "q_ref"))
    fn = _chunk_function(length, method, input_kind, "pd" if controller is not None else None,
                         bool(controller and controller.get("gravity_compensation", True)), batched, bool(stops))
    t = dt * np.arange(steps + 1)
    parts = {k: [] for k in ("q", "qd", "qdd", "tau", "u")}
    diverged = np.full(q0.shape[:-1], -1)
    q, qd = q0, qd0
    gains = None
    bar = _Progress(steps * dt, progress and chunks > 1)
    bar.update(0.0, "  (compiling)")
    try:
        for k in range(chunks):
            start = k * length
            u = None if inputs is None else inputs[start:start + length]
            traj, gains = fn(arm, q, qd, u, np.float64(start * dt), np.float64(dt), np.float64(bound), ctrl)
            keep = min(length, steps - start)
            out = {name: np.asarray(getattr(traj, name)) for name in parts}
            parts["q"].append(out["q"][..., 1:keep + 1, :])
            parts["qd"].append(out["qd"][..., 1:keep + 1, :])
            for name in ("qdd", "tau", "u"):
                parts[name].append(out[name][..., :keep, :])
            step = np.asarray(traj.diverged_step)
            newly = (diverged < 0) & (step >= 0) & (step < keep)
            diverged = np.where(newly, start + step, diverged)
            q, qd = out["q"][..., keep, :], out["qd"][..., keep, :]  # numpy carry: same signature every call
            bar.update((start + keep) / steps)
            if np.any(diverged >= 0):
                break
    finally:
        bar.close()
    if np.any(diverged >= 0):
        check_divergence(Trajectory(t=t, q=None, qd=None, qdd=None, tau=None, u=None, diverged_step=diverged))
    result = {
        "t": t,
        "q": np.concatenate([q0[..., None, :]] + parts["q"], axis=-2),
        "qd": np.concatenate([qd0[..., None, :]] + parts["qd"], axis=-2),
        **{name: np.concatenate(parts[name], axis=-2) for name in ("qdd", "tau", "u")},
    }
    if gains is not None:
        result["kp"], result["kd"] = (np.asarray(g) for g in gains)
    return result


def _csv_text(result, n: int) -> str:
    """t, q1..qn, qd1..qdn, tau1..taun; tau is blank in the last row (no step starts there).
    A batch gets a leading ``batch`` column and all its elements, one after the other."""
    q, qd, tau, t = result["q"], result["qd"], result["tau"], result["t"]
    batched = q.ndim == 3
    if not batched:
        q, qd, tau = q[None], qd[None], tau[None]
    header = (["batch"] if batched else []) + ["t"] + [f"q{j}" for j in range(1, n + 1)] \
        + [f"qd{j}" for j in range(1, n + 1)] + [f"tau{j}" for j in range(1, n + 1)]
    buf = io.StringIO()
    buf.write(",".join(header) + "\n")
    rows = len(t)
    for b in range(q.shape[0]):
        tau_b = np.concatenate([tau[b], np.full((1, n), np.nan)])
        block = np.column_stack([t, q[b], qd[b], tau_b])
        if batched:
            block = np.column_stack([np.full(rows, b), block])
        lines = io.StringIO()
        np.savetxt(lines, block, fmt="%.10g", delimiter=",")
        buf.write(lines.getvalue().replace("nan", ""))
    return buf.getvalue()


def _cmd_simulate(args) -> int:
    from ..simulate.integrators import METHODS
    from .plotting import require_matplotlib

    # Scalars first: they need no arm.
    dt = _positive(args.dt, "--dt", "a time step in seconds")
    duration = _positive(args.duration, "--duration", "a duration in seconds")
    bound = _positive(args.bound, "--bound", "a bound")
    if args.method not in METHODS:  # argparse choices already checks; kept for direct calls
        raise CommandError(f"--method: expected one of {', '.join(sorted(METHODS))}, got {args.method}")
    # Never past --duration: a remainder shorter than one step is left out, and said so.
    steps = int(math.floor(duration / dt + 1e-9))
    if steps < 1:
        raise CommandError(f"--duration: {duration:g} s is shorter than one time step (--dt {dt:g} s)")
    short_note = None
    if abs(steps * dt - duration) > 1e-9 * duration:
        short_note = (f"--duration {duration:g} s is not a whole number of --dt {dt:g} s steps: simulated {steps} steps, "
                      f"to t = {steps * dt:g} s")
    if args.batch is not None and args.batch < 1:
        raise CommandError(f"--batch: expected a positive number of rollouts, got {args.batch}")
    if args.perturb is not None and args.batch is None:
        raise CommandError("--perturb: only with --batch N (it perturbs the initial positions of the N rollouts)")
    sigma = 0.0
    if args.perturb is not None:
        values = _numbers(args.perturb, "--perturb")
        if len(values) != 1 or values[0] < 0:
            raise CommandError(f"--perturb: expected one standard deviation >= 0 (rad), got {args.perturb.strip()}")
        sigma = values[0]
    if args.seed is not None and args.batch is None:
        raise CommandError("--seed: only with --batch N --perturb SIGMA")
    if args.controller is None:
        for option, value in (("--target", args.target), ("--kp", args.kp), ("--kd", args.kd)):
            if value is not None:
                raise CommandError(f"{option}: only with --controller pd")
        if args.no_gravity_compensation:
            raise CommandError("--no-gravity-compensation: only with --controller pd")
    elif args.target is None:
        raise CommandError("--target: required with --controller pd (one position per joint)")

    outputs = [(args.out, "--out")] + [(p, o) for p, o in ((args.csv, "--csv"), (args.plot, "--plot"),
                                                              (args.animate, "--animate")) if p]
    animate_ext = os.path.splitext(args.animate)[1].lower() if args.animate else None
    if args.animate and animate_ext not in (".gif", ".mp4", ".html"):
        raise CommandError(f"--animate: {args.animate}: expected a .gif or .mp4 file (an animation) or a .html file (an interactive 3-D page)")
    seen = {}
    for path, option in outputs:
        _Outputs.check(path, option, args.force)
        key = os.path.abspath(path)
        if key in seen:
            raise CommandError(f"{option}: {path} is also the {seen[key]} file")
        seen[key] = option
    for option, wanted in (("--plot", args.plot), ("--animate", args.animate if animate_ext in (".gif", ".mp4") else None)):
        if wanted:
            try:
                require_matplotlib()
                if option == "--animate" and animate_ext == ".mp4":
                    from .drawing import _require_ffmpeg

                    _require_ffmpeg()
            except ImportError as exc:
                raise CommandError(f"{option}: {exc}", EXIT_FAILURE) from None

    arm = _load_arm(args.arm, strict=args.strict)
    n = arm.n
    q0 = _joint_vector(args.q0, "--q0", arm, default=0.0)
    qd0 = _joint_vector(args.qd0, "--qd0", arm, default=0.0)
    batch = args.batch
    est = (batch or 1) * (steps + 1) * n * 8 * 6
    if est > MAX_RESULT_BYTES:
        raise CommandError(
            f"--duration/--dt: {steps} steps{f' x {batch} rollouts' if batch else ''} would need about "
            f"{est / 1024**3:.1f} GB for the results; use a larger --dt or a shorter --duration"
        )

    inputs, controller, input_kind = None, None, "torque"
    if args.torque_schedule is not None:
        times, values = read_schedule(args.torque_schedule, "torque", n, arm.name)
        inputs, source = hold_schedule(times, values, steps, dt), "torque schedule"
    elif args.voltage_schedule is not None:
        _require_motor_model(arm, "--voltage-schedule")
        times, values = read_schedule(args.voltage_schedule, "voltage", n, arm.name)
        inputs, source, input_kind = hold_schedule(times, values, steps, dt), "voltage schedule", "voltage"
    elif args.controller == "pd":
        target = _joint_vector(args.target, "--target", arm)
        kp = None if args.kp is None else _joint_vector(args.kp, "--kp", arm, allow_scalar=True)
        kd = None if args.kd is None else _joint_vector(args.kd, "--kd", arm, allow_scalar=True)
        for option, gain in (("--kp", kp), ("--kd", kd)):
            if gain is not None and np.any(gain < 0):
                raise CommandError(f"{option}: expected gains >= 0, got {', '.join(_fmt(g) for g in gain)}")
        zeros, bw = np.zeros(n), PD_BANDWIDTH
        controller = {
            "kp_abs": zeros if kp is None else kp, "kp_rel": np.full(n, bw**2) if kp is None else zeros,
            "kd_abs": zeros if kd is None else kd, "kd_rel": np.full(n, 2 * bw) if kd is None else zeros,
            "target": target, "q_ref": q0, "gravity_compensation": not args.no_gravity_compensation,
        }
        source = "PD" + ("" if args.no_gravity_compensation else " + gravity compensation")
    else:
        inputs, source = np.zeros((steps, n)), "zero torque"

    stops = not args.no_stops
    lo, hi = (np.asarray(x, dtype=np.float64) for x in np.asarray(arm.limits.position).T)
    if stops:
        outside = np.flatnonzero((q0 < lo) | (q0 > hi))
        if outside.size:
            j = int(outside[0])
            raise CommandError(
                f"--q0: joint {j + 1} starts at {_fmt(q0[j])}, outside its position limits [{_fmt(lo[j], 4)}, {_fmt(hi[j], 4)}] "
                f"of {arm.name} (the limits act as end stops); start inside them, or pass --no-stops")
    clipped_note = None
    if batch is not None:
        rng = np.random.default_rng(0 if args.seed is None else args.seed)
        q0_run = q0 + sigma * rng.normal(size=(batch, n))
        if stops:
            moved = int(np.sum(np.any((q0_run < lo) | (q0_run > hi), axis=1)))
            if moved:
                q0_run = np.clip(q0_run, lo, hi)
                clipped_note = (f"{moved} of {batch} perturbed starts were outside the position limits and start on "
                                "the end stop instead (--no-stops keeps them)")
        qd0_run = np.broadcast_to(qd0, (batch, n)).copy()
    else:
        q0_run, qd0_run = q0, qd0

    from ..simulate.rollouts import DivergenceError

    try:
        result = run_chunked(arm, q0_run, qd0_run, steps=steps, dt=dt, method=args.method, inputs=inputs,
                             input_kind=input_kind, controller=controller, bound=bound, progress=on_terminal(),
                             stops=stops)
    except DivergenceError as exc:
        msg = _one_line(exc).replace("reduce dt", "reduce --dt").replace("pass bound= to raise the limit", "raise --bound")
        raise CommandError(msg, EXIT_FAILURE) from None

    record = dict(result)
    record.update(
        arm=np.asarray(arm.name), dt=np.asarray(dt), method=np.asarray(args.method), input=np.asarray(input_kind),
        source=np.asarray(source), joint_types=np.asarray(arm.joint_types), q0=q0_run, qd0=qd0_run,
        position_limits=np.asarray(arm.limits.position, dtype=float), torque_limits=np.asarray(arm.limits.torque, dtype=float),
    )
    if controller is not None:
        record["target"] = controller["target"]

    files = _Outputs()
    try:
        files.write(args.out, lambda f: np.savez(f, **record))
        if args.csv:
            files.write(args.csv, lambda f: f.write(_csv_text(result, n).encode("utf-8")))
        if args.plot:
            from .plotting import plot_trajectory

            fmt = os.path.splitext(args.plot)[1].lstrip(".").lower() or "png"
            files.write(args.plot, lambda f: plot_trajectory(record, f, format=fmt))
        if args.animate:
            target = None
            if controller is not None:
                from ..dynamics.kinematics import tool_pose

                target = np.asarray(tool_pose(arm, controller["target"]))[:3, 3]
            if animate_ext == ".html":
                from .view import MAX_BATCH_SHOWN
                from .viewer import arm_visuals, html_view

                visuals, _ = arm_visuals(args.arm, arm)
                qs = result["q"][:MAX_BATCH_SHOWN] if batch else result["q"][None]
                runs = [(f"rollout {b}" if batch else source, result["t"], qb) for b, qb in enumerate(qs)]
                page = html_view(arm, None, runs, targets=[] if target is None else [target],
                                 title=f"{arm.name}: {source}", visuals=visuals)
                files.write(args.animate, lambda f: f.write(page.encode("utf-8")))
            else:
                from .drawing import animate_arm

                q_first = result["q"][0] if batch else result["q"]
                files.write(args.animate, lambda f: animate_arm(arm, result["t"], q_first, f, target=target,
                                                                format=animate_ext[1:]))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write the results: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()

    # Summary on stdout.
    batch_text = f", {batch} rollouts (initial q perturbed by {sigma:g} rad)" if batch else ""
    print(f"{arm.name}: {steps} steps of {dt:g} s ({args.method}), {source}{batch_text}")
    qT = result["q"][..., -1, :]
    if batch:
        print(f"final q (element 0) = [{', '.join(_fmt(v) for v in qT[0])}]")
    else:
        print(f"final q = [{', '.join(_fmt(v) for v in qT)}]")
    if controller is not None:
        err = np.abs(qT - controller["target"]).reshape(-1, n).max(axis=0)
        j = int(np.argmax(err))
        print(f"PD gains kp = [{', '.join(_fmt(v, 4) for v in result['kp'])}], kd = [{', '.join(_fmt(v, 4) for v in result['kd'])}]")
        print(f"final max |q - target| = {err[j]:.3g} (joint {j + 1})")
    print("wrote " + ", ".join(p for p, _ in outputs))
    if short_note:
        print(f"note: {short_note}")
    if clipped_note:
        print(f"note: {clipped_note}")
    if stops:
        for line in stop_report(arm, result["t"], result["q"]):
            print(f"end stop: {line}")
    else:
        for line in limit_warnings(arm, result["t"], result["q"]):
            print(f"jaxarm: warning: {line}", file=sys.stderr)
    args._note = _consistency_note(arm, args.arm)
    return EXIT_OK


def stop_report(arm, t, q) -> list[str]:
    """One line per joint that was held by one of its end stops during the run (the position
    limits enforced by :func:`jaxarm.rollout`'s ``stops``): which stop, from when, for how long.
    q: (T+1, n) or (B, T+1, n)."""
    lo, hi = (np.asarray(x, dtype=np.float64) for x in np.asarray(arm.limits.position).T)
    q = np.asarray(q, dtype=np.float64)
    q = q.reshape((-1,) + q.shape[-2:])  # (B, T+1, n)
    dt = float(t[1] - t[0]) if len(t) > 1 else 0.0
    out = []
    for j in range(arm.n):
        unit = "rad" if arm.joint_types[j] == "revolute" else "m"
        for name, value in (("lower", lo[j]), ("upper", hi[j])):
            on = q[..., 1:, j] == value
            if not np.isfinite(value) or not on.any():
                continue
            first = int(np.argmax(on.any(axis=0))) + 1
            runs = int(np.sum(on.any(axis=1)))
            where = f" in {runs} of {q.shape[0]} rollouts" if q.shape[0] > 1 else ""
            held = on.sum(axis=1).max() * dt
            out.append(f"joint {j + 1} reached its {name} limit ({_fmt(value, 4)} {unit}){where} at t = {float(t[first]):.4g} s "
                       f"and was held there for {'up to ' if where else ''}{held:.4g} s")
    return out


def limit_warnings(arm, t, q) -> list[str]:
    """One line per joint whose position left the arm's limits during a run without end stops
    (``--no-stops``; a real arm would hit its end stop). q: (T+1, n) or (B, T+1, n)."""
    lo, hi = (np.asarray(x, dtype=np.float64) for x in np.asarray(arm.limits.position).T)
    q = np.asarray(q, dtype=np.float64)
    q = q.reshape((-1,) + q.shape[-2:])  # (B, T+1, n)
    out = []
    for j in range(arm.n):
        below, above = q[..., j] < lo[j] - 1e-12, q[..., j] > hi[j] + 1e-12
        outside = below | above
        if not outside.any():
            continue
        runs = np.flatnonzero(outside.any(axis=1))
        first = int(np.argmax(outside.any(axis=0)))
        worst = max(float(np.max(lo[j] - q[..., j], initial=0.0)), float(np.max(q[..., j] - hi[j], initial=0.0)))
        unit = "rad" if arm.joint_types[j] == "revolute" else "m"
        where = f" in {len(runs)} of {q.shape[0]} rollouts" if q.shape[0] > 1 else ""
        out.append(f"joint {j + 1} left its position limits [{_fmt(lo[j], 4)}, {_fmt(hi[j], 4)}] {unit}{where} from "
                   f"t = {float(t[first]):.4g} s, by up to {worst:.3g} {unit}; --no-stops lets joints pass their "
                   "limits (a real arm would hit its end stop)")
    return out
