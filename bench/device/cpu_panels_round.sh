#!/usr/bin/env bash
# Issue 16 on the GPU machine's Xeon, one round request (scripts/device_round.sh), <= 170 s:
# GPT-2's f32 Conv1D weights in 32-column panels (WeightLayout::panel32, the default) against
# transposed ones (XSERV_CPU_CONV1D=out_in, the rule before), and Qwen3-0.6B's 2-thread bf16
# decode. A CPU-only build, the [cpu] and [golden] tests (again with the switches under test),
# then, each block cut to what BUDGET has left, the most wanted first:
#   1. the GEMMs alone (cpu_ops_bench, M = 128, GPT-2's f32 shapes transposed and as panels) at
#      1, 2, 4 and 8 threads (GEMM_THREADS), one core's FMA peak alone and with 8 cores running it,
#      the prefill attention alone at 8 threads with and without XSERV_CPU_ATTN_SPLIT=claimed;
#   2. GPT-2 at 8 threads, prompt 128 then 32 generated, the variants of G8 interleaved
#      (bench/cpu_prefill_probe.sh rows, pinned to cores 0-7, G8_RUNS runs each);
#   3. the streaming ceilings of 2, 8 and 16 cores (stream_read_bench, the GEMVs' both:32) and
#      of 2 cores under the prefetch distances of SWEEP2;
#   4. GPT-2 at 16 (G16) and 2 (G2) threads, the same way;
#   5. per-op prefill profiles of GPT-2 at 8 threads (PROFILES8, alternating);
#   6. Qwen3-0.6B at 2 threads (Q2), and decode profiles of Q2_PROFILES.
# Issue 16's table rows from them: docs/benchmarks.md ("GPT-2's Conv1D weights in 32-column
# panels"). Round 1 of 2026-12-04 ran it with G8="base panels:XSERV_CPU_CONV1D=panels
# panels_pf_off:...,XSERV_CPU_GEMM_PREFETCH=off panels_t32x2:...,XSERV_CPU_GEMM_TILE=32x2
# panels_attn:...,XSERV_CPU_ATTN_SPLIT=claimed" when panels were opt-in.
#   OUT=... bash bench/device/cpu_panels_round.sh        (from the repository root)
source bench/device/cpu_round_common.sh
B=${B:-/tmp/b}
BUDGET=${BUDGET:-163}
left() { echo $((BUDGET - ($(date +%s) - t0))); }
OLD=XSERV_CPU_CONV1D=out_in
G8=${G8:-"base out_in:$OLD attn:XSERV_CPU_ATTN_SPLIT=claimed kc128:XSERV_CPU_GEMM_KC=128 first:XSERV_CPU_GEMM_FIRST=l2"}
G16=${G16:-"base out_in:$OLD"}
G2=${G2:-"base out_in:$OLD"}
Q2=${Q2:-"base seq0:XSERV_CPU_GEMV_SEQ=0,XSERV_CPU_GEMV_HEAD=0"}
Q2_PROFILES=${Q2_PROFILES:-}
PROFILES8=${PROFILES8:-"base out_in:$OLD"}
[ -n "${SKIP_BUILD:-}" ] || { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF \
  -DXSERV_BUILD_TESTS=ON -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build "$B" -j16 --target xserv_tests generate_bench stream_read_bench cpu_ops_bench \
    >>"$OUT/build.log" 2>&1; } || { tail -40 "$OUT/build.log"; exit 1; }
stamp built
timeout 40 "$B/tests/xserv_tests" "[cpu],[golden]" >"$OUT/tests.log" 2>&1
echo "tests [cpu],[golden]: rc=$? $(tail -2 "$OUT/tests.log" | tr '\n' ' ')" | tee "$OUT/summary.md"
# The switches read once per process: the tests they change, again with them on.
XSERV_CPU_ATTN_SPLIT=claimed XSERV_CPU_GEMM_KC=128 XSERV_CPU_GEMM_FIRST=l2 timeout 20 "$B/tests/xserv_tests" \
  "cpu paged attention*,cpu prefill then decode*,cpu gemm*,[golden]" >"$OUT/tests_on.log" 2>&1
echo "tests with XSERV_CPU_ATTN_SPLIT=claimed XSERV_CPU_GEMM_KC=128 XSERV_CPU_GEMM_FIRST=l2: rc=$? $(tail -2 "$OUT/tests_on.log" | tr '\n' ' ')" | tee -a "$OUT/summary.md"
stamp tested
{ echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "flags: $(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"; } |
  tee -a "$OUT/summary.md"

# 1. The GEMMs alone: GFLOP/s per shape (5-8 out_in, 13-16 panel32: qkv, attn_out, mlp_up, mlp_down).
taskset -c 0 "$B/bench/cpu_ops_bench" --benchmark_filter=BM_fma_peak --benchmark_min_time=0.2 >"$OUT/fma_peak.txt" 2>&1
echo "one core's FMA peak: $(grep -o 'GFLOP/s=[0-9.]*' "$OUT/fma_peak.txt" | head -1)" | tee -a "$OUT/summary.md"
# The same FMA loop on 8 cores at once (one process each): whether the clock holds.
for c in 0 1 2 3 4 5 6 7; do
  taskset -c "$c" "$B/bench/cpu_ops_bench" --benchmark_filter=BM_fma_peak --benchmark_min_time=0.3 >"$OUT/fma_peak_8_$c.txt" 2>&1 &
done
wait
echo "FMA peak per core with 8 cores busy: $(cat "$OUT"/fma_peak_8_*.txt | grep -o 'GFLOP/s=[0-9.]*' | cut -d= -f2 | sort -g | tr '\n' ' ')" |
  tee -a "$OUT/summary.md"
