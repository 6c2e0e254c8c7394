#!/bin/bash
# Issue 10, serving 16 at once (Qwen3-8B: 3.28k tok/s on the H200, goal 3.5k), two leads that
# change no result, against the defaults, interleaved, one process a figure (~4 min with the
# build). As a request's run.sh (scripts/device_round.sh) or alone:
#   OUT=... bash bench/device/rows16_round.sh
# 1. The one-pass short-context decode attention (the default for 1-16 rows up to 256 keys) was
#    only ever measured at batch 1; at 16 rows its blocks end ~9-13 us after the q|k|v GEMM
#    (H200 / H100 traces in docs/benchmarks.md): the mma kernel (XSERV_CUDA_ATTN_SHORT=0) and
#    the unfolded q/k prologue (XSERV_CUDA_ATTN_FUSE_QK=0) instead.
# 2. When the skinny GEMM lets the next kernel launch: measured on 2026-12-07 (docs/benchmarks.md,
#    "The skinny GEMM's trigger and the one-pass attention at 16 serving rows") against the then
#    default, at its start; after its wait won (+1% on 8B) and is the default since, so the
#    variants are now the old rule (XSERV_CUDA_SKINNY_TRIGGER=start) and after the K loop (end).
run_tests() {
  tests rmsgemm 90 "cuda rms_norm_gemm at 5-32 rows*"
  tests chain_end 150 "cuda: decode steps*,cuda engine: staggered*" XSERV_CUDA_SKINNY_TRIGGER=end
  tests chain_start 150 "cuda: decode steps*,cuda engine: staggered*" XSERV_CUDA_SKINNY_TRIGGER=start
}
source bench/device/serve_round.sh
v8=(base s0:XSERV_CUDA_ATTN_SHORT=0 f0:XSERV_CUDA_ATTN_FUSE_QK=0 ts:XSERV_CUDA_SKINNY_TRIGGER=start
    te:XSERV_CUDA_SKINNY_TRIGGER=end)
for v in "${v8[@]}" "${v8[@]}"; do sb "$v" qwen3-8b 16; done
v17=(base s0:XSERV_CUDA_ATTN_SHORT=0 ts:XSERV_CUDA_SKINNY_TRIGGER=start te:XSERV_CUDA_SKINNY_TRIGGER=end)
for v in "${v17[@]}" "${v17[@]}"; do sb "$v" qwen3-1.7b 16; done
echo "== $(ts) all done"
