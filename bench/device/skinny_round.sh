#!/bin/bash
# Issue 10, the 16-row decode step of Qwen3-8B (h/skinny, 2026-12-04): one request of the lead's
# round. Builds into /tmp/b, runs the tests of the changed paths first, then serving variants in
# their own processes, interleaved, then CUPTI traces of a serving run and of batch-1 decode (each
# stage only while the request's time lasts). The request's run.sh sets, before sourcing this:
#   run_tests      a function: calls of `tests LABEL LIMIT SPEC [ENV=V ...]` (first)
#   SERVE          "model:concurrency" words, each run with every variant of VARIANTS
#                  (variant-major: the variants interleave within a model's pass)
#   VARIANTS       "name:ENV=V,ENV=V" words (a name alone: the defaults)
#   PASSES         passes over VARIANTS per SERVE word (default 2, the second in reverse order)
#   REGRESS        "model:concurrencies" words run after the first pass (and again after the last),
#                  interleaved: the first variant of VARIANTS (the defaults) against the variant
#                  with the highest mean output tok/s of the first SERVE word so far
#   TRACES_FIRST   "label:model:concurrency:ENV=V,..." serve_bench runs under the CUPTI tracer, and
#                  "label:model:b1:ENV=V,..." generate_bench batch-1 runs (128 + 32 tokens), after
#                  the tests; TRACES the same after the first pass, TRACES_LAST after all passes
#   GEMM_BENCH     gemm_bench arguments (e.g. "--skinny 1 --models 8b --rows 16"), run after the
#                  tests ("" skips)
#   BUDGET         seconds the whole request may take (default 165)
ROUND_TARGETS="serve_bench gemm_bench xserv_cupti_trace" ROUND_BUDGET=165
source bench/device/cuda_round_common.sh
S=/tmp/b/bench/serve_bench
TRACER=/tmp/b/bench/libxserv_cupti_trace.so
settings() { local v=${1#*:}; [ "$v" = "$1" ] && v=""; echo "${v//,/ }"; }
name() { echo "${1%%:*}"; }
if declare -F run_tests >/dev/null; then run_tests; fi
if [ -n "${GEMM_BENCH:-}" ] && [ "$(left)" -ge 20 ]; then
  echo "== $(ts) gemm_bench ${GEMM_BENCH}"
  timeout 30 /tmp/b/bench/gemm_bench ${GEMM_BENCH} >"$OUT/gemm_bench.txt" 2>&1
  cat "$OUT/gemm_bench.txt"
fi
sb() {  # variant word, model, concurrency, need (seconds)
  [ "$(left)" -ge "$4" ] || { echo "$(ts) skip serve $2 $3 $(name "$1"): $(left) s left"; return; }
  local n s f; n=$(name "$1"); s=$(settings "$1"); f="$OUT/sb_${2}_${3}_$n.$(date -u +%H%M%S).txt"
  env $s timeout 40 "$S" --dummy-weights --config "bench/configs/$2.json" --device cuda --concurrency "$3" >"$f" 2>&1
  echo "$(ts) serve $2 $3 $n [$s]: tok/s $(grep -E '^\| [0-9]' "$f" | awk -F'|' '{printf "%s/", $3}' | tr -d ' ')" \
    "decode-only ms $(grep -oE '[0-9.]+ ms each' "$f" | awk '{printf "%s/", $1}')"
}
trace_runs() {  # trace words
  local w label model conc envs
  for w in "$@"; do
    IFS=: read -r label model conc envs <<<"$w"
    [ "$(left)" -ge 25 ] || { echo "$(ts) skip trace $label: $(left) s left"; continue; }
    echo "== $(ts) trace $label: $model $conc [${envs//,/ }]"
    if [ "$conc" = b1 ]; then
      env ${envs//,/ } CUDA_INJECTION64_PATH=$TRACER XSERV_TRACE_OUT="$OUT/trace_$label.csv" timeout 40 "$G" --dummy-weights \
        --config "bench/configs/$model.json" --device cuda --batch 1 --prompt-len 128 --gen-len 32 --repeat 1 \
        >"$OUT/trace_$label.txt" 2>&1
      python3 scripts/cupti_steps.py "$OUT/trace_$label.csv" --all-steps --top 40 >"$OUT/steps_$label.txt" 2>&1
    else
      env ${envs//,/ } CUDA_INJECTION64_PATH=$TRACER XSERV_TRACE_OUT="$OUT/trace_$label.csv" timeout 40 "$S" --dummy-weights \
        --config "bench/configs/$model.json" --device cuda --concurrency "$conc" >"$OUT/trace_$label.txt" 2>&1
      python3 scripts/cupti_steps.py "$OUT/trace_$label.csv" --top 40 >"$OUT/steps_$label.txt" 2>&1
    fi
    head -60 "$OUT/steps_$label.txt"
    gzip "$OUT/trace_$label.csv"
  done
}
trace_runs ${TRACES_FIRST:-}
best_variant() {  # model, concurrency: the variant word of VARIANTS with the highest mean tok/s
  local v n f x best="" best_tps=0
  for v in ${VARIANTS:-base}; do
    n=$(name "$v")
    x=$(for f in "$OUT"/sb_${1}_${2}_$n.*.txt; do
          [ -f "$f" ] && grep -E '^\| [0-9]' "$f" | head -1 | awk -F'|' '{print $3}'
        done | awk '$1 > 0 {s += $1; c++} END {if (c) printf "%d", s / c; else print 0}')
    if ((x > best_tps)); then best_tps=$x best=$v; fi
  done
  echo "$best"
}
regress() {
  local first=${SERVE%% *} vs base best w
  vs=(${VARIANTS:-base}); base=${vs[0]}
  best=$(best_variant "${first%%:*}" "${first#*:}")
  [ -n "$best" ] && [ "$best" != "$base" ] || { echo "$(ts) regressions: no variant beats $base"; return; }
  echo "== $(ts) regressions: $(name "$base") against $(name "$best") [$(settings "$best")]"
  for w in ${REGRESS:-}; do
    sb "$base" "${w%%:*}" "${w#*:}" 20
    sb "$best" "${w%%:*}" "${w#*:}" 20
  done
}
for w in ${SERVE:-}; do
  model=${w%%:*} conc=${w#*:}
  need=$([ "$model" = qwen3-8b ] && echo 16 || echo 10)
  echo "== $(ts) serving $model, $conc at once (output tok/s)"
  vs=(${VARIANTS:-base})
  for ((pass = 0; pass < ${PASSES:-2}; ++pass)); do
    if ((pass % 2 == 0)); then order=("${vs[@]}"); else order=(); for ((i = ${#vs[@]} - 1; i >= 0; --i)); do order+=("${vs[$i]}"); done; fi
    for v in "${order[@]}"; do sb "$v" "$model" "$conc" "$need"; done
    ((pass == 0)) && trace_runs ${TRACES:-}
    [ "$w" = "${SERVE%% *}" ] && ((pass == 0 || pass == ${PASSES:-2} - 1)) && regress
  done
done
trace_runs ${TRACES_LAST:-}
echo "== $(ts) done ($(( $(date +%s) - t0 )) s)"
