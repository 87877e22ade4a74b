"""Estimation on the Panda: the Kalman filter, the momentum observer and payload identification on
synthetic logs with known answers, the observer on the real log, and the filter's speed.

Synthetic logs: jaxarm RK4 rollouts of the Panda at 1 kHz under a smooth exciting torque plus
torque noise, 19-bit encoders (quantized positions), torque sensors with 0.05 N m noise, a 15 N
push on the tool from 2 to 3 s, and payloads of 1, 2 and 3 kg. Real log: Gaz et al. 2019's
``panda_excitation_traj1.csv`` from ``../shared/data/panda/`` (no contact), with the arm
identified from it by ``jaxarm identify`` defaults. Prints one JSON line per measurement.

    python experiments/estimation_panda.py [--log PATH] [--batch 16] [--only NAME ...]
        [--torque-sensors] [--variants extended unscented]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.cli import main as jaxarm_main  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from identify_panda import DATA  # noqa: E402

DT = 1e-3
SECONDS = 6.0
ENCODER = 2 * np.pi / 2**19  # rad per count
TORQUE_NOISE = 0.05  # N m, torque sensors
PROCESS = 0.1  # N m, torque the arm feels beyond the model
PUSH = np.array([0.0, 0.0, -15.0, 0.0, 0.0, 0.0])  # N on the tool, tool frame
PUSH_FROM, PUSH_TO = 2.0, 3.0


def emit(**row):
    print(json.dumps(row), flush=True)


def synthetic(arm, seed, push=True):
    """t, true q, qd, applied torque u (N - 1), measured q (quantized), measured torque, true external joint torque."""
    rng = np.random.default_rng(seed)
    n, T = arm.n, int(SECONDS / DT)
    t = np.arange(T + 1) * DT
    mid = np.mean(np.asarray(jaxarm.load_arm("panda").limits.position), axis=1)
    wave = np.stack([np.sin(2 * np.pi * (0.3 + 0.15 * j) * t[:-1] + j) + 0.5 * np.sin(2 * np.pi * (0.7 + 0.1 * j) * t[:-1]) for j in range(n)], 1)
    # a PD hold around a moving target plus feedforward keeps the arm in its workspace
    target = mid + 0.4 * wave

    def policy(tk, q, qd):
        k = jnp.clip((tk / DT).astype(int), 0, T - 1)
        return jaxarm.gravity_torques(arm, q) + 60.0 * (jnp.asarray(target)[k] - q) - 8.0 * qd

    f_ext = np.where(((t[:-1] >= PUSH_FROM) & (t[:-1] < PUSH_TO))[:, None], PUSH[None, :], 0.0) if push else None
    noise = PROCESS * rng.normal(size=(T, n))
    traj = jaxarm.rollout(arm, mid, np.zeros(n), lambda tk, q, qd: policy(tk, q, qd) + jnp.asarray(noise)[jnp.clip((tk / DT).astype(int), 0, T - 1)],
                          DT, steps=T, method="rk4", f_ext=f_ext, saturate=False)
    q, qd, u = np.asarray(traj.q), np.asarray(traj.qd), np.asarray(traj.u)
    zero = np.zeros(n)
    ext = np.zeros((T + 1, n))
    if push:
        on = (t >= PUSH_FROM) & (t < PUSH_TO)
        id_free = jax.vmap(lambda a: jaxarm.inverse_dynamics(arm, a, zero, zero))
        id_push = jax.vmap(lambda a: jaxarm.inverse_dynamics(arm, a, zero, zero, jnp.asarray(PUSH)))
        ext[on] = np.asarray(id_free(q[on])) - np.asarray(id_push(q[on]))
    q_meas = np.round(q / ENCODER) * ENCODER
    # the torque sensors see the commanded torque, not the unmodelled part (the process noise)
    commanded = u - noise
    tau_meas = np.vstack([commanded, commanded[-1:]]) + TORQUE_NOISE * rng.normal(size=(T + 1, n))
    return t, q, qd, u, q_meas, tau_meas, ext, noise


def filter_and_observer(arm):
    n = arm.n
    kw = dict(dt=DT, torque_std=np.hypot(PROCESS, TORQUE_NOISE), position_std=1e-7, quantization=ENCODER)
    # consistency of the state filter on a contact-free run (its noise model is then the truth's)
    free_t, fq_true, fqd_true, _, fq, ftau, _, _ = synthetic(arm, 1, push=False)
    plain = jaxarm.extended_kalman_filter(arm, ftau[:-1], fq, q0=fq[0], **kw)
    e = np.concatenate([fq_true - plain.q, fqd_true - plain.qd], axis=1)
    nees = np.einsum("ki,kij,kj->k", e, np.linalg.inv(plain.covariance), e)[500:]
    window = 200  # samples: NEES averaged over 0.2 s windows, and the 99 % band of such an average
    avg = np.convolve(nees, np.ones(window) / window, mode="valid")
    lo_w, hi_w = stats.chi2.ppf([0.005, 0.995], 2 * n * window) / window
    emit(measure="ekf_consistency", states="q, qd (14)", nees_mean=round(float(nees.mean()), 2), dof=2 * n,
         fraction_of_0p2s_windows_inside_99_band=round(float(np.mean((avg > lo_w) & (avg < hi_w))), 3),
         nis_mean_per_dof=round(float(plain.nis.mean() / n), 3),
         velocity_rmse_filter=round(float(np.sqrt(np.mean((plain.qd - fqd_true)[500:] ** 2))), 5),
         velocity_rmse_differentiated_encoders=round(float(np.sqrt(np.mean((np.gradient(fq, DT, axis=0) - fqd_true)[500:] ** 2))), 5),
         note="encoder quantization is uniform, not Gaussian; the band is for Gaussian errors")
    # the push: filter with external torques, and the observer on its states; thresholds from the
    # contact-free run filtered the same way
    t, q, qd, u, q_meas, tau_meas, ext, _ = synthetic(arm, 0)
    est = jaxarm.extended_kalman_filter(arm, tau_meas[:-1], q_meas, q0=q_meas[0], external_std=20.0, **kw)
    free_est = jaxarm.extended_kalman_filter(arm, ftau[:-1], fq, q0=fq[0], external_std=20.0, **kw)
    settle = int(1.0 / DT)  # the filter's and the observer's start-up
    for K in (25.0, 100.0):
        obs = jaxarm.momentum_observer(arm, t, est.q, est.qd, tau_meas, gain=K)
        free_obs = jaxarm.momentum_observer(arm, free_t, free_est.q, free_est.qd, ftau, gain=K)
        thr = jaxarm.detection_threshold(free_obs.residual, settle=settle)
        alarm = jaxarm.detect_contact(obs.residual, thr)
        alarm[:settle] = False
        first = t[np.flatnonzero(alarm)[0]] if alarm.any() else None
        inside = (t >= PUSH_FROM + 5 / K) & (t < PUSH_TO)
        err = obs.residual[inside] - ext[inside]
        err_kf = est.external[inside] - ext[inside]
        emit(measure="momentum_observer", gain_per_s=K, push_newton=15.0,
             external_torque_peak=np.round(np.abs(ext).max(axis=0), 3).tolist(),
             rmse_after_5_time_constants=np.round(np.sqrt(np.mean(err**2, axis=0)), 3).tolist(),
             kalman_external_rmse_same_interval=np.round(np.sqrt(np.mean(err_kf**2, axis=0)), 3).tolist(),
             residual_rmse_contact_free=np.round(np.sqrt(np.mean(free_obs.residual[settle:] ** 2, axis=0)), 3).tolist(),
             detected_at_s=None if first is None else round(float(first), 4), contact_starts_s=PUSH_FROM,
             false_alarms_before_contact=int(alarm[(t < PUSH_FROM)].sum()),
             false_alarms_on_contact_free_run=int(jaxarm.detect_contact(free_obs.residual[settle:], thr).sum()))


def payloads(arm):
    for mass in (1.0, 2.0, 3.0):
        com = np.array([0.01, -0.02, 0.06])
        held = arm.with_payload(mass, com, np.diag([0.002, 0.003, 0.002]) * mass)
        t, q, qd, u, q_meas, tau_meas, _, _ = synthetic(held, 2 + int(mass), push=False)
        raw = jaxarm.Log(t=t, q=q_meas, tau=tau_meas, source="synthetic")
        log = jaxarm.preprocess_log(raw, cutoff=20.0, velocity="differentiate")
        res = jaxarm.identify_payload(arm, log)
        # online: the filter with the mass as a parameter, from a guess of 0 kg
        theta_arm = lambda a, th: a.replace(payload=jaxarm.Payload(mass=th[0], com=jnp.asarray(com), inertia=jnp.zeros((3, 3))))  # noqa: E731
        est = jaxarm.extended_kalman_filter(arm, tau_meas[:-1], q_meas, dt=DT, q0=q_meas[0], torque_std=np.hypot(PROCESS, TORQUE_NOISE),
                                            position_std=1e-7, quantization=ENCODER, parameters=theta_arm, theta0=[0.0], theta_std=[3.0])
        online = est.parameters[:, 0]
        within = np.abs(online - mass) <= 0.05 * mass
        settled = next((k for k in range(len(within)) if within[k:].all()), None)
        emit(measure="payload", true_mass_kg=mass, offline_mass_kg=round(res.mass, 4),
             offline_mass_error_percent=round(100 * abs(res.mass - mass) / mass, 2),
             offline_com_error_mm=round(1e3 * float(np.linalg.norm(res.com - com)), 2), offline_consistent=res.consistent,
             online_final_mass_kg=round(float(online[-1]), 4), online_within_5_percent_from_s=None if settled is None else round(settled * DT, 3),
             note="online: the mass alone, COM and inertia known")


def real_log(log_path):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "panda.toml"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = jaxarm_main(["identify", str(log_path), "--arm", "panda", "--out", str(out)])
        if code:
            raise SystemExit("jaxarm identify failed on the Panda log")
        arm = jaxarm.load_arm(out)
    raw = jaxarm.load_log(log_path, arm)
    log = jaxarm.preprocess_log(raw, rate=1000.0, cutoff=10.0, trim=0.0, filter_torque=False)
    obs = jaxarm.momentum_observer(arm, log.t, log.q, log.dq, log.tau, gain=25.0)
    r = obs.residual[200:]
    smooth = jaxarm.preprocess_log(raw, rate=1000.0, cutoff=10.0)
    model_error = jaxarm.torque_rmse(smooth.tau, jaxarm.predict_torques(arm, smooth.q, smooth.dq, smooth.ddq))
    emit(measure="observer_on_real_panda_log", gain_per_s=25.0, note="no contact in this log: the residual is the model's error",
         residual_rms=np.round(np.sqrt(np.mean(r**2, axis=0)), 3).tolist(),
         residual_99th_percentile=np.round(np.percentile(np.abs(r), 99, axis=0), 3).tolist(),
         identified_model_torque_rmse=np.round(model_error, 3).tolist())


def speed(arm, batch, batch_steps=200, torque_sensors=False, variants=("extended", "unscented")):
    """Time per step of the public filters on the Panda (1 kHz, encoders only, or with
    ``torque_sensors`` encoders and the joint torque sensors): one filter over 1000 steps, then
    ``batch`` filters on different logs (torque noise added per log) over ``batch_steps`` steps in
    one call; compile times separately."""
    n = arm.n
    t, q, qd, u, q_meas, tau_meas, _, _ = synthetic(arm, 5, push=False)
    options = dict(dt=DT, q0=q_meas[0], torque_std=PROCESS, position_std=1e-5, quantization=ENCODER)
    sensors = np.concatenate([q_meas, tau_meas], axis=1) if torque_sensors else q_meas
    if torque_sensors:
        options.update(measure=("q", "tau"), torque_sensor_std=0.05)
    row = dict(measure="filter_speed", arm="panda", sensors=list(options.get("measure", ("q",))), device=jax.devices()[0].platform)
    for variant in variants:
        steps = 1000
        uu, zz = tau_meas[:steps], sensors[:steps + 1]
        start = time.perf_counter()
        jaxarm.kalman_filter(arm, uu, zz, variant=variant, **options)
        first = time.perf_counter() - start
        best = min(_timed(lambda: jaxarm.kalman_filter(arm, uu, zz, variant=variant, **options)) for _ in range(3))
        emit(**row, variant=variant, steps=steps, filters=1,
             first_call_seconds=round(first, 1), microseconds_per_step=round(1e6 * best / steps, 1))
        rng = np.random.default_rng(0)
        ub = tau_meas[None, :batch_steps] + 1e-3 * rng.normal(size=(batch, batch_steps, n))
        zb = np.broadcast_to(sensors[:batch_steps + 1], (batch, batch_steps + 1, sensors.shape[1]))
        start = time.perf_counter()
        jaxarm.kalman_filter(arm, ub, zb, variant=variant, **options)
        first = time.perf_counter() - start
        warm = _timed(lambda: jaxarm.kalman_filter(arm, ub, zb, variant=variant, **options))
        emit(**row, variant=variant, steps=batch_steps, filters=batch, first_call_seconds=round(first, 1), seconds=round(warm, 2),
             microseconds_per_step_per_filter=round(1e6 * warm / batch_steps / batch, 2))


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", default=str(DATA))
    p.add_argument("--batch", type=int, default=1000, help="filters on different logs in one batched call for the speed lines (default 1000)")
    p.add_argument("--only", nargs="+", choices=["filter", "payload", "speed", "real"], help="run only these parts")
    p.add_argument("--torque-sensors", action="store_true", help="speed: the filters read the torque sensors as well as the encoders")
    p.add_argument("--variants", nargs="+", choices=["extended", "unscented"], default=["extended", "unscented"],
                   help="speed: the filters timed")
    args = p.parse_args(argv)
    parts = set(args.only or ["filter", "payload", "speed", "real"])
    arm = jaxarm.load_arm("panda")
    if "filter" in parts:
        filter_and_observer(arm)
    if "payload" in parts:
        payloads(arm)
    if "speed" in parts:
        speed(arm, args.batch, torque_sensors=args.torque_sensors, variants=tuple(args.variants))
    if "real" in parts:
        if Path(args.log).exists():
            real_log(Path(args.log))
        else:
            emit(measure="observer_on_real_panda_log", skipped=f"{args.log} not found")


if __name__ == "__main__":
    main()
