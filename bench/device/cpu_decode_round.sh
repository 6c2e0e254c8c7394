#!/usr/bin/env bash
# Issue 16, decode on the GPU machine's CPU: one round request (scripts/device_round.sh), <= 240 s.
# A CPU-only build, the [cpu] and [golden] tests with the switches under test on, then decode
# (prompt 128, 32 generated; 3 interleaved runs per row, bench/cpu_prefill_probe.sh) of this
# build with and without each switch (VARIANTS: "label:VAR=v[,VAR=v] ..."), per-op profiles of
# a decode step, and the streaming-read ceiling with the L3 probe (stream_read_bench --nta-after).
#   OUT=... VARIANTS="..." bash bench/device/cpu_decode_round.sh        (from the repository root)
# A request's run.sh may define plan() (calls of probe / profile / stream below) and source this
# file instead; the default plan is Qwen3-0.6B at 8 threads.
source bench/device/cpu_round_common.sh
left() { echo $((${BUDGET:-225} - ($(date +%s) - t0))); }
B=${B:-/tmp/b}   # the build; SKIP_BUILD=1 uses one already there (trying the script out)
[ -n "${SKIP_BUILD:-}" ] || cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF -DXSERV_BUILD_TESTS=ON \
  -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF >"$OUT/build.log" 2>&1 &&
  cmake --build "$B" -j16 --target xserv_tests generate_bench stream_read_bench >>"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
stamp built
all_on=${ALL_ON:-}   # the switches under test, all on, for the tests
env $all_on timeout 40 $B/tests/xserv_tests "[cpu],[golden]" >"$OUT/tests.log" 2>&1
echo "tests [cpu],[golden] with '$all_on': rc=$? $(tail -2 "$OUT/tests.log" | tr '\n' ' ')" | tee "$OUT/summary.md"
stamp tested
{ echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "flags: $(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  lscpu | grep -i 'cache\|numa' | tr -s ' ' | tr '\n' ';'; echo
  echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"; } | tee -a "$OUT/summary.md"

# One block of decode rows: $1 = model:threads ..., each next to the base with every variant of
# $2 (default VARIANTS).
block() {
  local rows=""
  for mt in $1; do
    rows="$rows this:$mt:base"
    for v in ${2:-${VARIANTS:-}}; do rows="$rows this:$mt:$v"; done
  done
  echo "$rows"
}
probe() {  # $1 name, $2 rows, $3 timeout
  local t=$(( $3 < $(left) ? $3 : $(left) ))
  [ "$t" -gt 5 ] || { echo "skipped $1 (time)" | tee -a "$OUT/summary.md"; return; }
  ROWS="$2" BUILD=$B RUNS=${RUNS:-3} GEN_LEN=32 MD="$OUT/rows_$1.md" timeout "$t" \
    bench/cpu_prefill_probe.sh "$OUT/probe_$1" >/dev/null 2>>"$OUT/probe_err.log"
  grep -h '^| this' "$OUT/rows_$1.md" | sed "s/^/$1 /" | tee -a "$OUT/summary.md"
  # A block cut by its time limit has no table: its runs as they came (prefill, decode tok/s).
  grep -q '^| this' "$OUT/rows_$1.md" ||
    grep -o '^this:[^: ]*:[^: ]*:[^: ]*\|^| 1 | [0-9.]* | [0-9.]*' "$OUT/probe_$1/prefill_runs.txt" 2>/dev/null |
    paste - - | sed "s/^/$1 cut: /" | tee -a "$OUT/summary.md"
  stamp "$1 done"
}
profile() {  # $1 label, $2 env, $3 model, $4 threads
  [ "$(left)" -gt 15 ] || return
  env $2 timeout 30 taskset -c "0-$(($4 - 1))" $B/bench/generate_bench --dummy-weights \
    --config "bench/configs/$3.json" --device cpu --threads "$4" --prompt-len 128 --gen-len 32 \
    --repeat 1 --profile >"$OUT/profile_$1.txt" 2>&1
  { echo "### decode profile $1 ($3, $4 threads, $2)"
    sed -n '/^profile of the decode/,/^| all ops/p' "$OUT/profile_$1.txt"; } >>"$OUT/profiles.md"
}
stream() {  # $@ stream_read_bench arguments after the cores
  local n=$1; shift
  [ "$(left)" -gt 10 ] || return
  timeout 20 taskset -c "0-$((n - 1))" $B/bench/stream_read_bench --threads "$n" "$@" 2>&1 |
    tee -a "$OUT/stream.txt"
}

if declare -F plan >/dev/null; then plan; else probe q8 "$(block qwen3-0.6b:8)" 60; fi
stamp "plan done"
(cd "$OUT" && tar czf raw.tgz probe_* 2>/dev/null && rm -rf probe_*)
echo; cat "$OUT/summary.md"; echo; cat "$OUT/stream.txt" 2>/dev/null || true
