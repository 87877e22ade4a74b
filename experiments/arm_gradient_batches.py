"""The gradient of a batch of rollouts with respect to the arm they share, before and after.

Identification by gradient: a loss over a ``jax.vmap``-ed batch of 1000-step RK3 rollouts (the
sum of squared joint angles along the way), differentiated by ``jax.grad`` with respect to the
arm's standard inertial and drive parameters (``jaxarm.identify.linear_model``), the kinematics
known. Programs per arm and batch, compiled in one process and timed alternately:

- ``forward``: the loss itself (the arm traced the same way), as it runs now; ``forward_before``:
  with every friction model of the partly traced drives evaluated, as before;
- ``before``: the gradient as it ran before the three changes below;
- ``per_state_reads``: the inertial parameters read per state, one vector per body
  (``jaxarm.dynamics.algebra.per_state_entries``), instead of as unbatched scalars;
- ``friction_cotangent_apart``: and friction's share of the joint-velocity cotangent computed
  apart (``jaxarm.dynamics.newton_euler._FRICTION_COTANGENT_APART``);
- ``now``: and the friction models chosen per parameter field, so that the Stribeck and sigmoid
  models whose (known) parameters are zero are left out although the Coulomb and viscous
  coefficients are traced (``jaxarm.dynamics.drives._MODELS_BY_FIELD``): what ``jaxarm.rollout``
  gives now.

One JSON line per program: compile time, best of ``--repeats`` runs, the ratio to ``forward``, and
the largest relative difference of the gradient from ``before``'s. A batch of one reads the
parameters as before (there is nothing to sum over).

``--loss torque``: identification's other loss, the squared error of inverse dynamics' torques
against measured ones over a batch of samples (states, accelerations and torques: here the
arm's own torques at random states plus noise), ``jax.vmap`` over the samples, ``jax.grad``
with respect to the standard parameters (``--wrt parameters``) or to the whole arm, kinematics,
gravity and drives included (``--wrt arm``). Programs: ``forward``, ``before`` (the arm's
parameters read as unbatched scalars: ``jaxarm.dynamics.newton_euler._PER_STATE = False``) and
``now`` (read per state: the body model's inertial parameters and placements and the base
acceleration, ``newton_euler._read_per_state``). ``--wrt arm`` applies to the rollout loss too.

    python experiments/arm_gradient_batches.py
    python experiments/arm_gradient_batches.py --arms panda --batches 16,256 --steps 200
    python experiments/arm_gradient_batches.py --loss torque --wrt arm --arms puma560,panda --batches 1000
    python experiments/arm_gradient_batches.py --single --wrt arm --arms panda --batches 16 [--plain-jit] [--closed-over] [--unstaged] [--no-before]
    python experiments/arm_gradient_batches.py --summed-closed-over --arms panda --batches 16,1000 --functions inverse_dynamics,forward_dynamics --plain-jit

``--single``: the gradient of one state's squared error of inverse dynamics, forward dynamics or
the mass matrix (``--functions``) with respect to the whole arm (``--wrt arm``) or the standard
parameters, for one state and for each of ``--batches`` states (a ``jax.vmap`` of ``jax.grad``),
before and after traced kinematics were read in groups (``newton_euler._reads_grouped``),
compiled with jaxarm's compiler options or (``--plain-jit``) by a plain ``jax.jit``; the states
passed as arguments of the jit or (``--closed-over``) closed over by the loss; ``--unstaged``
adds the groups with the state itself as their witness, as before it was staged on the arm where
the states are closed over (``newton_euler._staged_on``); ``--no-before`` leaves out the scalar
reads.

``--summed-closed-over``: the gradient with respect to the whole arm of the squared error of
``--functions`` summed over ``--batches`` states that the loss closes over, with the state
itself as the witness of the groups and of forward dynamics' stored cotangents (``bare``), with
only the latter staged on the arm (``cotangents_staged``, forward dynamics) and as now.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.dynamics import drives, newton_euler  # noqa: E402
from jaxarm.identify.linear_model import arm_with_parameters, standard_parameters  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import benchmark as bench  # noqa: E402


# (label, differentiated, per-state reads, friction cotangent apart, friction models by field)
PROGRAMS = (("forward", False, True, True, True), ("forward_before", False, False, False, False),
            ("before", True, False, False, False), ("per_state_reads", True, True, False, False),
            ("friction_cotangent_apart", True, True, True, False), ("now", True, True, True, True))


# the torque loss: (label, differentiated, per-state reads), the other two switches as they are now
TORQUE_PROGRAMS = (("forward", False, True), ("before", True, False), ("now", True, True))


def measure(name, batch, steps, repeats, loss_kind="rollout", wrt="parameters"):
    arm = bench.benchmark_arm(name)
    rng = np.random.default_rng(0)
    # the variable: the standard parameters (kinematics known) or the whole arm
    x0 = standard_parameters(arm) if wrt == "parameters" else arm
    arm_of = (lambda p: arm_with_parameters(arm, p)) if wrt == "parameters" else (lambda a: a)
    if loss_kind == "rollout":
        q0, qd0, tau = (jnp.asarray(x) for x in bench.rollout_inputs(arm, rng, batch, steps))

        def loss(p):
            a = arm_of(p)
            q = jax.vmap(lambda x, v, u: jaxarm.rollout(a, x, v, u, 1e-3, on_divergence="flag").q)(q0, qd0, tau)
            return jnp.sum(q ** 2)

        table = PROGRAMS
    else:
        q, qd, qdd = (jnp.asarray(rng.uniform(-1.0, 1.0, (batch, arm.n))) for _ in range(3))
        measured = jax.jit(jax.vmap(lambda a, b, c: jaxarm.inverse_dynamics(arm, a, b, c)))(q, qd, qdd)
        measured = measured + jnp.asarray(rng.normal(0.0, 0.1, measured.shape))

        def loss(p):
            a = arm_of(p)
            return jnp.sum((jax.vmap(lambda x, v, w: jaxarm.inverse_dynamics(a, x, v, w))(q, qd, qdd) - measured) ** 2)

        table = tuple((label, differentiated, per_state, True, True) for label, differentiated, per_state in TORQUE_PROGRAMS)

    def flat(g):
        return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(g)])

    programs = {}
    for label, differentiated, per_state, apart, by_field in table:
        newton_euler._PER_STATE, newton_euler._FRICTION_COTANGENT_APART, drives._MODELS_BY_FIELD = per_state, apart, by_field
        # a new function for each program: jax caches a trace by function, not by these switches
        fn = jax.grad(loss) if differentiated else (lambda p: loss(p))
        try:
            start = time.perf_counter()
            compiled = jax.jit(fn, compiler_options=jaxarm.compiler_options()).lower(x0).compile()
            first = time.perf_counter() - start
            lines = compiled.as_text().count("\n")
        finally:
            newton_euler._PER_STATE = newton_euler._FRICTION_COTANGENT_APART = drives._MODELS_BY_FIELD = True
        programs[label] = dict(compiled=compiled, compile_s=first, best_s=float("inf"), lines=lines)
    values = {k: flat(v["compiled"](x0)) for k, v in programs.items()}
    for _ in range(repeats):
        for v in programs.values():
            start = time.perf_counter()
            jax.block_until_ready(v["compiled"](x0))
            v["best_s"] = min(v["best_s"], time.perf_counter() - start)
    base, before = programs["forward"]["best_s"], values["before"]
    for label, v in programs.items():
        row = dict(arm=name, loss=loss_kind, wrt=wrt, batch=batch, steps=steps if loss_kind == "rollout" else None,
                   program=label, compile_s=round(v["compile_s"], 2), optimized_hlo_lines=v["lines"],
                   ms=round(v["best_s"] * 1e3, 3), ratio_to_forward=round(v["best_s"] / base, 2))
        if values[label].shape == before.shape:
            row["gradient_rel_difference"] = float(np.max(np.abs(values[label] - before)) / np.max(np.abs(before)))
        print(json.dumps(row), flush=True)


FUNCTIONS = {
    "inverse_dynamics": lambda a, q, qd, x: jaxarm.inverse_dynamics(a, q, qd, x),
    "forward_dynamics": lambda a, q, qd, x: jaxarm.forward_dynamics(a, q, qd, x),
    "mass_matrix": lambda a, q, qd, x: jaxarm.mass_matrix(a, q) @ x,
}


def measure_single(name, function, form, batch, repeats, wrt="arm", plain=False, closed_over=False, unstaged=False,
                   scalars=True):
    """``--single``: the gradient of one state's squared error of ``function`` (its value against
    a measured one, the states passed as arguments of the jit), with respect to the whole arm or
    the standard parameters: for one state (``form="one"``, ``jax.grad``) or for each of
    ``batch`` states (``form="each"``, ``jax.vmap`` of ``jax.grad``: nothing is summed). Programs
    ``before`` (traced kinematics read as scalars: ``newton_euler._GROUPED_KINEMATICS = False``) and
    ``now`` (read in groups, ``newton_euler._reads_grouped``). ``plain``: compiled by a plain
    ``jax.jit`` (XLA's default options) instead of with ``jaxarm.compiler_options()``.
    ``closed_over``: the states and measurements closed over by the loss (constants of the
    program) instead of passed as arguments. ``unstaged``: also the program read in groups with
    the state itself as the groups' witness (``newton_euler._STAGED_WITNESS = False``), as before
    the witness was staged on the arm. ``scalars=False``: without ``before`` (the differences
    are then from the first program's gradient)."""
    arm = bench.benchmark_arm(name)
    rng = np.random.default_rng(0)
    x0 = standard_parameters(arm) if wrt == "parameters" else arm
    arm_of = (lambda p: arm_with_parameters(arm, p)) if wrt == "parameters" else (lambda a: a)
    f = FUNCTIONS[function]
    m = 1 if form == "one" else batch
    q, qd, x = (jnp.asarray(rng.uniform(-1.0, 1.0, (m, arm.n))) for _ in range(3))
    measured = jax.jit(jax.vmap(lambda a, b, c: f(arm, a, b, c)))(q, qd, x)
    measured = measured + jnp.asarray(rng.normal(0.0, 0.1, measured.shape))

    def loss(p, a, b, c, y):
        return jnp.sum((f(arm_of(p), a, b, c) - y) ** 2)

    args = (q[0], qd[0], x[0], measured[0]) if form == "one" else (q, qd, x, measured)
    if closed_over:
        data, args = args, ()
        inner = loss

        def loss(p):  # noqa: F811 (the same loss, its data constants of the program)
            return inner(p, *data)

    def flat(g):
        return np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree_util.tree_leaves(g)])

    programs = {}
    table = ((("before", False, True),) if scalars else ()) + ((("unstaged", True, False),) if unstaged else ()) \
        + (("now", True, True),)
    for label, grouped, staged in table:
        newton_euler._GROUPED_KINEMATICS, newton_euler._STAGED_WITNESS = grouped, staged
        # a new function for each program: jax caches a trace by function, not by the switch
        if closed_over and form == "each":
            each = jax.vmap(jax.grad(lambda p, *v: inner(p, *v)), (None, 0, 0, 0, 0))

            def fn(p, each=each):
                return each(p, *data)
        elif form == "one":
            fn = jax.grad(lambda *v: loss(*v))
        else:
            fn = jax.vmap(jax.grad(lambda *v: loss(*v)), (None, 0, 0, 0, 0))
        try:
            start = time.perf_counter()
            options = {} if plain else jaxarm.compiler_options()
            compiled = jax.jit(fn, compiler_options=options).lower(x0, *args).compile()
            first = time.perf_counter() - start
        finally:
            newton_euler._GROUPED_KINEMATICS = newton_euler._STAGED_WITNESS = True
        programs[label] = dict(compiled=compiled, compile_s=first, best_s=float("inf"), lines=compiled.as_text().count("\n"))
    values = {k: flat(v["compiled"](x0, *args)) for k, v in programs.items()}
    for _ in range(repeats):
        for v in programs.values():
            start = time.perf_counter()
            jax.block_until_ready(v["compiled"](x0, *args))
            v["best_s"] = min(v["best_s"], time.perf_counter() - start)
    before = values[table[0][0]]
    for label, v in programs.items():
        print(json.dumps(dict(arm=name, loss=function, wrt=wrt, form=form, states=m, program=label,
                              states_given="closed over" if closed_over else "as arguments",
                              jit="plain jax.jit" if plain else "jaxarm.compiler_options()",
                              compile_s=round(v["compile_s"], 2), optimized_hlo_lines=v["lines"],
                              ms=round(v["best_s"] * 1e3, 3),
                              gradient_rel_difference=float(np.max(np.abs(values[label] - before)) / np.max(np.abs(before))))),
              flush=True)


