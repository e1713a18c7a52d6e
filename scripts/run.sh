#!/usr/bin/env bash
# Sets up, builds and runs hetpar's main job on the built-in default scenario.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/cli/hetpar inspect examples/default.json "$@"
