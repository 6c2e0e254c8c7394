#!/bin/bash
# Issue 10: q|k|v's skinny GEMM in blocks of at most N warps (XSERV_CUDA_SKINNY_QKV_WARPS), so the
# one-pass attention launched after it finds registers on every SM and starts its K/V copies while
# the GEMM runs: tests, then serving Qwen3-8B (N = 4, 2) and 1.7B (N = 4) 16 at once against the
# defaults, interleaved, then the 8B layer by critical path (CUPTI trace) with N = 4. As a
# request's run.sh (scripts/device_round.sh) or alone: OUT=... bash bench/device/qkv_warps_round.sh
run_tests() {
  tests rmsgemm 90 "cuda rms_norm_gemm at 5-32 rows*"
  tests steps 120 "cuda: decode steps*" XSERV_CUDA_SKINNY_QKV_WARPS=2
}
source bench/device/serve_round.sh
for v in base q4:XSERV_CUDA_SKINNY_QKV_WARPS=4 q2:XSERV_CUDA_SKINNY_QKV_WARPS=2 base q4:XSERV_CUDA_SKINNY_QKV_WARPS=4; do
  sb "$v" qwen3-8b 16
done
for v in base q4:XSERV_CUDA_SKINNY_QKV_WARPS=4; do sb "$v" qwen3-1.7b 16; done
echo "== $(ts) all done"
# The layer by critical path (scripts/cupti_steps.py --last-prefill --order) with N = 4 (the
# defaults' trace of 2026-12-06 is in docs/benchmarks.md).
cmake --build /tmp/b -j16 --target xserv_cupti_trace >>"$OUT/build.txt" 2>&1
for v in q4:XSERV_CUDA_SKINNY_QKV_WARPS=4; do
  n=$(name "$v"); s=$(settings "$v")
  env $s CUDA_INJECTION64_PATH=/tmp/b/bench/libxserv_cupti_trace.so XSERV_TRACE_OUT=/tmp/trace_$n.csv timeout 60 "$S" \
    --dummy-weights --config bench/configs/qwen3-8b.json --device cuda --concurrency 16 >"$OUT/trace_sb_$n.txt" 2>&1
  python3 scripts/cupti_steps.py /tmp/trace_$n.csv --last-prefill --order >"$OUT/order_$n.txt" 2>&1
  echo "trace $n: $(grep -E '^\| [0-9]' "$OUT/trace_sb_$n.txt" | awk -F'|' '{printf "%s/", $3}')"; head -30 "$OUT/order_$n.txt"
done
echo "== $(ts) traces done"
