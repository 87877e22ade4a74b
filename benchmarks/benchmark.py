"""Benchmark suite: jaxarm's batched dynamics and rollouts beside Pinocchio, MuJoCo and MJX.

    python benchmarks/benchmark.py                        # full suite, Puma 560 + Panda, float64 + float32
    python benchmarks/benchmark.py --quick                # smoke run, < 2 min on 2 idle cores
    python benchmarks/benchmark.py --gpu --baseline none  # on an accelerator: batches to 10^6, MJX beside
    bash benchmarks/gpu_suite.sh OUTDIR 490               # the same in stages, each under a time limit
    python benchmarks/benchmark.py --arms panda --dtypes float64 --quantities inverse_dynamics --batches 1,65536
    python benchmarks/benchmark.py --record benchmarks/baseline.json   # re-record the baseline

Output. stdout carries only JSON lines: first the machine description (``{"machine": ...}``), then
one line per measurement with the keys ``arm, dtype, quantity, implementation, batch, value, unit``
(plus ``seconds``, ``steps``, ``dt``, ``entry``, ``call`` where they apply), then ratio lines
(jaxarm / peer, same run), target lines and comparison lines. The human-readable summary table, the
targets and the ``REGRESSION`` lines go to stderr, so ``> results.jsonl`` keeps a clean file.

Quantities (``--quantities``):

* ``inverse_dynamics``, ``mass_matrix``, ``forward_dynamics``: states per second of one jitted,
  vmapped call over a batch of random states (``--batches``, 1 .. 65536). Peer: Pinocchio's
  ``pin.rnea`` / ``pin.crba`` / ``pin.aba`` called in a Python loop (float64, one call per state,
  reported at batch 1: a loop's rate does not depend on the batch).
* ``rollout_rk3``, ``rollout_rk4``: simulated steps per second (batch x steps / wall time) of
  ``jax.jit(jax.vmap(jaxarm.rollout))`` over ``--rollout-batches`` rollouts of ``--steps`` steps
  (1000 at 1 ms) with a random torque schedule per rollout; the call returns the final states
  (what a cost function consumes), so XLA does not write whole trajectories. Peers: ``mujoco.rollout``
  with one thread per core (RK4: MuJoCo has no RK3, hence both jaxarm rows; the ratio lines
  compare jaxarm RK3 and jaxarm RK4 with MuJoCo RK4, labelled), run in chunks of at most 1024
  rollouts so its (batch, steps, state) output buffer stays small, and MJX (``jax.vmap`` of
  ``mjx.step`` in a ``lax.scan`` on jax's default device, ``--mjx-batches`` and ``--mjx-steps``
  steps, in each of ``--dtypes``: float32 with jax's x64 flag off, as MJX runs natively; its
  compile time too). Ratio lines ``jaxarm rk3 / mjx rk4`` compare steps/s at the same batch and
  dtype, and a target line asks for 10x MJX at the largest such batch.
* ``rollout_grad``: wall time of ``jax.grad`` of a rollout cost (squared final position plus a small
  input penalty) with respect to the torque schedules, divided by the time of the cost itself
  (unit ``x forward``; the two timed in alternation, ``paired_best_times``), at ``--grad-batches``, for the entries of ``--grad-entries``: ``autodiff``
  (plain reverse mode of the scan) by default, ``adjoint`` (``rollout(..., adjoint=True)``, the
  discrete adjoint of jaxarm.adjoint, deprecated: 12-80x forward against 3-5x, with 20x the
  memory, ``experiments/rollout_gradients.py``), and ``autodiff_loop`` (plain reverse mode with the
  Runge-Kutta stages in a loop on every platform, which a GPU otherwise writes out); the run
  stops if their gradients differ. ``arm``: the same cost's gradient with respect to the arm's
  standard parameters, the arm shared by the batch and its kinematics known (identification by
  gradient), relative to the same cost with the arm traced the same way. Each row also says what
  the kernel cost per call (``page_faults``: minor page faults, ``system_seconds``: system CPU
  time; ``forward_*`` the same of the cost itself; ``process_cost``): at batch 256 the reverse pass
  stores about 160 MB and, on a Linux whose transparent huge pages are ``madvise`` (recorded in the
  machine line), faults in every 4 kB page of it on every call (docs/benchmarks.md, "Page faults
  at large batches").
* ``compile``: lower + compile time of every jitted entry point measured above (``entry`` names
  it; one row per batch; ``cpu_seconds`` is the process CPU time, the better number on a loaded
  machine); MJX's compile time of its scanned rollout.
* ``latency``: median wall time of one jitted single-state call (no vmap), including dispatch,
  for the dynamics quantities selected (``entry``; their compile rows say ``<entry>_single``).

The arm. Every implementation simulates the same arm (``benchmark_arm``): the bundled arm with
Coulomb/Stribeck/sigmoid friction and position limits removed (MuJoCo models both as constraints,
not force laws, and would do different work); viscous friction, rotor inertia and gravity stay.
The bundled Puma 560 is the consensus model made physically consistent (MuJoCo rejects the
published one: massless link 1, link 3 breaks the triangle inequality). Each peer run
starts with a ``check`` line: the largest difference between the peer's and jaxarm's answer for a
few states, so a mismatch of models cannot pass unnoticed.

float32. ``--dtypes float32`` casts the arm (``arm.astype(jnp.float32)``) and every state and
input to float32; each float32 row carries ``f64_ops``, the number of float64 values in the
optimized HLO of the timed program (0 when the path really is float32 end to end).

Regression check. ``--record PATH`` writes the run (machine, command, rows) as JSON;
``benchmarks/baseline.json`` holds the numbers recorded for the repository. Every run
(``--quick`` included) compares its rows with the baseline rows of the same (arm, dtype, quantity,
implementation library, batch, entry, steps) and prints ``REGRESSION`` for anything more than
``--threshold`` (30 %) slower: slowdown = baseline rate / current rate for throughputs, current
time / baseline time for times and the gradient ratio. Machines differ (the baseline is recorded on
an idle 2-core machine; a laptop, CI box or a loaded machine is uniformly faster or slower), and
load scales jaxarm and its peers alike, so where a peer did the same work in the same run the
decision uses the *ratio* jaxarm / peer (Pinocchio for the dynamics, MuJoCo for rollouts), which is
nearly machine-independent; the absolute slowdown is printed beside it. Times without a peer
(compile times, single-call latency) are divided by the machine's own slowdown, measured in the
same run by two fixed reference workloads (``quantity="reference"``): a pure-Python loop for
latency (single-threaded interpreter and dispatch speed) and the compile of a fixed small jax
program for compile times. A machine running 2x slower than on the baseline's day (a busy host,
a slower CPU) then flags only what got slower beyond that; both slowdowns are printed. The gradient
rows are ratios to their own forward pass and are compared as they are. Timings never fail the run
unless ``--strict`` is given (exit status 3 on a regression).

One baseline per machine. Scaling by peers and reference workloads cannot make two CPUs alike:
Pinocchio and MuJoCo ran 1.3-1.9x faster on a 2-core Intel Xeon than on the 2-core AMD EPYC the
baseline was first recorded on, while jaxarm ran about as fast on both, so every peer ratio there
read as a 30-50 % regression of unchanged code. ``baseline.json`` therefore holds one recorded run
per machine (``{"runs": [...]}``; a file holding a single run, as ``--record`` writes a new one,
is read as well), and a run compares itself with the run recorded on the same machine (the same
CPU model, core count and jax backend), or, where none was, with the first run of the file,
saying so (``same_machine`` in the comparison line). ``--record PATH`` into an existing record
replaces the run of this machine and keeps the other machines' runs; a file at PATH that is not a
benchmark record stops the run before anything is measured, rather than being overwritten.

Timing. A compiled call is run once to warm up, then repeatedly until ``--min-time`` seconds are
spent (calls shorter than min-time / 10 are timed in groups); the best time per call is reported,
which is the least sensitive to other processes on a shared machine. JAX's persistent compilation
cache is disabled so compile times are real. jaxarm's entries are compiled with
``jaxarm.compiler_options()`` (recorded in the machine line), as ``jaxarm.jit`` compiles them;
``--plain-jit`` compiles them with a plain ``jax.jit`` instead, to see what a user's own jit gets
(on CPU: slower rollouts, and a much slower adjoint gradient). ``XLA_FLAGS`` is recorded in the machine line: with
jaxlib 0.10.2, ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`` (YNNPACK fusions off) makes the
batched kernels several times faster, float32 above all (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxarm  # noqa: E402
from jaxarm.core import xla as jaxarm_xla  # noqa: E402
from jaxarm.identify import linear_model as identification  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BASELINE = os.path.join(HERE, "baseline.json")

DYNAMICS = ("inverse_dynamics", "mass_matrix", "forward_dynamics")
ROLLOUTS = ("rollout_rk3", "rollout_rk4")
QUANTITIES = DYNAMICS + ROLLOUTS + ("rollout_grad", "rollout_stacked", "float32_error", "compile", "latency")
PEERS = ("pinocchio", "mujoco", "mjx")
PIN_CALLS = {"inverse_dynamics": "pin.rnea", "mass_matrix": "pin.crba", "forward_dynamics": "pin.aba"}
HIGHER_IS_BETTER = {"states/s", "steps/s"}
KEY_FIELDS = ("arm", "dtype", "quantity", "library", "batch", "entry", "steps")

FULL = dict(
    arms="puma560,panda",
    dtypes="float64,float32",
    batches="1,16,256,1024,4096,16384,65536",
    rollout_batches="1,16,256,1024,4096,16384",
    grad_batches="1,16",
    steps=1000,
    mjx_batches="1,16",
    mjx_steps=100,
    min_time=0.5,
    peers="pinocchio,mujoco,mjx",
    quantities=",".join(QUANTITIES),
)
# --quick: a subset of the full run (so a recorded full run is also quick's baseline), chosen by
# compile time, which dominates: ~3 s per dynamics entry, ~15 s per rollout, ~70 s for the gradient
# of a rollout (CPU seconds, jax 0.10.2), so RK4 rollouts, the gradient and MJX (~25 s) are left out
# (add them with --quantities / --peers).
QUICK = dict(
    FULL,
    arms="puma560",
    batches="256",
    rollout_batches="16",
    mjx_batches="1",
    min_time=0.05,
    peers="pinocchio,mujoco",
    quantities="inverse_dynamics,mass_matrix,forward_dynamics,rollout_rk3,compile,latency",
)
# --gpu: the suite for an accelerator: dynamics up to 10^6 states, RK3 rollouts up to 10^5, gradients
# up to 4096 rollouts, MJX on the same device and MuJoCo on the host's cores, in the same run.
GPU = dict(
    FULL,
    batches="1,1024,65536,1048576",
    rollout_batches="1,1024,16384,100000",
    grad_batches="1,16,256,4096",
    mjx_batches="1,1024,16384",
    min_time=0.3,
    peers="mujoco,mjx",
    quantities="inverse_dynamics,mass_matrix,forward_dynamics,rollout_rk3,rollout_grad,compile",
)


# --------------------------------------------------------------------------------------
# Machine, output


def machine():
    """The machine and library versions, as one JSON-able dict."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "device_kind": jax.devices()[0].device_kind,
        "numpy": np.__version__,
        "jaxarm": jaxarm.__version__,
        "pinocchio": version("pin"),
        "mujoco": version("mujoco"),
        "mujoco-mjx": version("mujoco-mjx"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
        # how the memory of large programs is paged in (process_cost): the kernel's transparent
        # huge pages mode and glibc's tunables (glibc.malloc.hugetlb=1 asks for huge pages)
        "transparent_hugepage": _transparent_hugepage(),
        "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES"),
        "compiler_options": "plain jax.jit" if PLAIN_JIT else jaxarm.compiler_options(),
        "loop_kernels": "plain jax.jit" if PLAIN_JIT else jaxarm_xla.loop_kernels_status(),
    }


