#!/usr/bin/env bash
# Issue 16 on the GPU machine's CPU, one round request (scripts/device_round.sh): the prefill
# GEMM's variants (XSERV_CPU_GEMM_PREFETCH / KC, each read once per process) against
# the default in one CPU-only build (and main's, BASE_TGZ), then whole prefills with the best two,
# then a GPT-2 decode profile.
#   OUT=... bash bench/device/cpu_gemm_round.sh        (from the repository root)
source bench/device/cpu_round_common.sh
build() {  # source dir, build dir, targets...
  local src=$1 dir=$2
  shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF -DXSERV_BUILD_TESTS=ON \
    -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF && cmake --build "$dir" -j16 --target "$@"
}
# BASE_TGZ (optional): files unpacked over a copy of this tree for a baseline build ("main").
base_pid=""
if [ -n "${BASE_TGZ:-}" ]; then
  rm -rf /tmp/base && mkdir -p /tmp/base
  tar --exclude=./.devdeps --exclude=./.git -cf - . | tar -xf - -C /tmp/base
  tar xzmf "$BASE_TGZ" -C /tmp/base
  build /tmp/base /tmp/bbase generate_bench cpu_ops_bench >"$OUT/build_base.log" 2>&1 &
  base_pid=$!
fi
build . /tmp/b xserv_tests generate_bench cpu_ops_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
stamp built
[ -n "$base_pid" ] && { wait "$base_pid" || { tail -20 "$OUT/build_base.log"; base_pid=""; }; }
stamp "base built: ${base_pid:-no}"
/tmp/b/tests/xserv_tests "[cpu]" >"$OUT/tests.log" 2>&1
echo "tests [cpu]: rc=$? $(tail -2 "$OUT/tests.log" | tr '\n' ' ')"
stamp tested
B=/tmp/b/bench
{ echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  taskset -c 0 $B/cpu_ops_bench --benchmark_filter=BM_fma_peak --benchmark_min_time=0.2 2>&1 |
    grep -o 'GFLOP/s=[0-9.]*' | head -1 | sed 's/^/one core FMA peak /'; } | tee "$OUT/summary.md"

# GEMMs alone, M = 128: GPT-2 f32 out_in (5 qkv, 6 attn_out, 7 mlp_up, 8 mlp_down) and Qwen3
# gate_up bf16 (10); 1 thread also GPT-2 qkv at M = 512 (the packing amortised 4x more).
# (The calls of 2026-12-02 also ran XSERV_CPU_GEMM_PREFETCH=l1s|l2s, _ORDER=panels and _MR=12,
# since removed: docs/benchmarks.md.)
V=("this:" "l1:XSERV_CPU_GEMM_PREFETCH=l1" "off:XSERV_CPU_GEMM_PREFETCH=off" "kc128:XSERV_CPU_GEMM_KC=128"
   "first:XSERV_CPU_GEMM_FIRST=l2")
gf() { grep '^BM_gemm' "$1" | awk '{ for (i = 2; i <= NF; ++i) if ($i ~ /^GFLOP\/s=/) { v = substr($i, 9); sub(/\/s/, "", v); printf "%.0f ", v } }'; }
echo "| variant | 1 thread: qkv attn_out mlp_up mlp_down q3_gate_up(bf16) qkv@512 | 8 threads: qkv attn_out mlp_up mlp_down q3_gate_up | 8-thread GPT-2 mean |" | tee -a "$OUT/summary.md"
[ -n "$base_pid" ] && V=("main:" "${V[@]}")
for v in "${V[@]}"; do
  name=${v%%:*}; vars=${v#*:}
  envs=(); [ -n "$vars" ] && IFS=, read -ra envs <<<"$vars"
  B=/tmp/b/bench; [ "$name" = main ] && B=/tmp/bbase/bench
  env "${envs[@]}" XSERV_BENCH_THREADS=1 taskset -c 0 $B/cpu_ops_bench \
    --benchmark_filter='BM_gemm/(5|6|7|8)/128/0/0|BM_gemm/10/128/1/0|BM_gemm/5/512/0/0' --benchmark_min_time=0.15 >"$OUT/g1_$name.txt" 2>&1
  env "${envs[@]}" XSERV_BENCH_THREADS=8 taskset -c 0-7 $B/cpu_ops_bench \
    --benchmark_filter='BM_gemm/(5|6|7|8)/128/0/0|BM_gemm/10/128/1/0' --benchmark_min_time=0.15 >"$OUT/g8_$name.txt" 2>&1
  g8=$(gf "$OUT/g8_$name.txt")
  mean=$(echo "$g8" | awk '{ print ($1 + $2 + $3 + $4) / 4 }')
  echo "$mean $name $vars" >>"$OUT/rank.txt"
  echo "| $name | $(gf "$OUT/g1_$name.txt")| $g8| $mean |" | tee -a "$OUT/summary.md"
done
stamp "gemms measured"

# Whole prefills: GPT-2 at 8 threads, the default and the two best variants of the 8-thread GEMMs,
# 3 interleaved runs each (min / median / max); then Qwen3-0.6B with the best one.
B=/tmp/b/bench
top=$(grep -v ' \(this\|main\) ' "$OUT/rank.txt" | sort -gr | head -2)
r1=$(echo "$top" | sed -n 1p); r2=$(echo "$top" | sed -n 2p)
n1=$(echo "$r1" | cut -d' ' -f2); e1=$(echo "$r1" | cut -d' ' -f3)
n2=$(echo "$r2" | cut -d' ' -f2); e2=$(echo "$r2" | cut -d' ' -f3)
echo "best at 8 threads: $n1 ($e1), $n2 ($e2)" | tee -a "$OUT/summary.md"
ROWS="base:gpt2:8:-  this:gpt2:8:-  this:gpt2:8:$n1:$e1  this:gpt2:8:$n2:$e2;
  base:qwen3-0.6b:8:-  this:qwen3-0.6b:8:-  this:qwen3-0.6b:8:$n1:$e1" \
  BUILD=/tmp/b BASE_BUILD=/tmp/bbase RUNS=3 GEN_LEN=8 MD="$OUT/rows.md" bench/cpu_prefill_probe.sh "$OUT/probe" >/dev/null 2>"$OUT/probe_err.log"
grep '^| \(this\|base\)' "$OUT/rows.md" | tee -a "$OUT/summary.md"
stamp "prefills measured"

# Where a GPT-2 decode step goes at 8 threads (and its prefill), default kernels; main's prefill.
taskset -c 0-7 $B/generate_bench --dummy-weights --config bench/configs/gpt2.json --device cpu --threads 8 \
  --prompt-len 128 --gen-len 32 --repeat 1 --profile >"$OUT/profile_gpt2_8.txt" 2>&1
[ -x /tmp/bbase/bench/generate_bench ] && taskset -c 0-7 /tmp/bbase/bench/generate_bench --dummy-weights \
  --config bench/configs/gpt2.json --device cpu --threads 8 --prompt-len 128 --gen-len 4 --repeat 1 --profile \
  >"$OUT/profile_gpt2_8_main.txt" 2>&1
stamp profiled
(cd "$OUT" && tar czf raw.tgz g1_* g8_* probe && rm -rf g1_* g8_* probe)
cat "$OUT/summary.md"
for f in profile_gpt2_8 profile_gpt2_8_main; do
  [ -f "$OUT/$f.txt" ] && { echo "## $f"; sed -n '/^profile of the prefill/,/^| all ops/p' "$OUT/$f.txt" | head -14; }
done
sed -n '/^profile of the decode/,/^| all ops/p' "$OUT/profile_gpt2_8.txt"
