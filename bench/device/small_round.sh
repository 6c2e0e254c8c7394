#!/bin/bash
# Issue 12, batch-1 decode of the small Qwen3 models (h/small, 2026-12-04): one request of the
# lead's round. Builds into /tmp/b, runs the tests of the changed paths first, then batch-1
# decode of each variant in its own process, interleaved (Qwen3-0.6B, 1.7B, then 8B and GPT-2 for
# regressions), late tests, then a per-kernel ncu of one graph-replayed step and the whole graph's
# span, each stage only while the request's time lasts (a test only with its whole limit left).
# The request's run.sh sets, before sourcing this:
#   run_tests            a function: calls of `tests LABEL LIMIT SPEC [ENV=V ...]` (first)
#   run_late_tests       the same, after the measurements, while the time lasts (optional)
#   V_06 V_17 V_8 V_G2   "name:ENV=V,ENV=V" words (Qwen3-0.6B, 1.7B, 8B, GPT-2), run in order
#   NCU_VARIANT          the variant whose step ncu profiles ("" skips)
#   BUDGET               seconds the whole request may take (default 190)
ROUND_TARGETS="" ROUND_BUDGET=190
source bench/device/cuda_round_common.sh
settings() { local v=${1#*:}; [ "$v" = "$1" ] && v=""; echo "${v//,/ }"; }
name() { echo "${1%%:*}"; }
if declare -F run_tests >/dev/null; then run_tests; fi
gb() {  # variant word, model, repeat, need (seconds)
  [ "$(left)" -ge "$4" ] || { echo "$(ts) skip $2 $(name "$1"): $(left) s left"; return; }
  local n s f; n=$(name "$1"); s=$(settings "$1"); f="$OUT/gb_${2}_$n.$(date -u +%H%M%S).txt"
  env $s timeout 40 "$G" --dummy-weights --config "bench/configs/$2.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat "$3" >"$f" 2>&1
  echo "$(ts) $2 $n [$s]: $(grep -E '^\| 1 ' "$f" | awk -F'|' '{printf "decode %s tok/s, %s ms/step", $4, $5}' | tr -s ' ')"
}
ncu_step() {  # model, variant word, need: the kernels of one graph-replayed decode step
  [ "$(left)" -ge "$3" ] || { echo "$(ts) skip ncu $1: $(left) s left"; return; }
  local s; s=$(settings "$2")
  echo "== $(ts) ncu: one graph-replayed decode step of $1, $(name "$2") [$s]"
  env XSERV_CUDA_PROFILE_REPLAY=3 $s timeout 60 ncu --clock-control none --cache-control none --profile-from-start off \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv "$G" --dummy-weights --config "bench/configs/$1.json" \
    --device cuda --batch 1 --prompt-len 128 --gen-len 12 --repeat 1 >"$OUT/ncu_$1.csv" 2>&1
  python3 scripts/ncu_kinds.py "$OUT/ncu_$1.csv" 2>&1 | tee "$OUT/ncu_$1_kinds.txt" | head -40
}
ncu_graph() {  # model, variant word, need: the same step as one workload (the graph's span on the
  # GPU with PDL overlapping its kernels), next to the sampling kernels outside it
  [ "$(left)" -ge "$3" ] || { echo "$(ts) skip ncu graph $1: $(left) s left"; return; }
  local s; s=$(settings "$2")
  echo "== $(ts) ncu: the graph of one decode step of $1 as one workload, $(name "$2") [$s]"
  env XSERV_CUDA_PROFILE_REPLAY=3 $s timeout 40 ncu --clock-control none --cache-control none --profile-from-start off \
    --graph-profiling graph --metrics gpu__time_duration.sum --csv "$G" --dummy-weights --config "bench/configs/$1.json" \
    --device cuda --batch 1 --prompt-len 128 --gen-len 12 --repeat 1 >"$OUT/ncu_graph_$1.csv" 2>&1
  python3 - "$OUT/ncu_graph_$1.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
if not rows:
    sys.exit("no ncu rows")
ix = {h: i for i, h in enumerate(rows[0])}
for r in rows[1:]:
    if r[ix["Metric Name"]] == "gpu__time_duration.sum":
        print(f'{r[ix["Kernel Name"]][:70]:70s} {r[ix["Metric Value"]]:>12s} {r[ix["Metric Unit"]]}')
PY
}
echo "== $(ts) Qwen3-0.6B, batch 1, 128 + 128"
for v in ${V_06:-}; do gb "$v" qwen3-0.6b 3 8; done
echo "== $(ts) Qwen3-1.7B, batch 1, 128 + 128"
for v in ${V_17:-}; do gb "$v" qwen3-1.7b 3 10; done
echo "== $(ts) Qwen3-8B, batch 1"
for v in ${V_8:-}; do gb "$v" qwen3-8b 2 20; done
echo "== $(ts) GPT-2, batch 1"
for v in ${V_G2:-}; do gb "$v" gpt2 3 6; done
# Tests the request already ran on an earlier round, again while the time lasts (run_late_tests).
if declare -F run_late_tests >/dev/null; then run_late_tests; fi
[ -n "${NCU_VARIANT:-}" ] && ncu_step qwen3-0.6b "$NCU_VARIANT" 30
[ -n "${NCU_VARIANT:-}" ] && ncu_graph qwen3-0.6b "$NCU_VARIANT" 20
[ -n "${NCU_VARIANT:-}" ] && ncu_step qwen3-1.7b "$NCU_VARIANT" 30
echo "== $(ts) done ($(( $(date +%s) - t0 )) s)"