def _transparent_hugepage():
    """The kernel's transparent huge pages mode (the bracketed word of
    /sys/kernel/mm/transparent_hugepage/enabled), or None off Linux."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    chosen = [w[1:-1] for w in text.split() if w.startswith("[")]
    return chosen[0] if chosen else text.strip()


def emit(obj):
    print(json.dumps(obj), flush=True)


def say(*parts):
    print(*parts, file=sys.stderr, flush=True)


def write_atomic(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Recorder:
    """Collects measurement rows and prints each as a JSON line."""

    def __init__(self):
        self.rows = []

    def add(self, arm, dtype, quantity, implementation, batch, value, unit, **extra):
        row = dict(arm=arm, dtype=dtype, quantity=quantity, implementation=implementation, batch=int(batch), value=float(value), unit=unit)
        row.update({k: v for k, v in extra.items() if v is not None})
        emit(row)
        self.rows.append(row)
        return row


# the machine's speed, for times that have no same-run peer: a fixed pure-Python loop
# (latency: interpreter and dispatch) and the trace and compile of a fixed small jax program
# (compile times); best of REFERENCE_REPEATS, in seconds
REFERENCE_REPEATS = 7
REFERENCE_FOR = {"latency": "python", "compile": "compile"}


def _python_reference():
    total, table = 0, {}
    for i in range(300_000):
        total += i * i % 7
        table[i & 1023] = total
    return total


def _compile_reference():
    # a new function object per call: traced, lowered and compiled afresh (no cache answers it)
    fn = jax.jit(lambda x: functools.reduce(lambda a, i: jnp.sin(a) * 1.0001 + jnp.cos(a * i), range(150), x))
    return fn.lower(jnp.zeros(16, jnp.float32)).compile()


def bench_reference(rec):
    """The two reference rows the regression check scales peerless times by."""
    for entry, work in (("python", _python_reference), ("compile", _compile_reference)):
        times = []
        for _ in range(REFERENCE_REPEATS):
            t0 = time.perf_counter()
            work()
            times.append(time.perf_counter() - t0)
        rec.add("machine", "float64", "reference", f"python {platform.python_version()}", 1, min(times), "s", entry=entry,
                call="a fixed pure-Python loop" if entry == "python" else "jax.jit(...).lower(...).compile() of a fixed 150-step elementwise program")


def machine_reference(row, rows):
    """The same-run reference row a peerless time is scaled by (None if there is none)."""
    entry = REFERENCE_FOR.get(row["quantity"])
    if entry is None or row["unit"] != "s" or library(row) != "jaxarm":
        return None
    return next((r for r in rows if r["quantity"] == "reference" and r.get("entry") == entry), None)


def library(row):
    return row["implementation"].split()[0]


def key(row):
    return tuple(library(row) if f == "library" else row.get(f) for f in KEY_FIELDS)


# --------------------------------------------------------------------------------------
# Timing


def best_time(call, min_time, long_call=10.0):
    """Best wall time (s) of one ``call()``: one warm-up, then repeats until ``min_time`` is spent.

    A warm-up longer than ``long_call`` seconds counts as the measurement (its first-call overhead
    is negligible then), so the big batches of the full run are not run twice.
    """
    t0 = time.perf_counter()
    call()
    warmup = time.perf_counter() - t0
    if warmup > long_call:
        return warmup
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    best, spent = first, first
    group = max(1, int(min_time / 10 / max(first, 1e-7)))
    while spent < min_time:
        t0 = time.perf_counter()
        for _ in range(group):
            call()
        elapsed = time.perf_counter() - t0
        best, spent = min(best, elapsed / group), spent + elapsed
    return best


def paired_best_times(calls, min_time, rounds=5, long_call=10.0):
    """Best wall time (s) per call of each of ``calls``, timed in alternation: ``rounds`` rounds,
    each running every call in turn (in groups of equal duration, about
    ``min_time / rounds / len(calls)`` each), after one warm-up of each. A ratio of two such
    times (a gradient and its forward pass) then compares calls made under the same conditions:
    timed one after the other, the two saw different episodes of a shared machine (the Panda's
    gradient / forward at batch 256 read 4.2-6.0x in four runs of the same command). A warm-up
    longer than ``long_call`` seconds counts as that call's measurement, as in :func:`best_time`."""
    first = []
    for call in calls:
        t0 = time.perf_counter()
        call()
        first.append(time.perf_counter() - t0)
    if max(first) > long_call:
        return first
    rounds = max(1, rounds)
    share = min_time / rounds / len(calls)
    groups = [max(1, int(share / max(t, 1e-7))) for t in first]
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, (call, group) in enumerate(zip(calls, groups)):
            t0 = time.perf_counter()
            for _ in range(group):
                call()
            best[i] = min(best[i], (time.perf_counter() - t0) / group)
    return best


def process_cost(call, calls=3):
    """Minor page faults and system CPU seconds per ``call()`` (already warm), from the process's
    resource usage: the kernel's share of a call. A program whose stored intermediates are large
    (the reverse pass of a batch of long rollouts) gets fresh memory from the kernel on every call
    and pays a page fault per 4 kB page touched; ``{}`` where the platform has no ``getrusage``."""
    try:
        import resource
    except ImportError:
        return {}
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(calls):
        call()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"page_faults": round((after.ru_minflt - before.ru_minflt) / calls),
            "system_seconds": round((after.ru_stime - before.ru_stime) / calls, 4)}


