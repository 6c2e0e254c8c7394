#!/usr/bin/env bash
# The CPU decode attention's GQA heads and key parts (thirty-second session, docs/cpu.md) on the
# GPU machine's CPU: this tree ("bn") against a base tree ("bo": this tree with the files of
# BASE_TGZ over it), BM_attention_decode over 28 layers' caches at 2 and 8 threads and Qwen3-0.6B
# decode after 2048 prompt tokens with either cache, interleaved, then the [cpu] tests. As a
# request of scripts/device_round.sh (~9 min on the Xeon; THREADS="8" ~3): run.sh sets
#   BASE_TGZ=$(dirname "$0")/base.tgz OUT=... bash bench/device/cpu_attn_round.sh
# with base.tgz made here by
#   git archive 739fe47 lib/backend/cpu/cpu_kernels.inc lib/backend/cpu/cpu_kernels.hpp \
#     lib/backend/cpu/cpu_attention.cpp | gzip > base.tgz
source bench/device/cpu_round_common.sh
{ echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "flags: $(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"; } | tee "$OUT/summary.md"
rm -rf /tmp/basesrc && mkdir -p /tmp/basesrc && tar -cf - --exclude=./.devdeps . | tar -xf - -C /tmp/basesrc && tar xzf "$BASE_TGZ" -C /tmp/basesrc
build() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF -DXSERV_BUILD_TESTS=ON -DXSERV_BUILD_EXAMPLES=OFF -DXSERV_BUILD_BENCH=ON >"$OUT/build_$3.log" 2>&1 && cmake --build "$2" -j8 --target ${4:-generate_bench cpu_ops_bench} >>"$OUT/build_$3.log" 2>&1 || tail -20 "$OUT/build_$3.log"; }
build . /tmp/bn new "generate_bench cpu_ops_bench xserv_tests" & build /tmp/basesrc /tmp/bo base & wait
stamp built
for n in ${THREADS:-2 8}; do for p in 1 2; do for b in bo bn; do
  echo "ops $b t$n: $(XSERV_BENCH_THREADS=$n taskset -c 0-$((n-1)) /tmp/$b/bench/cpu_ops_bench --benchmark_filter='BM_attention_decode/1/2048/./.*/28' --benchmark_min_time=0.3 2>&1 | grep BM_ | awk '{printf "%s %s | ", substr($1,21,13), $8}')" | tee -a "$OUT/summary.md"
done; done; done
stamp ops
for kv in bf16 f32; do for n in ${THREADS:-8 2}; do for p in 1 2; do for b in bo bn; do
  echo "gen $b kv=$kv t$n: $(XSERV_CPU_KV=$kv taskset -c 0-$((n-1)) timeout 90 /tmp/$b/bench/generate_bench --dummy-weights --config bench/configs/qwen3-0.6b.json --device cpu --threads $n --prompt-len 2048 --gen-len 32 2>&1 | grep -E '^\| 1 ' | tail -1)" | tee -a "$OUT/summary.md"
done; done; done; done
stamp done
timeout 90 /tmp/bn/tests/xserv_tests "[cpu]" 2>&1 | tail -2 | tee -a "$OUT/summary.md"
