"""Linearization accuracy and TV-LQR tracking on the Puma 560.

    python experiments/lqr_tracking.py            # 2 s nominal at 2 ms, 10 check points
    python experiments/lqr_tracking.py --quick    # 0.6 s nominal, 3 check points

Prints JSON lines:
- ``{"metric": "continuous_vs_fd", ...}`` / ``"rk3_step_vs_fd"``: max relative error (max |AD - FD| /
  max |FD| per matrix, worst over the check points) of the autodiff A, B against central finite
  differences along the nominal trajectory;
- ``{"metric": "rk3_vs_zoh", "dt": ...}``: max |A_rk3 - exp(A dt)| (and for B) along the nominal, for
  several dt: the difference shrinks as dt^2 (dA/dt dt^2 / 2, see tests/test_linearize.py) at the
  points where every joint moves (|qd| > 0.05 rad/s, ``moving_*``); near rest Coulomb friction
  switches inside the step and the step is nonsmooth;
- ``{"controller": "open_loop" | "tvlqr", "payload_error": ...}``: tracking of the nominal (designed
  with a 2.5 kg payload) by the arm actually holding a payload 10 % heavier (and lighter): RMS and
  final joint error (rad) and RMS tool-position error (m).
"""

from __future__ import annotations

import argparse
import json
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm import linearize as lin  # noqa: E402
from jaxarm.lqr import tvlqr_tracking  # noqa: E402

PAYLOAD = 2.5  # kg, the Puma 560's rated payload
PAYLOAD_COM = (0.0, 0.0, 0.05)