def median_latency(call, min_time, max_calls=2000, blocks=5):
    """Latency of single calls: the lowest of ``blocks`` medians, each of at least 20 calls over
    ``min_time`` / ``blocks`` (after a warm-up). On the 2-core CPU a compiled program's single calls
    come in two modes, about 5 us and 13-27 us, in episodes of tens to hundreds of milliseconds
    (one compiled Puma forward dynamics timed in blocks of 200 calls for 0.3 s); one median over
    the whole run reads whichever mode the run fell in (the quick run's batch-1 rows: 12-47 us
    against a 5.8 us baseline, for unchanged programs). The lowest block median is the fast mode,
    compared from run to run like the other rows."""
    call()
    medians = []
    for _ in range(blocks):
        times = []
        spent = 0.0
        while (spent < min_time / blocks or len(times) < 20) and len(times) < max_calls // blocks:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
            spent += times[-1]
        medians.append(float(np.median(times)))
    return min(medians)


PLAIN_JIT = False  # --plain-jit: compile without jaxarm's compiler options


def compile_timed(fn, *args):
    """(compiled, {"value": wall seconds, "cpu_seconds": process CPU seconds}) of jit + lower + compile.

    The CPU time is the better number on a loaded machine (XLA compiles mostly on one thread).
    Compiled as ``jaxarm.jit`` compiles (``jaxarm.compiler_options()``, small loops as single
    kernels: ``jaxarm.core.xla.loop_kernels``), unless ``--plain-jit`` (then as a user's plain
    ``jax.jit`` compiles it).
    """
    c0, t0 = time.process_time(), time.perf_counter()
    # jaxarm's recommended XLA options (on CPU: YNNPACK fusions and fusion emitters off, see jaxarm.core.xla)
    options = None if PLAIN_JIT else (jaxarm.compiler_options() or None)
    # traced inside loop_kernels() as well, as jaxarm.jit traces: the form of some programs
    # depends on it (jaxarm.integrators.gradient_written_out), and lowered as for the fusion
    # emitters it turns off (jaxarm.core.xla.fusion_emitters_active)
    with contextlib.ExitStack() as stack:
        if not PLAIN_JIT:
            stack.enter_context(jaxarm_xla.loop_kernels())
            if (options or {}).get("xla_cpu_use_fusion_emitters") is False:
                stack.enter_context(jaxarm_xla.fusion_emitters_off())
        lowered = jax.jit(fn).lower(*args)
        compiled = lowered.compile(compiler_options=options)
    return compiled, {"value": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}


def f64_ops(compiled):
    """Number of float64 values in the optimized HLO (0 for a true float32 program)."""
    return compiled.as_text().count("f64[")


# --------------------------------------------------------------------------------------
# The arm and the inputs


def benchmark_arm(name):
    """The bundled arm ``name`` as every implementation here simulates it.

    Coulomb / Stribeck / sigmoid friction and position limits are removed (MuJoCo would add them
    as constraints). The bundled arms are physically consistent, which MuJoCo requires (the
    literature Puma 560, ``puma560_rtb``, is not; ``puma560`` is its consistent version).
    """
    arm = jaxarm.load_arm(name)
    links = arm.links
    d = arm.drives
    drives = dataclasses.replace(
        d,
        coulomb_friction=np.zeros_like(d.coulomb_friction),
        static_friction=np.zeros_like(d.static_friction),
        sigmoid_friction=np.zeros_like(d.sigmoid_friction),
    )
    limits = dataclasses.replace(arm.limits, position=np.tile([-np.inf, np.inf], (arm.n, 1)))
    return arm.replace(links=links, drives=drives, limits=limits)


def random_states(rng, B, n):
    """q, qd, and a third vector (qdd or tau) for B states: (B, n) each, float64 numpy."""
    return rng.uniform(-1, 1, (B, n)), rng.uniform(-1, 1, (B, n)), rng.uniform(-1, 1, (B, n))


def rollout_inputs(arm, rng, B, T):
    """Initial states (B, n) and torque schedules (B, T, n): gravity compensation plus noise."""
    n = arm.n
    q0 = rng.uniform(-0.5, 0.5, (B, n))
    qd0 = rng.uniform(-0.5, 0.5, (B, n))
    g = np.asarray(jax.jit(jax.vmap(lambda q: jaxarm.gravity_torques(arm, q)))(q0))
    tau = g[:, None, :] + rng.uniform(-1.0, 1.0, (B, T, n))
    return q0, qd0, tau


# --------------------------------------------------------------------------------------
# jaxarm


def dynamics_fn(arm, quantity):
    """The single-state function of (q, qd, x) for a dynamics quantity."""
    return {
        "inverse_dynamics": lambda q, qd, qdd: jaxarm.inverse_dynamics(arm, q, qd, qdd),
        "mass_matrix": lambda q, qd, qdd: jaxarm.mass_matrix(arm, q),
        "forward_dynamics": lambda q, qd, tau: jaxarm.forward_dynamics(arm, q, qd, tau),
    }[quantity]


def rollout_final(arm, dt, method):
    """One rollout's final (q, qd) from (q0, qd0, schedule (T, n))."""

    def run(q0, qd0, u):
        traj = jaxarm.rollout(arm, q0, qd0, u, dt, method=method, on_divergence="flag")
        return traj.q[-1], traj.qd[-1]

    return run


def check_dtype(compiled, out, dtype, where):
    """float32 runs: the output is float32 and the count of float64 values in the HLO.

    Waits for ``out``: jax dispatches asynchronously, and a call still running here would be
    timed as part of the next one (a long rollout's warm-up then measured two calls)."""
    leaves = jax.tree_util.tree_leaves(jax.block_until_ready(out))
    if any(x.dtype != dtype for x in leaves):
        raise AssertionError(f"{where}: expected {jnp.dtype(dtype).name} results, got {[x.dtype.name for x in leaves]}")
    return f64_ops(compiled) if dtype == jnp.float32 else None


def bench_jaxarm_dynamics(rec, name, arm, dtype, cfg, rng):
    impl = f"jaxarm {jaxarm.__version__}"
    dname = jnp.dtype(dtype).name
    arm_d = arm.astype(dtype)
    for quantity in DYNAMICS:
        if quantity not in cfg.quantities:
            continue
        fn = jax.vmap(dynamics_fn(arm_d, quantity))
        for B in cfg.batches:
            args = tuple(jnp.asarray(x, dtype) for x in random_states(rng, B, arm.n))
            compiled, compile_s = compile_timed(fn, *args)
            f64 = check_dtype(compiled, compiled(*args), dtype, f"{name} {quantity}")
            if "compile" in cfg.quantities:
                rec.add(name, dname, "compile", impl, B, unit="s", entry=quantity, **compile_s)
            if quantity in cfg.quantities:
                t = best_time(lambda: jax.block_until_ready(compiled(*args)), cfg.min_time)
                rec.add(name, dname, quantity, impl, B, B / t, "states/s", seconds=t, f64_ops=f64)


def bench_jaxarm_latency(rec, name, arm, dtype, cfg, rng):
    impl = f"jaxarm {jaxarm.__version__}"
    dname = jnp.dtype(dtype).name
    arm_d = arm.astype(dtype)
    for quantity in DYNAMICS:
        if quantity not in cfg.quantities:
            continue
        args = tuple(jnp.asarray(x[0], dtype) for x in random_states(rng, 1, arm.n))
        compiled, compile_s = compile_timed(dynamics_fn(arm_d, quantity), *args)
        f64 = check_dtype(compiled, compiled(*args), dtype, f"{name} {quantity} (single state)")
        if "compile" in cfg.quantities:
            rec.add(name, dname, "compile", impl, 1, unit="s", entry=f"{quantity}_single", **compile_s)
        t = median_latency(lambda: jax.block_until_ready(compiled(*args)), cfg.min_time)
        rec.add(name, dname, "latency", impl, 1, t, "s", entry=quantity, f64_ops=f64)


