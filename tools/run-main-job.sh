#!/usr/bin/env bash
# The main job (README): installs dependencies, builds the release preset, runs the default
# pmbench experiment (every built-in index and DRAM comparator, a few workloads of 0.8 s each
# on 4x the last-level cache in records, loads shared across a built-in index's workloads;
# about 15 minutes on 2 cores with the build), draws the figures and writes the report. Prints
# the report's path last.
#
#   bash tools/run-main-job.sh [EXPERIMENT.toml] [RESULTS_DIR]
#
# Environment: JOBS (build jobs, default nproc), PYTHON (default Debian's /usr/bin/python3,
# which has python3-matplotlib; a pyenv python3 on PATH usually has not).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
experiment=${1:-$root/bench/experiments/default.toml}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${2:-$root/out/$(basename "$experiment" .toml)-$stamp}   # out/ is git-ignored
if [ -z "${PYTHON:-}" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
fi

tools/install-deps.sh >&2
cmake --preset release >/dev/null
# pmpool too: the README sends users to it to inspect the pools a run leaves.
targets="pmbench pmbench-counting pmpool"
# Experiments that name tree_api libraries by path (e.g. goals-10m.toml) need the wrappers.
for kind in $(grep -o 'libpmindex_[a-z]*_tree' "$experiment" | sort -u | sed 's/^lib//'); do
  targets="$targets $kind"
done
cmake --build --preset release -j "${JOBS:-$(nproc)}" --target $targets >&2

echo "== running $experiment -> $out" >&2
status=0
"$PYTHON" bench/experiment.py "$experiment" --pmbench build/release/bench/pmbench --out "$out" >/dev/null || status=$?
if [ "$status" -ne 0 ]; then echo "== some runs failed (see $out/manifest.json); the report lists them" >&2; fi

echo "== plotting" >&2
"$PYTHON" bench/plot.py "$out"
exit "$status"
