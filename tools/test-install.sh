#!/usr/bin/env bash
# Installs pmindex to a temporary prefix and uses it the three ways a project can
# (README "Using pmindex in your project"), building every example in examples/ and running it:
#   1. find_package(pmindex CONFIG) against the installed prefix;
#   2. pkg-config (shared library, then --static);
#   3. as a subproject (add_subdirectory): tests, benchmark and tools must stay off.
# The examples are compiled without any ISA flag (checked in the compile commands): the library
# must not impose one. The library is built at the baseline level (x86-64-v2): its disassembly
# holds AVX only in run-time-dispatched functions (tools/check-isa.sh), and examples run under
# qemu-user on a CPU model without AVX (Nehalem) with the same output; below the baseline
# (core2duo) the library refuses to start. With --deb it also builds the Debian packages with
# CPack, installs them
# with dpkg, builds an example against /usr and removes the packages again.
# Run by tools/test.sh (CI) after the sanitizer stages.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${PMINDEX_INSTALL_TEST_DIR:-$root/build/install-test}
jobs=$(nproc)
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

step() { echo "-- test-install: $*"; }
run_examples() {  # DIR
  local dir=$1 pools=$work/pools
  "$dir/open_and_recover" "$pools/o.pool"
  "$dir/open_and_recover" "$pools/o.pool" | grep -q "recovered pool"
  for kind in lbtree fptree nbtree apex reflist; do "$dir/insert_and_scan" "$kind" >/dev/null; done
  "$dir/variable_keys" >/dev/null
  for mode in adr eadr dram; do "$dir/choose_mode" "$mode" "$pools/m.pool"; done
  "$dir/choose_mode" dram
  "$dir/crash_and_recover" nbtree "$pools/c.pool"
  "$dir/crash_and_recover" lbtree "$pools/c.pool"
  "$dir/external_index" "$pools/x.pool" | grep -q "recovered 99 records"
  [ -e "$dir/libpair_log_plugin.so" ] || { echo "the plugin example was not built"; exit 1; }
}
no_isa_flags() {  # BUILD_DIR: the examples' compile commands carry no -m flag
  if grep -E '"command".*examples/.*\.cpp' "$1/compile_commands.json" | grep -qE ' -m[a-z0-9]'; then
    echo "an ISA flag reached a consumer's compile command:"; grep -E ' -m[a-z0-9]' "$1/compile_commands.json"
    exit 1
  fi
}

# The ISA-flag check must be able to fail: a consumer compile command with -mavx2.
bad=$work/bad-compile-commands
mkdir -p "$bad"
printf '[{"command": "g++ -mavx2 -c /src/examples/insert_and_scan.cpp"}]\n' >"$bad/compile_commands.json"
if (no_isa_flags "$bad") >/dev/null 2>&1; then
  echo "no_isa_flags accepted a compile command with -mavx2"; exit 1
fi

step "build and install (release, production flavour, shared + static) to $prefix"
cmake -S . -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPMINDEX_BUILD_TESTS=OFF \
  -DPMINDEX_BUILD_BENCH=OFF -DPMINDEX_FLAVOURS=production >/dev/null
cmake --build "$work/build" -j "$jobs" >/dev/null
cmake --install "$work/build" --prefix "$prefix" >/dev/null
for f in lib/libpmindex.a lib/libpmindex.so lib/cmake/pmindex/pmindexConfig.cmake \
         lib/cmake/pmindex/pmindexConfigVersion.cmake lib/pkgconfig/pmindex.pc \
         include/pmindex/index.h bin/pmpool; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
ls "$prefix"/lib/libpmindex.so.* >/dev/null

step "examples through find_package(pmindex)"
cmake -S examples -B "$work/examples" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build "$work/examples" -j "$jobs" >/dev/null
no_isa_flags "$work/examples"
run_examples "$work/examples"

step "minimum CPU: the installed library is x86-64-v2 and runs on a CPU without AVX2 (qemu-user)"
# A plain configure builds the baseline level (README "Minimum CPU"); the library says so.
"$prefix/bin/pmpool" --version | grep -q "(x86-64-v2)$" ||
  { echo "pmpool --version does not report x86-64-v2: $("$prefix/bin/pmpool" --version)"; exit 1; }
# No AVX instruction outside the run-time-dispatched functions, checked by disassembly; the
# checker must be able to fail: a loop compiled with -mavx2.
tools/check-isa.sh "$prefix/lib/libpmindex.a" "$prefix"/lib/libpmindex.so.*.*.* "$prefix/bin/pmpool"
mkdir -p "$work/isa"
printf 'void add(int* a, const int* b, int n) { for (int i = 0; i < n; ++i) a[i] += b[i]; }\n' \
  >"$work/isa/loop.c"
gcc -O3 -mavx2 -c "$work/isa/loop.c" -o "$work/isa/loop-avx2.o"
if tools/check-isa.sh "$work/isa/loop-avx2.o" >/dev/null; then
  echo "check-isa.sh accepted an object compiled with -mavx2"; exit 1
