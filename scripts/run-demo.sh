#!/usr/bin/env bash
# The main job (README): build xserv, then generate text on the CPU from the embedded default
# model. Extra arguments go to `xserv-cli generate` (e.g. -p "ROMEO:" -n 100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Its own build folder: the test command's build/release keeps its tests whichever runs first.
cmake --preset release -B build/demo -DXSERV_BUILD_TESTS=OFF -DXSERV_BUILD_BENCH=OFF >/dev/null
cmake --build build/demo -j"$(nproc)" --target xserv-cli
if [ $# -eq 0 ]; then set -- -p "ROMEO:" -n 120 --temperature 0.8 --seed 1; fi
exec build/demo/examples/cli/xserv-cli generate -m examples/models/shakespeare --device cpu "$@"
