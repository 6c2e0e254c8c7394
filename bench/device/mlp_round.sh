#!/usr/bin/env bash
# Issue 12: a batch-1 layer's whole SwiGLU MLP as one kernel of thread-block clusters
# (XSERV_CUDA_FUSED_MLP=1, cuda/mlp.cu, 2026-12-08) against the separate GEMVs (o_proj + gate|up,
# down_proj + q|k|v), in one build, interleaved, one process a figure. Tests first (the kernel
# against the CPU backend; a Qwen3 of 0.6B's layer shape against the separate GEMVs, graph
# replays equal to eager steps), then batch-1 decode 128 + 128 of Qwen3-1.7B, 0.6B and 8B (and the
# kernel with 4 slots a warp), the model and engine cases with the kernel on, then a CUPTI trace of
# the 1.7B layer in both forms.
# As a request's run.sh (scripts/device_round.sh) or alone (~4-5 min with the build):
#   OUT=... [BUDGET=300] bash bench/device/mlp_round.sh
set -uo pipefail
ROUND_TARGETS=xserv_cupti_trace
BUDGET=${BUDGET:-300}
source bench/device/cuda_round_common.sh
tests op 60 "cuda rms_norm_mlp*,cuda: Qwen3 batch-1 decode with the MLP*"
b1() {  # label, env settings (space-separated), model
  local f="$OUT/b1_${3}_$1.$(date -u +%H%M%S).txt"
  [ "$(left)" -ge 25 ] || { echo "$(ts) skip b1 $3 $1"; return; }
  # shellcheck disable=SC2086  # $2 is a list of settings
  env $2 timeout 40 "$G" --dummy-weights --config "bench/configs/$3.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat 2 >"$f" 2>&1
  echo "$(ts) b1 $3 $1: $(grep -E '^\| 1 ' "$f" | tail -1 | awk -F'|' '{printf "decode %s tok/s, %s ms a step", $4, $5}' | tr -s ' ')"
}
for pass in 1 2; do
  for m in qwen3-1.7b qwen3-0.6b qwen3-8b; do
    b1 sep XSERV_CUDA_FUSED_MLP=0 $m; b1 mlp XSERV_CUDA_FUSED_MLP=1 $m
    [ $m = qwen3-8b ] || b1 mlp4 "XSERV_CUDA_FUSED_MLP=1 XSERV_CUDA_FUSED_MLP_STAGES=4" $m
  done
done
tests models_fused 80 "cuda: *,cuda engine*" XSERV_CUDA_FUSED_MLP=1
LIB=/tmp/b/bench/libxserv_cupti_trace.so
for v in 0 1; do
  [ "$(left)" -ge 40 ] && [ -f "$LIB" ] || { echo "$(ts) skip trace $v"; continue; }
  f="$OUT/trace_1.7b_mlp$v"
  XSERV_CUDA_FUSED_MLP=$v CUDA_INJECTION64_PATH="$LIB" XSERV_TRACE_OUT="$f.csv" timeout 40 "$G" --dummy-weights \
    --config bench/configs/qwen3-1.7b.json --device cuda --batch 1 --prompt-len 128 --gen-len 128 --repeat 1 >"$f.gb.txt" 2>&1
  timeout 30 python3 scripts/cupti_steps.py "$f.csv" --last-prefill --order --top 40 >"$f.txt" 2>&1
  echo "$(ts) trace mlp=$v: $(grep -E '^\| 1 ' "$f.gb.txt" | tr -s ' ')"; gzip -f "$f.csv"
done
echo "== $(ts) done, $(left) s of the budget left"
