#!/usr/bin/env bash
# Issue 16's table on the GPU machine's Xeon in one call: GPT-2 124M f32, Qwen3-0.6B bf16 and
# Qwen3-1.7B bf16 at 2, 8 and 16 threads, prompt 128 then 32 generated (bench/cpu_prefill_probe.sh
# rows: generate_bench --dummy-weights --device cpu, pinned to cores 0..N-1), each decode next to
# the bytes it reads per token and the streaming-read ceiling of the same cores (stream_read_bench
# --prefetch both:32, read the way the GEMVs read, no huge pages; TABLE_HUGE=1 for
# XSERV_CPU_HUGEPAGES=1). Then, with the time left, one per-op profile of GPT-2's 8-thread decode
# step, GPT-2 at 8 threads against the variants in CMP and Qwen3-0.6B against those in Q8_CMP
# (interleaved; by default the decode GEMV's rules before 2026-12-04), and the streaming ceiling
# under other prefetch modes (SWEEP). ALL_ON: the switches the [cpu],[golden] tests run with.
#   OUT=... bash bench/device/cpu_table_round.sh        (from the repository root; a request's
#   run.sh under the round's timeout, 180-200 s: BUDGET, default 170 s, build and tests included)
# Runs per table row: GPT2_RUNS, Q06_RUNS (default 3), Q17_RUNS (8 and 16 threads, default 2),
# Q17_2_RUNS (2 threads, default 1: one run, its warm-up included, is ~20 s); the rows of one
# block interleave. G8_RUNS runs of each comparison (default 3); CMP and Q8_CMP their variants
# ("label:VAR=v[,VAR=v] ...", Q8_CMP empty: no Qwen3 block). Time per block (seconds, each also
# cut to what the budget has left): GPT2_S, Q06_S, Q17_S, Q17_2_S, G8_S.
export BUDGET=${BUDGET:-170} B=${B:-/tmp/bcpu}
export ALL_ON=${ALL_ON:-XSERV_CPU_GEMV_SEQ=0 XSERV_CPU_GEMV_HEAD=0}
CMP=${CMP:-old:XSERV_CPU_GEMV_SEQ=0,XSERV_CPU_GEMV_HEAD=0}
Q8_CMP=${Q8_CMP:-$CMP}
SWEEP=${SWEEP:-off both:128 both:64 l2:32}
# Bytes a decode token reads (MB): every weight once (the tied embedding as the lm_head; GPT-2's
# position table but one row is not read) plus the K/V cache at ~144 keys (the 32 steps' middle).
declare -A WEIGHT_MB=([gpt2]=494.6 [qwen3-0.6b]=1192.0 [qwen3-1.7b]=3441.0)
declare -A KV_MB=([gpt2]=10.6 [qwen3-0.6b]=33.0 [qwen3-1.7b]=33.0)
# llama.cpp's CPU build on an earlier lease of this machine (issue 16), prefill / decode tok/s.
declare -A LLAMA=([gpt2:2]="909 / 51.7" [gpt2:8]="3604 / 199" [qwen3-0.6b:2]="149 / 17.2" [qwen3-0.6b:8]="520 / 57.9")
table() {  # the table from the rows: decode GB/s = (weights + K/V) MB x tok/s, against the ceiling
  echo; echo "| model | threads | prefill tok/s | decode tok/s | MB read per token | decode GB/s | ceiling GB/s (same cores) | decode / ceiling | llama.cpp (issue) |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for m in gpt2 qwen3-0.6b qwen3-1.7b; do
    for n in 2 8 16; do
      local row ceil
      row=$(cat "$OUT/rows_t_$m.md" "$OUT/rows_t_${m}_2.md" 2>/dev/null | grep "^| this | $m | $n | base |" | head -1)
      ceil=$(grep "stream read: $n threads," "$OUT/stream.txt" 2>/dev/null | head -1 | sed -n 's/.*best of [0-9]*: \([0-9.]*\) GB.*/\1/p')
      [ -n "$row" ] || { echo "| $m | $n | (not run) | | | | ${ceil:-} | | ${LLAMA[$m:$n]:-} |"; continue; }
      echo "$row" | awk -F'|' -v m="$m" -v n="$n" -v w="${WEIGHT_MB[$m]}" -v kv="${KV_MB[$m]}" -v c="${ceil:-0}" -v l="${LLAMA[$m:$n]:-}" '{
        split($6, p, " / "); split($7, d, " / "); mb = w + kv; gbs = mb * d[2] / 1000;
        printf "| %s | %s | %s | %s | %.0f | %.1f | %s | %s | %s |\n", m, n, $6, $7, mb, gbs, c, (c > 0 ? sprintf("%.0f%%", 100 * gbs / c) : ""), l }'
    done
  done
}
plan() {
  local hp=${TABLE_HUGE:-0}
  for n in 2 8 16; do stream $n --mb 1024 --repeat 5 --prefetch both:32 --huge $hp; done
  RUNS=${GPT2_RUNS:-3} probe t_gpt2 "$(block "gpt2:2 gpt2:8 gpt2:16" "")" ${GPT2_S:-32}
  RUNS=${Q06_RUNS:-3} probe t_qwen3-0.6b "$(block "qwen3-0.6b:2 qwen3-0.6b:8 qwen3-0.6b:16" "")" ${Q06_S:-42}
  RUNS=${Q17_RUNS:-2} probe t_qwen3-1.7b "$(block "qwen3-1.7b:8 qwen3-1.7b:16" "")" ${Q17_S:-32}
  RUNS=${Q17_2_RUNS:-1} probe t_qwen3-1.7b_2 "$(block "qwen3-1.7b:2" "")" ${Q17_2_S:-30}
  table | tee -a "$OUT/summary.md"
  profile gpt2_8 "" gpt2 8   # where GPT-2's 8-thread decode step goes (profiles.md)
  RUNS=${G8_RUNS:-3} probe g8 "$(block gpt2:8 "$CMP")" ${G8_S:-30}
  [ -z "$Q8_CMP" ] || RUNS=${G8_RUNS:-3} probe q8 "$(block qwen3-0.6b:8 "$Q8_CMP")" ${G8_S:-30}
  # The ceiling under other prefetch modes (the first line per core count above is both:32).
  for n in 2 8; do
    for pf in $SWEEP; do stream $n --mb 1024 --repeat 5 --prefetch "$pf" --huge $hp; done
  done
}
source bench/device/cpu_decode_round.sh
