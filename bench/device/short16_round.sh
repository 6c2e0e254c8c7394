#!/bin/bash
# Issue 10: the one-pass short-context decode attention (the default for 1-16 rows up to 256
# keys) was only ever measured at batch 1; at 16 rows its blocks end ~9-13 us after the q|k|v
# GEMM (H200 / H100 traces in docs/benchmarks.md). Serving Qwen3-8B and 1.7B 16 at once with the
# defaults against the mma kernel (XSERV_CUDA_ATTN_SHORT=0) and the unfolded q/k prologue
# (XSERV_CUDA_ATTN_FUSE_QK=0), interleaved, one process a figure; no code change, so no tests
# (~110 s with the build). As a request's run.sh (scripts/device_round.sh) or alone:
# OUT=... bash bench/device/short16_round.sh
source bench/device/serve_round.sh
for v in base s0:XSERV_CUDA_ATTN_SHORT=0 f0:XSERV_CUDA_ATTN_FUSE_QK=0 base s0:XSERV_CUDA_ATTN_SHORT=0; do
  sb "$v" qwen3-8b 16
done
for v in base s0:XSERV_CUDA_ATTN_SHORT=0 base s0:XSERV_CUDA_ATTN_SHORT=0; do sb "$v" qwen3-1.7b 16; done
echo "== $(ts) all done"
