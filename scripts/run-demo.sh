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
scripts/install-deps.sh >&2  # progress on stderr: stdout is the generated text alone

cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda=AUTO  # a GPU is usable: build the CUDA backend when nvcc is installed
fi
# Without CUDA the compile time is the first run's time: a unity build (ten sources per
# translation unit, so simdjson, fmt and the standard headers are parsed a few times, not ~45)
# and Ninja (which compiles xserv-cli's sources while the library's still build) take it from
# 85 s to about 40 s on an idle 2-core machine. scripts/test.sh runs this script, so the unity
# build stays clean.
unity=ON
if [ "$cuda" != OFF ]; then unity=OFF; fi
generator=()
if [ ! -f build/demo/CMakeCache.txt ] && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)  # a folder configured earlier keeps its generator
fi
cmake --preset release -B build/demo "${generator[@]}" -DXSERV_CUDA=$cuda \
      -DXSERV_BUILD_TESTS=OFF -DXSERV_BUILD_BENCH=OFF \
      -DCMAKE_UNITY_BUILD=$unity -DCMAKE_UNITY_BUILD_BATCH_SIZE=10 >/dev/null
cmake --build build/demo -j"$(nproc)" --target xserv-cli >&2
if [ $# -eq 0 ]; then set -- -p "ROMEO:" -n 120 --temperature 0.8 --seed 1; fi
exec build/demo/examples/cli/xserv-cli generate -m examples/models/shakespeare "$@"
