#!/usr/bin/env bash
# The executor's closed loop on this machine (docs/validation.md, "Executor closed loop"):
# for each world size, ROUNDS times: the quick calibration under `mpirun -np N` (plus the
# plan's own GEMM shapes, --shapes-from, unless SHAPES=0), then `hetpar validate` of the
# tiny plan tests/data/executor/tiny-vlm-N.json against the prediction from that profile. Prints every round's iteration and kernel-census errors
# and keeps the records (JSON) under OUT. Repeated rounds, because a shared host's speed
# drifts between a calibration and the run that follows it.
#
#   scripts/closed_loop.sh [ROUNDS=3] [WORLDS="1 2 4"] [BACKEND=cpu]
# Environment: HETPAR (the binary, default build/cli/hetpar), OUT (default
# build/closed-loop), MPIRUN (default mpirun), SHAPES (1: calibrate the plan's shapes too).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
worlds=${2:-"1 2 4"}
backend=${3:-cpu}
hetpar=${HETPAR:-build/cli/hetpar}
out=${OUT:-build/closed-loop}
mpirun=${MPIRUN:-mpirun}
shapes=${SHAPES:-1}
mkdir -p "$out"
if [[ $(id -u) == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
for np in $worlds; do
  plan=tests/data/executor/tiny-vlm-$np.json
  for r in $(seq 1 "$rounds"); do
    profile=$out/$backend-np$np-r$r.json
    extra=()
    [[ $shapes == 1 ]] && extra=(--shapes-from "$plan")
    "$mpirun" -np "$np" --oversubscribe --bind-to none "$hetpar" calibrate --backend "$backend" \
      --quick "${extra[@]}" --out "$profile" >"$out/calibrate-np$np-r$r.log" 2>&1
    "$mpirun" -np "$np" --oversubscribe --bind-to none "$hetpar" validate "$plan" \
      --backend "$backend" --profile "$profile" --warmup 2 --iterations 5 \
      --json "$out/validate-np$np-r$r.json" >"$out/validate-np$np-r$r.log" 2>&1
    echo "== $np rank(s), round $r (load $(cut -d' ' -f1 /proc/loadavg))"
    grep -E '^(iteration time|  [a-z])' "$out/validate-np$np-r$r.log"
  done
done
