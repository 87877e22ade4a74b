"""rollout_batch over several devices: a subprocess with 4 forced host (CPU) devices.

The device count is fixed when JAX starts, so the check runs in a fresh interpreter with
XLA_FLAGS=--xla_force_host_platform_device_count=4. It runs rollout_batch on a batch of 10
(not divisible by 4: padded to 12 and trimmed) of arms with different masses, and on a batch of
8 for one arm, checks that the latter's output really is laid out over the 4 devices, and
compares both with the unsharded jax.vmap(rollout) to 1e-12.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = r"""
import functools
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

assert jax.config.jax_enable_x64
assert len(jax.devices()) == 4, jax.devices()
import jaxarm
from tests.helpers_sim import pendulum

T, dt = 20, 0.01
rng = np.random.default_rng(0)
q0, qd0 = rng.uniform(-1, 1, (10, 1)), rng.uniform(-0.5, 0.5, (10, 1))
U = rng.uniform(-2, 2, (10, T, 1))
arms = jaxarm.stack_arms([pendulum(mass=m) for m in np.linspace(0.8, 2.6, 10)])
same = jaxarm.stack_arms([pendulum()] * 10)

# unsharded reference: one device, jax.vmap(rollout)
vmapped = jax.jit(jax.vmap(functools.partial(jaxarm.rollout, dt=dt, method="euler", on_divergence="flag")))
ref_arms = vmapped(arms, q0, qd0, U)
ref_same = vmapped(same, q0, qd0, U)
assert len(ref_arms.q.sharding.device_set) == 1

# a batch of 10 arms: not divisible by 4 devices
traj = jaxarm.rollout_batch(arms, q0, qd0, U, dt, arm_batched=True, method="euler")
assert traj.q.shape == (10, T + 1, 1) and traj.diverged_step.shape == (10,), traj.q.shape
for name in ("t", "q", "qd", "qdd", "tau", "u", "diverged_step"):
    np.testing.assert_allclose(getattr(traj, name), getattr(ref_arms, name), rtol=1e-12, atol=1e-12, err_msg=name)
assert not np.allclose(traj.q[0], traj.q[-1])
print("batch of 10 arms on 4 devices == vmap; max |dq| =", float(np.max(np.abs(traj.q - ref_arms.q))))

# one arm, a batch of 8: no padding, so the output is the sharded array itself
traj8 = jaxarm.rollout_batch(pendulum(), q0[:8], qd0[:8], U[:8], dt, method="euler")
sh = traj8.q.sharding
print("batch of 8:", sh)
assert isinstance(sh, NamedSharding) and len(sh.device_set) == 4, sh
assert sh.spec[0] == "batch" and sh.mesh.shape["batch"] == 4, sh
shards = traj8.q.addressable_shards
assert len(shards) == 4 and {s.data.shape for s in shards} == {(2, T + 1, 1)}, [s.data.shape for s in shards]
assert len({s.device for s in shards}) == 4
for name in ("q", "qd", "tau", "u", "diverged_step"):
    np.testing.assert_allclose(getattr(traj8, name), getattr(ref_same, name)[:8], rtol=1e-12, atol=1e-12, err_msg=name)

# the arm compiled in as constants (the default) equals the arm passed as data; an arm with
# other values compiles anew (the cache is keyed by the values, never a stale program)
traj8_data = jaxarm.rollout_batch(pendulum(), q0[:8], qd0[:8], U[:8], dt, method="euler", constant_arm=False)
np.testing.assert_allclose(traj8.q, traj8_data.q, rtol=1e-12, atol=1e-12, err_msg="constant_arm=False")
heavy = jaxarm.rollout_batch(pendulum(mass=2.6), q0, qd0, U, dt, method="euler")
ref_heavy = vmapped(jaxarm.stack_arms([pendulum(mass=2.6)] * 10), q0, qd0, U)
np.testing.assert_allclose(heavy.q, ref_heavy.q, rtol=1e-12, atol=1e-12, err_msg="heavier arm")
assert not np.allclose(heavy.q, ref_same.q)

# a policy (feedback controller) instead of a schedule, batch of 10 over 4 devices
policy = jaxarm.pd_controller(20.0, 4.0, jnp.array([0.3]))
traj_pd = jaxarm.rollout_batch(pendulum(), q0, qd0, policy, dt, steps=T, method="euler")
ref_pd = jax.vmap(lambda q, qd: jaxarm.rollout(pendulum(), q, qd, policy, dt, steps=T, method="euler", on_divergence="flag"))(q0, qd0)
for name in ("q", "qd", "tau", "u"):
    np.testing.assert_allclose(getattr(traj_pd, name), getattr(ref_pd, name), rtol=1e-12, atol=1e-12, err_msg=name)
assert not np.allclose(traj_pd.u[0], traj_pd.u[1])  # the policy really sees each element's state
# a gradient through rollouts sharded over the 4 devices (reverse mode stores its cotangents by a
# product with the identity there, not by a conditional, whose predicate every device would need)
# equals the unsharded one
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
two_link = jaxarm.load_arm("two_link_planar")  # (a one-joint arm's product with the identity folds to a product)
def cost(U, q0, qd0):
    traj = jax.vmap(lambda q, qd, u: jaxarm.rollout(two_link, q, qd, u, dt, method="rk3", on_divergence="flag"))(q0, qd0, U)
    return jnp.sum(traj.q[:, -1] ** 2)
U, q0, qd0 = np.concatenate([U, -U], axis=2), np.concatenate([q0, 0.5 * q0], axis=1), np.concatenate([qd0, qd0], axis=1)
placed = [jax.device_put(a, NamedSharding(mesh, P("batch"))) for a in (U[:8], q0[:8], qd0[:8])]
grad_sharded = jax.jit(jax.grad(cost))
text = grad_sharded.lower(*placed).compile().as_text()
assert " conditional(" not in text and " dot(" in text
one_device = jax.jit(jax.grad(cost)).lower(U[:8], q0[:8], qd0[:8]).compile().as_text()
assert " conditional(" in one_device and " dot(" not in one_device
np.testing.assert_allclose(grad_sharded(*placed), jax.jit(jax.grad(cost))(U[:8], q0[:8], qd0[:8]), rtol=1e-12, atol=1e-14)
print("OK")
"""


def test_rollout_batch_sharded_over_4_host_devices():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_ENABLE_X64"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}"
    assert proc.stdout.rstrip().endswith("OK")