def bench_jaxarm_rollouts(rec, name, arm, dtype, cfg, rng):
    impl = f"jaxarm {jaxarm.__version__}"
    dname = jnp.dtype(dtype).name
    arm_d = arm.astype(dtype)
    T = cfg.steps
    for quantity in ROLLOUTS:
        if quantity not in cfg.quantities:
            continue
        method = quantity.split("_")[1]
        fn = jax.vmap(rollout_final(arm_d, cfg.dt, method))
        for B in cfg.rollout_batches:
            args = tuple(jnp.asarray(x, dtype) for x in rollout_inputs(arm, rng, B, T))
            compiled, compile_s = compile_timed(fn, *args)
            f64 = check_dtype(compiled, compiled(*args), dtype, f"{name} {quantity}")
            if "compile" in cfg.quantities:
                rec.add(name, dname, "compile", impl, B, unit="s", entry=quantity, steps=T, **compile_s)
            t = best_time(lambda: jax.block_until_ready(compiled(*args)), cfg.min_time)
            rec.add(name, dname, quantity, impl, B, B * T / t, "steps/s", seconds=t, steps=T, dt=cfg.dt, f64_ops=f64)
            del args


def perturbed_arms(arm, rng, B):
    """``B`` random perturbations of ``arm`` stacked into one arm with a batch axis
    (:func:`jaxarm.stack_arms`), as in domain randomization: every link mass and the viscous
    friction scaled by U(0.8, 1.2), every COM moved by N(0, 1 cm) per axis."""
    base = jaxarm.stack_arms([arm] * B)
    links, drives = base.links, base.drives
    links = dataclasses.replace(links, mass=np.asarray(links.mass) * rng.uniform(0.8, 1.2, np.shape(links.mass)),
                                com=np.asarray(links.com) + rng.normal(0.0, 0.01, np.shape(links.com)))
    drives = dataclasses.replace(drives, viscous_friction=np.asarray(drives.viscous_friction) * rng.uniform(0.8, 1.2, np.shape(drives.viscous_friction)))
    return base.replace(links=links, drives=drives)


def bench_jaxarm_stacked(rec, name, arm, dtype, cfg, rng):
    """RK3 rollouts with a different arm per batch element (``jax.vmap`` over a stacked arm:
    domain randomization), steps/s, beside the same rollouts with one constant arm in the same run
    (``ratio_to_constant``): the constant arm is folded at trace time, the stacked one cannot be;
    then the same batch as rollout_batch(arm_batched=True) compiles it, the leaves shared by the
    whole batch (the kinematics) compiled in and folded, the perturbed ones as data."""
    impl = f"jaxarm {jaxarm.__version__}"
    dname = jnp.dtype(dtype).name
    arm_d = arm.astype(dtype)
    T = cfg.steps

    def run(a, q0, qd0, u):
        traj = jaxarm.rollout(a, q0, qd0, u, cfg.dt, method="rk3", on_divergence="flag")
        return traj.q[-1], traj.qd[-1]

    for B in cfg.rollout_batches:
        args = tuple(jnp.asarray(x, dtype) for x in rollout_inputs(arm, rng, B, T))
        arms = perturbed_arms(arm, rng, B).astype(dtype)
        constant, _ = compile_timed(jax.vmap(rollout_final(arm_d, cfg.dt, "rk3")), *args)
        stacked, compile_s = compile_timed(jax.vmap(run), arms, *args)
        check_dtype(stacked, stacked(arms, *args), dtype, f"{name} rollout_stacked")
        jax.block_until_ready(constant(*args))
        t_const = best_time(lambda: jax.block_until_ready(constant(*args)), cfg.min_time)
        t = best_time(lambda: jax.block_until_ready(stacked(arms, *args)), cfg.min_time)
        if "compile" in cfg.quantities:
            rec.add(name, dname, "compile", impl, B, unit="s", entry="rollout_stacked", steps=T, **compile_s)
        rec.add(name, dname, "rollout_stacked", impl, B, B * T / t, "steps/s", seconds=t, steps=T, dt=cfg.dt,
                ratio_to_constant=t_const / t, constant_steps_per_s=B * T / t_const,
                call="jax.vmap(rollout) over jaxarm.stack_arms of B perturbed arms")
        # what rollout_batch(arm_batched=True) compiles: the leaves the batch shares (here the
        # kinematics, limits, gravity) as constants, only the perturbed ones as data
        try:
            from jaxarm.simulate.batch import _SharedLeaves
        except ImportError:  # an older jaxarm on PYTHONPATH (before/after comparisons)
            continue
        shared = _SharedLeaves(arms)
        varying = shared.varying(arms)
        split, compile_s = compile_timed(jax.vmap(lambda v, *x: run(shared.arm(v), *x)), varying, *args)
        check_dtype(split, split(varying, *args), dtype, f"{name} rollout_stacked (shared leaves)")
        t = best_time(lambda: jax.block_until_ready(split(varying, *args)), cfg.min_time)
        if "compile" in cfg.quantities:
            rec.add(name, dname, "compile", impl, B, unit="s", entry="rollout_stacked_shared", steps=T, **compile_s)
        rec.add(name, dname, "rollout_stacked", impl, B, B * T / t, "steps/s", seconds=t, steps=T, dt=cfg.dt,
                entry="shared leaves compiled in", ratio_to_constant=t_const / t, constant_steps_per_s=B * T / t_const,
                call="rollout_batch(arm_batched=True)'s kernel: vmap over the perturbed leaves, the shared ones compiled in")


def bench_float32_error(rec, name, arm, cfg, rng, B=16):
    """How far float32 rollouts drift from float64 ones: the same B random 1000-step RK3 rollouts in
    both precisions, the largest |q32 - q64| [rad or m] at the end (and over the whole run)."""
    T = cfg.steps
    q0, qd0, tau = rollout_inputs(arm, rng, B, T)

    def final_and_path(a):
        def run(q0, qd0, u):
            traj = jaxarm.rollout(a, q0, qd0, u, cfg.dt, method="rk3", on_divergence="flag")
            return traj.q

        return jax.jit(jax.vmap(run))

    qs = {}
    for dtype in (jnp.float64, jnp.float32):
        fn = final_and_path(arm.astype(dtype))
        qs[dtype] = np.asarray(fn(*(jnp.asarray(x, dtype) for x in (q0, qd0, tau))), dtype=np.float64)
    diff = np.abs(qs[jnp.float32] - qs[jnp.float64])
    rec.add(name, "float32", "float32_error", f"jaxarm {jaxarm.__version__}", B, float(diff[:, -1].max()), "rad",
            steps=T, dt=cfg.dt, max_over_run=float(diff.max()),
            q_range=float(np.ptp(qs[jnp.float64], axis=1).max()), call="max |q_float32 - q_float64| after the last step")


def _loop_kernels_on():
    """Whether this run's compiles make small loops single kernels (not under --plain-jit)."""
    return not PLAIN_JIT and jaxarm_xla.loop_kernels_status().get("loop_kernel_bytes") is not None


def _gradient_stage_form(arm, entry, batch):
    """The form of the RK3 stages in the gradient program of ``entry`` at ``batch`` rollouts (None
    for the adjoint)."""
    if entry == "adjoint":
        return None
    if entry == "autodiff_loop" or (entry == "arm" and jaxarm.integrators.stages_in_a_loop()):
        return "loop"
    written = (not jaxarm.integrators.stages_in_a_loop()
               or jaxarm.integrators.gradient_written_out(3, arm.n, batch, loop_kernels=_loop_kernels_on()))
    return "written_out" if written else "loop"


