#!/usr/bin/env bash
# Issue 16 on the GPU machine's CPU, one round request (scripts/device_round.sh): the unpacked
# out_in prefill GEMM (XSERV_CPU_GEMM_DOT=1: f32, =all: bf16 too; gemm_dot in cpu_kernels.inc),
# XSERV_CPU_GEMM_FIRST=l2 and the AMX bf16 prefill GEMM (XSERV_CPU_AMX=1, cpu_amx.hpp) against
# the default (the packed kernel, main's path) in one CPU-only build: [cpu] tests (the AMX case
# runs the tiles where the CPU has them; the GEMM tests again with the dot kernel on), the GEMMs
# alone at 1 and 8 threads, whole prefills of 3 interleaved runs, prefill profiles.
#   OUT=... bash bench/device/cpu_dot_round.sh        (from the repository root)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device-env.sh
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF -DXSERV_BUILD_TESTS=ON \
  -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv_tests generate_bench cpu_ops_bench >>"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
stamp built
/tmp/b/tests/xserv_tests "[cpu]" >"$OUT/tests.log" 2>&1
echo "tests [cpu]: rc=$? $(tail -2 "$OUT/tests.log" | tr '\n' ' ')"
XSERV_CPU_GEMM_DOT=all /tmp/b/tests/xserv_tests "[golden],cpu gemm*,cpu layer_norm_gemm*,cpu prefill*" >"$OUT/tests_dot.log" 2>&1
echo "tests with XSERV_CPU_GEMM_DOT=all: rc=$? $(tail -2 "$OUT/tests_dot.log" | tr '\n' ' ')"
stamp tested
B=/tmp/b/bench
{ echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -o 'avx512_bf16\|amx_tile\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  taskset -c 0 $B/cpu_ops_bench --benchmark_filter=BM_fma_peak --benchmark_min_time=0.2 2>&1 |
    grep -o 'GFLOP/s=[0-9.]*' | head -1 | sed 's/^/one core FMA peak /'; } | tee "$OUT/summary.md"

# GEMMs alone, M = 128 (weights L3-resident: the benchmark repeats them): GPT-2 f32 out_in
# (5 qkv, 6 attn_out, 7 mlp_up, 8 mlp_down), Qwen3 gate_up and down bf16 (10, 11).
gf() { grep '^BM_gemm' "$1" | awk '{ for (i = 2; i <= NF; ++i) if ($i ~ /^GFLOP\/s=/) { v = substr($i, 9); sub(/\/s/, "", v); printf "%.0f ", v } }'; }
echo "| variant | 1 thread: qkv attn_out mlp_up mlp_down q3_gate_up q3_down | 8 threads: the same |" | tee -a "$OUT/summary.md"
for v in "pack:" "dot:XSERV_CPU_GEMM_DOT=all" "amx:XSERV_CPU_AMX=1"; do
  name=${v%%:*}; vars=${v#*:}
  envs=(); [ -n "$vars" ] && envs=("$vars")
  env "${envs[@]}" XSERV_BENCH_THREADS=1 taskset -c 0 $B/cpu_ops_bench \
    --benchmark_filter='BM_gemm/(5|6|7|8)/128/0/0|BM_gemm/(10|11)/128/1/0' --benchmark_min_time=0.1 >"$OUT/g1_$name.txt" 2>&1
  env "${envs[@]}" XSERV_BENCH_THREADS=8 taskset -c 0-7 $B/cpu_ops_bench \
    --benchmark_filter='BM_gemm/(5|6|7|8)/128/0/0|BM_gemm/(10|11)/128/1/0' --benchmark_min_time=0.1 >"$OUT/g8_$name.txt" 2>&1
  echo "| $name | $(gf "$OUT/g1_$name.txt")| $(gf "$OUT/g8_$name.txt")|" | tee -a "$OUT/summary.md"
done
stamp "gemms measured"

# Whole prefills (3 interleaved runs each, min / median / max): Qwen3-0.6B at 2 and 8 threads
# with and without AMX, GPT-2 at 8 with the unpacked kernel and the first-tile prefetch.
ROWS="this:qwen3-0.6b:2:pack  this:qwen3-0.6b:2:amx:XSERV_CPU_AMX=1;
  this:qwen3-0.6b:8:pack  this:qwen3-0.6b:8:amx:XSERV_CPU_AMX=1;
  this:gpt2:8:pack  this:gpt2:8:dot:XSERV_CPU_GEMM_DOT=1  this:gpt2:8:first:XSERV_CPU_GEMM_FIRST=l2" \
  BUILD=/tmp/b RUNS=3 GEN_LEN=4 MD="$OUT/rows.md" timeout 110 bench/cpu_prefill_probe.sh "$OUT/probe" >/dev/null 2>"$OUT/probe_err.log"
grep '^| this' "$OUT/rows.md" | tee -a "$OUT/summary.md"
stamp "prefills measured"
# Where the prefill goes: Qwen3-0.6B at 2 threads, GPT-2 at 8 (packed and unpacked).
prof() {  # name model threads env...
  local name=$1 model=$2 n=$3
  shift 3
  env "$@" X=1 taskset -c 0-$((n - 1)) $B/generate_bench --dummy-weights --config bench/configs/$model.json --device cpu \
    --threads $n --prompt-len 128 --gen-len 4 --repeat 1 --profile >"$OUT/profile_$name.txt" 2>&1
  { echo "## prefill profile $name"; sed -n '/^profile of the prefill/,/^| all ops/p' "$OUT/profile_$name.txt" | head -16; } >>"$OUT/summary.md"
}
prof qwen3_2 qwen3-0.6b 2
prof qwen3_2_amx qwen3-0.6b 2 XSERV_CPU_AMX=1
prof gpt2_8 gpt2 8
grep '^backend' "$OUT/profile_qwen3_2_amx.txt" >>"$OUT/summary.md"
stamp profiled
# The probe's per-run lines, in case its time limit cut a block before its table.
grep -o '^this:[^ ]* run [0-9]*:\|^| 1 |.*' "$OUT/probe/prefill_runs.txt" 2>/dev/null | paste - - >"$OUT/runs.txt"
(cd "$OUT" && tar czf raw.tgz g1_* g8_* probe && rm -rf g1_* g8_* probe)
cat "$OUT/summary.md"
