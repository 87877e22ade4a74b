"""One state's dynamics called eagerly (outside any jit), as a new user first calls them.

For each function: the first call's seconds and the number of programs JAX compiled for it, then
the time of a call after that (best of ``--repeats``), on the Panda (float64); then the first call
with another arm of the same structure (the Panda with a payload) and with a third one. Two ways, each in a
process of its own so that neither warms the other's caches: ``compiled`` (what users get: the
call compiled whole, :func:`jaxarm.dynamics.eager.compiled_when_eager`) and ``op_by_op`` (the
function as written, run one operation at a time, as before). Pinocchio's rnea, crba and aba on
example-robot-data's Panda are timed in the same run where installed (a per-call reference).
One JSON line per function and way.

``--gradients N``: instead, ``jax.grad`` with respect to the arm called eagerly (a fit's gradient
step in a Python loop) of the squared torques of inverse dynamics at one state, over N states
(``jax.vmap``, the arm left out), and over N states with only the links traced: the first call,
then the best of ``--repeats`` calls, the same two ways (``compiled``: the kept program of
:func:`jaxarm.dynamics.eager._kept_for_traced`).

    python experiments/eager_calls.py
    python experiments/eager_calls.py --arm puma560 --repeats 50
    python experiments/eager_calls.py --gradients 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

FUNCTIONS = ("inverse_dynamics", "mass_matrix", "forward_dynamics", "bias_forces", "gravity_torques",
             "kinetic_energy", "tool_pose", "jacobian")


def _args(name, arm, q, qd, qdd):
    return {"inverse_dynamics": (arm, q, qd, qdd), "mass_matrix": (arm, q), "forward_dynamics": (arm, q, qd, qdd),
            "bias_forces": (arm, q, qd), "gravity_torques": (arm, q), "kinetic_energy": (arm, q, qd),
            "tool_pose": (arm, q), "jacobian": (arm, q)}[name]


def measure(mode: str, arm_name: str, repeats: int):
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import jaxarm

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(seconds) if event == "/jax/core/compile/backend_compile_duration" else None)
    arm = jaxarm.load_arm(arm_name)
    rng = np.random.default_rng(0)
    q, qd, qdd = (rng.uniform(-1, 1, arm.n) for _ in range(3))
    for name in FUNCTIONS:
        fn = getattr(jaxarm, name)
        fn = fn.__wrapped__ if mode == "op_by_op" else fn
        args = _args(name, arm, q, qd, qdd)
        before = len(compiles)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        first = time.perf_counter() - t0
        n_compiles = len(compiles) - before
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best = min(best, time.perf_counter() - t0)
        other = arm.with_payload(1.0)  # another arm of the same structure: its first call, then a third arm's
        before = len(compiles)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(other, *args[1:]))
        second = time.perf_counter() - t0
        n_second = len(compiles) - before
        t0 = time.perf_counter()
        jax.block_until_ready(fn(arm.with_payload(2.0), *args[1:]))
        third = time.perf_counter() - t0
        print(json.dumps({"function": name, "way": mode, "arm": arm_name, "first_call_s": round(first, 3),
                          "programs_compiled": n_compiles, "call_us": round(best * 1e6, 1),
                          "another_arm_first_call_s": round(second, 3), "another_arm_programs_compiled": n_second,
                          "third_arm_call_ms": round(third * 1e3, 2)}), flush=True)


def measure_gradients(mode: str, arm_name: str, repeats: int, samples: int):
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import jaxarm

    arm = jaxarm.load_arm(arm_name)
    rng = np.random.default_rng(0)
    q, qd, qdd = (jnp.asarray(rng.uniform(-1, 1, (samples, arm.n))) for _ in range(3))
    inverse = jaxarm.inverse_dynamics.__wrapped__ if mode == "op_by_op" else jaxarm.inverse_dynamics
    losses = {
        "one state, whole arm": (lambda a: jnp.sum(inverse(a, q[0], qd[0], qdd[0]) ** 2), arm),
        f"{samples} states, whole arm": (lambda a: jnp.sum(jax.vmap(inverse, (None, 0, 0, 0))(a, q, qd, qdd) ** 2), arm),
        f"{samples} states, links": (lambda links: jnp.sum(jax.vmap(inverse, (None, 0, 0, 0))(arm.replace(links=links), q, qd, qdd) ** 2),
                                     arm.links),
    }
    for name, (loss, x) in losses.items():
        t0 = time.perf_counter()
        jax.block_until_ready(jax.grad(loss)(x))
        first = time.perf_counter() - t0
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(jax.grad(loss)(x))
            best = min(best, time.perf_counter() - t0)
        print(json.dumps({"gradient": name, "way": mode, "arm": arm_name, "first_call_s": round(first, 2),
                          "call_ms": round(best * 1e3, 2)}), flush=True)


def pinocchio_reference(repeats: int):
    """Pinocchio's rnea, crba and aba on example-robot-data's Panda URDF (fingers locked), called
    from Python as a user would: the time per call for reference."""
    from importlib import metadata

    import numpy as np
    try:
        import pinocchio as pin
        files = metadata.files("example-robot-data") or []
    except (ImportError, metadata.PackageNotFoundError) as e:
        print(json.dumps({"peer": "pinocchio", "skipped": f"not installed ({e})"}))
        return
    urdf = [f.locate() for f in files if str(f).endswith("robots/panda_description/urdf/panda.urdf")]
    if not urdf:
        print(json.dumps({"peer": "pinocchio", "skipped": "example-robot-data has no panda.urdf"}))
        return
    model = pin.buildModelFromUrdf(str(urdf[0]))
    fingers = [model.getJointId(name) for name in model.names if "finger" in name]
    if fingers:
        model = pin.buildReducedModel(model, fingers, pin.neutral(model))
    data = model.createData()
    rng = np.random.default_rng(0)
    q, v, a = (rng.uniform(-1, 1, model.nv) for _ in range(3))
    for name, call in (("inverse_dynamics", lambda: pin.rnea(model, data, q, v, a)),
                       ("mass_matrix", lambda: pin.crba(model, data, q)),
                       ("forward_dynamics", lambda: pin.aba(model, data, q, v, a))):
        best = float("inf")
        for _ in range(max(repeats, 100)):
            t0 = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t0)
        print(json.dumps({"function": name, "way": f"pinocchio {pin.__version__} (example-robot-data panda, from Python)",
                          "call_us": round(best * 1e6, 1)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arm", default="panda")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--mode", choices=("compiled", "op_by_op"), help="measure one way in this process")
    parser.add_argument("--gradients", type=int, metavar="N", help="eager gradients with respect to the arm, N states")
    args = parser.parse_args()
    extra = [] if args.gradients is None else ["--gradients", str(args.gradients)]
    if args.mode and args.gradients is not None:
        measure_gradients(args.mode, args.arm, args.repeats, args.gradients)
    elif args.mode:
        measure(args.mode, args.arm, args.repeats)
    else:
        for mode in ("compiled", "op_by_op"):
            subprocess.run([sys.executable, __file__, "--mode", mode, "--arm", args.arm, "--repeats", str(args.repeats)] + extra,
                           check=True)
        if args.gradients is None:
            pinocchio_reference(args.repeats)