def bench_jaxarm_grad(rec, name, arm, dtype, cfg, rng):
    """Gradient of a batched rollout cost w.r.t. the torque schedules, relative to the cost itself
    (the default ``method="rk3"``), for the entries of ``--grad-entries``: plain reverse-mode
    autodiff (``autodiff``), ``rollout(..., adjoint=True)`` (``adjoint``, jaxarm.adjoint), and
    plain reverse mode with the Runge-Kutta stages in a loop whatever the platform
    (``autodiff_loop``: ``method=explicit_rk(*KUTTA3, loop=True)``). On a CPU ``autodiff`` runs
    the written-out stages for arms of up to 6 joints and the loop beyond
    (``jaxarm.integrators.gradient_written_out``), on a GPU always the written-out stages; each
    row says which (``stage_form``). The gradients must agree."""
    impl = f"jaxarm {jaxarm.__version__}"
    dname = jnp.dtype(dtype).name
    arm_d = arm.astype(dtype)
    T = cfg.steps
    methods = {"autodiff": ("rk3", False), "adjoint": ("rk3", True),
               "autodiff_loop": (jaxarm.integrators.explicit_rk(*jaxarm.integrators.KUTTA3, loop=True), False)}

    def cost_fn(method, adjoint):
        def run(q0, qd0, u):
            traj = jaxarm.rollout(arm_d, q0, qd0, u, cfg.dt, method=method, on_divergence="flag", adjoint=adjoint)
            return traj.q[-1]

        final = jax.vmap(run)

        def cost(u, q0, qd0):
            return jnp.sum(final(q0, qd0, u) ** 2) + 1e-6 * jnp.sum(u**2)

        return cost

    def arm_cost(p, u, q0, qd0):  # the same cost as a function of the arm's standard parameters
        shared = identification.arm_with_parameters(arm_d, p)
        final = jax.vmap(lambda a, b, c: jaxarm.rollout(shared, a, b, c, cfg.dt, on_divergence="flag").q[-1])
        return jnp.sum(final(q0, qd0, u) ** 2)

    for B in cfg.grad_batches:
        q0, qd0, tau = (jnp.asarray(x, dtype) for x in rollout_inputs(arm, rng, B, T))
        fwd, _ = compile_timed(cost_fn("rk3", False), tau, q0, qd0)
        torque_entries = [e for e in cfg.grad_entries if e != "arm"]
        # the forward pass's kernel share, once per batch, for the torque gradients' rows only
        forward_kernel = process_cost(lambda: jax.block_until_ready(fwd(tau, q0, qd0))) if torque_entries else {}
        if "arm" in cfg.grad_entries:
            # identification by gradient: w.r.t. the arm shared by the batch, the kinematics known;
            # relative to the same cost with the arm traced the same way
            p0 = jnp.asarray(identification.standard_parameters(arm_d), dtype)
            arm_fwd, _ = compile_timed(lambda p, u, a, b: arm_cost(p, u, a, b), p0, tau, q0, qd0)
            grad, compile_s = compile_timed(jax.grad(arm_cost), p0, tau, q0, qd0)
            f64 = check_dtype(grad, grad(p0, tau, q0, qd0), dtype, f"{name} rollout_grad arm")
            if "compile" in cfg.quantities:
                rec.add(name, dname, "compile", impl, B, unit="s", entry="rollout_grad_arm", steps=T, **compile_s)
            t_arm_fwd, t_grad = paired_best_times([lambda: jax.block_until_ready(arm_fwd(p0, tau, q0, qd0)),
                                                   lambda: jax.block_until_ready(grad(p0, tau, q0, qd0))], 2 * cfg.min_time)
            kernel = process_cost(lambda: jax.block_until_ready(grad(p0, tau, q0, qd0)))
            rec.add(name, dname, "rollout_grad", impl, B, t_grad / t_arm_fwd, "x forward", entry="arm",
                    seconds=t_grad, forward_seconds=t_arm_fwd, steps=T, dt=cfg.dt, f64_ops=f64,
                    stage_form=_gradient_stage_form(arm, "arm", B), **kernel)
        grads = {}
        for entry in torque_entries:
            grad, compile_s = compile_timed(jax.grad(cost_fn(*methods[entry])), tau, q0, qd0)
            grads[entry] = grad(tau, q0, qd0)
            f64 = check_dtype(grad, grads[entry], dtype, f"{name} rollout_grad")
            if "compile" in cfg.quantities:
                rec.add(name, dname, "compile", impl, B, unit="s", entry=f"rollout_grad_{entry}", steps=T, **compile_s)
            # the forward pass timed in alternation with this gradient (paired_best_times)
            t_fwd, t_grad = paired_best_times([lambda: jax.block_until_ready(fwd(tau, q0, qd0)),
                                               lambda: jax.block_until_ready(grad(tau, q0, qd0))], 2 * cfg.min_time)
            kernel = process_cost(lambda: jax.block_until_ready(grad(tau, q0, qd0)))
            rec.add(
                name, dname, "rollout_grad", impl, B, t_grad / t_fwd, "x forward", entry=entry,
                seconds=t_grad, forward_seconds=t_fwd, steps=T, dt=cfg.dt, f64_ops=f64,
                stage_form=_gradient_stage_form(arm, entry, B), **kernel,
                **{f"forward_{k}": v for k, v in forward_kernel.items()},
            )
        # the gradients must agree before their times mean anything
        if not grads:
            continue
        first, *others = grads
        a = np.asarray(grads[first], float)
        tol = 1e-9 if dtype == jnp.float64 else 1e-3
        for other in others:
            b = np.asarray(grads[other], float)
            if not np.allclose(a, b, rtol=tol, atol=tol * np.max(np.abs(a))):
                raise AssertionError(f"{name} rollout_grad: {other} and {first} gradients differ by {np.max(np.abs(a - b)):.3g}")


# --------------------------------------------------------------------------------------
# Peers


def pinocchio_model(arm, pin):
    """The arm as a Pinocchio model, built from jaxarm's canonical body model (placements + z joints)."""
    bodies = jax.tree_util.tree_map(np.asarray, jaxarm.body_model(arm))
    model = pin.Model()
    parent = 0
    for i, rev in enumerate(arm.is_revolute):
        placement = pin.SE3(bodies.rotation[i], bodies.translation[i])
        joint = pin.JointModelRZ() if rev else pin.JointModelPZ()
        parent = model.addJoint(parent, joint, placement, f"joint{i + 1}")
        m = float(bodies.mass[i])
        c = bodies.first_moment[i] / m if m > 0 else np.zeros(3)
        I_c = bodies.inertia_origin[i] - m * (c @ c * np.eye(3) - np.outer(c, c))
        model.appendBodyToJoint(parent, pin.Inertia(m, c, I_c), pin.SE3.Identity())
    R0 = np.asarray(arm.base)[:3, :3]
    model.gravity.linear = R0.T @ np.asarray(arm.gravity)
    model.armature = np.asarray(jaxarm.reflected_inertia(arm))
    return model


def bench_pinocchio(rec, name, arm, cfg, rng):
    import pinocchio as pin

    impl = f"pinocchio {pin.__version__}"
    model = pinocchio_model(arm, pin)
    data = model.createData()
    n = arm.n
    N = 2000 if cfg.min_time >= 0.2 else 200
    qs, qds, xs = random_states(rng, N, n)
    # same arm? jaxarm's inverse dynamics = Pinocchio's rnea + drive friction (only viscous is left)
    ours = jax.vmap(dynamics_fn(arm, "inverse_dynamics"))(qs[:8], qds[:8], xs[:8])
    ours = np.asarray(ours - jax.vmap(lambda qd: jaxarm.friction_torques(arm, qd))(qds[:8]))
    theirs = np.array([pin.rnea(model, data, qs[i], qds[i], xs[i]) for i in range(8)])
    emit({"check": "pinocchio rnea vs jaxarm inverse_dynamics - friction_torques", "arm": name,
          "max_abs_diff": float(np.abs(ours - theirs).max()), "max_abs": float(np.abs(theirs).max())})
    calls = {
        "inverse_dynamics": lambda i: pin.rnea(model, data, qs[i], qds[i], xs[i]),
        "mass_matrix": lambda i: pin.crba(model, data, qs[i]),
        "forward_dynamics": lambda i: pin.aba(model, data, qs[i], qds[i], xs[i]),
    }
    for quantity, call in calls.items():
        if quantity not in cfg.quantities:
            continue

        def loop(call=call):
            for i in range(N):
                call(i)

        t = best_time(loop, cfg.min_time) / N
        rec.add(name, "float64", quantity, impl, 1, 1.0 / t, "states/s", seconds=t, call=f"{PIN_CALLS[quantity]} in a Python loop over {N} states")


def mujoco_model(arm, dt):
    import mujoco

    model = mujoco.MjModel.from_xml_string(jaxarm.to_mjcf(arm, timestep=dt))
    if model.opt.integrator != mujoco.mjtIntegrator.mjINT_RK4 or model.nu != arm.n:
        raise RuntimeError(f"the MJCF of {arm.name} is not an RK4 model with {arm.n} motors")
    return model


def mujoco_state(mujoco, model, q0, qd0):
    """FULLPHYSICS states (B, nstate) = (time, qpos, qvel, act, ...) from q0, qd0 (B, n)."""
    B, n = q0.shape
    nstate = mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    state = np.zeros((B, nstate))
    state[:, 1 : 1 + n] = q0
    state[:, 1 + n : 1 + 2 * n] = qd0
    return state