for n in ${GEMM_THREADS:-1 2 4 8}; do
  XSERV_BENCH_THREADS=$n timeout 30 taskset -c "0-$((n - 1))" "$B/bench/cpu_ops_bench" \
    --benchmark_filter='BM_gemm/(5|6|7|8|13|14|15|16)/128/0/0' --benchmark_min_time=0.15 >"$OUT/gemm_$n.txt" 2>&1
  echo "GEMM GFLOP/s, M = 128, $n threads: $(awk '/^BM_gemm/ { for (i = 2; i <= NF; ++i) if ($i ~ /^GFLOP\/s=/) {
    v = substr($i, 9); sub(/\/s/, "", v); l = $(NF - 3); printf "%s %s, ", l, v } }' "$OUT/gemm_$n.txt")" | tee -a "$OUT/summary.md"
done
for v in rr claimed; do
  XSERV_CPU_ATTN_SPLIT=$v XSERV_BENCH_THREADS=8 timeout 15 taskset -c 0-7 "$B/bench/cpu_ops_bench" \
    --benchmark_filter='BM_attention_prefill' --benchmark_min_time=0.15 >"$OUT/attn_$v.txt" 2>&1
  echo "prefill attention alone, 8 threads, XSERV_CPU_ATTN_SPLIT=$v (us, 128 / 512 rows): $(awk '/^BM_attention_prefill/ { printf "%s ", $2 }' "$OUT/attn_$v.txt")" | tee -a "$OUT/summary.md"
done
stamp gemms

rows() {  # $1 model:threads, $2 variants "label[:VAR=v,VAR=v] ..."
  local r="" v
  for v in $2; do
    case $v in *:*) r="$r this:$1:$v" ;; *) r="$r this:$1:$v:" ;; esac
  done
  echo "$r"
}
probe() {  # $1 name, $2 rows, $3 runs, $4 seconds at most
  local t=$(( $4 < $(left) ? $4 : $(left) ))
  [ "$t" -gt 5 ] || { echo "skipped $1 (time)" | tee -a "$OUT/summary.md"; return; }
  ROWS="$2" BUILD=$B RUNS=$3 GEN_LEN=32 MD="$OUT/rows_$1.md" timeout "$t" \
    bench/cpu_prefill_probe.sh "$OUT/probe_$1" >/dev/null 2>>"$OUT/probe_err.log"
  grep -h '^| this' "$OUT/rows_$1.md" | sed "s/^/$1 /" | tee -a "$OUT/summary.md"
  # A block cut by its time limit has no table: its runs as they came (prefill, decode tok/s).
  grep -q '^| this' "$OUT/rows_$1.md" ||
    grep -o '^this:[^ ]* run [0-9]*\|^| 1 | [0-9.]* | [0-9.]*' "$OUT/probe_$1/prefill_runs.txt" 2>/dev/null |
    paste - - | sed "s/^/$1 cut: /" | tee -a "$OUT/summary.md"
  stamp "$1 done"
}
profile() {  # $1 label, $2 env (VAR=v,...), $3 model, $4 threads, $5 which: prefill or decode
  [ "$(left)" -gt 12 ] || return
  env ${2//,/ } timeout 25 taskset -c "0-$(($4 - 1))" "$B/bench/generate_bench" --dummy-weights \
    --config "bench/configs/$3.json" --device cpu --threads "$4" --prompt-len 128 --gen-len 16 \
    --repeat 1 --profile >"$OUT/profile_$1.txt" 2>&1
  { echo; echo "### $5 profile $1 ($3, $4 threads, ${2:-defaults})"
    sed -n "/^profile of the $5/,/^| all ops/p" "$OUT/profile_$1.txt"; } | tee -a "$OUT/profiles.md" >/dev/null
  stamp "profile $1"
}

# 2-6.
probe g8 "$(rows gpt2:8 "$G8")" "${G8_RUNS:-5}" 40
# The streaming ceilings (the GEMVs' prefetch, both:32), then other prefetch distances on 2 cores.
for n_pf in 2:both:32 8:both:32 16:both:32 ${SWEEP2:-}; do
  n=${n_pf%%:*}
  [ "$(left)" -gt 8 ] && timeout 15 taskset -c "0-$((n - 1))" "$B/bench/stream_read_bench" --threads "$n" --mb 1024 \
    --repeat 4 --prefetch "${n_pf#*:}" 2>&1 | tee -a "$OUT/stream.txt"
done
probe g16 "$(rows gpt2:16 "$G16")" "${G16_RUNS:-4}" 15
probe g2 "$(rows gpt2:2 "$G2")" "${G2_RUNS:-3}" 35
for v in $PROFILES8 $PROFILES8; do
  case $v in *:*) l=${v%%:*} e=${v#*:} ;; *) l=$v e="" ;; esac
  [ -f "$OUT/profile_gpt2_8_$l.txt" ] && l=${l}_2
  profile "gpt2_8_$l" "$e" gpt2 8 prefill
done
probe q2 "$(rows qwen3-0.6b:2 "$Q2")" "${Q2_RUNS:-2}" 25
for v in $Q2_PROFILES; do
  case $v in *:*) profile "q06_2_${v%%:*}" "${v#*:}" qwen3-0.6b 2 decode ;; *) profile "q06_2_$v" "" qwen3-0.6b 2 decode ;; esac
done
stamp "plan done"
(cd "$OUT" && tar czf raw.tgz probe_* 2>/dev/null && rm -rf probe_*)
echo; cat "$OUT/summary.md"; echo; cat "$OUT/stream.txt" 2>/dev/null; cat "$OUT/profiles.md" 2>/dev/null
