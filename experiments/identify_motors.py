"""Motor identification on a simulated Puma 560 with DC drives, under a designed excitation voltage.

1. The truth: the bundled Puma 560 (links, gear ratios, rotor inertias, viscous and asymmetric
   Coulomb friction from the Corke/Armstrong consensus model) with ILLUSTRATIVE motor constants
   (the model has none): Kt = 0.26 N m/A, R = 1.6 ohm, 40 V for joints 1-3, Kt = 0.09 N m/A,
   R = 3.9 ohm, 24 V for the wrist; illustrative limits 1 rad/s and 3 rad/s^2 for the excitation.
   The Coulomb friction's sign is smoothed as tanh(qd / 0.02 rad/s) (``coulomb_velocity_scale``,
   known to the identification): with the exact sign the simulated joints chatter through every
   velocity reversal (stick-slip at the 1 ms step), torque jumps of 2 |G| Tc (50 N m on joint 1)
   that no filtered measurement can follow.
2. Excitation: a Fourier trajectory (5 harmonics, 10 s period) designed with
   ``jaxarm.design_excitation`` (condition number of the base regressor, limits exact), tracked by
   a computed-torque voltage controller (``voltage_tracking_policy``) through 16-bit DACs, with
   1 ms RK3 steps, for ``--periods`` periods.
3. Sensors (``add_sensor_noise``): white Gaussian noise of ``--noise`` (default 1 %) of each
   signal's RMS on V, I and q (q: RMS about its mean), then quantization: 4096-count motor encoders
   (joint resolution 2 pi / (4096 |G|)), 12-bit ADCs over +/- the voltage limit and +/- the stall
   current V_limit / R. Positions are filtered by ``preprocess_log`` (zero-phase 4th-order
   Butterworth at ``--cutoff`` Hz, central differences for dq and ddq, edges trimmed); V and I
   enter unfiltered (``jaxarm.motor_identification.preprocess_motor_log``).
4. Identification (``identify_motors``): "alone" with the true link parameters, and "joint" with
   link parameters starting from a prior perturbed by 20 % (drive priors zero in both).
5. Validation on a fresh trajectory (a random Fourier series within the same limits, new noise):
   the torque the identified arm predicts from the filtered measurements against the measured
   torque G Kt I_meas (true Kt, raw current samples). Noise level of that torque channel:
   sigma_tau_j = |G_j| Kt_j sigma_I_j, with sigma_I_j the standard deviation of the current
   measurement error (noise and ADC quantization, measured). A perfect model scores 1.0.

Prints one JSON line per parameter and mode, one per joint of validation, a summary line with the
targets (Kt, R within 2 %; torque RMSE on moving samples within 1.5 sigma_tau), then tables.
Run: python experiments/identify_motors.py [--quick] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import excitation, identification, motor_identification as mi  # noqa: E402

KT = np.array([0.26, 0.26, 0.26, 0.09, 0.09, 0.09])  # N m/A, illustrative
RESISTANCE = np.array([1.6, 1.6, 1.6, 3.9, 3.9, 3.9])  # ohm, illustrative
VOLTAGE = np.array([40.0, 40.0, 40.0, 24.0, 24.0, 24.0])  # V, illustrative
VELOCITY_LIMIT = 1.0  # rad/s, illustrative (the bundled model has none)
ACCELERATION_LIMIT = 3.0  # rad/s^2
COULOMB_VELOCITY_SCALE = 0.02  # rad/s, joint side
ENCODER_COUNTS = 4096  # per motor turn
ADC_BITS = 12  # sensors (V, I)
DAC_BITS = 16  # the controller's output; a 12-bit DAC's 20 mV steps give wrist-torque steps of 3x the noise


def truth_arm():
    arm = jaxarm.load_arm("puma560")
    drives = dataclasses.replace(
        arm.drives,
        torque_constant=KT,
        resistance=RESISTANCE,
        voltage_limit=VOLTAGE,
        coulomb_velocity_scale=np.full(arm.n, COULOMB_VELOCITY_SCALE),
    )
    limits = dataclasses.replace(arm.limits, velocity=np.full(arm.n, VELOCITY_LIMIT))
    return arm.replace(drives=drives, limits=limits)


def prior_arm(truth, rng, perturb_links: float):
    """The truth's kinematics and gear ratios; drive parameters zero; links scaled by 1 +/- perturb."""
    zero = np.zeros(truth.n)
    drives = dataclasses.replace(
        truth.drives,
        rotor_inertia=zero,
        viscous_friction=zero,
        coulomb_friction=np.zeros((truth.n, 2)),
        torque_constant=zero,
        resistance=zero,
    )
    arm = truth.replace(drives=drives)
    if perturb_links:
        pi = np.asarray(identification.standard_parameters(arm, drives=False))
        pi = pi * (1.0 + perturb_links * rng.uniform(-1.0, 1.0, pi.shape))
        arm = jax.tree_util.tree_map(np.asarray, identification.arm_with_parameters(arm, pi, drives=False))
    return arm