def bench_mujoco(rec, name, arm, cfg, rng):
    import mujoco
    from mujoco import rollout as mj_rollout

    impl = f"mujoco {mujoco.__version__}"
    model = mujoco_model(arm, cfg.dt)
    nthread = os.cpu_count() or 1
    datas = [mujoco.MjData(model) for _ in range(nthread)]
    T, n = cfg.steps, arm.n
    # same arm? a short RK4 rollout against jaxarm's RK4 (classical RK4 of the same ODE: rounding only)
    q0, qd0, tau = rollout_inputs(arm, rng, 4, 50)
    out, _ = mj_rollout.rollout(model, datas, mujoco_state(mujoco, model, q0, qd0), tau)
    ours = np.asarray(jax.vmap(rollout_final(arm, cfg.dt, "rk4"))(q0, qd0, tau)[0])
    emit({"check": "mujoco.rollout RK4 vs jaxarm rk4, 50 steps, final q", "arm": name, "max_abs_diff": float(np.abs(out[:, -1, 1 : 1 + n] - ours).max())})
    for B in cfg.rollout_batches:
        q0, qd0, tau = rollout_inputs(arm, rng, B, T)
        state0 = mujoco_state(mujoco, model, q0, qd0)
        chunk = min(B, 1024)
        buffer = np.empty((chunk, T, state0.shape[1]))

        def run():
            for s in range(0, B, chunk):
                m = min(chunk, B - s)
                mj_rollout.rollout(model, datas, state0[s : s + m], tau[s : s + m], state=buffer[:m], persistent_pool=True)

        t = best_time(run, cfg.min_time)
        rec.add(name, "float64", "rollout_rk4", impl, B, B * T / t, "steps/s", seconds=t, steps=T, dt=cfg.dt,
                call=f"mujoco.rollout, {nthread} threads, RK4")
        del tau, buffer


def mjx_status():
    """(module, version) or (None, reason). MJX's import prints its optional back ends' failures
    ("Failed to import warp") to stdout; they go to stderr here, so stdout stays JSON lines."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            from mujoco import mjx
    except Exception as e:  # ImportError, or a broken install
        return None, f"{type(e).__name__}: {e}".splitlines()[0] + "; install with: pip install mujoco-mjx"
    try:
        return mjx, metadata.version("mujoco-mjx")
    except metadata.PackageNotFoundError:
        return mjx, "unknown"


def mjx_rollout(mjx, model):
    """(one, (mx, d0)): final qpos = one(q0, qd0, u (T, nu)), ``mjx.step`` in a ``lax.scan`` from
    (q0, qd0), one control row per step (vmap it over a batch); mx, d0 the MJX model and data, in
    the precision jax's x64 flag gives when this is called."""
    mx = mjx.put_model(model)
    d0 = mjx.make_data(mx)

    def one(q0, qd0, u):
        def body(d, uk):
            return mjx.step(mx, d.replace(ctrl=uk)), None

        d, _ = jax.lax.scan(body, d0.replace(qpos=q0, qvel=qd0), u)
        return d.qpos

    return one, (mx, d0)


def bench_mjx(rec, name, arm, cfg, rng, mjx, version):
    """jax.vmap of mjx.step in a lax.scan (RK4) on jax's default device, in each of ``--dtypes``:
    steps/s at ``--mjx-batches`` and compile time. MJX is not float32-clean with jax's x64 flag on
    (its step promotes the state to float64), so float32 runs it with the flag off, as MJX's users
    do: model, data, inputs, compile and calls inside ``jax.enable_x64(False)``."""
    impl = f"mjx {version}"
    model = mujoco_model(arm, cfg.dt)
    T = cfg.mjx_steps
    for dname in cfg.dtypes:
        dtype = getattr(np, dname)
        with jax.enable_x64(dname == "float64"):
            one, _ = mjx_rollout(mjx, model)
            for B in cfg.mjx_batches:
                args = tuple(jnp.asarray(np.asarray(x, dtype)) for x in rollout_inputs(arm, rng, B, T))
                compiled, compile_s = compile_timed(jax.vmap(one), *args)
                out = jax.block_until_ready(compiled(*args))
                if out.dtype != dtype:
                    raise AssertionError(f"{name} mjx {dname}: got {out.dtype} results")
                if "compile" in cfg.quantities:
                    rec.add(name, dname, "compile", impl, B, unit="s", entry="rollout_rk4", steps=T, **compile_s)
                t = best_time(lambda: jax.block_until_ready(compiled(*args)), cfg.min_time)
                rec.add(name, dname, "rollout_rk4", impl, B, B * T / t, "steps/s", seconds=t, steps=T, dt=cfg.dt,
                        call="jax.vmap(mjx.step) in lax.scan, RK4")
                del args


# --------------------------------------------------------------------------------------
# Ratios, targets, summary, comparison


def peer_reference(row, rows):
    """The same-run peer row a jaxarm row is normalized by (None if there is none)."""
    if library(row) != "jaxarm":
        return None
    q = row["quantity"]
    for r in rows:
        if r["arm"] != row["arm"] or r["quantity"] != (q if q in DYNAMICS else "rollout_rk4"):
            continue
        if q in DYNAMICS and library(r) == "pinocchio":
            return r
        if q in ROLLOUTS and library(r) == "mujoco" and r["batch"] == row["batch"] and r.get("steps") == row.get("steps"):
            return r
    return None


def mjx_reference(row, rows):
    """The same-run MJX row (same arm, dtype, batch, on the same jax device) a jaxarm rollout row
    is compared with; MJX runs fewer steps (``--mjx-steps``), so this compares rates, steps/s."""
    if library(row) != "jaxarm" or row["quantity"] not in ROLLOUTS:
        return None
    for r in rows:
        if (library(r) == "mjx" and r["quantity"] == "rollout_rk4" and r["arm"] == row["arm"]
                and r["dtype"] == row["dtype"] and r["batch"] == row["batch"]):
            return r
    return None


def ratio_rows(rows):
    out = []
    for row in rows:
        for ref in (peer_reference(row, rows), mjx_reference(row, rows)):
            if ref is None:
                continue
            label = f"jaxarm {row['quantity'].replace('rollout_', '')} / {library(ref)} {ref['quantity'].replace('rollout_', '')}"
            out.append({"ratio": label, "arm": row["arm"], "dtype": row["dtype"], "quantity": row["quantity"],
                            "batch": row["batch"], "value": row["value"] / ref["value"]})
    return out


def find(rows, **want):
    return [r for r in rows if all((library(r) if k == "library" else r.get(k)) == v for k, v in want.items())]


def targets(rows, cfg):
    """The issue's targets (float64), as far as this run measured them."""
    out = []
    for name in cfg.arms:
        pin_id = find(rows, arm=name, quantity="inverse_dynamics", library="pinocchio")
        ours = find(rows, arm=name, dtype="float64", quantity="inverse_dynamics", library="jaxarm")
        if pin_id and ours:
            r = max(ours, key=lambda x: x["batch"])
            out.append(dict(target=f"inverse dynamics at batch {r['batch']} >= 5x pin.rnea loop", arm=name,
                            required=5.0, achieved=r["value"] / pin_id[0]["value"], met=r["value"] / pin_id[0]["value"] >= 5.0,
                            note="issue: at batch 65536" if r["batch"] != 65536 else None))
        mj = find(rows, arm=name, quantity="rollout_rk4", library="mujoco")
        for m in sorted(mj, key=lambda x: abs(x["batch"] - 4096))[:1]:
            ours = find(rows, arm=name, dtype="float64", quantity="rollout_rk3", library="jaxarm", batch=m["batch"], steps=m["steps"])
            if ours:
                a = ours[0]["value"] / m["value"]
                out.append(dict(target=f"RK3 rollouts at batch {m['batch']} >= 10x mujoco.rollout (RK4, all cores) steps/s", arm=name,
                                required=10.0, achieved=a, met=a >= 10.0, note="issue: at batch 4096" if m["batch"] != 4096 else None))
        for dname in cfg.dtypes:
            mine = [(r, mjx_reference(r, rows)) for r in find(rows, arm=name, dtype=dname, quantity="rollout_rk3", library="jaxarm")]
            mine = [(r, m) for r, m in mine if m is not None]
            if mine:
                r, m = max(mine, key=lambda rm: rm[0]["batch"])
                a = r["value"] / m["value"]
                out.append(dict(target=f"RK3 rollouts at batch {r['batch']} >= 10x MJX (RK4, same device) steps/s, {dname}", arm=name,
                                required=10.0, achieved=a, met=a >= 10.0,
                                note=f"MJX ran {m['steps']} steps, jaxarm {r['steps']}" if m["steps"] != r["steps"] else None))
        comp = find(rows, arm=name, dtype="float64", quantity="compile", library="jaxarm", entry="rollout_rk3")
        if comp:
            c = max(comp, key=lambda x: x["batch"])
            out.append(dict(target=f"compile of a {c['steps']}-step RK3 rollout (batch {c['batch']}) < 5 s", arm=name,
                            required=5.0, achieved=c["value"], met=c["value"] < 5.0, cpu_seconds=c.get("cpu_seconds"),
                            note="issue: 1000 steps (the scan body compiles once: the step count barely matters)" if c["steps"] != 1000 else None))
        # the gradient target is about the torques (the arm's gradient is reported, not targeted)
        grad = [g for g in find(rows, arm=name, dtype="float64", quantity="rollout_grad", library="jaxarm") if g.get("entry") != "arm"]
        for g in grad:
            out.append(dict(target=f"gradient / forward time of a {g['steps']}-step rollout (batch {g['batch']}, {g.get('entry', 'autodiff')}) <= 4", arm=name,
                            required=4.0, achieved=g["value"], met=g["value"] <= 4.0,
                            note="issue: 1000 steps" if g["steps"] != 1000 else None))
    return [{k: v for k, v in t.items() if v is not None} for t in out]


