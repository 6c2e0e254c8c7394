#!/bin/bash
# Issue 10, serving 64-128 at once: the warpgroup MMA GEMM (cuda/gemm_wgmma.cu) with a deep ring
# (one block an SM, 7-11 stages in flight: XSERV_CUDA_WGMMA_DEEP) against its two-blocks-an-SM
# ring and cuBLASLt (~6 min with the build). As a request's run.sh (scripts/device_round.sh) or
# alone: OUT=... bash bench/device/wgmma_deep_round.sh
# 1. The kernel's tests with the deep ring forced on and off.
# 2. gemm_bench --wgmma 1 on Qwen3-1.7B / 8B at 16, 64 and 128 rows, the ring forced each way.
# 3. serve_bench 1.7B 64/128 and 8B 64 at once: cuBLASLt (the default) against
#    XSERV_CUDA_WGMMA_ROWS=128 with the deep ring where it fits (auto) and without, interleaved;
#    8B 16 at once: the skinny kernel (the default) against the wgmma kernel from 9 rows.
ROUND_TARGETS="gemm_bench serve_bench" ROUND_BUDGET=${ROUND_BUDGET:-420}
source bench/device/cuda_round_common.sh
tests deep 90 "cuda wgmma gemm*" XSERV_CUDA_WGMMA_DEEP=1
tests shallow 90 "cuda wgmma gemm*" XSERV_CUDA_WGMMA_DEEP=0
grep -A3 "probe:" "$OUT"/tests_deep.txt | head -20
for d in 0 1; do
  echo "== $(ts) gemm_bench --wgmma 1, XSERV_CUDA_WGMMA_DEEP=$d"
  XSERV_CUDA_WGMMA_DEEP=$d timeout 100 /tmp/b/bench/gemm_bench --wgmma 1 --models 1.7b,8b --rows 16,64,128 \
    >"$OUT/gemm_deep$d.txt" 2>&1
  grep -E "^\| (model|1.7b|8b)" "$OUT/gemm_deep$d.txt"
done
S=/tmp/b/bench/serve_bench
sb() {  # label, env, model, concurrency
  [ "$(left)" -ge 30 ] || { echo "$(ts) skip serve $1 $3: $(left) s left"; return; }
  local f="$OUT/sb_$3_$1.$(date -u +%H%M%S%N).txt"
  env $2 timeout 40 $S --dummy-weights --config "bench/configs/$3.json" --device cuda --concurrency "$4" >"$f" 2>&1
  echo "$(ts) serve $3 $1 [$2]: tok/s $(grep -E '^\| [0-9]' "$f" | awk -F'|' '{printf "%s/", $3}' | tr -d ' ')" \
    "decode-only ms $(grep -oE '[0-9.]+ ms each' "$f" | awk '{printf "%s/", $1}')"
}
v=("base|" "deep|XSERV_CUDA_WGMMA_ROWS=128" "shallow|XSERV_CUDA_WGMMA_ROWS=128 XSERV_CUDA_WGMMA_DEEP=0")
for pass in $(seq 1 "${PASSES:-2}"); do  # PASSES=1: one pass of the serving rows
  for x in "${v[@]}"; do sb "${x%%|*}" "${x#*|}" qwen3-1.7b 64,128; done
  [ $pass = 1 ] && for x in "${v[@]}"; do sb "${x%%|*}" "${x#*|}" qwen3-8b 64; done
done
# 16 rows on the kernel (an activation tile of 32, zeros past 16) instead of the skinny one.
for x in "base|" "wg16|XSERV_CUDA_SKINNY_ROWS=8 XSERV_CUDA_WGMMA_ROWS=128"; do sb "${x%%|*}" "${x#*|}" qwen3-8b 16; done
echo "== $(ts) all done"
