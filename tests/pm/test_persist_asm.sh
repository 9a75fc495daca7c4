#!/usr/bin/env bash
# The production path costs nothing extra: pm::store + pm::persist in adr mode must compile to
# the raw store / clwb / sfence sequence, the always-on counter increments, one branch on the
# flush kind and the loop over cache lines -- no calls, nothing else conditional.
# (valgrind 3.19 cannot run clwb, so this reads the disassembly instead of counting.)
# Usage: test_persist_asm.sh BINARY [FUNCTION]. The known-bad probe (a fast path with an extra
# call and branch) is run by ctest with WILL_FAIL, so the checker itself is tested.
set -euo pipefail
bin=$1
fn=${2:-pmindex_probe_store_persist}
dis=$(mktemp)
trap 'rm -f "$dis"' EXIT
objdump -d --no-show-raw-insn "$bin" >"$dis"
body=$(awk -v f="<$fn>:" '$0 ~ f {on=1; next} on && /^$/{exit} on{print}' "$dis")
echo "$body"
fail() { echo "FAIL: $*"; exit 1; }
[ -n "$body" ] || fail "probe function not found"
grep -q 'clwb' <<<"$body" || fail "no clwb"
grep -q 'sfence' <<<"$body" || fail "no sfence"
if grep -qE '\scall' <<<"$body"; then
  # The only call allowed is the out-of-line slow path for non-clwb modes.
  calls=$(grep -cE '\scall' <<<"$body")
  grep -E '\scall' <<<"$body" | grep -q 'persist_slow' || fail "unexpected call on the fast path"
  [ "$calls" -le 1 ] || fail "$calls calls"
fi
cond=$(grep -cE '\sj(e|ne|a|ae|b|be|g|ge|l|le|z|nz|s|ns)\s' <<<"$body" || true)
echo "conditional branches: $cond (one mode check + the cache-line loop back edge)"
[ "$cond" -le 2 ] || fail "$cond conditional branches, expected at most 2"
echo "PASS"
