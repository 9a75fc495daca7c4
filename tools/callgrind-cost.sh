#!/usr/bin/env bash
# Instructions per lookup and per insert of each index kind, counted by callgrind (issue 16).
#
#   tools/callgrind-cost.sh [--binary B] [--records N] [--load bulk|insert] [--max-lookup X]
#                           [--breakdown] KIND...
#
# Runs bench/micro/lookup_cost (B, default build/release/bench/lookup_cost: a Release build,
# since the counts are of optimised code) twice per kind under callgrind, with L1 and L2
# lookups (I1 and I2 inserts). Only the find loop and the insert loop are instrumented; the
# difference of the two runs divided by the difference of their lengths cancels the constant
# part, so the figure is the inclusive cost of one `find` (one `insert`) plus the loop's few
# instructions. Prints "kind lookup_instr insert_instr" per kind.
# --max-lookup X: exit 1 if any kind's lookup_instr exceeds X (the `long` tests).
# --load insert: the N keys are inserted in random order instead of bulk-loaded at fill 1.0
# (the tree shape the originals' drivers build by insert; inserts then rarely split).
# --breakdown: also print the per-function inclusive costs of the longer find loop.
set -euo pipefail

binary="build/release/bench/lookup_cost"
records=1000000
load=bulk
max_lookup=""
breakdown=0
kinds=()
while (($#)); do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --records) records="$2"; shift 2 ;;
    --load) load="$2"; shift 2 ;;
    --max-lookup) max_lookup="$2"; shift 2 ;;
    --breakdown) breakdown=1; shift ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) kinds+=("$1"); shift ;;
  esac
done
((${#kinds[@]})) || { echo "usage: $0 [--binary B] [--records N] [--max-lookup X] KIND..." >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 2; }

L1=20000 L2=120000 I1=5000 I2=25000
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

total() { sed -n 's/^totals: //p' "$1"; }

run() {  # kind lookups inserts tag
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/$4" \
    "$binary" "$1" --records "$records" --load "$load" --lookups "$2" --inserts "$3" \
    >"$work/$4.log" 2>&1 || { cat "$work/$4.log" >&2; echo "$1: lookup_cost failed" >&2; exit 1; }
}

status=0
for kind in "${kinds[@]}"; do
  run "$kind" $L1 $I1 short
  run "$kind" $L2 $I2 long
  lookup=$(( ($(total "$work/long.1") - $(total "$work/short.1")) / (L2 - L1) ))
  insert=$(( ($(total "$work/long.2") - $(total "$work/short.2")) / (I2 - I1) ))
  echo "$kind $lookup $insert"
  if ((breakdown)); then
    callgrind_annotate --inclusive=yes --threshold=99 "$work/long.1" | sed -n '/^Ir/,$p' | head -25
  fi
  if [[ -n "$max_lookup" ]] && ((lookup > max_lookup)); then
    echo "$kind: $lookup instructions per lookup > $max_lookup" >&2
    status=1
  fi
done
exit $status
