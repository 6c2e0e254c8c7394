#!/bin/bash
# Issue 10, serving 64-128 at once: Hopper's warpgroup MMA GEMM (cuda/gemm_wgmma.cu) against
# cuBLASLt at 17-128 rows (~6 min with the build). As a request's run.sh (scripts/device_round.sh)
# or alone: OUT=... bash bench/device/wgmma_round.sh
# 1. Tests: the kernel against the CPU backend (every activation tile, K parts 1-8), the residual
#    GEMM through it, decode-step graphs and engine requests with it on.
# 2. gemm_bench --wgmma 1: the layer and lm_head GEMMs of Qwen3-1.7B / 8B alone, cuBLASLt's
#    heuristic first against the kernel with its own K parts and 1/2/4/8.
# (WG_LEAN=1 leaves out the decode-step and engine tests.)
# 3. serve_bench 1.7B 64/128 and 8B 64 at once: cuBLASLt (the default) against
#    XSERV_CUDA_WGMMA_ROWS=128 (and with XSERV_CUDA_WGMMA_MCAST=2), one process a figure, interleaved;
#    8B 16 at once: the skinny kernel (the default) against the wgmma kernel from 9 rows.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device-env.sh
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DXSERV_BUILD_BENCH=ON \
  -DXSERV_BUILD_EXAMPLES=OFF -DXSERV_CUDA_TEST_BINARY=ON >"$OUT/build.txt" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv_cuda_tests generate_bench serve_bench gemm_bench >>"$OUT/build.txt" 2>&1 ||
  { tail -40 "$OUT/build.txt"; exit 1; }
export SKIP_BUILD=1
run_tests() {
  tests wg 90 "cuda wgmma gemm*"
  # On a failure, the one-hot probe's messages name the wrong positions (a layout permutation).
  grep -q "one-hot" "$OUT/tests_wg.txt" && grep -A3 "probe:" "$OUT/tests_wg.txt" | head -40
  tests wgres 90 "cuda gemm_rms_norm_gemm: the residual*"
  [ "${WG_LEAN:-0}" = 1 ] || tests wgchain 180 "cuda: decode steps*,cuda engine: staggered*,cuda: batched Qwen3*,cuda: tiny*" XSERV_CUDA_WGMMA_ROWS=128
}
source bench/device/serve_round.sh
echo "== $(date -u +%H:%M:%S) gemm_bench --wgmma 1"
timeout ${GEMM_LIMIT:-150} /tmp/b/bench/gemm_bench --wgmma 1 --models 1.7b,8b --rows ${GEMM_ROWS:-64,128} \
  >"$OUT/gemm_wgmma.txt" 2>&1
cat "$OUT/gemm_wgmma.txt"
v=(base wg:XSERV_CUDA_WGMMA_ROWS=128 wgm:XSERV_CUDA_WGMMA_ROWS=128,XSERV_CUDA_WGMMA_MCAST=2)
for x in "${v[@]}"; do sb "$x" qwen3-1.7b 64,128; done
for x in "${v[@]}"; do sb "$x" qwen3-8b 64; done
# 16 rows on the kernel too (an activation tile of 32, zeros past 16) instead of the skinny one.
for x in base wg16:XSERV_CUDA_SKINNY_ROWS=8,XSERV_CUDA_WGMMA_ROWS=128; do sb "$x" qwen3-8b 16; done
[ "${PASSES:-1}" -ge 2 ] && for x in "${v[@]}"; do sb "$x" qwen3-1.7b 64,128; done
echo "== $(date -u +%H:%M:%S) all done"
