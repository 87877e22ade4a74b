"""``jaxarm estimate``: filtered states and external joint torques from a log."""

from __future__ import annotations

import os
import sys

import numpy as np

from .common import EXIT_FAILURE, EXIT_OK, CommandError, _load_arm, _numbers, _one_line, _Outputs, _positive

OBSERVER_GAIN = 25.0  # 1/s: 40 ms time constant


def _estimate_plot(fmt, t, q_meas, q, external_ekf, external_obs, threshold):
    from matplotlib.figure import Figure

    n = q.shape[1]
    fig = Figure(figsize=(10, 1.6 * n + 1.0))
    axes = fig.subplots(n, 2, sharex=True, squeeze=False)
    for j in range(n):
        ax = axes[j, 0]
        ax.plot(t, 1e3 * (q_meas[:, j] - q[:, j]), color="0.5", lw=0.6)
        ax.set_ylabel(f"q{j + 1} meas - filt [mrad]", fontsize=7)
        ax = axes[j, 1]
        ax.plot(t, external_obs[:, j], color="C1", lw=0.8, label="momentum observer")
        ax.plot(t, external_ekf[:, j], color="C0", lw=0.8, label="Kalman filter")
        ax.axhline(threshold[j], color="C3", lw=0.6, ls="--")
        ax.axhline(-threshold[j], color="C3", lw=0.6, ls="--", label="contact threshold")
        ax.set_ylabel(f"tau_ext{j + 1} [N m]", fontsize=7)
    axes[0, 1].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("t [s]")
    axes[-1, 1].set_xlabel("t [s]")
    fig.tight_layout()

    def write(f):
        fig.savefig(f, format=fmt, dpi=100)

    return write


def _applied(arm, kind, u, qd):
    """The joint torques the drives apply (N, n) from the log's inputs u: the torque columns, or the
    motor model's torque from the currents (G Kt I) or voltages (Swartz eq 12) at velocities qd."""
    import jax.numpy as jnp

    from ..dynamics.motors import _input_torque

    return np.asarray(_input_torque(arm, jnp.asarray(u), jnp.asarray(qd), kind))


def _point_payload(arm, theta):
    """The arm carrying a point mass theta[0] at its tool frame's origin (online payload estimation)."""
    import jax.numpy as jnp

    from ..model.arm import Payload

    return arm.replace(payload=Payload(mass=theta[0], com=jnp.zeros(3, theta.dtype), inertia=jnp.zeros((3, 3), theta.dtype)))


