#!/usr/bin/env bash
# Installs hetpar's build and test dependencies from Debian's packages. Idempotent and
# quiet: when everything is present it only runs dpkg-query and returns in well under a
# second. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libfmt-dev nlohmann-json3-dev libboost-graph-dev libeigen3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin libtbb-dev
)
# The runtime's cuda backend is optional and not from Debian: CMake builds it when it finds
# NVIDIA's CUDA toolkit (nvcc, cuBLASLt) and NCCL, e.g. under /usr/local/cuda.

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq >/dev/null
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