def rel_err(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def fd_jacobians(fun, x, u, eps=1e-6):
    cx = [(fun(x + eps * e, u) - fun(x - eps * e, u)) / (2 * eps) for e in np.eye(len(x))]
    cu = [(fun(x, u + eps * e) - fun(x, u - eps * e)) / (2 * eps) for e in np.eye(len(u))]
    return np.stack(cx, 1), np.stack(cu, 1)


def nominal(arm, duration, dt):
    """A smooth 2 s reach: PD with gravity compensation towards a goal, torques recorded."""
    T = int(round(duration / dt))
    q0 = np.array([0.0, 0.5, -0.5, 0.0, 0.3, 0.0])
    goal = q0 + np.array([0.6, -0.4, 0.5, 0.4, -0.4, 0.3])
    pd = jaxarm.pd_controller(150.0, 25.0, goal, gravity_compensation=arm)
    return jaxarm.rollout(arm, q0, np.zeros(arm.n), pd, dt, steps=T)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--dt", type=float, default=2e-3)
    p.add_argument("--points", type=int, default=10, help="check points along the nominal for the FD comparison")
    p.add_argument("--quick", action="store_true", help="0.6 s nominal, 3 check points")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.points = 0.6, 3
    puma = jaxarm.load_arm("puma560")
    model = puma.with_payload(PAYLOAD, PAYLOAD_COM)
    dt = args.dt
    nom = nominal(model, args.duration, dt)
    T = nom.tau.shape[0]
    q, qd, u = np.asarray(nom.q[:T]), np.asarray(nom.qd[:T]), np.asarray(nom.tau)
    pts = np.linspace(1, T - 1, args.points).astype(int)  # skip t = 0, where qd = 0 sits on the Coulomb switch

    # --- linearization vs finite differences
    f = jax.jit(lambda x, u: lin._state_derivative(model, x, u))
    F = jax.jit(lambda x, u: lin._step(model, x, u, dt, None, "rk3", "torque", True))
    A, B = lin.linearize_continuous(model, q[pts], qd[pts], u[pts])
    Ad, Bd = lin.linearize_trajectory(model, q[pts], qd[pts], u[pts], dt)
    worst = {"A": 0.0, "B": 0.0, "Ad": 0.0, "Bd": 0.0}
    for j, k in enumerate(pts):
        x = np.concatenate([q[k], qd[k]])
        Afd, Bfd = fd_jacobians(lambda x, u: np.asarray(f(x, u)), x, u[k])
        Adfd, Bdfd = fd_jacobians(lambda x, u: np.asarray(F(x, u)), x, u[k])
        worst["A"] = max(worst["A"], rel_err(A[j], Afd))
        worst["B"] = max(worst["B"], rel_err(B[j], Bfd))
        worst["Ad"] = max(worst["Ad"], rel_err(Ad[j], Adfd))
        worst["Bd"] = max(worst["Bd"], rel_err(Bd[j], Bdfd))
    print(json.dumps({"metric": "continuous_vs_fd", "points": len(pts), "max_rel_err_A": worst["A"], "max_rel_err_B": worst["B"]}), flush=True)
    print(json.dumps({"metric": "rk3_step_vs_fd", "dt": dt, "points": len(pts), "max_rel_err_A": worst["Ad"], "max_rel_err_B": worst["Bd"]}), flush=True)

    # Coulomb friction switches sign inside a step where a joint is nearly at rest (|qd| < ~dt |qdd|):
    # there the step is nonsmooth and the RK3 / ZOH comparison is not O(dt^2); report those apart.
    moving = np.min(np.abs(qd[pts]), axis=1) > 0.05
    for h in (1e-2, 5e-3, 2.5e-3, 1.25e-3):
        Adh, Bdh = (np.asarray(m) for m in lin.linearize_trajectory(model, q[pts], qd[pts], u[pts], h))
        Az, Bz = (np.asarray(m) for m in lin.discretize_zoh(A, B, h))
        dA, dB = np.abs(Adh - Az).max(axis=(1, 2)), np.abs(Bdh - Bz).max(axis=(1, 2))
        scale_A, scale_B = np.abs(Adh - np.eye(12)).max(), np.abs(Bdh).max()
        line = {"metric": "rk3_vs_zoh", "dt": h, "points": len(pts), "moving_points": int(moving.sum()),
                "max_abs_diff_A": float(dA.max()), "max_abs_diff_B": float(dB.max()),
                "max_rel_diff_A": float(dA.max() / scale_A), "max_rel_diff_B": float(dB.max() / scale_B)}
        if moving.any():
            line.update({"moving_max_abs_diff_A": float(dA[moving].max()), "moving_max_abs_diff_B": float(dB[moving].max())})
        print(json.dumps(line), flush=True)

    # --- TV-LQR tracking with a payload-mass error
    t0 = time.perf_counter()
    Qw = np.concatenate([np.full(6, 1e4), np.full(6, 10.0)])
    policy, sol = tvlqr_tracking(model, nom.q, nom.qd, nom.tau, dt, Q=Qw, R=1e-3, torque_limit=puma.limits.torque)
    jax.block_until_ready(sol.K)
    design_s = time.perf_counter() - t0
    tool = jax.jit(jax.vmap(lambda q: jaxarm.tool_pose(model, q)[:3, 3]))
    p_nom = np.asarray(tool(nom.q))
    for factor in (1.1, 0.9):
        true_arm = puma.with_payload(PAYLOAD * factor, PAYLOAD_COM)
        runs = {
            "open_loop": jaxarm.rollout(true_arm, nom.q[0], nom.qd[0], nom.tau, dt),
            "tvlqr": jaxarm.rollout(true_arm, nom.q[0], nom.qd[0], policy, dt, steps=T),
        }
        for name, tr in runs.items():
            e = np.asarray(tr.q - nom.q)
            ep = np.linalg.norm(np.asarray(tool(tr.q)) - p_nom, axis=1)
            print(json.dumps({
                "controller": name, "payload_error": round(factor - 1.0, 3), "payload_kg": PAYLOAD * factor,
                "steps": T, "dt": dt, "rms_joint_error_rad": float(np.sqrt(np.mean(e**2))),
                "final_joint_error_rad": float(np.max(np.abs(e[-1]))),
                "rms_tool_error_m": float(np.sqrt(np.mean(ep**2))),
                "max_torque_Nm": float(np.max(np.abs(np.asarray(tr.tau)))),
                **({"design_seconds_incl_compile": round(design_s, 3)} if name == "tvlqr" else {}),
            }), flush=True)


if __name__ == "__main__":
    main()
