#!/usr/bin/env bash
# The main job (README): build xserv-cli, then generate text from the embedded default model.
# Extra arguments go to `xserv-cli generate` (e.g. -p "ROMEO:" -n 100).
#
# Only what the demo runs is built: the xserv-cli target and the static internals it links (no
# tests, benchmarks, examples or libxserv.so). The CUDA kernels are compiled only when a GPU is
# usable here (nvidia-smi lists one); otherwise the build is CPU-only, since kernels that cannot
# run would only slow the first run down. xserv-cli picks the device itself (CUDA when usable,
# else the CPU). Its own build folder: the test command's build/release keeps its tests
# whichever runs first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda=AUTO  # a GPU is usable: build the CUDA backend when nvcc is installed
fi
cmake --preset release -B build/demo -DXSERV_CUDA=$cuda -DXSERV_BUILD_TESTS=OFF \
      -DXSERV_BUILD_BENCH=OFF >/dev/null
cmake --build build/demo -j"$(nproc)" --target xserv-cli
if [ $# -eq 0 ]; then set -- -p "ROMEO:" -n 120 --temperature 0.8 --seed 1; fi
exec build/demo/examples/cli/xserv-cli generate -m examples/models/shakespeare "$@"
