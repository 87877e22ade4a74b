"""jaxarm.enable_compilation_cache: a second process loads the programs the first one compiled
(JAX's persistent compilation cache), and the switch respects the user's own settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One process: enable the cache in the given folder, compile a Puma mass matrix under jaxarm.jit,
# and print what JAX's compilation-cache events said.
SCRIPT = """
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import jaxarm
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
folder = jaxarm.enable_compilation_cache(sys.argv[1] if len(sys.argv) > 1 else None, min_compile_time=0)
arm = jaxarm.load_arm("puma560")
M = jaxarm.jit(lambda q: jaxarm.mass_matrix(arm, q))(jnp.linspace(0.1, 0.6, 6))
print(json.dumps({"folder": folder, "hits": events.count("/jax/compilation_cache/cache_hits"),
                  "misses": events.count("/jax/compilation_cache/cache_misses"), "m11": float(M[0, 0])}))
"""


def _run(args=(), **overrides):
    """Run SCRIPT in a fresh process with no cache settings inherited, then ``overrides`` (None:
    unset); returns what it printed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAXARM_CACHE_DIR"):
        env.pop(name, None)
    env.update({k: v for k, v in overrides.items() if v is not None})
    out = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_what_the_first_compiled(tmp_path):
    folder = tmp_path / "xla"
    first = _run([folder])
    assert first["folder"] == str(folder) and first["misses"] >= 1
    assert any(folder.iterdir()), "nothing was written to the cache"
    second = _run([folder])
    assert second["hits"] >= 1 and second["misses"] == 0
    assert second["m11"] == first["m11"]


def test_cache_folder_from_the_environment_and_off_switch(tmp_path):
    env_folder = tmp_path / "from_env"
    got = _run(JAXARM_CACHE_DIR=str(env_folder))
    assert got["folder"] == str(env_folder) and any(env_folder.iterdir())
    off = _run(JAXARM_CACHE_DIR="off", XDG_CACHE_HOME=str(tmp_path / "home"))
    assert off["folder"] is None and off["hits"] == 0 and not (tmp_path / "home").exists()
    default = _run(XDG_CACHE_HOME=str(tmp_path / "home"))
    assert default["folder"] == str(tmp_path / "home" / "jaxarm" / "xla")


def test_a_cache_configured_for_jax_is_left_alone(tmp_path):
    got = _run([tmp_path / "ours"], JAX_COMPILATION_CACHE_DIR=str(tmp_path / "users"))
    assert got["folder"] == str(tmp_path / "users") and not (tmp_path / "ours").exists()


def test_bad_minimum_compile_time_is_refused(tmp_path):
    import jaxarm

    with pytest.raises(ValueError, match="min_compile_time"):
        jaxarm.enable_compilation_cache(tmp_path, min_compile_time=-1.0)
