"""A real multi-process run (JAX's multi-controller model): two ``jax.distributed`` processes on
this machine's CPU with a localhost coordinator and Gloo collectives. Each process calls
``rollout_batch`` with the same global batch; the batch is laid out over the two processes'
devices (each holds half of it), the results are gathered, and both processes' gathered results
equal the single-process ``jax.vmap(rollout)`` to round-off. A divergence in the half that another
process holds is raised in both. On a GPU cluster the same script runs with one process per host
(docs/guide/simulation.md)."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

WORKER = r"""
import sys
pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=nproc, process_id=pid)
import numpy as np
from jax.experimental import multihost_utils
import jaxarm

assert jax.process_count() == nproc and len(jax.devices()) == nproc and len(jax.local_devices()) == 1
arm = jaxarm.load_arm("two_link_planar")
B, T, dt = 6, 200, 2e-3
rng = np.random.default_rng(0)  # every process builds the same global batch
q0 = rng.uniform(-0.5, 0.5, (B, 2))
U = rng.uniform(-5, 5, (B, T, 2))
traj = jaxarm.rollout_batch(arm, q0, np.zeros((B, 2)), U, dt)
local = [s.data.shape for s in traj.q.addressable_shards]
gathered = {k: multihost_utils.process_allgather(getattr(traj, k), tiled=True) for k in ("q", "qd", "tau", "stop_steps")}
diverged = None
try:
    bad = U.copy()
    bad[-1, 5:] = 1e12  # the last element (held by the last process) blows up
    jaxarm.rollout_batch(arm, q0, np.zeros((B, 2)), bad, dt, saturate=False)
except jaxarm.DivergenceError as exc:
    diverged = str(exc)
np.savez(out, local=np.asarray(local), diverged=np.asarray(diverged or ""), **gathered)
print("process", pid, "of", nproc, "local shards", local, flush=True)
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_two(script, args):
    """Run ``script`` as processes 0 and 1 (argv: the id, then ``args(i)``); their outputs."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), JAXARM_CACHE_DIR="off")
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, str(script), str(i), *args(i)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the two processes did not finish in 300 s")
    for p, text in zip(procs, outputs):
        if p.returncode != 0 and ("gloo" in text.lower() and "not" in text.lower() and "support" in text.lower()):
            pytest.skip("this jaxlib has no Gloo CPU collectives")
        assert p.returncode == 0, text[-3000:]
    return outputs


def test_two_processes_shard_a_batch_and_agree_with_one(tmp_path):
    jax = pytest.importorskip("jax")
    import jaxarm

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(_free_port())
    _run_two(script, lambda i: ["2", port, str(tmp_path / f"out{i}.npz")])

    arm = jaxarm.load_arm("two_link_planar")
    B, T, dt = 6, 200, 2e-3
    rng = np.random.default_rng(0)
    q0 = rng.uniform(-0.5, 0.5, (B, 2))
    U = rng.uniform(-5, 5, (B, T, 2))
    ref = jax.jit(jax.vmap(lambda q, u: jaxarm.rollout(arm, q, np.zeros(2), u, dt)))(q0, U)
    for i in range(2):
        got = np.load(tmp_path / f"out{i}.npz")
        np.testing.assert_array_equal(got["local"], [[B // 2, T + 1, 2]])  # each process holds half the batch
        for k in ("q", "qd", "tau", "stop_steps"):
            np.testing.assert_allclose(got[k], np.asarray(getattr(ref, k)), rtol=0, atol=1e-12, err_msg=f"process {i}: {k}")
        assert "batch element 5" in str(got["diverged"]), str(got["diverged"])
    assert not np.allclose(ref.q[0], ref.q[1])


def test_the_guides_worker_runs_as_written(tmp_path):
    """The two-process script of docs/guide/simulation.md, as the page shows it (only its port made
    free): both processes hold half the batch and print the single-process run's checksum."""
    jax = pytest.importorskip("jax")
    import re

    import jaxarm
    from docs_pages import block_run_by

    code = block_run_by(ROOT / "docs/guide/simulation.md", "test_multiprocess.py")
    assert "localhost:12355" in code
    script = tmp_path / "worker.py"
    script.write_text(code.replace("localhost:12355", f"localhost:{_free_port()}"))
    outputs = _run_two(script, lambda i: [])
    arm = jaxarm.load_arm("puma560")  # float64 (conftest), as the script asks
    rng = np.random.default_rng(0)
    q0 = rng.uniform(-0.3, 0.3, (64, arm.n))
    torques = rng.uniform(-5.0, 5.0, (64, 500, arm.n))
    ref = jax.jit(jax.vmap(lambda q, u: jaxarm.rollout(arm, q, np.zeros(arm.n), u, 1e-3).q))(q0, torques)
    sums = []
    for i, text in enumerate(outputs):
        m = re.search(rf"process {i} of 2: held 32 runs, gathered q \(64, 501, 6\), checksum (\S+)", text)
        assert m, text[-2000:]
        sums.append(float(m.group(1)))
    assert sums[0] == sums[1]
    np.testing.assert_allclose(sums[0], float(np.sum(np.asarray(ref))), rtol=1e-12)