def fmt(value, unit):
    if unit == "s":
        return f"{value * 1e3:.3g}ms" if value < 1 else f"{value:.3g}s"
    if unit == "x forward":
        return f"{value:.2f}x"
    return f"{value:.3g}"


def summary(rows, markdown=False):
    """A table per (arm, quantity): one line per (implementation, dtype, entry), one column per batch.

    Plain text for the terminal, or Markdown (``--markdown``) for docs/benchmarks.md.
    """
    lines = []
    groups = {}
    for r in rows:
        groups.setdefault((r["arm"], r["quantity"], r["unit"]), []).append(r)
    for (arm, quantity, unit), rs in groups.items():
        batches = sorted({r["batch"] for r in rs})
        series = {}
        for r in rs:
            label = r.get("entry", "") + (f" T={r['steps']}" if "steps" in r else "")
            series.setdefault((r["implementation"], r["dtype"], label.strip()), {})[r["batch"]] = r["value"]
        lines.append("")
        if markdown:
            lines.append(f"**{arm} {quantity}** ({unit}, by batch size)")
            lines.append("")
            lines.append("| implementation | dtype | entry | " + " | ".join(str(b) for b in batches) + " |")
            lines.append("|---|---|---|" + "---|" * len(batches))
            for (impl, dtype, label), vals in series.items():
                lines.append(f"| {impl} | {dtype} | {label} | " + " | ".join(fmt(vals[b], unit) if b in vals else "" for b in batches) + " |")
            continue
        lines.append(f"{arm} {quantity} [{unit}]")
        lines.append(f"  {'implementation':22s} {'dtype':8s} {'entry':22s}" + "".join(f"{b:>10d}" for b in batches))
        for (impl, dtype, label), vals in series.items():
            cells = "".join(f"{fmt(vals[b], unit) if b in vals else '':>10s}" for b in batches)
            lines.append(f"  {impl:22s} {dtype:8s} {label:22s}{cells}")
    return lines


def machine_key(info):
    """What makes two runs' timings comparable without scaling: the CPU model, its cores, the backend."""
    info = info or {}
    return (info.get("cpu"), info.get("cores"), info.get("backend"))


def recorded_runs(record, path="the record"):
    """The runs (list of dicts with "machine" and "rows") of a recorded file's JSON: a single run
    (what ``--record`` writes into a new file) or ``{"runs": [...]}`` (one per machine)."""
    if isinstance(record, dict) and isinstance(record.get("runs"), list):
        runs = record["runs"]
    elif isinstance(record, dict) and isinstance(record.get("rows"), list):
        runs = [record]
    else:
        raise ValueError(f"{path}: expected a benchmark record (a JSON object with 'rows', or with 'runs', a list of them)")
    for i, run in enumerate(runs):
        if not (isinstance(run, dict) and isinstance(run.get("rows"), list)):
            raise ValueError(f"{path}: runs[{i}] is not a recorded run (a JSON object with 'rows')")
    return runs


def baseline_for(info, record, path="the baseline"):
    """(the recorded run to compare a run on machine ``info`` with, whether it was recorded on the
    same machine): the run of the same CPU model, cores and backend, else the file's first run."""
    runs = recorded_runs(record, path)
    same = [r for r in runs if machine_key(r.get("machine")) == machine_key(info)]
    return (same[0], True) if same else (runs[0], False)


def merged_record(existing, run):
    """The record to write for ``--record``: ``run`` alone, or, into an existing record of other
    machines' runs, those runs with this machine's put in (in its place if it had one, else last)."""
    if existing is None:
        return run
    mine = machine_key(run["machine"])
    runs, placed = [], False
    for r in recorded_runs(existing):
        if machine_key(r.get("machine")) != mine:
            runs.append(r)
        elif not placed:
            runs.append(run)
            placed = True
    if not placed:
        runs.append(run)
    return run if len(runs) == 1 else {"runs": runs}


