#!/bin/bash
# Issue 12: the next layer's K/V rows asked into L2 by the one-pass short-context attention
# (XSERV_CUDA_ATTN_KV_NEXT=1, Backend::prefetch_next_kv), batch-1 decode of Qwen3-0.6B / 1.7B /
# 8B against the defaults, interleaved, after the hint's tests (the same bits). From the
# repository root on the GPU machine, as a request's run.sh (scripts/device_round.sh) or alone
# (~150 s): OUT=... bash bench/device/kv_next_round.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/device-env.sh
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DXSERV_BUILD_BENCH=ON \
  -DXSERV_BUILD_EXAMPLES=OFF -DXSERV_CUDA_TEST_BINARY=ON >"$OUT/build.txt" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv_cuda_tests generate_bench >>"$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
echo "== built in ${SECONDS} s"; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
T=/tmp/b/tests/cuda/xserv_cuda_tests
timeout -k 5 60 $T "cuda decode attention: the one-pass short-context kernel" >"$OUT/t1.txt" 2>&1; echo "t1 rc=$? $(grep -E '^(All tests|test cases)' $OUT/t1.txt | tr '\n' ' ')"
XSERV_CUDA_ATTN_KV_NEXT=1 timeout -k 5 60 $T "cuda: tiny*,cuda: decode steps*" >"$OUT/t2.txt" 2>&1; echo "t2 rc=$? $(grep -E '^(All tests|test cases)' $OUT/t2.txt | tr '\n' ' ')"
grep -B3 -A12 -m2 FAILED $OUT/t1.txt $OUT/t2.txt | head -30
gb() {  # label, env, model
  local f="$OUT/gb_$3_$1.$(date -u +%H%M%S%N).txt"
  env $2 timeout 40 /tmp/b/bench/generate_bench --dummy-weights --config "bench/configs/$3.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat 2 >"$f" 2>&1
  echo "$(date -u +%T) $3 $1 [$2]: $(grep -E '^\| 1 ' "$f" | tail -1 | awk -F'|' '{print $4}')"
}
# KV_MODELS: the models of the two passes (default 0.6B and 1.7B; KV_8B=0 leaves out the 8B pair).
for pass in 1 2; do
  for m in ${KV_MODELS:-qwen3-0.6b qwen3-1.7b}; do gb base "" $m; gb kv XSERV_CUDA_ATTN_KV_NEXT=1 $m; done
done
[ "${KV_8B:-1}" = 0 ] || { gb base "" qwen3-8b; gb kv XSERV_CUDA_ATTN_KV_NEXT=1 qwen3-8b; }
echo "== done in ${SECONDS} s"
