#!/usr/bin/env bash
# Issue 16 on the GPU machine's CPU in one command, no CUDA build: this tree's CPU backend next
# to a baseline tree's, on the same machine and cores (machines of that kind differ by up to 60%
# from one call to the next, so only figures of one call compare).
#
#   scripts/cpu_device_run.sh [BASE_SRC]       (from the repository root, .devdeps carried)
#
# BASE_SRC: a copy of the tree to compare against, e.g. made before a patch was unpacked over
# this one: `mkdir /tmp/base && tar --exclude=./.devdeps -cf - . | tar -xf - -C /tmp/base`.
# Steps ($OUT/summary.md holds the tables, $OUT/logs.tgz every log; the device tool returns at
# most 8 files, so logs go to $OUT/l and are packed at the end):
#   1. CPU-only Release builds (Ninja, -j16) of this tree in /tmp/bcpu (tests, generate_bench,
#      stream_read_bench) and of BASE_SRC in /tmp/bbase, while make_random_model.py writes the
#      gpt2, qwen3-0.6b and qwen3-1.7b checkpoints to /tmp/models;
#   2. the CPU op tests and the golden (HF logits) tests: `xserv_tests "[cpu],[golden]"`;
#   3. bench/cpu_compare.sh for this tree (Qwen3-0.6B with XSERV_CPU_CHUNKS=1 as a variant) and
#      for the baseline, at 2, 8 and 16 pinned threads, with the streaming-read ceiling;
#   4. the per-op profile of a Qwen3-0.6B decode step at 8 threads (generate_bench --profile).
# About 3 minutes on 16 cores. SKIP_BASE=1 skips the baseline's benchmarks.
# STAGE=prefill replaces steps 3-4 by bench/cpu_prefill_probe.sh (prefill rows of several runs
# each with env variants, per-op profiles of a prefill, the GEMMs alone at 1/2/8/16 threads).
# STAGE=ab: the gpt2 and qwen3-0.6b checkpoints only, this tree against BASE_SRC through
# bench/cpu_prefill_probe.sh with AB_ROWS (default below: 3 interleaved runs per row), one
# core's FMA peak and the GEMMs alone; $OUT/rows.md fills as rows finish, so a run cut short by
# its time limit still returns what it measured.
# STAGE=decode: decode rows (prompt 128, then 32 generated) of this tree against BASE_SRC through
# bench/cpu_prefill_probe.sh, dummy weights (bench/configs; no checkpoint making, no
# cpu_ops_bench build): first the streaming-read ceiling of 2, 8 and 16 cores with and without
# the GEMV's software prefetch (stream_read_bench --prefetch), then GPT-2 f32 and Qwen3-0.6B bf16
# at 8 threads with the XSERV_CPU_GEMV_PREFETCH and poll variants (DECODE_ROWS_8, DECODE_RUNS_8
# = 3 interleaved runs each), then 16 and 2 threads and Qwen3-1.7B at 8 (DECODE_ROWS,
# DECODE_RUNS = 2 runs each). $OUT/rows8.md and rows_more.md fill block by block. About 4
# minutes on 16 cores, both builds included.
set -uo pipefail
OUT=${OUT:-/tmp/out}
L=$OUT/l
mkdir -p "$L"
base_src=${1:-}
source scripts/device-env.sh
export MODELS=/tmp/models PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

checkpoints="qwen3-0.6b gpt2 qwen3-1.7b"
[ "${STAGE:-}" = ab ] && checkpoints="gpt2 qwen3-0.6b"
[ "${STAGE:-}" = decode ] && checkpoints=""
(mkdir -p "$MODELS"
 for m in $checkpoints; do
   [ -f "$MODELS/$m/config.json" ] || python3 .devdeps/tools/make_random_model.py "$MODELS" "$m"
 done) >"$L/models.log" 2>&1 &
makers=$!

build() {  # source dir, build dir, targets...
  local src=$1 dir=$2
  shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF \
    -DXSERV_BUILD_TESTS=ON -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF &&
    cmake --build "$dir" -j16 --target "$@"
}
ops_bench=cpu_ops_bench
[ "${STAGE:-}" = decode ] && ops_bench=""
build . /tmp/bcpu xserv_tests generate_bench stream_read_bench $ops_bench >"$L/build.log" 2>&1 &
this_build=$!
base_build=""
if [ -n "$base_src" ]; then
  build "$base_src" /tmp/bbase generate_bench >"$L/build_base.log" 2>&1 &
  base_build=$!
