#!/usr/bin/env bash
# The benchmark plots of docs/benchmarks.md: docs/bench/plot.py reads the recorded results
# (docs/bench/*.json) and writes docs/bench/<machine>-<group>.png. After recording new figures,
# edit the JSON (each number says where it was recorded), run this and commit both.
# Usage: scripts/bench-plots.sh [JSON ...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh python3-matplotlib > /dev/null
# Debian's python3 has python3-matplotlib; another python3 first on PATH may not.
exec /usr/bin/python3 docs/bench/plot.py "$@"
