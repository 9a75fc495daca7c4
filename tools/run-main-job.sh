#!/usr/bin/env bash
# The main job (README): installs dependencies, builds the release preset and runs the
# benchmark comparison, ending with the report's path.
# Until pmbench lands (issue 4) this runs the substrate micro-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target pm_microbench
mkdir -p out
build/release/src/tools/pm_microbench --records "${PMINDEX_RECORDS:-200000}" --output out/microbench.md