def measure(truth, params, periods, dt, noise, seed, cutoff):
    """Simulate the tracked excitation, add sensor noise, preprocess. Returns (raw noisy log,
    exact log, preprocessed log)."""
    T = float(params.period)
    steps = int(round(periods * T / dt))
    q0, qd0, _ = excitation.fourier_trajectory(params, 0.0)
    policy = excitation.voltage_tracking_policy(truth, params, kp=400.0, kd=40.0)
    dac = jaxarm.DAC(full_scale=VOLTAGE, bits=DAC_BITS)  # one converter per joint, +/- its voltage limit
    traj = jaxarm.rollout(truth, q0, qd0, policy, dt, steps=steps, input="voltage", dac=dac)
    exact = mi.simulated_motor_log(truth, traj, sampling="average")  # what anti-aliased sensors see
    G = np.asarray(truth.drives.gear_ratio)
    raw = mi.add_sensor_noise(
        exact,
        relative=noise,
        encoder_resolution=2 * np.pi / (ENCODER_COUNTS * np.abs(G)),
        voltage_range=VOLTAGE,
        current_range=VOLTAGE / RESISTANCE,
        adc_bits=ADC_BITS,
        seed=seed,
    )
    return raw, exact, mi.preprocess_motor_log(raw, cutoff=cutoff)


