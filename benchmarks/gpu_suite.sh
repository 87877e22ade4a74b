#!/usr/bin/env bash
# The accelerator suite of benchmarks/benchmark.py in stages, most wanted first, each in its own
# process under its own time limit, so that a short hold on a GPU still returns the rollouts
# against MJX even if a later stage runs out of time. Every stage writes JSON lines to
# OUTDIR/<stage>.jsonl; their human-readable summaries go to OUTDIR/suite.err.
#
#     bash benchmarks/gpu_suite.sh OUTDIR [BUDGET_SECONDS]      # default budget 490 s
#
# Stages: RK3 rollouts of the Panda, then of the Puma 560, against MJX (RK4) on the same device,
# float64 and float32, at 16384 and 10^5 rollouts of 1000 steps (MJX: 10^5 rollouts of 100 steps;
# compile times too); gradients of the Puma's 1000-step rollout cost (float64, plain reverse mode
# with the Runge-Kutta stages written out, the GPU default, and in a loop) at 1 and 4096 rollouts;
# inverse/forward dynamics and the mass matrix at 2^20 states; last, if the budget allows (not
# yet run on a GPU), the gradient with respect to the Puma's standard parameters at 4096
# rollouts. Sized by what an H200 took (each program compiles in 10-40 s there): about 490 s for
# the first four stages.
set -u
out=${1:?usage: bash benchmarks/gpu_suite.sh OUTDIR [BUDGET_SECONDS]}
budget=${2:-490}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
start=$SECONDS

stage() {
    local name=$1 limit=$2
    shift 2
    local left=$((budget - (SECONDS - start)))
    if ((left < 20)); then
        echo "stage $name: skipped, ${left} s of the budget left" | tee -a "$out/suite.err"
        return
    fi
    ((limit > left)) && limit=$left
    echo "== stage $name (limit ${limit} s)" >>"$out/suite.err"
    timeout -k 5 "$limit" "$py" "$here/benchmark.py" --gpu --baseline none "$@" >"$out/$name.jsonl" 2>>"$out/suite.err"
    echo "stage $name: exit $? after $((SECONDS - start)) s" | tee -a "$out/suite.err"
}

rollouts=(--quantities rollout_rk3,compile --rollout-batches 16384,100000 --mjx-batches 100000 --peers mjx)
stage rollouts_panda 170 --arms panda "${rollouts[@]}"
stage rollouts_puma 110 --arms puma560 "${rollouts[@]}"
stage gradients 130 --arms puma560 --quantities rollout_grad,compile --dtypes float64 --grad-batches 1,4096 --grad-entries autodiff,autodiff_loop --peers none
stage dynamics 80 --quantities inverse_dynamics,mass_matrix,forward_dynamics,compile --batches 1048576 --peers none
stage arm_gradients 90 --arms puma560 --quantities rollout_grad,compile --dtypes float64 --grad-batches 4096 --grad-entries arm --peers none
