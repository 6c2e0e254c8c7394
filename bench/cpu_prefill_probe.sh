#!/usr/bin/env bash
# Prefill (and decode) on the GPU machine's CPU (issue 16), several runs per row: medians, env
# variants, two builds interleaved, per-op profiles of a prefill, the GEMMs alone per thread count.
#
#   bench/cpu_prefill_probe.sh OUT_DIR        (from the repository root)
#
# BUILD holds a CPU-only Release build with generate_bench (and cpu_ops_bench for the GEMM rows),
# BASE_BUILD optionally a baseline build with generate_bench. Each row: generate_bench --device
# cpu --prompt-len 128 --gen-len GEN_LEN (default 8; decode rows: 32) --repeat R (best of R after
# a warm-up; R = 2 for GPT-2, 1 for the Qwen3 models), pinned to cores 0..N-1, run RUNS times (default 3) as separate processes;
# min / median / max over those runs. ROWS: blocks separated by ";", each of rows
# "tree:model:threads:label[:VAR=v,VAR=v]" (tree: this or base; label "-": no variables); within
# a block the runs interleave (run 1 of every row, then run 2, ...), so a drift of the machine
# hits every row of the block alike. Checkpoints: $MODELS/<model> when it holds a config.json,
# else --dummy-weights with bench/configs/<model>.json (same shapes; no minute of checkpoint
# making on a fresh machine). OUT_DIR/prefill.md gets the tables (MD overrides the path), OUT_DIR
# the raw logs. PROFILES="model:threads ..." and GEMM_THREADS="1 8 ..." add the per-op prefill
# profiles and the cpu_ops_bench GEMM rows (with one core's FMA peak).
set -uo pipefail
out=${1:?OUT_DIR}
build=${BUILD:-/tmp/bcpu}
base_build=${BASE_BUILD:-}
models=${MODELS:-/tmp/models}
runs=${RUNS:-3}
mkdir -p "$out"
md=${MD:-$out/prefill.md}

# min / median / max of a list of numbers, each printed with the printf format $1 (default %.0f).
stats() {
  tr ' ' '\n' | grep . | sort -g | awk -v f="${1:-%.0f}" '{v[NR]=$1} END {if (NR) printf f " / " f " / " f, v[1], v[int((NR+1)/2)], v[NR]}'
}
model_args() {
  if [ -f "$models/$1/config.json" ]; then echo "-m $models/$1"; else echo "--dummy-weights --config bench/configs/$1.json"; fi
}

{
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC'); load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "topology (cpu: core socket): $(lscpu -p=CPU,CORE,SOCKET 2>/dev/null | grep -v '^#' | tr '\n' ' ')"
  echo "cpu0 thread siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null)"
} | tee "$md"

# One core's FMA peak and the GEMMs alone (M = 128, xserv's kernels): GFLOP/s per thread count.
# Shapes 0-3 GPT-2 (f32, Conv1D in_out), 5-8 the same transposed (out_in), 9-11 Qwen3-0.6B bf16.
gemm_rows() {
  [ -x "$build/bench/cpu_ops_bench" ] || return
  taskset -c 0 "$build/bench/cpu_ops_bench" --benchmark_filter=BM_fma_peak --benchmark_min_time=0.2 >"$out/fma_peak.txt" 2>&1
  echo "one core's FMA peak (BM_fma_peak): $(grep -o 'GFLOP/s=[0-9.]*' "$out/fma_peak.txt" | head -1)" | tee -a "$md"
  # The same on N cores at once (one process per core): whether the clock drops with all busy.
  for n in ${FMA_CORES:-}; do
    [ "$n" -le "$(nproc)" ] || continue
    for c in $(seq 0 $((n - 1))); do
      taskset -c "$c" "$build/bench/cpu_ops_bench" --benchmark_filter=BM_fma_peak --benchmark_min_time=0.3 \
        >"$out/fma_peak_${n}_$c.txt" 2>&1 &
    done
    wait
    echo "FMA peak per core with $n cores busy: $(cat "$out"/fma_peak_${n}_*.txt | grep -o 'GFLOP/s=[0-9.]*' |
      cut -d= -f2 | stats)" | tee -a "$md"
  done
  for n in ${GEMM_THREADS:-}; do
    [ "$n" -le "$(nproc)" ] || continue
    XSERV_BENCH_THREADS=$n taskset -c "0-$((n - 1))" "$build/bench/cpu_ops_bench" \
      --benchmark_filter="${GEMM_FILTER:-BM_gemm/(0|1|2|3|6|8)/128/0/0|BM_gemm/(9|10|11)/128/1/0}" \
      --benchmark_min_time=0.2 >"$out/gemm_$n.txt" 2>&1
    # "shape(dtype) GFLOP/s" per benchmark line (the counter prints as e.g. GFLOP/s=150.2/s).
    echo "GEMM GFLOP/s, M = 128, $n threads: $(awk '/^BM_gemm/ { split($1, a, "/"); for (i = 2; i <= NF; ++i)
      if ($i ~ /^GFLOP\/s=/) { v = substr($i, 9); sub(/\/s/, "", v); printf "%s(%s) %s, ", a[2], a[4], v } }' \
      "$out/gemm_$n.txt")" | tee -a "$md"
  done
}