def validate(truth, identified, raw, exact, filtered, min_speed):
    """Per-joint torque RMSE of the identified arm on (filtered) measurements vs the measured torque
    G Kt_true I_meas at the same samples -- over all samples and over the samples moving at
    |qd| >= min_speed (away from velocity reversals, where the smoothed Coulomb sign amplifies the
    velocity noise) -- vs the true torque, and the torque channel's noise level."""
    G, Kt = np.asarray(truth.drives.gear_ratio), np.asarray(truth.drives.torque_constant)
    rows = np.searchsorted(raw.t, filtered.t)
    tau_meas = G * Kt * raw.I[rows]
    tau_true = exact.tau[rows]
    pred = np.asarray(jax.vmap(lambda a, b, c: jaxarm.inverse_dynamics(identified, a, b, c))(filtered.q, filtered.dq, filtered.ddq))
    sigma = np.abs(G) * Kt * np.std(raw.I - exact.I, axis=0)  # noise level of the torque channel
    err = pred - tau_meas
    rmse = np.sqrt(np.mean(err**2, axis=0))
    moving = np.abs(filtered.dq) >= min_speed
    rmse_moving = np.array([np.sqrt(np.mean(err[moving[:, j], j] ** 2)) for j in range(truth.n)])
    rmse_true = np.sqrt(np.mean((pred - tau_true) ** 2, axis=0))
    return rmse, rmse_moving, rmse_true, sigma


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short optimization and one period (about a minute)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise", type=float, default=0.01, help="sensor noise, fraction of each signal's RMS")
    ap.add_argument("--periods", type=int, default=None, help="excitation periods logged (default 3, quick 1)")
    ap.add_argument("--cutoff", type=float, default=1.5, help="low-pass cutoff of the preprocessing [Hz] (top harmonic: 0.5 Hz)")
    ap.add_argument("--min-speed", type=float, default=0.02, help="|qd| [rad/s] below which a sample is left out of the mechanical fit and of the 'moving' validation RMSE")
    ap.add_argument("--dt", type=float, default=1e-3)
    args = ap.parse_args(argv)
    periods = args.periods or (1 if args.quick else 3)
    started = time.time()
    truth = truth_arm()
    rng = np.random.default_rng(args.seed)

    design = excitation.design_excitation(
        truth,
        harmonics=5,
        period=10.0,
        samples=60,
        acceleration_limit=ACCELERATION_LIMIT,
        steps=20 if args.quick else 200,
        seed=args.seed,
    )
    print(json.dumps({
        "excitation": "designed", "condition_initial": design.condition_initial, "condition": design.condition,
        "max_ratio": {k: float(np.max(v)) for k, v in design.ratios.items()}, "seconds": round(time.time() - started, 1),
    }), flush=True)

    raw, exact, fit_log = measure(truth, design.params, periods, args.dt, args.noise, args.seed, args.cutoff)
    fresh = excitation.design_excitation(
        truth, harmonics=5, period=10.0, samples=60, acceleration_limit=ACCELERATION_LIMIT, steps=0, seed=args.seed + 1
    ).params_initial
    raw_v, exact_v, val_log = measure(truth, fresh, 1, args.dt, args.noise, args.seed + 1, args.cutoff)

    truth_values = mi.motor_parameters(truth)
    summary = {"noise": args.noise, "periods": periods, "cutoff_hz": args.cutoff}
    tables = []
    for mode, perturb in (("alone", 0.0), ("joint", 0.2)):
        prior = prior_arm(truth, rng, perturb)
        res = mi.identify_motors(fit_log, prior, mode=mode, min_speed=args.min_speed)
        for line in res.json_lines(truth).splitlines():
            print(json.dumps({"mode": mode, **json.loads(line)}))
        rmse, rmse_moving, rmse_true, sigma = validate(truth, res.arm, raw_v, exact_v, val_log, args.min_speed)
        for j in range(truth.n):
            print(json.dumps({
                "mode": mode, "validation_joint": j + 1, "rmse_vs_measured": float(rmse[j]),
                "rmse_vs_measured_moving": float(rmse_moving[j]), "rmse_vs_true": float(rmse_true[j]),
                "noise_level": float(sigma[j]), "ratio": float(rmse[j] / sigma[j]), "ratio_moving": float(rmse_moving[j] / sigma[j]),
            }))
        rel = mi.relative_error(res.values, truth_values).reshape(truth.n, -1)
        summary[mode] = {
            "max_rel_error_Kt": float(np.max(rel[:, 0])),
            "max_rel_error_R": float(np.max(rel[:, 1])),
            "max_torque_ratio": float(np.max(rmse / sigma)),
            "max_torque_ratio_moving": float(np.max(rmse_moving / sigma)),
            "target_met": bool(np.max(rel[:, :2]) <= 0.02 and np.max(rmse_moving / sigma) <= 1.5),
            "rank": res.rank,
        }
        tables.append((mode, res, rmse, rmse_moving, rmse_true, sigma))
    summary["seconds"] = round(time.time() - started, 1)
    print(json.dumps({"summary": summary}))

    for mode, res, rmse, rmse_moving, rmse_true, sigma in tables:
        print(f"\n== mode {mode}: motor-side parameters (illustrative truth) ==")
        print(res.table(truth))
        print(f"\nvalidation torque RMSE [N m] ({mode}); ratio = RMSE / noise level, 1.0 = perfect")
        print(f"{'joint':>5} {'vs measured':>12} {'ratio':>6} {'moving':>10} {'ratio':>6} {'vs true':>10} {'noise':>8}")
        for j in range(truth.n):
            print(
                f"{j + 1:>5} {rmse[j]:>12.4f} {rmse[j] / sigma[j]:>6.2f} {rmse_moving[j]:>10.4f} "
                f"{rmse_moving[j] / sigma[j]:>6.2f} {rmse_true[j]:>10.4f} {sigma[j]:>8.4f}"
            )
    return summary


if __name__ == "__main__":
    main()
