#!/bin/bash
# Issue 10, batched decode (h/serve, 2026-12-03): one request of the lead's round. Builds from
# scratch into /tmp/b, runs the tests of the new paths, then Qwen3-1.7B decode steps
# (generate_bench) and serving (serve_bench) with each variant in its own process, interleaved,
# and Qwen3-8B serving if time is left. Sourced by a request's run.sh, which may define
# run_tests (calls of `tests LABEL LIMIT SPEC [ENV=V ...]`) and sets the variants:
# "name:ENV=V,ENV=V" words in GB_VARIANTS / SERVE_VARIANTS / SERVE8_VARIANTS (run in that order;
# a name alone runs the defaults). In a serving variant MBT=N is serve_bench's --max-batch-tokens
# (unset: serve_bench's default, 16384 since 2026-12-04; 2048 before). ROUND_EXTRA_TARGETS: more
# targets to build (e.g. xserv_cupti_trace).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
ts() { date -u +%H:%M:%S; }
echo "== $(ts) build"
[ "${SKIP_BUILD:-0}" = 1 ] || { source scripts/device-env.sh && cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DXSERV_BUILD_BENCH=ON \
  -DXSERV_BUILD_EXAMPLES=OFF -DXSERV_CUDA_TEST_BINARY=ON >"$OUT/build.txt" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv_cuda_tests generate_bench serve_bench ${ROUND_EXTRA_TARGETS:-} >>"$OUT/build.txt" 2>&1 ||
  { tail -40 "$OUT/build.txt"; exit 1; }; }
T=${T:-/tmp/b/tests/cuda/xserv_cuda_tests}
G=${G:-/tmp/b/bench/generate_bench}
S=${S:-/tmp/b/bench/serve_bench}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# "a:X=1,Y=2" -> env settings of variant a
settings() { local v=${1#*:}; [ "$v" = "$1" ] && v=""; echo "${v//,/ }"; }
name() { echo "${1%%:*}"; }
tests() {  # label, timeout, spec, env...
  local label=$1 limit=$2 spec=$3; shift 3
  echo "== $(ts) tests $label: $spec $*"
  env "$@" timeout -k 10 "$limit" "$T" "$spec" >"$OUT/tests_$label.txt" 2>&1
  echo "rc=$? $(grep -E "^(All tests|test cases)" "$OUT/tests_$label.txt" | tail -2 | tr '\n' ' ')"
}
# The request defines run_tests (calls of `tests LABEL LIMIT SPEC [ENV=V...]`) before sourcing.
if declare -F run_tests >/dev/null; then run_tests; fi
gb() {  # variant word, model
  local n s; n=$(name "$1"); s=$(settings "$1")
  env $s timeout 30 "$G" --dummy-weights --config "bench/configs/$2.json" --device cuda --batch ${GB_BATCH:-16,64,128} \
    --prompt-len 128 --gen-len 32 --repeat 1 >"$OUT/gb_${2}_$n.$(date -u +%H%M%S).txt" 2>&1
  echo "$(ts) gb $2 $n [$s]: ms/step $(grep -hE '^\| [0-9]' "$OUT"/gb_${2}_$n.*.txt | tail -3 | awk -F'|' '{printf "%s/", $5}' | tr -d ' ')"
}
sb() {  # variant word, model, concurrency
  local n s kv mbt=(); n=$(name "$1"); s=$(settings "$1")
  for kv in $s; do case $kv in MBT=*) mbt=(--max-batch-tokens "${kv#MBT=}") ;; esac; done
  env $s timeout 40 "$S" --dummy-weights --config "bench/configs/$2.json" --device cuda --concurrency "$3" \
    ${mbt[@]+"${mbt[@]}"} >"$OUT/sb_${2}_$n.$(date -u +%H%M%S).txt" 2>&1
  local f; f=$(ls -t "$OUT"/sb_${2}_$n.*.txt | head -1)
  echo "$(ts) serve $2 $n [$s]: tok/s $(grep -E '^\| [0-9]' "$f" | awk -F'|' '{printf "%s/", $3}' | tr -d ' ')" \
    "decode-only ms $(grep -oE '[0-9.]+ ms each' "$f" | awk '{printf "%s/", $1}')"
}
echo "== $(ts) qwen3-1.7b decode steps (generate_bench, 16/64/128 rows, ms a step)"
for v in ${GB_VARIANTS:-}; do gb "$v" qwen3-1.7b; done
echo "== $(ts) qwen3-1.7b serving 16/64/128 at once (output tok/s)"
for v in ${SERVE_VARIANTS:-}; do sb "$v" qwen3-1.7b 16,64,128; done
echo "== $(ts) qwen3-8b serving 16/128 at once"
for v in ${SERVE8_VARIANTS:-}; do sb "$v" qwen3-8b 16,128; done
echo "== $(ts) done"
