#!/usr/bin/env bash
# The main job (README): build xserv, then generate text on the CPU from the embedded default
# model. Extra arguments go to `xserv-cli generate` (e.g. -p "ROMEO:" -n 100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release -DXSERV_BUILD_TESTS=OFF -DXSERV_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release -j"$(nproc)" --target xserv-cli
if [ $# -eq 0 ]; then set -- -p "ROMEO:" -n 120 --temperature 0.8 --seed 1; fi
exec build/release/examples/cli/xserv-cli generate -m examples/models/shakespeare --device cpu "$@"
