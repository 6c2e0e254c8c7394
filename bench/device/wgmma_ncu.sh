#!/bin/bash
# Where the warpgroup MMA GEMM (cuda/gemm_wgmma.cu) loses to cuBLASLt at 64 rows (~3 min with the
# build): its test, then ncu's full set on one launch of each side of gemm_bench --wgmma 1:
#   wg_qkv17   the kernel on Qwen3-1.7B's q|k|v at 64 rows, its own K parts (11.6 us vs 8.4, H100)
#   lt_qkv17   cuBLASLt's first kernel of the same GEMM
#   wg_qkv8    the kernel on Qwen3-8B's q|k|v at 64 rows, its own 8 K parts (26.7 us vs 20.3)
# As a request's run.sh (scripts/device_round.sh) or alone: OUT=... bash bench/device/wgmma_ncu.sh
ROUND_TARGETS=gemm_bench ROUND_BUDGET=${ROUND_BUDGET:-280}
source bench/device/cuda_round_common.sh
tests wg 90 "cuda wgmma gemm*"
G=/tmp/b/bench/gemm_bench
# Back-to-back launches without programmatic dependent launch: does the early launch of the next
# GEMM (its weights before its wait) help or hurt the kernel here?
echo "== gemm_bench, XSERV_CUDA_PDL=0"
XSERV_CUDA_PDL=0 timeout 60 $G --wgmma 1 --models 1.7b --rows 64,128 2>&1 | grep -E "^\| 1.7b"
prof() {  # name, gemm_bench args, ncu filter args...
  local name=$1 args=$2; shift 2
  timeout 120 ncu --set full "$@" --launch-count 1 $G --wgmma 1 $args >"$OUT/ncu_$name.txt" 2>&1
  echo "== $name: rc=$?"
  grep -E "^  [A-Za-z_]+.*\(|Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Block Limit Shared|Waves Per SM|Grid Size|Cluster Size|Stall|One or More|No Eligible" \
    "$OUT/ncu_$name.txt" | head -30 | tr -s ' '
}
prof wg_qkv17 "--models 1.7b --rows 64" -k regex:wgmma_gemm
# cuBLASLt's kernel (the first kernel of gemm_bench that is not ours; launched before ours)
prof lt_qkv17 "--models 1.7b --rows 64" -k "regex:^(?!wgmma)"
prof wg_qkv8 "--models 8b --rows 64" -k regex:wgmma_gemm
echo "== $(date -u +%H:%M:%S) all done"