fi
wait "$this_build" || { tail -40 "$L/build.log"; exit 1; }
stamp "built"

/tmp/bcpu/tests/xserv_tests "[cpu],[golden]" >"$L/tests.log" 2>&1
echo "tests [cpu],[golden]: exit $? ($(tail -2 "$L/tests.log" | tr '\n' ' '))" | tee "$OUT/summary.md"
stamp "tested"

if [ "${STAGE:-}" = ab ]; then
  [ -n "$base_build" ] && { wait "$base_build" || tail -20 "$L/build_base.log"; }
  wait "$makers"
  stamp "base built; checkpoints: $(ls "$MODELS" | tr '\n' ' ')"
  ab_rows="this:gpt2:8:-  base:gpt2:8:-  this:gpt2:16:-  base:gpt2:16:-  this:gpt2:2:-  base:gpt2:2:-;
    this:qwen3-0.6b:8:-  base:qwen3-0.6b:8:-  this:qwen3-0.6b:16:-  base:qwen3-0.6b:16:-;
    this:gpt2:8:in_out:XSERV_CPU_CONV1D=in_out  this:gpt2:8:pspin20:XSERV_CPU_PREFILL_SPIN_US=20
    this:gpt2:8:spin200:XSERV_CPU_SPIN_US=200  this:gpt2:8:kc128:XSERV_CPU_GEMM_KC=128
    this:qwen3-0.6b:8:kc128:XSERV_CPU_GEMM_KC=128  this:qwen3-0.6b:8:pspin20:XSERV_CPU_PREFILL_SPIN_US=20;
    this:qwen3-0.6b:2:-  base:qwen3-0.6b:2:-"
  ROWS=${AB_ROWS:-$ab_rows} BUILD=/tmp/bcpu BASE_BUILD=/tmp/bbase GEMM_THREADS=${GEMM_THREADS:-"1 8"} FMA_CORES=${FMA_CORES:-"8 16"} \
    GEMM_FILTER=${GEMM_FILTER:-"BM_gemm/(1|3|6|8)/128/0/0|BM_gemm/10/128/1/0"} \
    PROFILES=${PROFILES:-gpt2:8} MD="$OUT/rows.md" bench/cpu_prefill_probe.sh "$L/ab" >/dev/null 2>"$L/ab_err.log"
  stamp "measured"
  tail -5 "$L/ab_err.log"
  tar czf "$OUT/logs.tgz" -C "$OUT" l && rm -rf "$L"
  exit 0
