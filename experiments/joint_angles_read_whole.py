"""Joint angles read whole, or by a plain split: RK3 rollouts and their gradients at small batches.

On a CPU, :func:`jaxarm.dynamics.kinematics.joint_frames` reads the joint angles with
``algebra.entries(q, whole=True)``: every angle also reads the first and the last one (plus zero
times their sum). Without it, a batched fusion that never reads the first angle (the Puma 560's
and the Panda's first joint turns about gravity, so that angle drops out of the dynamics) is
vectorized by LLVM with its last vector's worth of rows run as scalar code; at batch 16 in float32
that is half the batch.

Both variants of the same 1000-step RK3 rollout (``method="rk3"``) are traced in one process (the
plain split by patching ``algebra.entries`` while tracing) and timed alternately, as in
``experiments/rk_stage_forms.py`` (whose options this script takes). One JSON line per arm, dtype,
batch, quantity and variant: steps per second or seconds (best of ``--repeats`` calls), and the
first call's time.

    python experiments/joint_angles_read_whole.py
    python experiments/joint_angles_read_whole.py --dtypes float64 --batches 1,16,256 --gradients
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rk_stage_forms  # noqa: E402  (x64 enabled there)

from jaxarm.dynamics import algebra  # noqa: E402


@contextlib.contextmanager
def plain_split():
    """While tracing: joint angles read by a plain split (the variant before ``whole``)."""
    entries = algebra.entries
    algebra.entries = lambda x, whole=False: entries(x)
    try:
        yield
    finally:
        algebra.entries = entries


def variants():
    return {"read_whole": ("rk3", contextlib.nullcontext), "plain_split": ("rk3", plain_split)}


if __name__ == "__main__":
    rk_stage_forms.main(description=__doc__.split("\n")[0], variants=variants, label="variant",
                        batches="1,16,64,256,4096", repeats=7)
