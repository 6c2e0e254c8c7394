# The shared start of the CUDA round scripts (skinny_round.sh, small_round.sh, small4_round.sh):
# sourced after the request's settings. Builds from scratch into /tmp/b (xserv_cuda_tests,
# generate_bench and ROUND_TARGETS), prints the GPU's clocks, and defines
#   left    seconds left of BUDGET (default ROUND_BUDGET) since this file was sourced
#   ts      the UTC time of day
#   tests   LABEL LIMIT SPEC [ENV=V ...]: [cuda] cases matching SPEC under a time limit (skipped
#           when less time is left), the log in $OUT/tests_LABEL.txt, the verdict and the first
#           failures printed
# and T (the test binary) and G (generate_bench).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
t0=$(date +%s)
left() { echo $(( t0 + ${BUDGET:-${ROUND_BUDGET:-165}} - $(date +%s) )); }
ts() { date -u +%H:%M:%S; }
echo "== $(ts) build"
# shellcheck disable=SC2086  # ROUND_TARGETS is a list of targets
source scripts/device-env.sh && cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF -DXSERV_CUDA_TEST_BINARY=ON >"$OUT/build.txt" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv_cuda_tests generate_bench ${ROUND_TARGETS:-} >>"$OUT/build.txt" 2>&1 ||
  { tail -40 "$OUT/build.txt"; exit 1; }
echo "== $(ts) built ($(( $(date +%s) - t0 )) s)"
T=/tmp/b/tests/cuda/xserv_cuda_tests
G=/tmp/b/bench/generate_bench
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# The test binary may not end on timeout's SIGTERM alone (Catch2 handles the signal to report;
# a call of 2026-12-06 lost its whole remaining time to that), hence -k: SIGKILL 10 s later.
tests() {  # label, timeout, spec, env...
  local label=$1 limit=$2 spec=$3; shift 3
  [ "$(left)" -ge "$limit" ] || { echo "$(ts) skip tests $label: $(left) s left"; return; }
  echo "== $(ts) tests $label: $spec $*"
  env "$@" timeout -k 10 "$limit" "$T" "$spec" >"$OUT/tests_$label.txt" 2>&1
  echo "rc=$? $(grep -E "^(All tests|test cases)" "$OUT/tests_$label.txt" | tail -2 | tr '\n' ' ')"
  grep -B3 -A12 -m3 "FAILED" "$OUT/tests_$label.txt" | head -40
}
