#!/usr/bin/env bash
# The test command (README, .ci/run): install missing packages, build (CUDA too when nvcc is
# found), run every test, then build and run the tests again under ASan + UBSan.
# Usage: scripts/test.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)

cmake --preset release
cmake --build --preset release -j"$jobs"
ctest --preset release -j"$jobs"

if [ "${1:-}" != "--no-sanitize" ]; then
  # The sanitizer build skips CUDA: device code is not instrumented and the GPU is not here.
  cmake --preset asan
  cmake --build --preset asan -j"$jobs"
  ctest --preset asan -j"$jobs"
fi
echo "scripts/test.sh: all tests passed"
