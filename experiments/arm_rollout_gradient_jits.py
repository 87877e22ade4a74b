"""One rollout's gradient with respect to the arm, under a plain ``jax.jit`` and under ``jaxarm.jit``.

The loss: the sum of squared joint angles along one RK3 rollout of ``--steps`` steps (1 ms) of the
bundled arm from a random state, gravity-compensating torques plus noise; ``jax.grad`` with
respect to the whole arm (``--wrt arm``: kinematics, base, tool, gravity, drives traced) or to its
standard parameters (``--wrt parameters``: the kinematics known). The states and torques are
arguments of the jit. Each program is compiled by a plain ``jax.jit`` (XLA's default options, as a
user's own program is) and with ``jaxarm.compiler_options()`` inside ``loop_kernels()`` (as
``jaxarm.jit`` compiles); one JSON line each: compile seconds, the best of ``--repeats`` calls,
and with ``--profile`` the kernel that takes the most time in a ``jax.profiler`` trace of two
calls (its name, milliseconds per gradient, launches per gradient), where it takes more than 5 %
of the gradient's time (under ``jaxarm.jit`` the time loop is one kernel, not looked into).

    python experiments/arm_rollout_gradient_jits.py
    python experiments/arm_rollout_gradient_jits.py --arms panda --wrt arm --steps 200 --profile
    python experiments/arm_rollout_gradient_jits.py --arms panda --wrt arm --unstored   # before and after, one process
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import json
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.core import xla  # noqa: E402
from jaxarm.dynamics import kinematics  # noqa: E402
from jaxarm.identify.linear_model import arm_with_parameters, standard_parameters  # noqa: E402


def hottest_kernel(compiled, args, calls=2):
    """(name, ms per call, launches per call) of the kernel with the most time in a trace."""
    from jax._src.profiler import ProfileData

    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        for _ in range(calls):
            jax.block_until_ready(compiled(*args))
        jax.profiler.stop_trace()
        data = ProfileData.from_file(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0])
    total, count = collections.Counter(), collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLAEigen"):
                continue
            for event in line.events:
                if not event.name.startswith(("ThunkExecutor", "while", "call", "end:")):
                    total[event.name] += event.duration_ns
                    count[event.name] += 1
    name, ns = total.most_common(1)[0]
    return name, round(ns / calls / 1e6, 2), count[name] // calls


def measure(name, wrt, steps, repeats, profile, unstored=False):
    arm = jaxarm.load_arm(name)
    n = arm.n
    rng = np.random.default_rng(0)
    q0, qd0 = (jnp.asarray(rng.uniform(-0.5, 0.5, n)) for _ in range(2))
    g = jax.jit(lambda q: jaxarm.gravity_torques(arm, q))(q0)
    u = jnp.asarray(np.asarray(g)[None] + rng.uniform(-1.0, 1.0, (steps, n)))
    x0 = arm if wrt == "arm" else jnp.asarray(standard_parameters(arm))
    arm_of = (lambda a: a) if wrt == "arm" else (lambda p: arm_with_parameters(arm, p))

    def loss(x, q0, qd0, u):
        return jnp.sum(jaxarm.rollout(arm_of(x), q0, qd0, u, 1e-3, method="rk3").q ** 2)

    args = (x0, q0, qd0, u)
    labels = ("plain jax.jit", "jaxarm.jit")
    for label in labels + (("plain jax.jit, unstored",) if unstored else ()):
        plain = label.startswith("plain jax.jit")
        # (the joint angles' cotangents stored apart under a plain jax.jit, or put together as
        # they are computed: kinematics._STORED_ANGLE_COTANGENTS)
        kinematics._STORED_ANGLE_COTANGENTS = not label.endswith("unstored")
        fn = jax.grad(lambda *v: loss(*v))  # a new function each time: jax caches a trace by function
        start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            if not plain:  # as jaxarm.jit lowers and compiles
                stack.enter_context(xla.loop_kernels())
                stack.enter_context(xla.fusion_emitters_off())
            compiled = jax.jit(fn).lower(*args).compile(compiler_options=None if plain else jaxarm.compiler_options())
        first = time.perf_counter() - start
        jax.block_until_ready(compiled(*args))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            best = min(best, time.perf_counter() - t0)
        row = dict(arm=name, wrt=wrt, steps=steps, jit=label, compile_s=round(first, 2), ms=round(best * 1e3, 2))
        if profile:  # (under jaxarm.jit the time loop runs as one kernel, which the trace does not look into)
            kernel, ms, launches = hottest_kernel(compiled, args)
            if ms > 0.05 * row["ms"]:
                row.update(hottest_kernel=kernel, hottest_ms=ms, hottest_launches=launches)
        print(json.dumps(row), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="panda,puma560")
    ap.add_argument("--wrt", default="arm,parameters", help="comma-separated: arm, parameters")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="also the kernel with the most time in a profile")
    ap.add_argument("--unstored", action="store_true",
                    help="also under a plain jax.jit with the joint angles' cotangents put together as they are "
                         "computed (before they were stored apart; the same program with the kinematics known)")
    args = ap.parse_args(argv)
    for name in args.arms.split(","):
        for wrt in args.wrt.split(","):
            measure(name, wrt, args.steps, args.repeats, args.profile, args.unstored)


if __name__ == "__main__":
    main()
