#!/usr/bin/env bash
# Configures and builds hetpar into build/ (Release with debug info, Ninja).
# Extra arguments go to cmake's configure step. Warnings are errors here, as in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DHETPAR_WERROR=ON "$@" >/dev/null
cmake --build build --parallel "$(nproc)"
