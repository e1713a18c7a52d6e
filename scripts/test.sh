#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (what README.md shows and .ci/run calls).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --timeout 600
