#!/usr/bin/env bash
# Issue 16's table on the GPU machine's Xeon in one call (h/cpu, thirteenth session): GPT-2 124M
# f32, Qwen3-0.6B bf16 and Qwen3-1.7B bf16 at 2, 8 and 16 threads, prompt 128 then 32 generated
# (bench/cpu_prefill_probe.sh rows: generate_bench --dummy-weights --device cpu, pinned to cores
# 0..N-1), each decode next to the bytes it reads per token and the streaming-read ceiling of the
# same cores (stream_read_bench --prefetch both:32, read the way the GEMVs read, with the build's
# default, no huge pages; TABLE_HUGE=1 for XSERV_CPU_HUGEPAGES=1), then GPT-2 at 8 threads against
# the opt-in switches (CMP) interleaved. Not run yet (what issue 16 has left, docs/benchmarks.md):
#   OUT=... bash bench/device/cpu_table_round.sh        (from the repository root; ~190 s, so a
#   request's run.sh under `timeout 200`, or TABLE_RUNS/G8_S/T_S trimmed for 150 s)
# TABLE_RUNS runs per table row (default 1; the rows of one model interleave), G8_RUNS of the
# GPT-2 comparison (default 4), CMP its variants ("label:VAR=v[,VAR=v] ...", default the L1
# prefetch distance, the GEMV column groups and huge pages, each alone).
export BUDGET=${BUDGET:-190} B=${B:-/tmp/bcpu}
export ALL_ON=${ALL_ON:-XSERV_CPU_HUGEPAGES=1 XSERV_CPU_GEMV_GROUP_KB=64 XSERV_CPU_GEMV_L1_KB=12}
CMP=${CMP:-l1:XSERV_CPU_GEMV_L1_KB=12 group:XSERV_CPU_GEMV_GROUP_KB=64 huge:XSERV_CPU_HUGEPAGES=1}
# Bytes a decode token reads (MB): every weight once (the tied embedding as the lm_head; GPT-2's
# position table but one row is not read) plus the K/V cache at ~144 keys (the 32 steps' middle).
declare -A WEIGHT_MB=([gpt2]=494.6 [qwen3-0.6b]=1192.0 [qwen3-1.7b]=3441.0)
declare -A KV_MB=([gpt2]=10.6 [qwen3-0.6b]=33.0 [qwen3-1.7b]=33.0)
plan() {
  local hp=${TABLE_HUGE:-0}
  for n in 2 8 16; do stream $n --mb 1024 --repeat 5 --prefetch both:32 --huge $hp; done
  RUNS=${G8_RUNS:-4} probe g8 "$(block gpt2:8 "$CMP")" ${G8_S:-30}
  for m in gpt2 qwen3-0.6b qwen3-1.7b; do
    RUNS=${TABLE_RUNS:-1} probe "t_$m" "$(block "$m:2 $m:8 $m:16" "")" ${T_S:-45}
  done
  # The table: decode GB/s = (weights + K/V) MB x tok/s; against the same cores' ceiling.
  { echo; echo "| model | threads | prefill tok/s | decode tok/s | MB read per token | decode GB/s | ceiling GB/s (same cores) | decode / ceiling |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for m in gpt2 qwen3-0.6b qwen3-1.7b; do
      for n in 2 8 16; do
        local row ceil
        row=$(grep -h "^| this | $m | $n | base |" "$OUT/rows_t_$m.md" 2>/dev/null | head -1)
        ceil=$(grep "stream read: $n threads," "$OUT/stream.txt" 2>/dev/null | head -1 | sed -n 's/.*best of [0-9]*: \([0-9.]*\) GB.*/\1/p')
        [ -n "$row" ] || { echo "| $m | $n | (not run) | | | | ${ceil:-} | |"; continue; }
        echo "$row" | awk -F'|' -v m="$m" -v n="$n" -v w="${WEIGHT_MB[$m]}" -v kv="${KV_MB[$m]}" -v c="${ceil:-0}" '{
          split($6, p, " / "); split($7, d, " / "); mb = w + kv; gbs = mb * d[2] / 1000;
          printf "| %s | %s | %s | %s | %.0f | %.1f | %s | %s |\n", m, n, $6, $7, mb, gbs, c, c > 0 ? sprintf("%.0f%%", 100 * gbs / c) : "" }'
      done
    done; } | tee -a "$OUT/summary.md"
}
source bench/device/cpu_decode_round.sh
