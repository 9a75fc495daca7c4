#!/bin/bash
# datasets_network.sh PYTHON DATASETS_PY PMBENCH CACHE: fetches every real dataset through its
# registry (pinned, checksummed; --limit keeps them small, but the downloads are whole: the
# basemap wheel is 91 MB, the Debian Contents index 11.6 MB, the npm tarballs ~25 MB), then
# runs pmbench conformance on each. Exit 77 (ctest: skipped) when a registry is unreachable.
set -u
py=$1; datasets=$2; pmbench=$3; cache=$4
for url in https://pypi.org/simple/ https://registry.npmjs.org/ https://deb.debian.org/debian/dists/bookworm/Release; do
  if ! "$py" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)" "$url" 2>/dev/null; then
    echo "SKIPPED: $url is unreachable (no network); the dataset fetch test needs PyPI, npm and deb.debian.org"
    exit 77
  fi
done
mkdir -p "$cache"
fail=0
run() {  # run NAME PMBENCH-ARGS...
  local name=$1; shift
  local file
  file=$("$py" "$datasets" fetch "$name" --limit 20000 --cache "$cache") || { echo "FAIL: fetch $name"; fail=1; return; }
  echo "$name -> $file ($(stat -c %s "$file") bytes)"
  "$pmbench" lbtree --dataset "$file" -n 10000 -p 20000 -r 0.4 -i 0.2 -u 0.1 -s 0.1 --rmw_ratio 0.2 \
      --verify -q "$@" || { echo "FAIL: pmbench on $name"; fail=1; }
}
run npm-names
run github-users
run debian-paths
run gshhg-longitudes --key_type double
run gshhg-longlat --key_type double
run gshhg-s2
# doubles reach APEX as IEEE values through the native API
file=$("$py" "$datasets" fetch gshhg-longlat --limit 20000 --cache "$cache") &&
  "$pmbench" apex --dataset "$file" --key_type double -n 10000 -p 20000 -r 0.5 -i 0.3 -s 0.2 --verify -q ||
  { echo "FAIL: apex on gshhg-longlat"; fail=1; }
exit $fail
