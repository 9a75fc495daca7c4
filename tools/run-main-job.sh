#!/bin/sh
# The README's main command: build pmbench (Release), run the default experiment (every
# built-in index and DRAM comparator, a few workloads, about a second each; under ~5 minutes
# on 2 cores), draw the figures and write the report. Prints the report's path last.
#
#   tools/run-main-job.sh [EXPERIMENT.toml] [RESULTS_DIR]
#
# Environment: BUILD_DIR (default build/release), JOBS (default 2), PYTHON (default Debian's
# /usr/bin/python3, which has python3-matplotlib; a pyenv python3 on PATH usually has not).
set -eu
if [ -z "${PYTHON:-}" ]; then
  if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
fi
root=$(cd "$(dirname "$0")/.." && pwd)
experiment=${1:-$root/bench/experiments/default.toml}
build=${BUILD_DIR:-$root/build/release}
jobs=${JOBS:-2}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${2:-$root/build/results/$(basename "$experiment" .toml)-$stamp}  # build/ is git-ignored

echo "== building pmbench in $build" >&2
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPMINDEX_BUILD_BENCH=ON \
      -DPMINDEX_BUILD_TESTS=OFF -DPMINDEX_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target pmbench pmbench-counting >&2

echo "== running $experiment -> $out" >&2
status=0
"$PYTHON" "$root/bench/experiment.py" "$experiment" --pmbench "$build/bench/pmbench" --out "$out" >/dev/null || status=$?
if [ "$status" -ne 0 ]; then echo "== some runs failed (see $out/manifest.json); the report lists them" >&2; fi

echo "== plotting" >&2
report=$("$PYTHON" "$root/bench/plot.py" "$out")
echo "$report"
exit "$status"