def read_record(path):
    """The JSON of an existing record at ``path`` (None if there is no file); a clear error for a
    file that is not one."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable benchmark record ({e})") from None
    recorded_runs(record, path)
    return record


def compare(rows, baseline, threshold):
    """Comparison lines against the baseline rows; slowdown > 1 + threshold is a regression."""
    base = {key(r): r for r in baseline["rows"]}
    out = []
    for row in rows:
        b = base.get(key(row))
        if b is None:
            continue
        higher = row["unit"] in HIGHER_IS_BETTER
        absolute = b["value"] / row["value"] if higher else row["value"] / b["value"]
        ref, bref = peer_reference(row, rows), peer_reference(b, baseline["rows"])
        relative = None
        if ref is not None and bref is not None:
            relative = (b["value"] / bref["value"]) / (row["value"] / ref["value"])
        # a time without a peer: scaled by how much slower the machine ran its reference workload
        mref, bmref = machine_reference(row, rows), machine_reference(b, baseline["rows"])
        machine_slowdown = mref["value"] / bmref["value"] if relative is None and mref is not None and bmref is not None else None
        vs_machine = absolute / machine_slowdown if machine_slowdown is not None else None
        decisive = relative if relative is not None else vs_machine if vs_machine is not None else absolute
        out.append(dict(
            compare={f: row.get(f) for f in ("arm", "dtype", "quantity", "implementation", "batch", "entry", "steps") if row.get(f) is not None},
            baseline=b["value"], value=row["value"], unit=row["unit"], slowdown=absolute, slowdown_vs_peer=relative,
            machine_slowdown=machine_slowdown, slowdown_vs_machine=vs_machine,
            status="REGRESSION" if decisive > 1 + threshold else "ok",
        ))
    return out


# --------------------------------------------------------------------------------------
# Main


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run (< 2 min): Puma, batch 256 / 16 rollouts, no RK4, gradient or MJX")
    p.add_argument("--gpu", action="store_true", help="the accelerator suite: batches up to 10^6 (dynamics) and 10^5 (rollouts), gradients, MJX")
    p.add_argument("--arms", help=f"comma-separated bundled arms (default {FULL['arms']})")
    p.add_argument("--dtypes", help=f"comma-separated float64, float32 (default {FULL['dtypes']})")
    p.add_argument("--quantities", help=f"comma-separated subset of {','.join(QUANTITIES)} (default: all; --quick: {QUICK['quantities']})")
    p.add_argument("--peers", help=f"comma-separated subset of {','.join(PEERS)}, or none (default: all installed)")
    p.add_argument("--batches", help=f"dynamics batch sizes (default {FULL['batches']})")
    p.add_argument("--rollout-batches", help=f"rollout batch sizes (default {FULL['rollout_batches']})")
    p.add_argument("--grad-batches", help=f"rollout-gradient batch sizes (default {FULL['grad_batches']})")
    p.add_argument("--grad-entries", default="autodiff",
                   help="rollout_grad entries: autodiff (plain reverse mode), adjoint (rollout(adjoint=True), deprecated: "
                        "slower and far larger than plain reverse mode, see experiments/rollout_gradients.py), autodiff_loop "
                        "(plain reverse mode, Runge-Kutta stages in a loop on every platform), arm (w.r.t. the arm's standard "
                        "parameters instead of the torques); default autodiff; the torque gradients are compared")
    p.add_argument("--steps", type=int, help=f"rollout steps (default {FULL['steps']})")
    p.add_argument("--dt", type=float, default=1e-3, help="rollout time step, s (default 1e-3)")
    p.add_argument("--mjx-batches", help=f"MJX batch sizes (default {FULL['mjx_batches']})")
    p.add_argument("--mjx-steps", type=int, help=f"MJX rollout steps (default {FULL['mjx_steps']})")
    p.add_argument("--min-time", type=float, help=f"seconds spent timing each measurement (default {FULL['min_time']})")
    p.add_argument("--plain-jit", action="store_true",
                   help="compile jaxarm's entries with a plain jax.jit, without jaxarm.compiler_options() (what a user's own jit gets)")
    p.add_argument("--record", metavar="PATH", help="write this run (machine, command, rows) as JSON to PATH")
    p.add_argument("--markdown", metavar="PATH", help="write the summary tables as Markdown to PATH (for docs/benchmarks.md)")
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="recorded numbers to compare with ('none' to skip)")
    p.add_argument("--threshold", type=float, default=0.30, help="flag a slowdown beyond 1 + threshold (default 0.30)")
    p.add_argument("--strict", action="store_true", help="exit with status 3 if a REGRESSION is flagged")
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else GPU if args.gpu else FULL
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    def ints(s, what):
        try:
            out = [int(x) for x in str(s).split(",") if x.strip()]
        except ValueError:
            p.error(f"--{what}: expected comma-separated whole numbers, got {s!r}")
        if not out or min(out) < 1:
            p.error(f"--{what}: expected positive batch sizes, got {s!r}")
        return out

    def choices(s, allowed, what):
        out = [x.strip() for x in str(s).split(",") if x.strip() and x.strip() != "none"]
        bad = [x for x in out if x not in allowed]
        if bad:
            p.error(f"--{what}: unknown {bad}; expected a subset of {', '.join(allowed)}")
        return out

    args.arms = choices(args.arms, jaxarm.bundled_arms(), "arms")
    args.dtypes = choices(args.dtypes, ("float64", "float32"), "dtypes")
    args.quantities = choices(args.quantities, QUANTITIES, "quantities")
    args.peers = choices(args.peers, PEERS, "peers")
    args.batches = ints(args.batches, "batches")
    args.rollout_batches = ints(args.rollout_batches, "rollout-batches")
    args.grad_batches = ints(args.grad_batches, "grad-batches")
    args.mjx_batches = ints(args.mjx_batches, "mjx-batches")
    args.grad_entries = choices(args.grad_entries, ("autodiff", "adjoint", "autodiff_loop", "arm"), "grad-entries")
    if args.steps < 1 or args.mjx_steps < 1 or not args.dt > 0 or args.min_time < 0:
        p.error("--steps, --mjx-steps: positive; --dt: positive; --min-time: non-negative")
    return args


def main(argv=None):
    global PLAIN_JIT
    cfg = parse(sys.argv[1:] if argv is None else argv)
    PLAIN_JIT = bool(cfg.plain_jit)
    # read before anything is measured (and before --record may write the same file): a file that
    # is not a benchmark record stops the run here rather than being overwritten after it
    try:
        baseline_record = read_record(cfg.baseline) if cfg.baseline != "none" else None
        existing_record = read_record(cfg.record) if cfg.record else None
    except ValueError as e:
        sys.exit(f"benchmark.py: {e}")
    jax.config.update("jax_enable_compilation_cache", False)  # compile times must be real
    info = machine()
    emit({"machine": info})
    rng = np.random.default_rng(0)
    rec = Recorder()
    peers_ok = {}
    for peer in cfg.peers:
        if peer == "mjx":
            mod, why = mjx_status()
            peers_ok[peer] = (mod, why) if mod is not None else None
            if mod is None:
                emit({"peer": "mjx", "status": "absent", "reason": why})
                say(f"mjx: absent ({why})")
            continue
        try:
            __import__("pinocchio" if peer == "pinocchio" else "mujoco.rollout")
            peers_ok[peer] = True
        except ImportError as e:
            peers_ok[peer] = None
            emit({"peer": peer, "status": "absent", "reason": str(e)})
            say(f"{peer}: absent ({e})")
    started = time.perf_counter()
    if cfg.baseline != "none" or cfg.record:
        bench_reference(rec)
    for name in cfg.arms:
        arm = benchmark_arm(name)
        for dname in cfg.dtypes:
            dtype = getattr(jnp, dname)
            bench_jaxarm_dynamics(rec, name, arm, dtype, cfg, rng)
            if "latency" in cfg.quantities:
                bench_jaxarm_latency(rec, name, arm, dtype, cfg, rng)
            bench_jaxarm_rollouts(rec, name, arm, dtype, cfg, rng)
            if "rollout_stacked" in cfg.quantities:
                bench_jaxarm_stacked(rec, name, arm, dtype, cfg, rng)
            if "rollout_grad" in cfg.quantities:
                bench_jaxarm_grad(rec, name, arm, dtype, cfg, rng)
        if "float32_error" in cfg.quantities:
            bench_float32_error(rec, name, arm, cfg, rng)
        if peers_ok.get("pinocchio") and set(DYNAMICS) & set(cfg.quantities):
            bench_pinocchio(rec, name, arm, cfg, rng)
        for peer, bench in (("mujoco", bench_mujoco), ("mjx", bench_mjx)):
            if peers_ok.get(peer) and set(ROLLOUTS) & set(cfg.quantities):
                try:
                    bench(rec, name, arm, cfg, rng, *(peers_ok[peer] if peer == "mjx" else ()))
                except ValueError as e:  # an arm MuJoCo does not accept (to_mjcf names the joint)
                    emit({"peer": peer, "arm": name, "status": "skipped", "reason": str(e)})
                    say(f"{peer}: skipped for {name} ({e})")
    rows = rec.rows
    baseline, same_machine = baseline_for(info, baseline_record, cfg.baseline) if baseline_record is not None else (None, None)
    ratios = ratio_rows(rows)
    for r in ratios:
        emit(r)
    goals = targets(rows, cfg)
    for g in goals:
        emit(g)
    run = {"machine": info, "command": ["benchmarks/benchmark.py"] + (sys.argv[1:] if argv is None else list(argv)),
           "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time(), "rows": rows, "ratios": ratios, "targets": goals}
    if cfg.record:
        write_atomic(cfg.record, json.dumps(merged_record(existing_record, run), indent=1) + "\n")
    if cfg.markdown:
        write_atomic(cfg.markdown, "\n".join(summary(rows, markdown=True)).lstrip() + "\n")

    for line in summary(rows):
        say(line)
    say("")
    for r in ratios:
        say(f"ratio {r['arm']} {r['dtype']} batch {r['batch']}: {r['ratio']} = {r['value']:.3g}")
    say("")
    for g in goals:
        say(f"target [{g['arm']}] {g['target']}: achieved {g['achieved']:.3g} -> {'MET' if g['met'] else 'NOT MET'}"
            + (f" (CPU {g['cpu_seconds']:.3g} s)" if "cpu_seconds" in g else "") + (f" ({g['note']})" if "note" in g else ""))
    regressions = 0
    if cfg.baseline != "none":
        if baseline is not None:
            lines = compare(rows, baseline, cfg.threshold)
            emit({"comparison": os.path.relpath(cfg.baseline), "baseline_machine": baseline.get("machine"), "same_machine": same_machine,
                  "matched": len(lines), "rows": len(rows)})
            say("")
            bm = baseline.get("machine") or {}
            say(f"comparison with {os.path.relpath(cfg.baseline)} ({len(lines)} of {len(rows)} rows matched; "
                f"baseline machine: {bm.get('cpu')}, {bm.get('cores')} cores"
                + ("" if same_machine else f"; none recorded on this one ({info.get('cpu')}, {info.get('cores')} cores): "
                   "peer ratios differ between CPUs, record one with --record") + ")")
            for c in lines:
                emit(c)
                k = c["compare"]
                rel = "" if c["slowdown_vs_peer"] is None else f", vs peer {c['slowdown_vs_peer']:.2f}x"
                if c["slowdown_vs_machine"] is not None:
                    rel += f", {c['slowdown_vs_machine']:.2f}x on a machine {c['machine_slowdown']:.2f}x slower"
                text = (f"{k['arm']} {k['dtype']} {k['quantity']} {k.get('entry', '')} {k['implementation']} batch {k['batch']}: "
                        f"{fmt(c['value'], c['unit'])} (baseline {fmt(c['baseline'], c['unit'])}), slowdown {c['slowdown']:.2f}x{rel}")
                if c["status"] == "REGRESSION":
                    regressions += 1
                    say("REGRESSION " + text)
            say(f"{regressions} regression(s) beyond {cfg.threshold:.0%}" + ("" if regressions else "; none"))
        else:
            emit({"comparison": None, "reason": f"no baseline at {cfg.baseline}"})
            say(f"no baseline at {cfg.baseline}: nothing to compare")
    if cfg.strict and regressions:
        sys.exit(3)
    return run


if __name__ == "__main__":
    main()
