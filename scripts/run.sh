#!/usr/bin/env bash
# Sets up, builds and runs hetpar's main job: `hetpar plan` on the built-in default
# scenario (LLaVA-1.5-7B on 64 H100s), the winner written to build/default.plan.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/cli/hetpar plan examples/default.json --out build/default.plan.json "$@"
