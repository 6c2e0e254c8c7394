#!/usr/bin/env bash
# The test command (README, .ci/run): install missing packages, build (CUDA too when nvcc is
# found), run every test, then build and run the tests again under ASan + UBSan, the thread
# tests under ThreadSanitizer (the tsan preset registers the [threads] Catch2 cases and the
# tests labelled "threads"), and each libFuzzer target briefly on its corpus (scripts/fuzz.sh).
# Then the README's main command (scripts/run-demo.sh) must generate text.
# Each stage prints how many tests it ran; a stage that ran none fails, and so does a build whose
# ctest list misses a test case of the Catch2 binary (tests/check_test_count.py runs as a test).
# Usage: scripts/test.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
summary=()

# run_stage PRESET [TARGET...]: configure (tests and benchmarks on, whatever an earlier configure
# of the same build folder chose, e.g. scripts/run-demo.sh), build (only TARGETs when given: the
# tests the preset's ctest filter selects), run ctest, record the totals.
run_stage() {
  local preset=$1 log
  shift
  log=$(mktemp)
  cmake --preset "$preset" -DXSERV_BUILD_TESTS=ON -DXSERV_BUILD_EXAMPLES=ON
  if [ $# -gt 0 ]; then
    cmake --build --preset "$preset" -j"$jobs" --target "$@"
  else
    cmake --build --preset "$preset" -j"$jobs"
  fi
  local listed
  listed=$(ctest --preset "$preset" -N | sed -n 's/^Total Tests: *//p')
  if ! ctest --preset "$preset" -j"$jobs" --no-tests=error 2>&1 | tee "$log"; then
    summary+=("$preset: FAILED ($(grep -Eo '[0-9]+ tests failed out of [0-9]+' "$log" || echo 'see above'))")
    printf 'scripts/test.sh: %s\n' "${summary[@]}"
    exit 1
  fi
  local ran
  ran=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  rm -f "$log"
  if [ -z "$ran" ] || [ "$ran" -eq 0 ] || [ "$ran" != "$listed" ]; then
    echo "scripts/test.sh: stage $preset ran ${ran:-no} tests of ${listed:-?} listed" >&2
    exit 1
  fi
  summary+=("$preset: $ran/$listed tests passed")
}

run_stage release
# The README's main command, as written (its unity build, its default model): text must come out.
demo_out=$(scripts/run-demo.sh -p "ROMEO:" -n 24 --seed 1)
if [ "$(printf '%s' "$demo_out" | wc -w)" -lt 5 ]; then
  echo "scripts/test.sh: scripts/run-demo.sh printed no text: '$demo_out'" >&2
  exit 1
fi
summary+=("demo: scripts/run-demo.sh generated $(printf '%s' "$demo_out" | wc -w) words")
# The Debian packages built, installed with apt, used and removed (as root only, as in CI).
pkg_log=$(mktemp)
scripts/test-packages.sh | tee "$pkg_log"
summary+=("packages: $(tail -1 "$pkg_log")")
if [ "${1:-}" != "--no-sanitize" ]; then
  # The sanitizer builds skip CUDA: device code is not instrumented and the GPU is not here.
  run_stage asan
  # ThreadSanitizer over what its ctest preset selects (label "threads").
  run_stage tsan xserv_tests capi_threads_test
  # 7 targets x 20 s, plus the clang build.
  fuzz_log=$(mktemp)
  if ! scripts/fuzz.sh ci 20 2>&1 | tee "$fuzz_log"; then
    summary+=("fuzz: FAILED")
    printf 'scripts/test.sh: %s\n' "${summary[@]}"
    exit 1
  fi
  summary+=("fuzz: $(grep -c '^fuzz .* ok:' "$fuzz_log") targets clean")
  rm -f "$fuzz_log"
fi
printf 'scripts/test.sh: %s\n' "${summary[@]}"
echo "scripts/test.sh: all tests passed"
