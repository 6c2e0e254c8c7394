#!/bin/bash
# Issues 12 and 10: the one-pass short-context decode attention reading each key's slot from the
# batch's key slots (DeviceBatch::key_slots, 2026-12-07) instead of the row's context length and
# then its block-table entry: one dependent round trip fewer before its K/V copies, in a prologue
# that ncu and the CUPTI traces have exposed at batch 1 (Qwen3-0.6B: it overlaps only the q|k|v's
# ~3 us) and at 16 rows. Against XSERV_CUDA_ATTN_KEY_SLOTS=0 (the lookup as before) in the same
# build, interleaved, one process a figure; beside them the norm GEMVs' early trigger
# (XSERV_CUDA_GEMV_EARLY_TRIGGER=6: bit 2 lets the q|k|v launch the attention before its own wait,
# so the attention's prologue can start under the down_proj), never measured on the 0.6B alone.
# Every [cuda] case first (the tree also has the twenty-eighth session's removals, not yet run on
# a GPU). As a request's run.sh (scripts/device_round.sh) or alone (~9 min with the build):
#   OUT=... bash bench/device/key_slots_round.sh
t0=$(date +%s)
left() { echo $(( t0 + ${BUDGET:-540} - $(date +%s) )); }
run_tests() { tests suite "${SUITE_LIMIT:-200}" "[cuda]"; }
source bench/device/serve_round.sh
grep -E "^(All tests|test cases|assertions)" "$OUT/tests_suite.txt"
b1() {  # variant word, model: batch-1 decode, 128 + 128 tokens
  local n s f; n=$(name "$1"); s=$(settings "$1")
  [ "$(left)" -ge 20 ] || { echo "$(ts) skip b1 $2 $n"; return; }
  f="$OUT/b1_${2}_$n.$(date -u +%H%M%S).txt"
  env $s timeout 40 "$G" --dummy-weights --config "bench/configs/$2.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat 2 >"$f" 2>&1
  echo "$(ts) b1 $2 $n [$s]: $(grep -E '^\| 1 ' "$f" | tr -s ' ')"
}
vb=(slots0:XSERV_CUDA_ATTN_KEY_SLOTS=0 slots et6:XSERV_CUDA_GEMV_EARLY_TRIGGER=6)
vs=(slots0:XSERV_CUDA_ATTN_KEY_SLOTS=0 slots)
for pass in 1 2; do
  echo "== $(ts) pass $pass"
  for v in "${vb[@]}"; do b1 "$v" qwen3-0.6b; done
  for v in "${vb[@]:0:2}"; do b1 "$v" qwen3-1.7b; done
  for v in "${vs[@]}"; do [ "$(left)" -ge 40 ] && sb "$v" qwen3-8b 16; done
  for v in "${vs[@]}"; do [ "$(left)" -ge 20 ] && sb "$v" qwen3-1.7b 16; done
done
echo "== $(ts) all done"
