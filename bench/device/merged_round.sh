#!/usr/bin/env bash
# The lead's last call of a session: the merged main, every [cuda] case, then batch-1 decode and
# serving with the session's new defaults off ("before", BEFORE's env settings, serving also at
# BEFORE_MBT tokens a step) and on ("after"), interleaved, one process per figure. Written after
# the fourteenth session's final request (docs/benchmarks.md, "Merged main of the fourteenth
# session"), whose serving "after" runs an unset argument cut. From the repository root, as a
# request's run.sh or alone (~300 s: build ~70, tests <= TESTS_S, decode ~60, serving ~60):
#   BEFORE="XSERV_CUDA_X=0 XSERV_CUDA_Y=0" OUT=... bash bench/device/merged_round.sh
# The [cuda] suite needed more than 160 s by the fifteenth session (31 of its cases ran), so
# TESTS_S defaults to 240. BUDGET (default 330 s) skips the Qwen3-8B serving pair when it would not fit.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BEFORE=${BEFORE:-} BEFORE_MBT=${BEFORE_MBT:-} BUDGET=${BUDGET:-330}
ts() { date -u +%H:%M:%S; }
source scripts/device-env.sh
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DXSERV_BUILD_BENCH=ON \
  -DXSERV_BUILD_EXAMPLES=OFF -DXSERV_CUDA_TEST_BINARY=ON >"$OUT/build.txt" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv_cuda_tests generate_bench serve_bench >>"$OUT/build.txt" 2>&1 ||
  { tail -40 "$OUT/build.txt"; exit 1; }
echo "== $(ts) built in ${SECONDS} s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout -k 10 "${TESTS_S:-240}" /tmp/b/tests/cuda/xserv_cuda_tests "[cuda]" --durations yes >"$OUT/cuda_tests.txt" 2>&1
echo "== $(ts) [cuda] rc=$? $(grep -E '^(All tests|test cases)' "$OUT/cuda_tests.txt" | tr '\n' ' ')"
G=/tmp/b/bench/generate_bench S=/tmp/b/bench/serve_bench
gb() {  # label, env settings, model, repeat
  local f
  f="$OUT/gb_$3_$1.$(date -u +%H%M%S).txt"
  env $2 timeout 40 "$G" --dummy-weights --config "bench/configs/$3.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat "$4" >"$f" 2>&1
  echo "$(ts) $3 $1: $(grep -E '^\| 1 ' "$f" | tail -1 | awk -F'|' '{printf "decode %s tok/s, %s ms a step", $4, $5}' | tr -s ' ')"
}
sb() {  # label, env settings, model, concurrency, extra serve_bench arguments (may be empty)
  local f
  f="$OUT/sb_$3_$1.$(date -u +%H%M%S).txt"
  env $2 timeout 40 "$S" --dummy-weights --config "bench/configs/$3.json" --device cuda --concurrency "$4" ${5:-} \
    >"$f" 2>&1
  echo "$(ts) serve $3 $1: output tok/s $(grep -E '^\| [0-9]' "$f" | awk -F'|' '{printf "%s/", $3}' | tr -d ' ')"
}
mbt=${BEFORE_MBT:+--max-batch-tokens $BEFORE_MBT}
for m in qwen3-0.6b qwen3-1.7b; do
  for round in 1 2; do gb before "$BEFORE" $m 2; gb after "" $m 2; done
done
gb before "$BEFORE" gpt2 2; gb after "" gpt2 2
gb before "$BEFORE" qwen3-8b 1; gb after "" qwen3-8b 1
for round in 1 2; do sb before "$BEFORE" qwen3-1.7b 16,64,128 "$mbt"; sb after "" qwen3-1.7b 16,64,128; done
if [ "$SECONDS" -lt $((BUDGET - 30)) ]; then
  sb before "$BEFORE" qwen3-8b 16,128 "$mbt"; sb after "" qwen3-8b 16,128
else
  echo "$(ts) Qwen3-8B serving skipped at ${SECONDS} s"
fi
echo "== $(ts) done in ${SECONDS} s"
