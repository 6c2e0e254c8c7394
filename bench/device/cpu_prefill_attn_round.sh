#!/usr/bin/env bash
# The CPU prefill attention with its rows in SIMD lanes (thirty-third session, docs/cpu.md) on the
# GPU machine's CPU (AVX-512: tiles of 16 rows, 1 x 16 accumulators; measured only on an AVX2
# EPYC so far): one build, XSERV_CPU_ATTN_LANES=0 (the row-major kernel) against the default,
# interleaved: BM_attention_prefill at 2 and 8 threads, then prefill tok/s of Qwen3-0.6B (2048
# prompt tokens, f32 and bf16 cache) and GPT-2 (1022, its context less the 2 generated) at 8 and 2 threads, then the [cpu] tests.
# As a request of scripts/device_round.sh (~6 min on the Xeon): run.sh sets
#   OUT=... bash bench/device/cpu_prefill_attn_round.sh
source bench/device/cpu_round_common.sh
{ echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "flags: $(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"; } | tee "$OUT/summary.md"
cmake -S . -B /tmp/bl -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF -DXSERV_BUILD_TESTS=ON -DXSERV_BUILD_EXAMPLES=OFF \
  -DXSERV_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 && cmake --build /tmp/bl -j16 --target generate_bench cpu_ops_bench xserv_tests >>"$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
stamp built
for n in ${THREADS:-2 8}; do for p in 1 2; do for l in 0 1; do
  echo "ops lanes=$l t$n: $(XSERV_CPU_ATTN_LANES=$l XSERV_BENCH_THREADS=$n taskset -c 0-$((n-1)) /tmp/bl/bench/cpu_ops_bench --benchmark_filter='BM_attention_prefill' --benchmark_min_time=0.3 2>&1 | grep BM_ | awk '{printf "%s %s | ", substr($1,22,10), $2}')" | tee -a "$OUT/summary.md"
done; done; done
stamp ops
gen() {  # model prompt-len threads lanes [kv]
  echo "gen $1 p$2 t$3 lanes=$4 kv=${5:-f32}: $(XSERV_CPU_ATTN_LANES=$4 XSERV_CPU_KV=${5:-f32} taskset -c 0-$(($3 - 1)) timeout 120 /tmp/bl/bench/generate_bench --dummy-weights --config bench/configs/$1.json --device cpu --threads $3 --prompt-len $2 --gen-len 2 2>&1 | grep -E '^\| 1 ' | tail -1)" | tee -a "$OUT/summary.md"
}
for n in ${GEN_THREADS:-8 2}; do for p in 1 2; do for l in 0 1; do
  gen qwen3-0.6b 2048 "$n" "$l"; gen qwen3-0.6b 2048 "$n" "$l" bf16; gen gpt2 1022 "$n" "$l"
done; done; done
stamp gen
timeout 120 /tmp/bl/tests/xserv_tests "[cpu]" 2>&1 | tail -2 | tee -a "$OUT/summary.md"
stamp done
