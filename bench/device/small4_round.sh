#!/bin/bash
# Issue 12, batch-1 decode of Qwen3-1.7B towards 900 tok/s (h/small4, 2026-12-04): one request of
# the lead's round. Builds into /tmp/b, runs the tests of the changed paths first, then traces one
# generate_bench run per model under the CUPTI injection library (every kernel of the
# graph-replayed decode steps in launch order: scripts/cupti_steps.py --last-prefill --order),
# then batch-1 decode of each variant in its own process, interleaved, while the time lasts.
# The request's run.sh sets, before sourcing this:
#   run_tests            a function: calls of `tests LABEL LIMIT SPEC [ENV=V ...]` (first)
#   TRACE                "model:variant-word" words traced before the measurements (in order)
#   RUNS                 "model:variant-word" words measured, in order (model: qwen3-0.6b, ...)
#   LATE_TRACE           traces after the measurements, while the time lasts
#   LATE_RUNS            more measurements after those, while the time lasts
#   BUDGET               seconds the whole request may take (default 165)
# A variant word is "name" or "name=ENV=V,ENV=V" (settings after the first '=').
ROUND_TARGETS="xserv_cupti_trace" ROUND_BUDGET=165
source bench/device/cuda_round_common.sh
LIB=$(ls /tmp/b/bench/libxserv_cupti_trace.so 2>/dev/null)
model() { echo "${1%%:*}"; }
vname() { local w=${1#*:}; echo "${w%%=*}"; }
settings() { local w=${1#*:} v; v=${w#*=}; [ "$v" = "$w" ] && v=""; echo "${v//,/ }"; }
trace() {  # "model:variant": one warm-up and one measured run of 128 + 128 under the CUPTI library
  local m n s f; m=$(model "$1"); n=$(vname "$1"); s=$(settings "$1")
  [ "$(left)" -ge 15 ] || { echo "$(ts) skip trace $m $n: $(left) s left"; return; }
  [ -n "$LIB" ] || { echo "no libxserv_cupti_trace.so"; return; }
  f="$OUT/trace_${m}_$n"
  echo "== $(ts) trace $m $n [$s]"
  env $s CUDA_INJECTION64_PATH="$LIB" XSERV_TRACE_OUT="$f.csv" timeout 40 "$G" --dummy-weights \
    --config "bench/configs/$m.json" --device cuda --batch 1 --prompt-len 128 --gen-len 128 --repeat 1 >"$f.gb.txt" 2>&1
  echo "rc=$? $(grep -E '^\| 1 ' "$f.gb.txt" | awk -F'|' '{printf "decode %s tok/s (traced)", $4}' | tr -s ' ')"
  timeout 30 python3 scripts/cupti_steps.py "$f.csv" --last-prefill --order --top 40 >"$f.txt" 2>&1
  grep -A4 '^run:' "$f.txt" | head -5; grep -A40 'ends. advance summed' "$f.txt" | head -30
  gzip -f "$f.csv"
}
gb() {  # "model:variant"
  local m n s f need=10; m=$(model "$1"); n=$(vname "$1"); s=$(settings "$1")
  case $m in qwen3-8b) need=24 ;; gpt2|qwen3-0.6b) need=8 ;; esac
  [ "$(left)" -ge "$need" ] || { echo "$(ts) skip $m $n: $(left) s left"; return; }
  local rep=2; [ "$m" = qwen3-8b ] && rep=1
  f="$OUT/gb_${m}_$n.$(date -u +%H%M%S).txt"
  env $s timeout 40 "$G" --dummy-weights --config "bench/configs/$m.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat "$rep" >"$f" 2>&1
  echo "$(ts) $m $n [$s]: $(grep -E '^\| 1 ' "$f" | awk -F'|' '{printf "decode %s tok/s, %s ms/step", $4, $5}' | tr -s ' ')"
}
if declare -F run_tests >/dev/null; then run_tests; fi
for w in ${TRACE:-}; do trace "$w"; done
echo "== $(ts) batch 1, 128 + 128, one process a figure"
for w in ${RUNS:-}; do gb "$w"; done
for w in ${LATE_TRACE:-}; do trace "$w"; done
for w in ${LATE_RUNS:-}; do gb "$w"; done
echo "== $(ts) done ($(( $(date +%s) - t0 )) s)"
