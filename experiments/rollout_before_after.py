"""Rollout performance of jaxarm (Puma 560, float64, RK3, dt 1 ms), variants measured alternately
in ONE process (medians of --reps): steps/s of jit(vmap(rollout)) at several batches, compile time of
the 1000-step rollout, and the time of jax.grad (sum of squares of the final state wrt all inputs)
relative to the forward rollout at batch 1.

Variants: "noynn" / "ynn" = jit with / without compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}
("lib" = whatever jaxarm.compiler_options() returns, if present);
"+libm" = monkeypatch jnp.sin/cos back into the rollout's joint transforms (the pre-change code);
"+rolled" = method=jaxarm.integrators.rk3_rolled; "+unrolled" = the three RK3 stages written out;
"+unrollK" = rollout(unroll=K); "+ckpt0/1" = rollout(checkpoint=...).

Usage: python experiments/rollout_before_after.py \
          [--batches 1 256 4096] [--big-steps 200] [--reps 3] [--variants ynn noynn] [--grad]
"""
import argparse, json, time, statistics
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
import jaxarm
import jaxarm.dynamics.kinematics as dyn
import jaxarm.model.arm as armmod
from jaxarm import spatial

p = argparse.ArgumentParser()
p.add_argument("--batches", type=int, nargs="*", default=[1, 256, 4096])
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--big-steps", type=int, default=200, help="steps for batches >= 1024 (steps/s is per step; compile is the same)")
p.add_argument("--reps", type=int, default=3)
p.add_argument("--variants", nargs="+", default=["ynn", "noynn"])
p.add_argument("--grad", action="store_true")
p.add_argument("--grad-variants", nargs="+", default=None, help="e.g. noynn+ckpt1 noynn+rolled+unroll2")
a = p.parse_args()

arm = jaxarm.load_arm("puma560")
n, dt = arm.n, 1e-3
NOYNN = {"xla_cpu_experimental_ynn_fusion_type": ""}


def libm_joint_transform(bodies, i, revolute, qi):  # the pre-change joint transform (jnp.sin/cos)
    R0, p0 = bodies.rotation[i], bodies.translation[i]
    if revolute:
        return spatial.mm(R0, spatial.rot_z(qi)), p0
    return R0, p0 + R0[:, 2] * qi


def options(variant):
    if "noynn" in variant:
        return NOYNN
    if variant.startswith("lib"):
        return jaxarm.compiler_options()
    return {}


class patched:
    def __init__(self, variant):
        self.on = "libm" in variant
    def __enter__(self):
        if self.on:
            self.saved = dyn.joint_transform
            dyn.joint_transform = libm_joint_transform
    def __exit__(self, *exc):
        if self.on:
            dyn.joint_transform = self.saved


def inputs(B, T, seed=0):
    rng = np.random.default_rng(seed)
    q0 = rng.uniform(-0.5, 0.5, (B, n)); qd0 = rng.uniform(-0.5, 0.5, (B, n))
    g = np.asarray(jax.jit(jax.vmap(lambda q: jaxarm.gravity_torques(arm, q)))(q0))
    u = g[:, None, :] + rng.uniform(-1, 1, (B, T, n))
    return jnp.asarray(q0), jnp.asarray(qd0), jnp.asarray(u)


def timeit(f, *args):
    t = time.perf_counter(); jax.block_until_ready(f(*args)); return time.perf_counter() - t


def compiled(fn, variant, args):
    with patched(variant):
        t = time.perf_counter()
        c = jax.jit(fn, compiler_options=options(variant)).lower(*args).compile()
        return c, time.perf_counter() - t


def rollout_kwargs(variant):
    kw = {}
    for tok in variant.split("+"):
        if tok == "rolled":
            from jaxarm import integrators
            kw["method"] = integrators.rk3_rolled
        elif tok == "unrolled":
            kw["method"] = __import__("jaxarm").integrators.rk3  # the stages written out (pre-change default)
        elif tok.startswith("unroll"):
            kw["unroll"] = int(tok[6:])
        elif tok.startswith("ckpt"):
            kw["checkpoint"] = bool(int(tok[4:]))
    return kw


def fwd(variant="", **kw):
    kw = {**rollout_kwargs(variant), **kw}
    return jax.vmap(lambda q0, qd0, u: jaxarm.rollout(arm, q0, qd0, u, dt, on_divergence="flag", **kw).q[-1])


rows = []
def emit(**r):
    rows.append(r); print(json.dumps(r), flush=True)

for B in a.batches:
    T = a.steps if B < 1024 else a.big_steps
    args = inputs(B, T)
    comp = {}
    for v in a.variants:
        comp[v], cs = compiled(fwd(v), v, args)
        emit(kind="compile", variant=v, batch=B, steps=T, seconds=round(cs, 2))
    times = {v: [] for v in a.variants}
    for v in a.variants:
        timeit(comp[v], *args)
    for _ in range(a.reps):
        for v in a.variants:
            times[v].append(timeit(comp[v], *args))
    ref = np.asarray(comp[a.variants[0]](*args))
    for v in a.variants:
        med = statistics.median(times[v])
        err = float(np.max(np.abs(np.asarray(comp[v](*args)) - ref)))
        emit(kind="rollout", variant=v, batch=B, steps=T, steps_per_s=round(B * T / med), max_diff_vs_first=err)

if a.grad:
    B, T = 1, a.steps
    args = inputs(B, T)
    gvars = a.grad_variants or a.variants
    res = {}
    for gv in gvars:
        v = gv
        f = fwd(v)
        cost = lambda q0, qd0, u, f=f: jnp.sum(f(q0, qd0, u) ** 2)
        cf, csf = compiled(f, v, args)
        cg, csg = compiled(jax.grad(cost, argnums=2), v, args)
        res[gv] = (cf, cg)
        emit(kind="compile_grad", variant=gv, forward_s=round(csf, 2), grad_s=round(csg, 2))
    tf = {g: [] for g in gvars}; tg = {g: [] for g in gvars}
    for g in gvars:
        timeit(res[g][0], *args); timeit(res[g][1], *args)
    for _ in range(a.reps):
        for g in gvars:
            tf[g].append(timeit(res[g][0], *args)); tg[g].append(timeit(res[g][1], *args))
    g0 = np.asarray(res[gvars[0]][1](*args))
    for g in gvars:
        mf, mg = statistics.median(tf[g]), statistics.median(tg[g])
        diff = float(np.max(np.abs(np.asarray(res[g][1](*args)) - g0)) / np.max(np.abs(g0)))
        emit(kind="grad_ratio", variant=g, forward_ms=round(mf * 1e3, 2), grad_ms=round(mg * 1e3, 2),
             ratio=round(mg / mf, 2), rel_diff_vs_first=diff)
