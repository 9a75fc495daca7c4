#!/usr/bin/env bash
# The API reference, generated from the public headers by Doxygen (docs/api/Doxyfile):
#
#   bash tools/api-docs.sh [OUT_DIR]          default build/api; open OUT_DIR/html/index.html
#
# Fails (exit 1, warnings listed) when a public symbol is undocumented or a doc comment is
# malformed, so missing documentation fails the build that runs it (tools/test.sh does).
# PMINDEX_API_INPUT="a.h b.h" documents other headers instead (the script's own test).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/api}
if ! command -v doxygen >/dev/null; then
  echo "api-docs: doxygen is not installed (bash tools/install-deps.sh installs it)" >&2
  exit 2
fi
mkdir -p "$out"
warnings=$out/warnings.txt
{
  cat "$root/docs/api/Doxyfile"
  echo "OUTPUT_DIRECTORY = $out"
  if [ -n "${PMINDEX_API_INPUT:-}" ]; then echo "INPUT = $PMINDEX_API_INPUT"; fi
} | (cd "$root" && doxygen - >/dev/null 2>"$warnings")
if [ -s "$warnings" ]; then
  echo "api-docs: $(wc -l <"$warnings") Doxygen warning(s); every public symbol needs a /// comment:"
  sed "s|$root/||" "$warnings"
  exit 1
fi
echo "api-docs: $out/html/index.html"
