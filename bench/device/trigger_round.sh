#!/bin/bash
# Issue 12 (batch-1 decode of the small models): the early triggers after the norm GEMVs' one
# (XSERV_CUDA_GEMV_EARLY_TRIGGER=6, the default since 2026-12-07: Qwen3-0.6B +3.3%, GPT-2 +2.6%
# on an H100). Variants, interleaved, one process a figure, two passes:
#   et7  XSERV_CUDA_GEMV_EARLY_TRIGGER=7: the bulk GEMVs too (o_proj, down_proj: the next layer's
#        q|k|v launches under the down_proj's wait; alone, in 2026-12-04, GPT-2 lost 3.4%)
#   at1  XSERV_CUDA_ATTN_EARLY_TRIGGER=1: the decode attention lets the o_proj launch first thing,
#        so its blocks fill their weight rings under the attention's prologue
# Tests first: the attention and GEMV-chain cases, and the model cases (HF fixtures, graph
# replays against eager steps, the engine's equalities) under both switches.
# As a request's run.sh (scripts/device_round.sh) or alone (~5 min with the build):
#   OUT=... bash bench/device/trigger_round.sh
t0=$(date +%s)
left() { echo $(( t0 + ${BUDGET:-420} - $(date +%s) )); }
run_tests() {
  tests units 90 "cuda decode attention*,cuda one-row GEMV chains*,cuda qk_attention*,cuda qk_transform_store and paged*"
  tests models_at1 60 "cuda: *,cuda engine*" XSERV_CUDA_ATTN_EARLY_TRIGGER=1
  tests models_et7 60 "cuda: *,cuda engine*" XSERV_CUDA_GEMV_EARLY_TRIGGER=7 XSERV_CUDA_ATTN_EARLY_TRIGGER=1
}
source bench/device/serve_round.sh
b1() {  # variant word, model: batch-1 decode, 128 + 128 tokens
  local n s f; n=$(name "$1"); s=$(settings "$1")
  [ "$(left)" -ge 20 ] || { echo "$(ts) skip b1 $2 $n"; return; }
  f="$OUT/b1_${2}_$n.$(date -u +%H%M%S).txt"
  env $s timeout 40 "$G" --dummy-weights --config "bench/configs/$2.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat 2 >"$f" 2>&1
  echo "$(ts) b1 $2 $n [$s]: $(grep -E '^\| 1 ' "$f" | tr -s ' ')"
}
vb=(base et7:XSERV_CUDA_GEMV_EARLY_TRIGGER=7 at1:XSERV_CUDA_ATTN_EARLY_TRIGGER=1
    both:XSERV_CUDA_GEMV_EARLY_TRIGGER=7,XSERV_CUDA_ATTN_EARLY_TRIGGER=1)
vs=(base at1:XSERV_CUDA_ATTN_EARLY_TRIGGER=1)
for pass in 1 2; do
  echo "== $(ts) pass $pass"
  for m in qwen3-0.6b gpt2 qwen3-1.7b qwen3-8b; do for v in "${vb[@]}"; do b1 "$v" $m; done; done
  for v in "${vs[@]}"; do [ "$(left)" -ge 40 ] && sb "$v" qwen3-8b 16; done
  for v in "${vs[@]}"; do [ "$(left)" -ge 20 ] && sb "$v" qwen3-1.7b 16; done
done
echo "== $(ts) all done"
