#!/bin/bash
# Issues 12 and 10: the one-pass short-context decode attention's lean copies
# (XSERV_CUDA_ATTN_LEAN_COPIES=1, 2026-12-07, not yet run on a GPU when written) against the
# default copies, in one build, interleaved, one process a figure, two passes. ncu of 2026-12-07
# (docs/benchmarks.md, "The new default on a third lease, traced; the batch-1 one-pass attention
# under ncu") counted ~745 instructions a warp before the copies were all issued, ~34 a copy; the
# lean form compiles to ~17 a copy (static SASS of the head_dim-128 kernel 5240 -> 4680). Where it
# should show: Qwen3-0.6B batch 1 (the attention is 7.8 of a layer's 20.9 us of critical path on
# an H100) and Qwen3-8B 16 at once (the attention's blocks start only as the q|k|v GEMM's leave,
# so its whole prologue is exposed). CUPTI traces of the batch-1 layer of both forms (0.6B, 1.7B). Tests first (the one-pass kernel's exact cases hold the lean
# form bit for bit; the model cases under it), then the figures, then ncu of both forms at batch 1.
# Ran on an H100 on 2026-12-07 (docs/benchmarks.md, "The one-pass attention's lean copies"): the
# lean copies won and are the kernel's only form since, so the variable is gone and both variants
# of this script now run the same code; it stays as the record of that round.
# As a request's run.sh (scripts/device_round.sh) or alone (~6 min with the build):
#   OUT=... bash bench/device/lean_round.sh
t0=$(date +%s)
left() { echo $(( t0 + ${BUDGET:-420} - $(date +%s) )); }
run_tests() {
  tests attn 60 "cuda decode attention: the one-pass*,cuda qk_attention*"
  tests models_lean 45 "cuda: *,cuda engine*" XSERV_CUDA_ATTN_LEAN_COPIES=1
}
ROUND_EXTRA_TARGETS=xserv_cupti_trace
source bench/device/serve_round.sh
LIB=/tmp/b/bench/libxserv_cupti_trace.so
trace() {  # variant word, model: one batch-1 run of 128 + 128 under the CUPTI library, the layer in launch order
  local n s f; n=$(name "$1"); s=$(settings "$1")
  [ "$(left)" -ge 45 ] && [ -f "$LIB" ] || { echo "$(ts) skip trace $2 $n"; return; }
  f="$OUT/trace_${2}_$n"
  env $s CUDA_INJECTION64_PATH="$LIB" XSERV_TRACE_OUT="$f.csv" timeout 40 "$G" --dummy-weights \
    --config "bench/configs/$2.json" --device cuda --batch 1 --prompt-len 128 --gen-len 128 --repeat 1 >"$f.gb.txt" 2>&1
  timeout 30 python3 scripts/cupti_steps.py "$f.csv" --last-prefill --order --top 40 >"$f.txt" 2>&1
  echo "$(ts) trace $2 $n: $(grep -E '^\| 1 ' "$f.gb.txt" | tr -s ' ')"; gzip -f "$f.csv"
}
b1() {  # variant word, model: batch-1 decode, 128 + 128 tokens
  local n s f; n=$(name "$1"); s=$(settings "$1")
  [ "$(left)" -ge 20 ] || { echo "$(ts) skip b1 $2 $n"; return; }
  f="$OUT/b1_${2}_$n.$(date -u +%H%M%S).txt"
  env $s timeout 40 "$G" --dummy-weights --config "bench/configs/$2.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat 2 >"$f" 2>&1
  echo "$(ts) b1 $2 $n [$s]: $(grep -E '^\| 1 ' "$f" | tr -s ' ')"
}
v=(base lean:XSERV_CUDA_ATTN_LEAN_COPIES=1)
pass() {
  echo "== $(ts) pass $1"
  for m in qwen3-0.6b qwen3-1.7b qwen3-8b; do for w in "${v[@]}"; do b1 "$w" $m; done; done
  for w in "${v[@]}"; do [ "$(left)" -ge 40 ] && sb "$w" qwen3-8b 16; done
  [ "$1" = 1 ] || for w in "${v[@]}"; do [ "$(left)" -ge 20 ] && sb "$w" qwen3-1.7b 16; done
}
pass 1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
# The full set with per-instruction stall samples (the SASS page as CSV): the post-wait chain's
# time by region (load of the q/k/v row, transform, scores, softmax, P.V, combine).
for w in "${v[@]}"; do
  [ "$(left)" -ge 50 ] || break
  n=$(name "$w"); s=$(settings "$w")
  env $s XSERV_CUDA_PROFILE_REPLAY=3 timeout 120 "$NCU" --clock-control none --cache-control none --profile-from-start off \
    -k "regex:attention_decode_short" -c 1 --set full --import-source yes -o "$OUT/ncu_$n" \
    "$G" --dummy-weights --device cuda --repeat 1 --config bench/configs/qwen3-0.6b.json --batch 1 --prompt-len 128 \
    --gen-len 8 >"$OUT/ncu_$n.log" 2>&1
  "$NCU" -i "$OUT/ncu_$n.ncu-rep" --page details --print-details all >"$OUT/ncu_$n.txt" 2>&1
  "$NCU" -i "$OUT/ncu_$n.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_${n}_sass.csv" 2>&1
  gzip -f "$OUT/ncu_${n}_sass.csv"; rm -f "$OUT/ncu_$n.ncu-rep"
  echo "$(ts) ncu $n: $(grep -E '^\s+(Duration|Executed Instructions |Warp Cycles Per Issued)' "$OUT/ncu_$n.txt" | tr -s ' ' | tr '\n' ';')"
done
# The current defaults' batch-1 layer (the early trigger's default changed since the last H200
# profile) and the lean form's, for the attention's share of the critical path.
for m in qwen3-1.7b qwen3-0.6b; do for w in "${v[@]}"; do trace "$w" $m; done; done
pass 2
echo "== $(ts) all done"