def measure_summed_closed_over(name, function, batch, repeats, plain=False):
    """``--summed-closed-over``: the gradient with respect to the whole arm of ``function``'s
    squared error summed over ``batch`` states that the loss closes over (constants of the
    program), as identification from NumPy data usually is. Programs: ``bare`` (the state itself
    the witness of the groups and stored cotangents: ``newton_euler._STAGED_WITNESS = False``),
    ``cotangents_staged`` (forward dynamics only: its own stored cotangents' witness staged, the
    groups' not) and ``now``."""
    from jaxarm.dynamics import forward

    arm = bench.benchmark_arm(name)
    rng = np.random.default_rng(0)
    f = FUNCTIONS[function]
    q, qd, x = (jnp.asarray(rng.uniform(-1.0, 1.0, (batch, arm.n))) for _ in range(3))
    measured = jax.jit(jax.vmap(lambda a, b, c: f(arm, a, b, c)))(q, qd, x)
    measured = measured + jnp.asarray(rng.normal(0.0, 0.1, measured.shape))

    def loss(a):
        return jnp.sum((jax.vmap(lambda u, v, w: f(a, u, v, w))(q, qd, x) - measured) ** 2)

    table = [("bare", False, False)]
    if function == "forward_dynamics":
        table.append(("cotangents_staged", True, False))
    table.append(("now", True, True))
    programs = {}
    for label, staged, groups in table:
        newton_euler._STAGED_WITNESS, forward._STAGED_GROUPS_SUMMED = staged, groups
        try:
            start = time.perf_counter()
            options = {} if plain else jaxarm.compiler_options()
            compiled = jax.jit(jax.grad(lambda a: loss(a)), compiler_options=options).lower(arm).compile()
            first = time.perf_counter() - start
        finally:
            newton_euler._STAGED_WITNESS = forward._STAGED_GROUPS_SUMMED = True
        programs[label] = dict(compiled=compiled, compile_s=first, best_s=float("inf"), lines=compiled.as_text().count("\n"))
    flat = {k: np.concatenate([np.ravel(np.asarray(g)) for g in jax.tree_util.tree_leaves(v["compiled"](arm))])
            for k, v in programs.items()}
    for _ in range(repeats):
        for v in programs.values():
            start = time.perf_counter()
            jax.block_until_ready(v["compiled"](arm))
            v["best_s"] = min(v["best_s"], time.perf_counter() - start)
    for label, v in programs.items():
        print(json.dumps(dict(arm=name, loss=function, wrt="arm", form="summed", states=batch, program=label,
                              states_given="closed over", jit="plain jax.jit" if plain else "jaxarm.compiler_options()",
                              compile_s=round(v["compile_s"], 2), optimized_hlo_lines=v["lines"],
                              ms=round(v["best_s"] * 1e3, 3),
                              gradient_rel_difference=float(np.max(np.abs(flat[label] - flat["bare"])) / np.max(np.abs(flat["bare"]))))),
              flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="puma560,panda")
    ap.add_argument("--batches", default="16,256")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--loss", choices=("rollout", "torque"), default="rollout")
    ap.add_argument("--wrt", choices=("parameters", "arm"), default="parameters",
                    help="differentiate with respect to the standard parameters (kinematics known) or the whole arm")
    ap.add_argument("--single", action="store_true",
                    help="the gradient of one state's error (and of each state's, a jax.vmap of jax.grad over "
                         "--batches states) for --functions, before and after traced kinematics were read in groups")
    ap.add_argument("--plain-jit", action="store_true", help="with --single or --summed-closed-over: compile by a plain jax.jit (XLA's defaults)")
    ap.add_argument("--closed-over", action="store_true",
                    help="with --single: the states closed over by the loss (constants of the program), not arguments")
    ap.add_argument("--unstaged", action="store_true",
                    help="with --single: also the groups with the state itself as their witness (before it was staged on the arm)")
    ap.add_argument("--summed-closed-over", action="store_true",
                    help="the gradient of --functions' squared error summed over --batches states the loss closes over, "
                         "with the state itself or staged on the arm as the witness")
    ap.add_argument("--no-before", action="store_true",
                    help="with --single: leave out the program reading traced kinematics as scalars (slow to compile and run)")
    ap.add_argument("--functions", default="inverse_dynamics,forward_dynamics,mass_matrix",
                    help="with --single: comma-separated " + ", ".join(FUNCTIONS))
    args = ap.parse_args(argv)
    print(json.dumps(dict(machine=bench.machine())), flush=True)
    if args.summed_closed_over:
        for name in args.arms.split(","):
            for function in args.functions.split(","):
                for batch in (int(b) for b in args.batches.split(",")):
                    measure_summed_closed_over(name, function, batch, args.repeats, args.plain_jit)
        return
    if args.single:
        for name in args.arms.split(","):
            for function in args.functions.split(","):
                measure_single(name, function, "one", 1, args.repeats, args.wrt, args.plain_jit, args.closed_over,
                               args.unstaged, not args.no_before)
                for batch in (int(b) for b in args.batches.split(",")):
                    measure_single(name, function, "each", batch, args.repeats, args.wrt, args.plain_jit, args.closed_over,
                                   args.unstaged, not args.no_before)
        return
    for name in args.arms.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            measure(name, batch, args.steps, args.repeats, args.loss, args.wrt)


if __name__ == "__main__":
    main()
