#!/usr/bin/env bash
# Prefill on the GPU machine's CPU (issue 16): where multi-thread prefill loses. Several runs per
# row (medians), env variants, per-op profiles of a prefill, and the GEMMs alone per thread count.
#
#   bench/cpu_prefill_probe.sh OUT_DIR        (from the repository root; BUILD holds a CPU-only
#                                              Release build with generate_bench, cpu_ops_bench)
#
# Writes OUT_DIR/prefill.md (tables) and OUT_DIR/prefill_*.txt (raw logs). Rows: generate_bench
# --device cpu --prompt-len 128 --gen-len 8 --repeat 2 (best of 2 after a warm-up) run RUNS times
# (default 3) as separate processes, pinned to cores 0..N-1; min / median / max of those runs.
# ROWS="model:threads:label:VAR=v,VAR=v ..." picks the rows (label "-" with no variables: default).
set -uo pipefail
out=${1:?OUT_DIR}
build=${BUILD:-/tmp/bcpu}
models=${MODELS:-/tmp/models}
runs=${RUNS:-3}
mkdir -p "$out"
md=$out/prefill.md
gb=$build/bench/generate_bench

# min / median / max of a list of numbers.
stats() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {if (NR) printf "%.0f / %.0f / %.0f", v[1], v[int((NR+1)/2)], v[NR]}'; }

{
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC'); load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "| model | threads | variant | prefill tok/s min / median / max | decode tok/s min / median / max |"
  echo "| --- | ---: | --- | ---: | ---: |"
} | tee "$md"
default_rows="gpt2:2:-  gpt2:8:-  gpt2:16:-  gpt2:2:out_in:XSERV_CPU_CONV1D=out_in
  gpt2:8:out_in:XSERV_CPU_CONV1D=out_in  gpt2:16:out_in:XSERV_CPU_CONV1D=out_in
  gpt2:8:spin200:XSERV_CPU_SPIN_US=200  gpt2:8:tile128:XSERV_CPU_GEMM_TILE=128
  gpt2:8:tile64:XSERV_CPU_GEMM_TILE=64  gpt2:8:chunks1:XSERV_CPU_CHUNKS=1
  qwen3-0.6b:2:-  qwen3-0.6b:8:-  qwen3-0.6b:16:-  qwen3-1.7b:8:-  qwen3-1.7b:16:-"
for row in ${ROWS:-$default_rows}; do
  IFS=: read -r model n label vars <<<"$row"
  [ "$n" -le "$(nproc)" ] || continue
  envs=()
  [ -n "${vars:-}" ] && IFS=, read -ra envs <<<"$vars"
  pre="" dec=""
  for r in $(seq "$runs"); do
    log=$(env "${envs[@]}" timeout 120 taskset -c "0-$((n - 1))" "$gb" -m "$models/$model" --device cpu \
            --threads "$n" --prompt-len 128 --gen-len 8 --repeat 2 2>&1)
    echo "$model $n $label run $r: $log" >>"$out/prefill_runs.txt"
    line=$(echo "$log" | grep '^| 1 |')
    pre="$pre $(echo "$line" | awk -F'|' '{print $3}')"
    dec="$dec $(echo "$line" | awk -F'|' '{print $4}')"
  done
  echo "| $model | $n | $label | $(echo "$pre" | stats) | $(echo "$dec" | stats) |" | tee -a "$md"
done

# Per-op profiles of a prefill (generate_bench --profile prints the prefill's ops, then decode's).
for p in ${PROFILES:-gpt2:2 gpt2:8 gpt2:16 qwen3-0.6b:8}; do
  IFS=: read -r model n <<<"$p"
  [ "$n" -le "$(nproc)" ] || continue
  taskset -c "0-$((n - 1))" "$gb" -m "$models/$model" --device cpu --threads "$n" --prompt-len 128 \
    --gen-len 4 --repeat 1 --profile >"$out/prefill_profile_${model}_$n.txt" 2>&1
  { echo; echo "### prefill profile, $model, $n threads"; echo
    sed -n '/^profile of the prefill/,/^| all ops/p' "$out/prefill_profile_${model}_$n.txt" | head -30; } | tee -a "$md"
done

# The GEMMs alone (M = 128, xserv's kernels): GFLOP/s per thread count. Shapes 0-3 GPT-2 (f32,
# Conv1D in_out), 5-8 the same transposed (out_in), 9-11 Qwen3-0.6B bf16.
if [ -x "$build/bench/cpu_ops_bench" ]; then
  { echo; echo "### GEMM GFLOP/s, M = 128 (cpu_ops_bench)"; echo; } | tee -a "$md"
  for n in ${GEMM_THREADS:-1 2 8 16}; do
    [ "$n" -le "$(nproc)" ] || continue
    XSERV_BENCH_THREADS=$n taskset -c "0-$((n - 1))" "$build/bench/cpu_ops_bench" \
      --benchmark_filter="${GEMM_FILTER:-BM_gemm/(0|1|2|3|6|8)/128/0/0|BM_gemm/(9|10|11)/128/1/0}" \
      --benchmark_min_time=0.2 >"$out/gemm_$n.txt" 2>&1
    # "shape(dtype) GFLOP/s" per benchmark line (the counter prints as e.g. 150.2G/s).
    echo "threads $n: $(awk '/^BM_gemm/ { split($1, a, "/"); for (i = 2; i <= NF; ++i)
      if ($i ~ /^GFLOP\/s=/) { v = substr($i, 9); sub(/\/s/, "", v); printf "%s(%s) %s, ", a[2], a[4], v } }' \
      "$out/gemm_$n.txt")" | tee -a "$md"
  done
fi
