#!/usr/bin/env bash
# The C API reference: Doxygen over capi/xserv.h (docs/api/Doxyfile) into docs/api/html
# (open docs/api/html/index.html; generated, not committed). Fails, listing them, on any Doxygen
# warning, in particular a public declaration of xserv.h without documentation — that is the CI
# check (ctest test capi_docs).
# Usage: scripts/api-docs.sh [OUTPUT_DIR]        (needs Debian's doxygen: scripts/install-deps.sh)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$src/docs/api}")
command -v doxygen > /dev/null || { echo "api-docs: doxygen is not installed (apt-get install doxygen)"; exit 1; }
mkdir -p "$out"
rm -f "$out/warnings.log"
# The filter is a python3 script (standard library only).
export XSERV_SOURCE_DIR=$src XSERV_DOC_OUTPUT=$out
export XSERV_DOC_FILTER=$src/docs/api/doxygen_filter.py
if ! doxygen "$src/docs/api/Doxyfile" || [ -s "$out/warnings.log" ]; then
  echo "api-docs: Doxygen warnings (every public declaration in capi/xserv.h needs a comment):"
  cat "$out/warnings.log"
  exit 1
fi
echo "api-docs: $out/html/index.html"