fi
if [ "${STAGE:-}" = decode ]; then
  [ -n "$base_build" ] && { wait "$base_build" || tail -20 "$L/build_base.log"; }
  stamp "base built"
  {
    echo
    echo "streaming-read ceiling (stream_read_bench --mb 1024 --repeat 10, cores 0..N-1), GB/s:"
    echo
    echo "| threads | no flag (4 KB ahead into L1) | --prefetch off | --prefetch l2:32 | --prefetch both:32 |"
    echo "| ---: | ---: | ---: | ---: | ---: |"
  } | tee -a "$OUT/rows.md"
  for n in 2 8 16; do
    [ "$n" -le "$(nproc)" ] || continue
    row="| $n |"
    for pf in "" "--prefetch off" "--prefetch l2:32" "--prefetch both:32"; do
      row="$row $(taskset -c "0-$((n - 1))" /tmp/bcpu/bench/stream_read_bench --threads "$n" --mb 1024 --repeat 10 $pf |
                  sed -n 's/.*: \([0-9.]*\) GB\/s.*/\1/p') |"
    done
    echo "$row" | tee -a "$OUT/rows.md"
  done
  stamp "ceilings measured"
  pf=XSERV_CPU_GEMV_PREFETCH
  rows8="this:qwen3-0.6b:8:-  base:qwen3-0.6b:8:-  this:qwen3-0.6b:8:l1:$pf=l1  this:qwen3-0.6b:8:l2_32:$pf=l2:32
    this:qwen3-0.6b:8:spin20:XSERV_CPU_SPIN_US=20;
    this:gpt2:8:-  base:gpt2:8:-  this:gpt2:8:l1:$pf=l1  this:gpt2:8:l2_32:$pf=l2:32  this:gpt2:8:spin20:XSERV_CPU_SPIN_US=20"
  rows="this:gpt2:16:-  base:gpt2:16:-  this:gpt2:16:l2_32:$pf=l2:32  this:qwen3-0.6b:16:-  base:qwen3-0.6b:16:-;
    this:gpt2:2:-  base:gpt2:2:-  this:qwen3-0.6b:2:-  base:qwen3-0.6b:2:-  this:qwen3-0.6b:2:l2_32:$pf=l2:32;
    this:qwen3-1.7b:8:-  base:qwen3-1.7b:8:-"
  ROWS=${DECODE_ROWS_8:-$rows8} RUNS=${DECODE_RUNS_8:-3} GEN_LEN=32 BUILD=/tmp/bcpu BASE_BUILD=/tmp/bbase MD="$OUT/rows8.md" \
    bench/cpu_prefill_probe.sh "$L/decode8" >/dev/null 2>"$L/decode_err.log"
  stamp "8 threads measured"
  ROWS=${DECODE_ROWS:-$rows} RUNS=${DECODE_RUNS:-2} GEN_LEN=32 BUILD=/tmp/bcpu BASE_BUILD=/tmp/bbase MD="$OUT/rows_more.md" \
    bench/cpu_prefill_probe.sh "$L/decode" >/dev/null 2>>"$L/decode_err.log"
  stamp "measured"
  grep -h '^| \(this\|base\) ' "$OUT/rows8.md" "$OUT/rows_more.md"
  tail -5 "$L/decode_err.log"
  tar czf "$OUT/logs.tgz" -C "$OUT" l && rm -rf "$L"
  exit 0
fi
wait "$makers"
stamp "checkpoints: $(ls "$MODELS" | tr '\n' ' ')"
if [ "${STAGE:-}" = prefill ]; then
  BUILD=/tmp/bcpu bench/cpu_prefill_probe.sh "$L/prefill" >/dev/null 2>"$L/prefill_err.log"
  stamp "prefill probed"
  { echo; cat "$L/prefill/prefill.md"; tail -5 "$L/prefill_err.log"; } | tee -a "$OUT/summary.md"
  tar czf "$OUT/logs.tgz" -C "$OUT" l && rm -rf "$L"
  exit 0
fi
THREADS="2 8 16" MODEL_NAMES="qwen3-0.6b gpt2 qwen3-1.7b" BUILD=/tmp/bcpu REBUILD=0 \
  VARIANTS="chunks1:XSERV_CPU_CHUNKS=1" VARIANT_MODELS=qwen3-0.6b \
  bench/cpu_compare.sh "$L/cpu_compare_this.md" >/dev/null
stamp "this tree measured"
if [ -n "$base_build" ] && [ "${SKIP_BASE:-0}" != 1 ]; then
  if wait "$base_build"; then
    THREADS="2 8 16" MODEL_NAMES="qwen3-0.6b gpt2" BUILD=/tmp/bbase REBUILD=0 \
      bench/cpu_compare.sh "$L/cpu_compare_base.md" >/dev/null
  else
    tail -20 "$L/build_base.log"
  fi
  stamp "baseline measured"
fi
taskset -c 0-7 /tmp/bcpu/bench/generate_bench -m "$MODELS/qwen3-0.6b" --device cpu --threads 8 \
  --prompt-len 128 --gen-len 32 --repeat 1 --profile >"$L/profile_qwen3-0.6b_8.txt" 2>&1
stamp "profiled"

{
  echo
  echo "## this tree"
  cat "$L/cpu_compare_this.md"
  if [ -f "$L/cpu_compare_base.md" ]; then
    echo
    echo "## baseline"
    cat "$L/cpu_compare_base.md"
  fi
  echo
  echo "## profile, Qwen3-0.6B, 8 threads (this tree)"
  sed -n '/^profile/,$p' "$L/profile_qwen3-0.6b_8.txt" | head -24
} | tee -a "$OUT/summary.md"
tar czf "$OUT/logs.tgz" -C "$OUT" l && rm -rf "$L"