def _cmd_estimate(args) -> int:
    """Resample the log to a uniform rate, run the Kalman filter (q, qd and external torques) and
    the momentum observer, write them (and a plot) atomically."""
    from ..estimate import contact_link, detect_contact, detection_threshold, extended_kalman_filter, momentum_observer
    from ..estimate.kalman import _blocks
    from ..identify.fit import predict_torques
    from ..identify.logs import LogError, preprocess_log
    from .identify import _joint_names, _read_log

    outputs = [(args.out, "--out")] + ([(args.plot, "--plot")] if args.plot else [])
    for path, option in outputs:
        _Outputs.check(path, option, args.force)
    if args.plot:
        from .plotting import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as exc:
            raise CommandError(str(exc), EXIT_FAILURE) from None
    position_std = _positive(args.position_std, "--position-std", "an encoder noise [rad]") if args.position_std else 1e-4
    gain = _positive(args.gain, "--gain", "an observer gain [1/s]") if args.gain else OBSERVER_GAIN
    free_until = _numbers(args.contact_free_until, "--contact-free-until")[0] if args.contact_free_until else None
    arm = _load_arm(args.arm)
    raw = _read_log(args.log, arm, args, _joint_names(args.joint_names, args.arm, arm.n))
    try:
        log = preprocess_log(raw, cutoff=None, trim=0.0, filter_torque=False)  # uniform rate, nothing filtered
    except LogError as exc:
        raise CommandError(_one_line(exc)) from None
    kind = args.input or "torque"
    field, columns_named = {"torque": ("tau", "torque columns (tau1..tau{n})"), "current": ("I", "motor current columns (I1..I{n})"),
                            "voltage": ("V", "motor voltage columns (V1..V{n})")}[kind]
    if getattr(raw, field) is None:
        raise CommandError(f"{args.log}: no {columns_named.format(n=arm.n)}: --input {kind} reads the inputs from them")
    if args.torque_sensor_std and kind == "torque":
        raise CommandError("--torque-sensor-std: the torque columns are the input with --input torque; give --input current "
                           "or voltage to read them as link-side torque sensors")
    if args.torque_sensor_std and raw.tau is None:
        raise CommandError(f"--torque-sensor-std: {os.path.basename(args.log)} has no torque columns (tau1..tau{arm.n})")
    if args.current_std and (kind != "voltage" or raw.I is None):
        raise CommandError("--current-std: motor currents are a measurement under --input voltage, from current columns "
                           f"(I1..I{arm.n})")
    if raw.gaps().size:
        raise CommandError(f"{args.log}: the log has gaps in time; estimate each contiguous part on its own")
    where = os.path.basename(args.log)
    dt = float(np.median(np.diff(log.t)))
    notes = []
    if args.torque_std:
        torque_std = _positive(args.torque_std, "--torque-std", "a torque noise [N m]")
    else:  # the arm model's torque error on this log, with accelerations from a 10 Hz low-passed velocity
        smooth = preprocess_log(raw, cutoff=min(10.0, 0.2 / dt), trim=0.0)
        applied = _applied(arm, kind, getattr(smooth, field), smooth.dq)
        torque_std = np.sqrt(np.mean((predict_torques(arm, smooth.q, smooth.dq, smooth.ddq) - applied) ** 2, axis=0))
        torque_std = np.maximum(torque_std, 1e-3 * max(float(np.max(torque_std)), 1e-9))
        notes.append("torque noise per joint " + ", ".join(f"{x:.3g}" for x in torque_std)
                     + " N m: the arm model's torque error on this log (give --torque-std to set it)")
    measure, extra = ("q",), {}
    if args.velocity_std:
        if raw.dq is None:
            raise CommandError(f"--velocity-std: {where} has no velocity columns (dq1..dq{arm.n})")
        measure, extra = ("q", "qd"), {"velocity_std": _positive(args.velocity_std, "--velocity-std", "a velocity noise [rad/s]")}
    columns = {"q": log.q, "qd": log.dq, "tau": log.tau, "current": log.I}
    if args.torque_sensor_std:
        measure, extra = measure + ("tau",), {**extra, "torque_sensor_std": _positive(args.torque_sensor_std, "--torque-sensor-std",
                                                                                        "a torque-sensor noise [N m]")}
    if args.current_std:
        measure, extra = measure + ("current",), {**extra, "current_std": _positive(args.current_std, "--current-std",
                                                                                    "a current-sensor noise [A]")}
    if args.payload_mass:
        m0 = float(np.atleast_1d(_positive(args.payload_mass, "--payload-mass", "a starting payload mass [kg]"))[0])
        # a point mass at the tool frame's origin (the arm's own payload replaced); nearly constant
        extra = {**extra, "parameters": _point_payload, "theta0": [m0], "theta_std": [max(m0, 1.0)]}
        notes.append(f"payload: a point mass at the tool frame's origin, estimated online from {m0:g} kg "
                     f"(standard deviation {max(m0, 1.0):g} kg at the start)")
    external_std = _positive(args.external_std, "--external-std", "a random-walk intensity [N m / sqrt(s)]") if args.external_std else 5.0
    u = getattr(log, field)
    try:
        est = extended_kalman_filter(arm, u[:-1], np.concatenate([columns[name] for name in measure], axis=1),
                                     dt=dt, q0=log.q[0], qd0=log.dq[0] if log.dq is not None else None, torque_std=torque_std,
                                     position_std=position_std, external_std=external_std, measure=measure, input=kind, **extra)
        applied = _applied(arm, kind, u, est.qd) + (est.actuator if est.actuator is not None else 0.0)
        obs = momentum_observer(arm, log.t, est.q, est.qd, applied, gain=gain)
    except ValueError as exc:
        raise CommandError(f"cannot estimate from {where}: {_one_line(exc)}") from None
    settle = int(np.ceil(5.0 / gain / dt))
    free = slice(settle, None) if free_until is None else slice(settle, int(np.searchsorted(log.t, free_until)))
    if free.stop is not None and free.stop <= settle + 10:
        raise CommandError(f"--contact-free-until: {free_until:g} s leaves too little contact-free data after the observer settles")
    if free_until is not None:
        threshold = detection_threshold(obs.residual[free], factor=1.5)
    else:  # contacts are rare: 6 robust standard deviations (median absolute deviation) of the whole log's residual
        r = obs.residual[settle:]
        threshold = 6.0 * 1.4826 * np.median(np.abs(r - np.median(r, axis=0)), axis=0)
        threshold = np.maximum(threshold, 1e-9)
        notes.append("contact thresholds: 6 robust standard deviations of the residual over the whole log "
                     "(give --contact-free-until T to set them from contact-free data)")
    contact = detect_contact(obs.residual, threshold)
    contact[:settle] = False
    links = contact_link(obs.residual, threshold) * contact
    files = _Outputs()
    try:
        results = dict(t=log.t, q=est.q, qd=est.qd, std=est.std, external_kalman=est.external, external_observer=obs.residual,
                       contact=contact, contact_link=links, threshold=threshold,
                       nis=est.nis, torque_std=np.broadcast_to(torque_std, (arm.n,)),
                       applied_torque=applied)
        if est.actuator is not None:
            _, d0, _ = _blocks(arm.n, external=True, actuator=True)  # the command always estimates external torques
            results.update(drive_error=est.actuator, drive_error_std=est.std[:, d0:d0 + arm.n])
        if est.parameters is not None:
            results.update(payload_mass=est.parameters[:, 0], payload_mass_std=est.std[:, -1])
        files.write(args.out, lambda f: np.savez(f, **results))
        if args.plot:
            fmt = os.path.splitext(args.plot)[1].lstrip(".").lower() or "png"
            files.write(args.plot, _estimate_plot(fmt, log.t, log.q, est.q, est.external, obs.residual, threshold))
        files.commit()
    except OSError as exc:
        raise CommandError(f"cannot write the results: {_one_line(exc)}", EXIT_FAILURE) from None
    finally:
        files.discard()
    for note in notes:
        print(f"jaxarm: {where}: {note}", file=sys.stderr)
    m = len(measure) * arm.n
    print(f"{arm.name}: {len(log)} samples at {1 / dt:.4g} Hz; Kalman filter on {' and '.join(measure)}, "
          f"mean normalized innovation {float(np.mean(est.nis)) / m:.3g} (1 when the noise model fits)")
    if est.parameters is not None:
        print(f"payload mass: {est.parameters[-1, 0]:.4g} kg +- {est.std[-1, -1]:.2g} at the end of the log")
    hits = np.flatnonzero(contact)
    print("contact: " + ("none detected" if hits.size == 0 else
                         f"{hits.size} samples, first at t = {log.t[hits[0]]:.4g} s, on link {int(links[hits[0]])}"))
    print("wrote " + ", ".join(p for p, _ in outputs))
    return EXIT_OK
