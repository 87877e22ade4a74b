"""Batched RK3 rollouts of the Puma 560: throughput versus batch size, beside MuJoCo.

    python experiments/batched_rollouts.py                     # batch 1 .. 16384, 1000 steps at 1 ms
    python experiments/batched_rollouts.py --quick             # batch 1 .. 64, 200 steps
    python experiments/batched_rollouts.py --plot rollouts.png

Prints one JSON line per measurement: steps per second (batch x steps / wall time of one jitted
call, after compilation) and the compile time. If MuJoCo is installed, `mujoco.rollout` runs the
same arm (exported with `jaxarm.to_mjcf`), the same dt and step count, with one thread per core, in
the same run; its integrator is RK4 (MuJoCo has no RK3), so jaxarm's RK4 is measured too and the
ratio line compares like with like. Coulomb friction is removed from the arm for both simulators
(MuJoCo models it as a constraint, not a force law); viscous friction and rotor inertia stay.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402


def _arm():
    """The Puma 560 as MuJoCo can load it, used by both simulators.

    The consensus model has a massless link 1 with Iyy only, and link 3 breaks the triangle
    inequality; MuJoCo rejects both. Link 1 only ever spins about its y axis (joint 1's axis), so
    giving it 1 g at its origin on that axis and balancing Ixx = Izz = Iyy / 2 leaves every joint
    torque unchanged; link 3's Izz is raised from 0.0125 to 0.020 (the smallest round value that
    satisfies the triangle inequality). Coulomb friction is removed (see the module docstring).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jaxarm.PhysicalConsistencyWarning)
        arm = jaxarm.load_arm("puma560")
    mass = np.array(arm.links.mass)
    inertia = np.array(arm.links.inertia)
    mass[0] = 1e-3
    inertia[0] = np.diag([inertia[0, 1, 1] / 2, inertia[0, 1, 1], inertia[0, 1, 1] / 2])
    inertia[2, 2, 2] = 0.020
    links = dataclasses.replace(arm.links, mass=mass, inertia=inertia)
    drives = dataclasses.replace(arm.drives, coulomb_friction=np.zeros_like(arm.drives.coulomb_friction))
    return arm.replace(links=links, drives=drives)


def _inputs(rng, B, T, n):
    q0 = rng.uniform(-0.5, 0.5, (B, n))
    qd0 = rng.uniform(-0.5, 0.5, (B, n))
    tau = rng.uniform(-5, 5, (B, T, n))
    return q0, qd0, tau


def bench_jaxarm(arm, batches, T, dt, method, dtype, rng, min_time):
    arm_d = arm.astype(dtype)
    fn = jax.jit(
        jax.vmap(lambda q0, qd0, u: jaxarm.rollout(arm_d, q0, qd0, u, dt, method=method, on_divergence="flag").q[-1])
    )
    rows = []
    for B in batches:
        q0, qd0, tau = (jnp.asarray(x, dtype) for x in _inputs(rng, B, T, arm.n))
        t0 = time.perf_counter()
        compiled = fn.lower(q0, qd0, tau).compile()
        compile_s = time.perf_counter() - t0
        jax.block_until_ready(compiled(q0, qd0, tau))
        best, spent = np.inf, 0.0
        while spent < min_time or best == np.inf:
            start = time.perf_counter()
            jax.block_until_ready(compiled(q0, qd0, tau))
            elapsed = time.perf_counter() - start
            best, spent = min(best, elapsed), spent + elapsed
        row = {
            "library": "jaxarm",
            "version": jaxarm.__version__,
            "method": method,
            "dtype": jnp.dtype(dtype).name,
            "batch": B,
            "steps": T,
            "dt": dt,
            "seconds": best,
            "steps_per_second": B * T / best,
            "compile_seconds": compile_s,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def bench_mujoco(arm, batches, T, dt, rng, min_time):
    try:
        import mujoco
        from mujoco import rollout as mj_rollout
    except ImportError:
        return []
    model = mujoco.MjModel.from_xml_string(jaxarm.to_mjcf(arm, timestep=dt))
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    nthread = os.cpu_count() or 1
    datas = [mujoco.MjData(model) for _ in range(nthread)]
    nstate = mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    rows = []
    for B in batches:
        q0, qd0, tau = _inputs(rng, B, T, arm.n)
        state0 = np.zeros((B, nstate))
        state0[:, 1 : 1 + arm.n] = q0  # FULLPHYSICS = (time, qpos, qvel, act, ...)
        state0[:, 1 + arm.n : 1 + 2 * arm.n] = qd0
        if model.nu != arm.n:
            raise RuntimeError(f"MJCF has {model.nu} actuators, expected {arm.n}")
        mj_rollout.rollout(model, datas, state0, tau, persistent_pool=True)  # warm-up
        best, spent = np.inf, 0.0
        while spent < min_time or best == np.inf:
            start = time.perf_counter()
            mj_rollout.rollout(model, datas, state0, tau, persistent_pool=True)
            elapsed = time.perf_counter() - start
            best, spent = min(best, elapsed), spent + elapsed
        row = {
            "library": "mujoco",
            "version": mujoco.__version__,
            "call": f"mujoco.rollout, {nthread} threads",
            "method": "rk4",
            "dtype": "float64",
            "batch": B,
            "steps": T,
            "dt": dt,
            "seconds": best,
            "steps_per_second": B * T / best,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {}
    for r in rows:
        key = f"{r['library']} {r['method']} {r['dtype']}"
        series.setdefault(key, []).append((r["batch"], r["steps_per_second"]))
    for key, pts in series.items():
        pts.sort()
        ax.loglog(*zip(*pts), marker="o", label=key)
    ax.set_xlabel("batch size (rollouts)")
    ax.set_ylabel("simulated steps per second")
    ax.set_title("Puma 560 rollouts, 1 ms steps")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,16,256,1024,4096,16384")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--dt", type=float, default=1e-3)
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--plot", default=None, help="write a throughput-vs-batch PNG here")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.steps, args.min_time = "1,64", 200, 0.0
    batches = [int(b) for b in args.batches.split(",")]
    dtype = getattr(jnp, args.dtype)
    arm = _arm()
    rng = np.random.default_rng(0)
    rows = []
    for method in ("rk3", "rk4"):
        rows += bench_jaxarm(arm, batches, args.steps, args.dt, method, dtype, rng, args.min_time)
    mj = bench_mujoco(arm, batches, args.steps, args.dt, rng, args.min_time)
    rows += mj
    for m in mj:
        for method in ("rk3", "rk4"):
            ours = [r for r in rows if r["library"] == "jaxarm" and r["method"] == method and r["batch"] == m["batch"]]
            if ours:
                ratio = ours[0]["steps_per_second"] / m["steps_per_second"]
                print(json.dumps({"metric": f"jaxarm_{method}_over_mujoco_rk4", "batch": m["batch"], "value": ratio}), flush=True)
    if args.plot:
        plot(rows, args.plot)
    return rows


if __name__ == "__main__":
    main()
