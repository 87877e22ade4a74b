"""Where the first call of a rollout gradient goes, for each form of the Runge-Kutta stages.

The gradient of a 1000-step RK3 rollout cost (the sum of squared final joint angles, with respect
to the torques) in the forms a rollout can take: ``"rk3"`` by name (what a user gets: the stages
written out for arms with stages x joints <= ``jaxarm.integrators.WRITTEN_OUT_GRADIENT_SIZE``, the
stage loop otherwise), the stage loop and the written-out stages asked for explicitly; each with
the stages' dynamics traced once for all stages (under one ``jax.jit``, the default) and once per
stage. All are compiled in one process and timed alternately (``experiments/rk_stage_forms.py``);
one JSON line per program: trace and lowering, XLA's compile, first call, best run. Run times
compare within one process; trace times only across processes (a trace warms jax's caches for
the next one), so compare those with one form per process (``--forms rk3``, then
``--forms rk3_per_stage``, alternately).

    python experiments/gradient_first_call.py
    python experiments/gradient_first_call.py --arms panda --batches 16 --forms loop,loop_per_stage
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rk_stage_forms  # noqa: E402  (sets float64 on)

from jaxarm import integrators  # noqa: E402


@contextlib.contextmanager
def traced_per_stage():
    """The stages' dynamics traced once per stage (no shared jax.jit) while the context is open."""
    saved = integrators._SHARE_STAGE_TRACE
    integrators._SHARE_STAGE_TRACE = False
    try:
        yield
    finally:
        integrators._SHARE_STAGE_TRACE = saved


def variants():
    loop = integrators.explicit_rk(*integrators.KUTTA3, loop=True)
    written = integrators.explicit_rk(*integrators.KUTTA3, loop=False)
    forms = {}
    for label, method in (("rk3", "rk3"), ("loop", loop), ("written_out", written)):
        forms[label] = (method, contextlib.nullcontext)
        forms[label + "_per_stage"] = (method, traced_per_stage)
    return forms


if __name__ == "__main__":
    args = sys.argv[1:]
    chosen = None
    if "--forms" in args:
        i = args.index("--forms")
        chosen = args[i + 1].split(",")
        del args[i: i + 2]
    pick = (lambda: {k: v for k, v in variants().items() if k in chosen}) if chosen else variants
    rk_stage_forms.main(args + ["--gradients", "--parts"], description=__doc__.split("\n")[0], variants=pick,
                        label="form", batches="1,16,256", repeats=3)