{
  echo
  echo "| tree | model | threads | variant | prefill tok/s min / median / max | decode tok/s min / median / max |"
  echo "| --- | --- | ---: | --- | ---: | ---: |"
} | tee -a "$md"
default_rows="this:gpt2:2:-  this:gpt2:8:-  this:gpt2:16:-;
  this:qwen3-0.6b:2:-  this:qwen3-0.6b:8:-  this:qwen3-0.6b:16:-"
IFS=';' read -ra blocks <<<"$(echo "${ROWS:-$default_rows}" | tr '\n' ' ')"  # one line: read stops at a newline
for block in "${blocks[@]}"; do
  read -ra rows <<<"$block"
  declare -A pre=() dec=()
  for r in $(seq "$runs"); do
    for row in "${rows[@]}"; do
      IFS=: read -r tree model n label vars <<<"$row"
      [ "$n" -le "$(nproc)" ] || continue
      gb=$build/bench/generate_bench
      [ "$tree" = base ] && gb=$base_build/bench/generate_bench
      [ -x "$gb" ] || continue
      envs=()
      [ -n "${vars:-}" ] && IFS=, read -ra envs <<<"$vars"
      repeat=1
      [ "$model" = gpt2 ] && repeat=2
      log=$(env "${envs[@]}" timeout 120 taskset -c "0-$((n - 1))" "$gb" $(model_args "$model") --device cpu \
              --threads "$n" --prompt-len 128 --gen-len "${GEN_LEN:-8}" --repeat "$repeat" 2>&1)
      echo "$row run $r: $log" >>"$out/prefill_runs.txt"
      line=$(echo "$log" | grep '^| 1 |')
      pre[$row]="${pre[$row]:-} $(echo "$line" | awk -F'|' '{print $3}')"
      dec[$row]="${dec[$row]:-} $(echo "$line" | awk -F'|' '{print $4}')"
    done
  done
  for row in "${rows[@]}"; do
    IFS=: read -r tree model n label vars <<<"$row"
    [ -n "${pre[$row]:-}" ] || continue
    echo "| $tree | $model | $n | $label | $(echo "${pre[$row]}" | stats) | $(echo "${dec[$row]}" | stats %.1f) |" | tee -a "$md"
  done
  unset pre dec
done

echo | tee -a "$md"
gemm_rows

# Per-op profiles of a prefill (generate_bench --profile prints the prefill's ops, then decode's;
# the timed wrapper runs layer_norm_gemm as its three steps).
for p in ${PROFILES:-}; do
  IFS=: read -r model n <<<"$p"
  [ "$n" -le "$(nproc)" ] || continue
  taskset -c "0-$((n - 1))" "$build/bench/generate_bench" $(model_args "$model") --device cpu --threads "$n" \
    --prompt-len 128 --gen-len 4 --repeat 1 --profile >"$out/prefill_profile_${model}_$n.txt" 2>&1
  { echo; echo "### prefill profile, $model, $n threads"; echo
    sed -n '/^profile of the prefill/,/^| all ops/p' "$out/prefill_profile_${model}_$n.txt" | head -30; } | tee -a "$md"
done
