#!/usr/bin/env bash
# Installs the Debian 12 packages pmindex needs (build, tests, benchmark, plots). Idempotent:
# only missing packages are installed. Needs root (or sudo) when something is missing.
set -euo pipefail

packages=(
  g++ cmake ninja-build git pkg-config dpkg-dev # toolchain (dpkg-dev: CPack .deb dependencies)
  libgtest-dev                                  # tests
  zlib1g-dev                                    # pool header CRC-32
  libcli11-dev nlohmann-json3-dev libfmt-dev    # pmpool / pmbench CLI and output
  libtbb-dev libabsl-dev                        # DRAM comparators (tbb::concurrent_map, absl::btree_map)
  clang-14 libclang-rt-14-dev                   # libFuzzer target (g++ has no -fsanitize=fuzzer)
  python3 python3-matplotlib                    # plots and report
  doxygen                                       # API reference (tools/api-docs.sh)
  qemu-user                                     # tools/test-install.sh: runs on a CPU without AVX
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# A fresh cloud machine often runs its own apt at boot: wait for the dpkg lock (the option) and
# retry while another apt holds the list lock, up to 10 minutes each, instead of failing.
lock_wait=(-o DPkg::Lock::Timeout=600)
retry() {
  local tries=60
  until "$@"; do
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || return 1
    echo "install-deps: '$*' failed (another package manager running?); retrying in 10 s" >&2
    sleep 10
  done
}
retry $SUDO apt-get "${lock_wait[@]}" update -qq
retry $SUDO apt-get "${lock_wait[@]}" install -y -qq --no-install-recommends "${missing[@]}"