fi
# qemu-user with a CPU model that has SSE4.2 and POPCNT but no AVX (Nehalem). It must really
# lack AVX2: an AVX2 instruction must die with SIGILL (132) under it and run without qemu.
command -v qemu-x86_64 >/dev/null ||
  { echo "qemu-x86_64 not found (tools/install-deps.sh)"; exit 1; }
nehalem=(qemu-x86_64 -cpu Nehalem)
core2=(qemu-x86_64 -cpu core2duo)  # below the baseline: no SSE4.2, no POPCNT
printf '%s\n' 'int main(void) {' \
  '  __asm__ volatile("vpaddd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0");' '  return 0;' '}' \
  >"$work/isa/avx2.c"
gcc -O0 "$work/isa/avx2.c" -o "$work/isa/avx2"
rc=0; "${nehalem[@]}" "$work/isa/avx2" 2>/dev/null || rc=$?
[ "$rc" -eq 132 ] ||
  { echo "an AVX2 instruction under '${nehalem[*]}' exited $rc, not 132 (SIGILL)"; exit 1; }
if grep -qw avx2 /proc/cpuinfo; then "$work/isa/avx2"; fi
# The examples under the AVX-less model: the same output as on this CPU (PACTree's fingerprint
# match takes its SSE2 path there and its AVX2 path here when the CPU has AVX2).
for kind in lbtree fptree nbtree pactree; do
  "$work/examples/insert_and_scan" "$kind" >"$work/isa/native.out"
  "${nehalem[@]}" "$work/examples/insert_and_scan" "$kind" >"$work/isa/qemu.out" 2>/dev/null
  cmp -s "$work/isa/native.out" "$work/isa/qemu.out" ||
    { echo "insert_and_scan $kind: output under qemu Nehalem differs"; exit 1; }
done
"${nehalem[@]}" "$work/examples/crash_and_recover" lbtree "$work/pools/q.pool" >/dev/null
# Below the baseline the library stops at load time with a message and status 132 instead of
# faulting somewhere (src/isa.cpp).
rc=0
"${core2[@]}" "$work/examples/insert_and_scan" lbtree >/dev/null 2>"$work/isa/core2.err" || rc=$?
[ "$rc" -eq 132 ] && grep -q "libpmindex: .*lacks SSE4.2, POPCNT" "$work/isa/core2.err" ||
  { echo "below the baseline: exit $rc, stderr:"; cat "$work/isa/core2.err"; exit 1; }

step "examples through pkg-config (shared, then static)"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
mkdir -p "$work/pc"
for ex in insert_and_scan crash_and_recover; do
  # shellcheck disable=SC2046
  g++ -O2 examples/$ex.cpp -o "$work/pc/$ex" $(pkg-config --cflags --libs pmindex)
done
# shellcheck disable=SC2046
g++ -O2 examples/insert_and_scan.cpp -o "$work/pc/insert_and_scan-static" \
  $(pkg-config --cflags pmindex) $(pkg-config --static --libs pmindex | sed 's/-lpmindex/-l:libpmindex.a/')
LD_LIBRARY_PATH=$prefix/lib ldd "$work/pc/insert_and_scan" | grep -q "libpmindex.so.* => $prefix/lib/" ||
  { echo "the pkg-config build did not link libpmindex.so"; exit 1; }
LD_LIBRARY_PATH=$prefix/lib "$work/pc/insert_and_scan" apex >/dev/null
LD_LIBRARY_PATH=$prefix/lib "$work/pc/crash_and_recover" fptree "$work/pools/p.pool"
if ldd "$work/pc/insert_and_scan-static" | grep -q libpmindex; then
  echo "the --static build links libpmindex.so"; exit 1
fi
"$work/pc/insert_and_scan-static" lbtree >/dev/null

step "examples with pmindex as a subproject"
cmake -S tests/install/subproject -B "$work/sub" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DPMINDEX_SOURCE_DIR="$root" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build "$work/sub" -j "$jobs" >/dev/null
no_isa_flags "$work/sub"
"$work/sub/examples/insert_and_scan" nbtree >/dev/null
"$work/sub/examples/variable_keys" >/dev/null

if [ "${1:-}" = "--deb" ]; then
  step "Debian packages (CPack), installed with dpkg"
  (cd "$work/build" && cpack -G DEB >/dev/null)
  debs=("$work"/build/*.deb)
  printf '   %s\n' "${debs[@]##*/}"
  for deb in "${debs[@]}"; do  # the package states the minimum CPU (README "Minimum CPU")
    dpkg-deb -f "$deb" Description | grep -q "Runs on any x86-64-v2 CPU" ||
      { echo "${deb##*/}: the description does not state the baseline CPU"; exit 1; }
  done
  dpkg -i "${debs[@]}" >/dev/null
  trap 'dpkg -r pmindex-tools libpmindex-dev libpmindex >/dev/null 2>&1 || true' EXIT
  cmake -S examples -B "$work/deb-examples" -G Ninja >/dev/null
  cmake --build "$work/deb-examples" -j "$jobs" >/dev/null
  "$work/deb-examples/insert_and_scan" apex >/dev/null
  pmpool --help >/dev/null
fi
step "passed"
