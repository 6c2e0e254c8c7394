#!/bin/bash
# Issue 10 (and 12's long contexts): the decode attention on bulk copies (XSERV_CUDA_ATTN_BULK=1,
# twenty-first session, 2026-12-06) against its cp.async forms, on one GPU. Written for the
# session's device round, which never found a machine (every start refused): nothing of it has
# run on a GPU yet. From the repository root, as a request's run.sh (scripts/device_round.sh) or
# alone (~420 s with the [cuda] suite cut to what is left):
#   OUT=... BUDGET=420 bash bench/device/bulk_attn_round.sh
# Builds into /tmp/b; runs the form's test (bulk against the cp.async forms bit for bit and the
# CPU) first, then base / bulk interleaved, one process a figure: Qwen3-1.7B decode steps at 64 and
# 128 rows (the one-kv-head-a-warp form), Qwen3-8B decode after 16384 tokens and Qwen3-1.7B after
# 4096 (the block kernel, split keys), serving Qwen3-1.7B 64 / 128 at once; a second pass of the
# steps and serving; then every [cuda] case in what is left of BUDGET.
ROUND_TARGETS="serve_bench" ROUND_BUDGET=420
source bench/device/cuda_round_common.sh
S=/tmp/b/bench/serve_bench
tests bulk 75 "cuda decode attention on bulk*"
settings() { local v=${1#*:}; echo "${v//,/ }"; }
V="base: bulk:XSERV_CUDA_ATTN_BULK=1"
steps() {  # pass
  local v n s f
  for v in $V; do
    n=${v%%:*}; s=$(settings "$v"); f="$OUT/steps17_${n}_$1.txt"
    [ "$(left)" -ge 15 ] || { echo "$(ts) skip steps $n"; continue; }
    env $s timeout 30 "$G" --dummy-weights --config bench/configs/qwen3-1.7b.json --device cuda --batch 64,128 \
      --prompt-len 128 --gen-len 32 --repeat 1 >"$f" 2>&1
    echo "$(ts) 1.7B decode $n: $(grep -E '^\| (64|128) ' "$f" | awk -F'|' '{printf "%s rows %s tok/s %s ms; ", $2, $4, $5}' | tr -s ' ')"
  done
}
long() {  # model, prompt tokens, generated tokens
  local v n s f
  for v in $V; do
    n=${v%%:*}; s=$(settings "$v"); f="$OUT/long_$1_${n}.txt"
    [ "$(left)" -ge 35 ] || { echo "$(ts) skip $1 after $2 $n"; continue; }
    env $s timeout 45 "$G" --dummy-weights --config "bench/configs/$1.json" --device cuda --prompt-len "$2" \
      --gen-len "$3" --batch 1 --repeat 1 >"$f" 2>&1
    echo "$(ts) $1 after $2 tokens $n: $(grep -E '^\| 1 ' "$f" | tr -s ' ')"
  done
}
serve() {  # pass
  local v n s f
  for v in $V; do
    n=${v%%:*}; s=$(settings "$v"); f="$OUT/serve17_${n}_$1.txt"
    [ "$(left)" -ge 30 ] || { echo "$(ts) skip serve $n"; continue; }
    env $s timeout 40 "$S" --dummy-weights --config bench/configs/qwen3-1.7b.json --device cuda --concurrency 64,128 >"$f" 2>&1
    echo "$(ts) serve 1.7B 64,128 $n: tok/s $(grep -E '^\| [0-9]' "$f" | awk -F'|' '{printf "%s/", $3}' | tr -d ' ')" \
      "decode-only ms $(grep -oE '[0-9.]+ ms each' "$f" | awk '{printf "%s/", $1}')"
  done
}
steps 1; long qwen3-8b 16384 32; long qwen3-1.7b 4096 64; serve 1; steps 2; serve 2
[ "$(left)" -gt 60 ] && tests all $(( $(left) - 15 )) "[cuda]"
echo "== $(ts) done"
