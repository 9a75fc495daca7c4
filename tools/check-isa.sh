#!/usr/bin/env bash
# Checks by disassembly that a binary built for the baseline level (x86-64-v2, README "Minimum
# CPU") holds no AVX code outside the functions that are reached only after a run-time CPU
# check: the compiler must not have spread AVX through the library.
#
#   tools/check-isa.sh FILE...     (shared library, executable, archive or object)
#
# An AVX instruction is a VEX-encoded one (its mnemonic starts with "v": vmovdqu, vpcmpeqb,
# vzeroupper, ...; verr/verw are not VEX) or one naming a ymm/zmm register. Allowed: the
# functions named in ALLOWED below, each compiled with __attribute__((target("avx2"))) and
# called only after a run-time CPU check (__builtin_cpu_supports("avx2"), isa::search_level();
# docs/isa.md). Prints the offending functions; exit 1 if any, 2 on usage errors.
set -euo pipefail
(($#)) || { echo "usage: $0 FILE..." >&2; exit 2; }
command -v objdump >/dev/null || { echo "objdump not found" >&2; exit 2; }

# Demangled names (a prefix up to the parameter list, anchored) of the run-time-dispatched AVX2
# code: PACTree's fingerprint match and the AVX2 entry points of LB+-Tree, FPTree and NBTree
# lookups (PMINDEX_AVX2_ENTRY, docs/isa.md), with g++'s .cold parts of them.
ALLOWED='^(pmindex::pactree::\(anonymous namespace\)::match_avx2|pmindex::lbtree::LBTree<[0-9]+u>::find_word_avx2|pmindex::fptree::FPTree<[0-9]+u>::find_word_avx2|pmindex::nbtree::NBTree::find_u64_avx2)\('

status=0
for f in "$@"; do
  [ -r "$f" ] || { echo "$f: not readable" >&2; exit 2; }
  bad=$(objdump -d -C --no-show-raw-insn "$f" | awk -v allowed="$ALLOWED" '
    /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<") + 1); sub(/>:$/, "", fn); next }
    /^ +[0-9a-f]+:\t/ {
      split($0, part, "\t"); insn = part[2]; split(insn, w, " "); m = w[1]
      if ((m ~ /^v/ && m !~ /^ver[rw]/) || insn ~ /%[yz]mm/) {
        if (fn !~ allowed && !(fn in seen)) { seen[fn] = 1; print fn ": " insn }
      }
    }')
  if [ -n "$bad" ]; then
    echo "$f: AVX instructions outside the run-time-dispatched functions:"
    printf '%s\n' "$bad" | sed -n 1,20p  # sed reads it all: head would end echo with SIGPIPE
    echo "($(printf '%s\n' "$bad" | wc -l) functions)"
    status=1
  fi
done
exit $status
