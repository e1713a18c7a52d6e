#!/usr/bin/env bash
# The GPU session's one call (the `device` tool, ../.library/device/README.md): on a GPU
# machine that has CUDA, CMake and ninja but not hetpar's Debian libraries, unpack the .deb
# files scripts/device_bundle.sh put in .device/debs, build hetpar with its cuda backend,
# run the gpu-labelled tests, then calibrate the GPU at the GEMM shapes of the validation
# runs (hetpar calibrate --backend cuda --shapes-from), and time fused attention and GEMMs
# through PyTorch burst and sustained (scripts/device_attention.py), and a MoE layer's expert
# GEMMs as Transformer Engine issues them (scripts/device_experts.py), so a miss can be told
# apart here: kernel rate or the rest of the model. Everything it writes lands in $OUT
# (default build-device/out): logs, calibrated profiles, the attention table.
#
#   here:   bash scripts/device_bundle.sh
#   device: run(command="bash scripts/device_check.sh", carry=[".device"], timeout_s=600)
#
# HETPAR_DEVICE_RUNS: validation runs to calibrate at (names under validation/runs, without
# .json); HETPAR_DEVICE_BASE: the built-in profile the calibration starts from (dgx-h200);
# HETPAR_DEVICE_ARCH: CMAKE_CUDA_ARCHITECTURES (90); HETPAR_DEVICE_SUSTAIN: seconds each
# GEMM runs back to back before it is timed (0.5; 0 = burst); HETPAR_DEVICE_TARGETS: the
# build targets (all; "hetpar runtime_cuda_test" is what the later steps need; without the
# test binary its step is left out); HETPAR_DEVICE_PYTORCH=0 leaves out the PyTorch timings
# (scripts/device_attention.py; scripts/device_memory.py runs alone). Steps go on
# after a failure where they can; the exit status is the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-device/out}
mkdir -p "$out"
runs=${HETPAR_DEVICE_RUNS:-"nemo-24.07-llama3-8b-8xh100-fp8 nemo-24.07-gpt3-175b-128xh100-fp8 llama3-405b-16384xh100 mbridge-26.02-gpt-oss-120b-64xh100-bf16"}
base=${HETPAR_DEVICE_BASE:-dgx-h200}
arch=${HETPAR_DEVICE_ARCH:-90}
sustain=${HETPAR_DEVICE_SUSTAIN:-0.5}  # seconds each GEMM runs back to back before timing
targets=${HETPAR_DEVICE_TARGETS:-}
status=0
step() {  # step NAME COMMAND...: runs it, its output in $out/NAME.log
  local name=$1
  shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc, $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
  return "$rc"
}

