#!/usr/bin/env bash
# The test command (README): installs dependencies, then
#   1. ASan+UBSan build (-O1, all persistence flavours incl. the crash-simulator tracing
#      flavour): runs the `unit` and `crash` labels, crash suites sized for CI;
#   2. TSan build: runs the `stress` label, time-boxed;
#   3. clang libFuzzer build: replays known crashers, then fuzzes pool open + recovery briefly
#      (seeded from the commit, a fixed number of runs);
#   4. install: the library installed and used through find_package, pkg-config, as a
#      subproject and as Debian packages, with every example built and run (tools/test-install.sh);
#      the installed x86-64-v2 library checked by disassembly and run under qemu-user without AVX.
# `tools/test.sh --long` runs the exhaustive `long` label instead (release build): >= 10,000
# crash images per index and mode, hundreds of kill cycles. Run it during development.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh

# Crash suites explore new images on every commit: the seed comes from the commit hash.
rev=$(git rev-parse --short=8 HEAD 2>/dev/null || echo 00c0ffee)
export PMINDEX_CRASH_SEED=${PMINDEX_CRASH_SEED:-$((16#$rev))}
export PMINDEX_STRESS_SECONDS=${PMINDEX_STRESS_SECONDS:-3}
jobs=$(nproc)

# Each stage's wall time, printed in the summary at the end.
summary=()
stage_start=$SECONDS
stage_done() {
  summary+=("$(printf '%-28s %4d s  %s' "$1" $((SECONDS - stage_start)) "$2")")
  stage_start=$SECONDS
}
print_summary() {
  echo "== summary (total $SECONDS s)"
  printf '  %s\n' "${summary[@]}"
}

# g++ 12's TSan cannot cope with the high mmap ASLR entropy of recent kernels ("unexpected
# memory mapping"); run sanitized binaries with ASLR off where setarch allows it.
norand=""
if setarch "$(uname -m)" -R true 2>/dev/null; then norand="setarch $(uname -m) -R"; fi

if [ "${1:-}" = "--long" ]; then
  export PMINDEX_CRASH_IMAGES=${PMINDEX_CRASH_IMAGES:-10000}
  export PMINDEX_KILL_CYCLES=${PMINDEX_KILL_CYCLES:-300}
  cmake --preset release && cmake --build --preset release -j "$jobs"
  ctest --test-dir build/release -L long --output-on-failure -j "$jobs"
  exit 0
fi

export PMINDEX_CRASH_IMAGES=${PMINDEX_CRASH_IMAGES:-1000}
export PMINDEX_KILL_CYCLES=${PMINDEX_KILL_CYCLES:-30}
echo "== crash seed $PMINDEX_CRASH_SEED, $PMINDEX_CRASH_IMAGES images per index and mode"

echo "== ASan+UBSan: unit and crash"
cmake --preset asan >/dev/null && cmake --build --preset asan -j "$jobs"
stage_done "asan build" "built"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  $norand ctest --test-dir build/asan -L 'unit|crash' -LE long --output-on-failure -j "$jobs" \
  | tee build/asan/ctest.log
stage_done "asan unit+crash tests" "$(grep -E 'tests passed' build/asan/ctest.log | tail -n 1)"

echo "== TSan: stress"
# The shared-key test runs once per kind and persistence mode (30 runs): 1 s each, not
# PMINDEX_STRESS_SECONDS, keeps the stage inside CI's budget. The `long` variant runs 20 s each.
export PMINDEX_SHARED_KEY_SECONDS=${PMINDEX_SHARED_KEY_SECONDS:-1}
cmake --preset tsan >/dev/null
# Build only what the stress label runs (each test is named after its executable).
stress=$(ctest --test-dir build/tsan -L stress -LE long -N | awk '/Test +#/{print $3}')
cmake --build --preset tsan -j "$jobs" --target $stress
stage_done "tsan build" "built"
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tools/tsan.supp" \
  $norand ctest --test-dir build/tsan -L stress -LE long --output-on-failure -j 1 \
  | tee build/tsan/ctest.log
stage_done "tsan stress tests" "$(grep -E 'tests passed' build/tsan/ctest.log | tail -n 1)"

echo "== libFuzzer: pool open + recovery"
cmake --preset fuzz >/dev/null && cmake --build --preset fuzz -j "$jobs"
stage_done "fuzz build" "built"
fuzz=build/fuzz/tests/fuzz/fuzz_pool_open
# Known crashers first (each was a real bug), then a run seeded like the crash suites, so a
# commit's CI run is reproducible: same seed, same number of runs, same result.
$norand $fuzz tests/fuzz/regressions/* >build/fuzz/regressions.log 2>&1 ||
  { cat build/fuzz/regressions.log; exit 1; }
rm -rf build/fuzz/corpus && mkdir -p build/fuzz/corpus
runs=${PMINDEX_FUZZ_RUNS:-300000}
if ! $norand $fuzz -seed=$((PMINDEX_CRASH_SEED % 2147483647)) -runs="$runs" \
    -artifact_prefix=build/fuzz/ -print_final_stats=1 build/fuzz/corpus tests/fuzz/regressions \
    >build/fuzz/fuzz.log 2>&1; then
  tail -n 60 build/fuzz/fuzz.log
  echo "fuzz: FAILED; the crashing input is in build/fuzz/ (add it to tests/fuzz/regressions/)"
  exit 1
fi
grep -E "stat::number_of_executed_units|Done" build/fuzz/fuzz.log
echo "fuzz: no crash in $runs runs (seed $((PMINDEX_CRASH_SEED % 2147483647)))"
stage_done "fuzz" "no crash in $runs runs"

echo "== install: CMake package, pkg-config, subproject, Debian packages; the examples; minimum CPU"
bash tools/test-install.sh --deb
stage_done "install + examples" \
  "examples built and run three ways; .deb installed; x86-64-v2 library run under qemu Nehalem"
print_summary
