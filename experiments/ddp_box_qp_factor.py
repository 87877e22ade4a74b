"""How the backward pass of ``trajopt.ddp`` factors its knots' Q_uu: three forms in one process.

    python experiments/ddp_box_qp_factor.py [--arms panda puma560] [--batches 0 8] [--rounds 20]
                                            [--forms columns lapack unrolled] [--jit jaxarm plain]

Each knot of the backward pass solves a box QP (Tassa, Mansard & Todorov 2014) and factors Q_uu
(or its free block) up to three times. The forms:

- ``columns``: the solver as it is, one column per trip of a loop
  (:func:`jaxarm.dynamics.linalg.cholesky_factor_columns`);
- ``lapack``: the platform's library for one problem (LAPACK's potrf) and the unrolled scalar
  factorization for a batch (:func:`jaxarm.dynamics.linalg.cholesky_factor_by_batch`, the form
  the solver had before);
- ``unrolled``: the unrolled scalar factorization for both (:func:`jaxarm.dynamics.linalg.cholesky_factor`).

``--jit jaxarm`` compiles as :func:`jaxarm.jit` does (its options, and loops whose iterations read
and write little compiled as one kernel, :func:`jaxarm.core.xla.loop_kernels`); ``plain`` as a
plain ``jax.jit`` does. Every form is compiled first (its compile time and optimized HLO size
recorded), checked to take the same iterations to the same cost as the first, then all are timed
in alternation (``--rounds`` calls of each), so that a busy machine slows them alike. One JSON
line per arm, batch (0: one problem, not in a ``jax.vmap``) and jit.

The problem: the reach of ``experiments/trajopt_crocoddyl.py`` (its ``reach_ocp``: 100
semi-implicit Euler knots of 10 ms, effort, goal, posture and speed terms, the torque limits as
the box) on a bundled arm; a batch reaches goals scattered around it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

from jaxarm.dynamics import linalg  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ddp_knot_gains  # noqa: E402  its reach on a bundled arm (trajopt_crocoddyl.reach_ocp)

FORMS = {"columns": linalg.cholesky_factor_columns, "lapack": linalg.cholesky_factor_by_batch,
         "unrolled": linalg.cholesky_factor}


def compiled(problem, arg, batch, form, how):
    """The solve compiled with the backward pass's factorization ``form``, as ``how`` compiles, and
    its compile seconds and lines of optimized HLO."""
    c, seconds = ddp_knot_gains.compiled_with(problem, arg, batch, "_factor", FORMS[form], plain=how == "plain")
    return c, seconds, len(c.as_text().splitlines())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", nargs="+", default=["panda", "puma560"])
    ap.add_argument("--batches", type=int, nargs="+", default=[0, 8])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--forms", nargs="+", default=list(FORMS), choices=list(FORMS))
    ap.add_argument("--jit", nargs="+", default=["jaxarm"], choices=["jaxarm", "plain"])
    args = ap.parse_args(argv)
    for name in args.arms:
        for batch in args.batches:
            problem, arg = ddp_knot_gains.reach(name, batch)
            for how in args.jit:
                programs, results, compile_s, lines = {}, {}, {}, {}
                for form in args.forms:
                    programs[form], compile_s[form], lines[form] = compiled(problem, arg, batch, form, how)
                    results[form] = jax.block_until_ready(programs[form](arg))
                ddp_knot_gains.check_same(f"{name} batch {batch}", results)
                first = results[args.forms[0]]
                times = ddp_knot_gains.in_alternation(programs, arg, args.rounds)
                row = dict(case="ddp_box_qp_factor", arm=name, batch=batch, jit=how,
                           iterations=np.asarray(first.iterations).tolist(), rounds=args.rounds, device=str(jax.devices()[0]))
                for form, ts in times.items():
                    ts = np.sort(ts)
                    row[form] = dict(min_ms=round(1e3 * ts[0], 2), q1_ms=round(1e3 * float(np.percentile(ts, 25)), 2),
                                     median_ms=round(1e3 * float(np.median(ts)), 2), compile_s=round(compile_s[form], 2),
                                     hlo_lines=lines[form])
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
