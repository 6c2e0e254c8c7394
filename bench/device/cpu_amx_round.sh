#!/usr/bin/env bash
# Issue 16 on the GPU machine's CPU, one round request (scripts/device_round.sh), <= 100 s: a
# CPU-only build, the [cpu] and [golden] tests (the AMX cases on the tiles), then whole prefills
# of 3 interleaved runs: Qwen3-0.6B at 8 threads with the AMX GEMM's A rows skewed (the default)
# and not (XSERV_CPU_AMX_LDA=tight), GPT-2 at 8 with the first tile's L2 prefetch (the default)
# and without (XSERV_CPU_GEMM_FIRST=off); Qwen3-1.7B at 8 with AMX and without, one run each.
# (Round 1's script, with the unpacked GEMM and the GEMMs alone per variant: git history,
# bench/device/cpu_dot_round.sh.)
#   OUT=... bash bench/device/cpu_amx_round.sh        (from the repository root)
source bench/device/cpu_round_common.sh
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF -DXSERV_BUILD_TESTS=ON \
  -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv_tests generate_bench >>"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
stamp built
/tmp/b/tests/xserv_tests "[cpu],[golden]" >"$OUT/tests.log" 2>&1
echo "tests [cpu],[golden]: rc=$? $(tail -2 "$OUT/tests.log" | tr '\n' ' ')" | tee "$OUT/summary.md"
stamp tested
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.md"
ROWS="this:qwen3-0.6b:8:amx  this:qwen3-0.6b:8:tight:XSERV_CPU_AMX_LDA=tight;
  this:gpt2:8:first  this:gpt2:8:first_off:XSERV_CPU_GEMM_FIRST=off" \
  BUILD=/tmp/b RUNS=3 GEN_LEN=2 MD="$OUT/rows.md" timeout 45 bench/cpu_prefill_probe.sh "$OUT/probe" >/dev/null 2>"$OUT/probe_err.log"
ROWS="this:qwen3-1.7b:8:amx  this:qwen3-1.7b:8:no_amx:XSERV_CPU_AMX=0" \
  BUILD=/tmp/b RUNS=1 GEN_LEN=2 MD="$OUT/rows17.md" timeout 25 bench/cpu_prefill_probe.sh "$OUT/probe17" >/dev/null 2>>"$OUT/probe_err.log"
grep -h '^| this' "$OUT/rows.md" "$OUT/rows17.md" | tee -a "$OUT/summary.md"
stamp "prefills measured"
# The probes' per-run lines, in case a time limit cut a block before its table.
cat "$OUT"/probe*/prefill_runs.txt 2>/dev/null | grep -o '^this:[^ ]* run [0-9]*:\|^| 1 |.*' | paste - - >"$OUT/runs.txt"
(cd "$OUT" && tar czf raw.tgz probe probe17 && rm -rf probe probe17)
