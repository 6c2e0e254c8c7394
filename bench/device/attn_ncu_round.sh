#!/bin/bash
# Where the tensor-core decode attention's time goes (issues 10 and 12): ncu's full section set,
# warp stall reasons and per-line stall samples, for one launch of each form in a graph-replayed
# decode step. From the repository root, as a request's run.sh (scripts/device_round.sh) or alone
# (~200 s):
#   OUT=... BUDGET=220 bash bench/device/attn_ncu_round.sh
# Forms: the 4-warp block kernel with split keys (Qwen3-8B batch 1 after 16384 tokens; 52% of the
# DRAM bandwidth in CUPTI traces of 2026-12-06, H100 and H200 alike) and the one-kv-head-a-warp
# form (Qwen3-1.7B decode at 128 rows), and the one-pass short-context kernel at 16 rows
# (Qwen3-8B, rows16) and at batch 1 (Qwen3-0.6B, b1_06; ATTN_NCU_FORMS chooses). ncu replays each kernel with the caches as found
# (--cache-control none) and the clocks as found (--clock-control none), so its durations are
# the kernel alone, without the PDL overlap that a trace's include.
ROUND_TARGETS="cpu_ops_bench" ROUND_BUDGET=220
source bench/device/cuda_round_common.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
prof() {  # label, kernel regex, generate_bench arguments...
  local label=$1 kre=$2; shift 2
  [ "$(left)" -ge 40 ] || { echo "$(ts) skip ncu $label: $(left) s left"; return; }
  echo "== $(ts) ncu $label"
  XSERV_CUDA_PROFILE_REPLAY=3 timeout 150 "$NCU" --clock-control none --cache-control none --profile-from-start off \
    -k "regex:$kre" -c 1 --set full --import-source yes -o "$OUT/ncu_$label" \
    "$G" --dummy-weights --device cuda --repeat 1 "$@" >"$OUT/ncu_$label.log" 2>&1 || echo "rc=$?"
  tail -3 "$OUT/ncu_$label.log"
  "$NCU" -i "$OUT/ncu_$label.ncu-rep" --page details --print-details all >"$OUT/ncu_${label}_details.txt" 2>&1
  "$NCU" -i "$OUT/ncu_$label.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_${label}_sass.csv" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Stall|Issued Warp|No Eligible|Active Warps" \
    "$OUT/ncu_${label}_details.txt" | head -30
  "$NCU" -i "$OUT/ncu_$label.ncu-rep" --page raw >"$OUT/ncu_${label}_raw.txt" 2>&1
  grep -E "smsp__pcsamp_warps_issue_stalled_[a-z_]+ " "$OUT/ncu_${label}_raw.txt" | sort -k3 -n -r | head -12
  gzip -f "$OUT/ncu_${label}_sass.csv"
}
# ATTN_NCU_FORMS picks and orders the forms (default: long8b rows128).
for form in ${ATTN_NCU_FORMS:-long8b rows128}; do
  case $form in
    long8b) prof long8b "attention_decode_mma" --config bench/configs/qwen3-8b.json --batch 1 --prompt-len 16384 --gen-len 8 ;;
    rows128) prof rows128 "attention_decode_mma" --config bench/configs/qwen3-1.7b.json --batch 128 --prompt-len 128 --gen-len 8 ;;
    # The one-pass short-context kernel at 16 serving rows of Qwen3-8B: ~9-13 us after the q|k|v
    # GEMM in the traces, for ~12 MB of K/V a layer (~3 us at the H200's rate).
    rows16) prof rows16 "attention_decode_short" --config bench/configs/qwen3-8b.json --batch 16 --prompt-len 128 --gen-len 8 ;;
    # The same kernel at batch 1 of Qwen3-0.6B, the largest item of its layer (7.8 us of a 20.9 us
    # critical path in an H100 trace of 2026-12-07, for 0.5 MB of K/V).
    b1_06) prof b1_06 "attention_decode_short" --config bench/configs/qwen3-0.6b.json --batch 1 --prompt-len 128 --gen-len 8 ;;
  esac
done
echo "== $(ts) done"
# The CPU backend's prefill LayerNorm took ~47 us a call at 2, 8 and 16 threads alike in
# generate_bench --profile on this machine's Xeon (2026-12-06), where 128 x 768 rows should scale:
# the op alone, by threads.
[ -n "${ATTN_NCU_NO_CPU:-}" ] || for t in 1 2 8 16; do
  XSERV_BENCH_THREADS=$t taskset -c 0-$((t - 1)) timeout 20 /tmp/b/bench/cpu_ops_bench --benchmark_filter='BM_layer_norm|BM_attention_prefill' \
    --benchmark_min_time=0.1 2>&1 | grep -E "^BM_" | sed "s/^/$t threads: /"
done