# 1. Hetpar's libraries, unpacked where nothing else looks (no root file system change).
deps=${HETPAR_DEPS_ROOT:-/tmp/hetpar-deps}
if ! ls .device/debs/*.deb >/dev/null 2>&1; then
  echo "device_check: no .device/debs/*.deb: run scripts/device_bundle.sh first and carry .device" >&2
  exit 2
fi
mkdir -p "$deps"
for f in .device/debs/*.deb; do dpkg -x "$f" "$deps"; done
lib=$deps/usr/lib/x86_64-linux-gnu
machine_ld=${LD_LIBRARY_PATH:-}  # PyTorch runs with the machine's own libraries only
export PATH=$deps/usr/bin:$PATH
export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX=$deps/usr  # Open MPI finds its components and help files under it
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# NCCL: the CUDA toolkit's, NCCL_HOME's, or else the one PyTorch's pip packages bring
# (nvidia/nccl, which has libnccl.so.2 only: CMake looks for libnccl.so).
if [ -z "${NCCL_HOME:-}" ] && [ ! -f /usr/local/cuda/include/nccl.h ]; then
  pip_nccl=$(python3 -c 'import os, nvidia
for p in nvidia.__path__:
    d = os.path.join(p, "nccl")
    if os.path.exists(os.path.join(d, "include", "nccl.h")): print(d); break' 2>/dev/null)
  if [ -n "$pip_nccl" ]; then
    mkdir -p /tmp/hetpar-nccl/lib
    ln -sfn "$pip_nccl/include" /tmp/hetpar-nccl/include
    ln -sf "$pip_nccl/lib/libnccl.so.2" /tmp/hetpar-nccl/lib/libnccl.so
    export NCCL_HOME=/tmp/hetpar-nccl LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$pip_nccl/lib
  fi
fi
# The card as found (read only): its clocks and power limit bound every GEMM rate below.
{ nvidia-smi; nvidia-smi -q -d POWER,CLOCK,PERFORMANCE,TEMPERATURE; } >"$out/nvidia-smi.txt" 2>&1 || true

# 2. Configure and build. Open MPI's compiler wrapper is not unpacked; FindMPI gets the
# library and header directly.
step configure cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DHETPAR_CUDA=ON -DHETPAR_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_PREFIX_PATH="$deps/usr" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
  -DMPI_CXX_SKIP_MPICXX=ON -DMPI_CXX_ADDITIONAL_INCLUDE_DIRS="$lib/openmpi/include" \
  -DMPI_CXX_LIB_NAMES=mpi \
  -DMPI_mpi_LIBRARY="$lib/openmpi/lib/libmpi.so" || exit "$status"
# shellcheck disable=SC2086  # targets is a word list
step build cmake --build build-device --parallel "$(nproc)" ${targets:+--target $targets} ||
  exit "$status"

# 3. The cuda backend against the cpu one (skipped, and so reported, without a GPU). The
# binary itself: ctest's test discovery failed on that machine's CMake (2026-12-04).
if [ -x build-device/tests/runtime_cuda_test ]; then
  step gpu-tests build-device/tests/runtime_cuda_test
fi

# 4. Fused attention (cuDNN, FlashAttention-2) and GEMMs through PyTorch, burst and
# sustained: the rates the built-in profiles quote, which the cuda backend cannot measure.
if [ "${HETPAR_DEVICE_PYTORCH:-1}" != 0 ] &&
  LD_LIBRARY_PATH=$machine_ld PYTHONUNBUFFERED=1 step attention python3 scripts/device_attention.py --json "$out/attention.json"; then
  tail -n 25 "$out/attention.log" >>"$out/summary.txt"
fi

# 4b. A MoE layer's expert GEMMs as Transformer Engine issues them (one per local expert on
# 4 streams) against one stream, a grouped kernel and one dense GEMM, at the suite's MoE
# rows' per-rank shapes; beside them the cost model's expert ops for the same rows (the
# built-in profiles; the H100's GEMM rates are the H200's, docs/validation.md).
if [ "${HETPAR_DEVICE_PYTORCH:-1}" != 0 ] &&
  LD_LIBRARY_PATH=$machine_ld PYTHONUNBUFFERED=1 step experts python3 scripts/device_experts.py --fp8 --json "$out/experts.json"; then
  cat "$out/experts.log" >>"$out/summary.txt"
  for r in mbridge-26.02-gpt-oss-120b-64xh100-bf16 mlm-recipes-qwen3-30b-a3b-32xh100-bf16 \
    mbridge-25.09-qwen3-30b-a3b-16xh100-fp8-tokendrop \
    moezoo-qwen3-235b-a22b-256xh100-bf16-tp4-ep8-deepep moezoo-qwen3-235b-a22b-256xh100-bf16-ep32-deepep; do
    if build-device/cli/hetpar simulate "validation/runs/$r.json" --ops >"$out/ops-$r.log" 2>&1; then
      grep -E '^Plan|expert_fc' "$out/ops-$r.log" | sed "s/^/  model $r: /" >>"$out/summary.txt"
    fi
  done
fi

# 5. Calibrate at each run's own GEMMs. Compare here: `hetpar simulate RUN --ops` with the
# built-in profile and with the calibrated GEMM tables (docs/calibration.md, "GPUs").
hetpar=build-device/cli/hetpar
for r in $runs; do
  scenario=validation/runs/$r.json
  if [ ! -f "$scenario" ]; then
    echo "no $scenario" | tee -a "$out/summary.txt"
    [ "$status" -eq 0 ] && status=2
    continue
  fi
  step "calibrate-$r" "$hetpar" calibrate --backend cuda --quick --base "$base" \
    --shapes-from "$scenario" --max-shapes 24 --sustain "$sustain" --out "$out/$base-$r.json"
  # The GEMM rates (fp8 plans in fp8) and what adding into the fp32 main_grad costs.
  grep -h '^GEMM' "$out/calibrate-$r.log" | sed "s/^/  $r: /" >>"$out/summary.txt"
done
echo "device_check: done, exit $status; outputs in $out" | tee -a "$out/summary.txt"
exit "$status"
