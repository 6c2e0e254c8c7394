#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks on the GPU machine, in one command (device time is
# scarce: everything that belongs together runs here, logs land in $OUT).
#   scripts/cuda_device_run.sh check   build, [cuda] tests, compute-sanitizer, GPT-2 + Qwen3-0.6B
#                                       parity and benchmarks next to transformers
#   scripts/cuda_device_run.sh big     Qwen3-8B: parity, load time, prefill 512, decode b1/16/64
#                                       next to transformers
#   scripts/cuda_device_run.sh decode  [cuda] tests, then decode speed with programmatic dependent
#                                       launch off and on (XSERV_CUDA_PDL), per-kernel times (ncu)
#   scripts/cuda_device_run.sh tests   [cuda] tests, compute-sanitizer over the sampling kernels
#   scripts/cuda_device_run.sh serve   [cuda] tests (engine included), then the engine's serving
#                                       benchmarks (bench/serve_bench: Qwen3-8B and 1.7B at 1/16/64/
#                                       128 concurrent, Poisson arrivals, a shared 1024-token prefix),
#                                       and c_api_bench on Qwen3-8B
#   scripts/cuda_device_run.sh tp      on 1 GPU: every [cuda] test, Qwen3-8B / 14B batch-1 decode
#                                       (TP=1); on 2 GPUs (nvidia-h200-x2): tensor-parallel tests
#                                       (TP=2 vs 1 on GPT-2 f32 and Qwen3-0.6B bf16), Qwen3-8B decode
#                                       at TP=2 with and without its all-reduces, 128-request serving
#                                       at TP=1 and 2, Qwen3-14B TP=2 decode; docs/parallel.md
#   scripts/cuda_device_run.sh latency [cuda] tests, then load time, host RSS, first-token
#                                       latency of unseen prompt lengths and greedy vs sampled
#                                       decode through the C API (Qwen3-8B, 0.6B; c_api_bench)
#   scripts/cuda_device_run.sh sampling the sampling tests under memcheck and racecheck, then
#                                       greedy vs sampled decode through the C API (Qwen3-0.6B, 8B)
#   scripts/cuda_device_run.sh attn    [cuda] tests, then long-context, serving and batch-1 speed
#                                       with the tiled decode attention off (before) and on (after)
#   scripts/cuda_device_run.sh prefill the prefill-attention tests (both kernels) under compute-
#                                       sanitizer memcheck, then Qwen3-8B prefill of 16384 tokens with
#                                       the wmma kernel (before) and the mma kernel (after), and the
#                                       kernel time of one prefill's attention (ncu; PREFILL_NCU=0
#                                       leaves it out); FULL_TESTS=1 runs every [cuda] test first
#   scripts/cuda_device_run.sh decodeprof  [cuda] tests (SKIP_TESTS=1: none), batch-1 decode of
#                                       GPT-2, Qwen3-0.6B/1.7B/8B with PDL off and on, each step's
#                                       kernels, gaps and idle time outside the graph (nsys,
#                                       scripts/nsys_steps.py), Qwen3-8B per-kernel bandwidth (ncu)
#   scripts/cuda_device_run.sh fused   [cuda] tests, then decode with the fused kernels off
#                                       (before), as default (after) and with the opt-in one-kernel
#                                       attention: every model at batch 1, a long-ish
#                                       context, 16 rows; GPT-2 + Qwen3-0.6B parity with transformers
#   scripts/cuda_device_run.sh gemv    the decode GEMV tests, memcheck over every K split,
#                                       the GEMV launch-shape sweep (bench/gemv_bench), batch-1
#                                       decode of every model before/after (GEMV_SIDES), 8B at 16 rows
#   scripts/cuda_device_run.sh skinny  the GEMM, engine and graph tests (memcheck over the GEMM
#                                       test), then batched decode (8/16/32 rows) and serving at
#                                       16/64 concurrent with 5..32-row GEMMs on cuBLASLt (before,
#                                       XSERV_CUDA_SKINNY_ROWS=0) and on the skinny kernel (after);
#                                       SKINNY_NCU=1 adds one 16-row Qwen3-8B step per kernel (ncu),
#                                       SKINNY_SERVE=0 leaves the serving runs out
#   scripts/cuda_device_run.sh dattn   [cuda] tests (TEST_SPEC: a filter; SKIP_TESTS=1: none), compute-sanitizer over the
#                                       decode attention tests, then decode with the tile kernel
#                                       (XSERV_CUDA_ATTN_MMA=0, before) and the mma kernel (after):
#                                       Qwen3-8B after 16k, 1.7B after 4k, batch 1 of 0.6B/1.7B/8B,
#                                       8B serving at 16/128; the attention kernels' time and DRAM
#                                       bytes of one decode step (ncu). VARIANTS="stages2 ..." adds
#                                       tuning runs after 16k/4k (XSERV_CUDA_ATTN_STAGES / _SPLIT_KEYS),
#                                       B1_VARIANTS="fuseqk ..." to the 0.6B/1.7B batch-1 runs
#   scripts/cuda_device_run.sh serveprof  batched decode (issue 10): step times and serving at
#                                       16/64/128 of Qwen3-1.7B and 8B, ncu tables of one step
#                                       per batch size with its sampling (scripts/ncu_steps.py)
#   scripts/cuda_device_run.sh batched  sampling/engine tests (memcheck over the sampling
#                                       tests), then Qwen3-1.7B and 8B serving and decode at
#                                       16/64/128 with the sampling as before (XSERV_CUDA_SAMPLE_
#                                       LEGACY=1) and after, VARIANTS of 1.7B, ncu of the sampling
#   scripts/cuda_device_run.sh profile [cuda] tests, then per-kernel times (ncu, scripts/
#                                       ncu_table.py) of one graph-replayed decode step at 16/64/
#                                       128 rows (Qwen3-8B, 1.7B; dummy weights)
#   scripts/cuda_device_run.sh gpt2prof GPT-2 124M f32: its op and model tests, memcheck over the
#                                       LayerNorm GEMV and transpose, batch-1 decode and prefill 512
#                                       with the Conv1D weights as stored and the f32 attention's
#                                       merge and k/v write as separate kernels (before), the
#                                       weights transposed (conv1d), everything (after); the
#                                       kernels of one decode step before and after (ncu)
# Builds here with Ninja (about 35 s on the 16 cores), then runs. On a machine still warm from
# someone else's run, /tmp/b holds their build: sources unpacked from an archive keep their
# older modification times and Ninja rebuilds nothing. Start from an empty /tmp/b then (or
# unpack with `tar -m`).
set -uo pipefail
stage=${1:-check}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
root=$(pwd)
source scripts/device-env.sh
export PYTHONUNBUFFERED=1
echo "== build"
t0=$(date +%s)
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF -DXSERV_CUDA_TEST_BINARY=ON >"$OUT/build.txt" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv_cuda_tests xserv_logits_dump generate_bench tokenizer_bench c_api_bench serve_bench \
    >>"$OUT/build.txt" 2>&1 || { tail -50 "$OUT/build.txt"; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"
bin=/tmp/b/bin
mkdir -p $bin
cp /tmp/b/tests/cuda/xserv_cuda_tests $bin/xserv_tests && cp /tmp/b/bench/generate_bench /tmp/b/bench/c_api_bench /tmp/b/bench/serve_bench $bin/
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/gpu.txt"
tools=$root/.devdeps/tools

bench() {  # model dir, extra args; prints generate_bench's table
  "$bin/generate_bench" -m "$1" --device cuda "${@:2}" 2>&1
}

run_cuda_tests() {  # the [cuda] tests; the log in $OUT/tests.txt, failures and totals here
  echo "== [cuda] tests"
  timeout "$1" "$bin/xserv_tests" "${TEST_SPEC:-[cuda]}" --durations yes >"$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|with expansion|:[0-9]+: " "$OUT/tests.txt" | tail -30
}

sanitize() {  # test-name patterns, log file: compute-sanitizer memcheck over those tests
  echo "== compute-sanitizer memcheck ($1)"
  timeout 90 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    "$bin/xserv_tests" "$1" 2>&1 | tail -6 | tee "$OUT/$2"
}

checkpoints() {  # make_random_model.py names; Qwen3-8B's files end up in the page cache
  echo "== checkpoints"
  timeout 150 python3 "$tools/make_random_model.py" /tmp/models "$@" 2>&1 | grep make_models
  if [ -d /tmp/models/qwen3-8b ]; then cat /tmp/models/qwen3-8b/*.safetensors >/dev/null; fi
}

ncu_decode_step() {  # per-kernel times of two layers of a Qwen3-8B decode-shaped step
  echo "== kernel times, Qwen3-8B decode (ncu, two layers of a decode-shaped step)"
  echo "[5]" >/tmp/p.txt  # one token: the prefill is a decode-shaped step (GEMV, split-KV attention)
  timeout 90 ncu --clock-control none --launch-skip 25 --launch-count 14 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    --csv /tmp/b/tests/cuda/xserv_logits_dump -m /tmp/models/qwen3-8b --prompts /tmp/p.txt --out /tmp/ncu --gen 2 \
    >"$OUT/ncu.csv" 2>&1
  python3 - "$OUT/ncu.csv" <<'PY' || tail -5 "$OUT/ncu.csv"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ix = {h: i for i, h in enumerate(hdr)}
k = collections.OrderedDict()
for r in rows[1:]:
  name = r[ix["Kernel Name"]][:60]
  k.setdefault((r[ix["ID"]], name), {})[r[ix["Metric Name"]]] = (r[ix["Metric Value"]], r[ix["Metric Unit"]])
for (i, name), m in k.items():
  t = m.get("gpu__time_duration.sum", ("?", ""))
  b = m.get("dram__bytes_read.sum", ("?", ""))
  p = m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", ("?", ""))
  print(f"{name:60s} {t[0]:>10s} {t[1]:4s} {b[0]:>10s} {b[1]:6s} {p[0]:>6s}%")
PY
}

ncu_step() {  # model config, rows, log name, env...: kernel times of one graph-replayed decode step
  local cfg=$1 rows=$2 name=$3
  echo "== ncu: one decode step of $(basename "$cfg" .json) at $rows rows ${*:4}"
  env XSERV_CUDA_PROFILE_REPLAY=3 "${@:4}" timeout 120 ncu --clock-control none --cache-control none \
    --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
    "$bin/generate_bench" --dummy-weights --config "$cfg" --device cuda --batch "$rows" \
    --prompt-len 128 --gen-len 12 --repeat 1 >"/tmp/ncu/$name.csv" 2>&1
  python3 scripts/ncu_table.py "/tmp/ncu/$name.csv" || tail -5 "/tmp/ncu/$name.csv"
}

nsys_steps() {  # config, log name, env...: nsys trace of a 24-token decode, the step anatomy
  local cfg=$1 name=$2
  echo "== nsys: decode steps of $(basename "$cfg" .json) at batch 1 ${*:3}"
  env "${@:3}" timeout 90 "$NSYS" profile -t cuda --cuda-graph-trace=node -f true -o "/tmp/ncu/$name" \
    "$bin/generate_bench" --dummy-weights --config "$cfg" --device cuda --batch 1 --prompt-len 128 \
    --gen-len 24 --repeat 1 >"/tmp/ncu/$name.log" 2>&1 || tail -3 "/tmp/ncu/$name.log"
  timeout 60 "$NSYS" stats -q --report cuda_gpu_trace --format csv -f -o "/tmp/ncu/$name" \
    "/tmp/ncu/$name.nsys-rep" >/dev/null 2>&1
  python3 scripts/nsys_steps.py "/tmp/ncu/${name}_cuda_gpu_trace.csv" 10 2>&1 | head -${NSYS_LINES:-40}
}

if [ "$stage" = decodeprof ]; then
  # Batch-1 decode anatomy (issue 12): speed with programmatic dependent launch off and on, the
  # kernels, their gaps and the idle time outside the graph per step (nsys), GEMV bandwidth (ncu).
  [ "${SKIP_TESTS:-0}" = 1 ] || run_cuda_tests 100
  NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  echo "nsys: ${NSYS:-none}"
  mkdir -p /tmp/ncu
  {
    for m in ${MODELS:-gpt2 qwen3-0.6b qwen3-1.7b qwen3-8b}; do
      for pdl in 0 1; do
        echo "-- $m PDL=$pdl"
        XSERV_CUDA_PDL=$pdl timeout 60 "$bin/generate_bench" --dummy-weights --config bench/configs/$m.json \
          --device cuda --prompt-len 128 --gen-len 128 --batch 1 --repeat 3 2>&1 | grep -E "^\| 1|rror"
      done
    done
  } 2>&1 | tee "$OUT/bench_decode.txt"
  {
    if [ -n "$NSYS" ]; then
      for m in ${MODELS:-gpt2 qwen3-0.6b qwen3-1.7b qwen3-8b}; do nsys_steps bench/configs/$m.json nsys_$m; done
    fi
    [ "${NCU:-1}" = 1 ] && ncu_step bench/configs/qwen3-8b.json 1 ncu_8b_1
  } 2>&1 | tee "$OUT/anatomy.txt"
  rm -f /tmp/ncu/*.sqlite; tar czf "$OUT/traces.tgz" -C /tmp/ncu . 2>/dev/null
elif [ "$stage" = fused ]; then
  # Issue 12's decode fusions in one call: before (XSERV_CUDA_FUSED_NORM=0) and after (the
  # defaults: GPT-2's LayerNorm/GELU in its GEMVs): batch-1 decode of every small model and
  # Qwen3-8B, a context of 1000 keys, and 16 rows; then the HF parity of the models the fusions run.
  run_cuda_tests 120
  ab() {  # config, generate_bench args...: before, after (the defaults)
    for side in before after; do
      case $side in
        before) envs=(XSERV_CUDA_FUSED_NORM=0) ;;
        *) envs=(XSERV_CUDA_NOTHING=1) ;;
      esac
      printf -- "-- %s %s %s: " "$1" "${*:2}" $side
      env "${envs[@]}" timeout 60 "$bin/generate_bench" --dummy-weights --config bench/configs/$1.json \
        --device cuda "${@:2}" 2>&1 | grep -E "^\| [0-9]|rror" | tr '\n' ' '; echo
    done
  }
  {
    for m in gpt2 qwen3-0.6b qwen3-1.7b qwen3-8b; do
      ab $m --prompt-len 128 --gen-len 128 --batch 1 --repeat 3
    done
    ab qwen3-0.6b --prompt-len 900 --gen-len 100 --batch 1 --repeat 2
    ab qwen3-1.7b --prompt-len 128 --gen-len 128 --batch 16 --repeat 2
    for m in gpt2 qwen3-0.6b; do  # the engine's host time per step, next to the step time
      timeout 60 "$bin/generate_bench" --dummy-weights --config bench/configs/$m.json --device cuda \
        --prompt-len 128 --gen-len 128 --batch 1 --repeat 1 --profile 2>&1 | grep -A12 "profile of"
    done
  } 2>&1 | tee "$OUT/bench_ab.txt"
  checkpoints gpt2 qwen3-0.6b
  echo "== parity"
  timeout 100 python3 tests/reference/cuda_parity.py /tmp/b "$OUT/parity_small.json" /tmp/models/gpt2 /tmp/models/qwen3-0.6b 2>&1 | grep -v Warning | tail -8
elif [ "$stage" = gemv ]; then
  # Issue 12, the batch-1 decode GEMVs (helper gemv): the op and model tests they touch, memcheck
  # over the GEMV at every warps-per-column split, the GEMV launch-shape sweep (bench/gemv_bench), then batch-1 decode of
  # every model with each side of GEMV_SIDES ("label:ENV=V,ENV=V ..."; the first is "before":
  # main's behaviour), Qwen3-8B also with GEMV_SIDES_8B, Qwen3-8B at 16 rows, and how many of
  # Qwen3-8B's layers run unstacked (generate_bench --profile: separate rms_norm / swiglu calls).
  cmake --build /tmp/b -j16 --target gemv_bench >>"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
  echo "== op and model tests"
  timeout 150 "$bin/xserv_tests" "${GEMV_TESTS:-cuda DeviceArena*,cuda gemm*,cuda rms_norm_gemm*,cuda layer_norm_gemm*,cuda: decode steps*,cuda out_in GEMVs*,cuda: tiny*,cuda engine*}" \
    --durations yes >"$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|:[0-9]+: " "$OUT/tests.txt" | tail -20
  [ "${GEMV_MEMCHECK:-1}" = 1 ] && sanitize "cuda out_in GEMVs*" memcheck_gemv.txt
  if [ "${GEMV_SWEEP:-1}" = 1 ]; then
    echo "== gemv_bench ${GEMV_BENCH_ARGS:-}"
    timeout 90 /tmp/b/bench/gemv_bench ${GEMV_BENCH_ARGS:-} >"$OUT/gemv_bench.txt" 2>&1
    grep -E "best|rror" "$OUT/gemv_bench.txt"; grep -E "\| 0 \| 0 \|" "$OUT/gemv_bench.txt"
  fi
  sides=(${GEMV_SIDES:-before:XSERV_CUDA_ADJACENT_WEIGHTS=0 after:XSERV_CUDA_NOTHING=1})
  gb() {  # model, side label:envs, generate_bench args...
    local label=${2%%:*} envs=${2#*:}
    printf -- "-- %s %s %s: " "$1" "$label" "${*:3}"
    env ${envs//,/ } timeout 60 "$bin/generate_bench" --dummy-weights --config bench/configs/$1.json \
      --device cuda "${@:3}" 2>&1 | grep -E "^\| [0-9]|rror" | tr '\n' ' '; echo
  }
  {
    for m in ${GEMV_MODELS:-gpt2 qwen3-0.6b qwen3-1.7b qwen3-8b}; do
      for side in "${sides[@]}"; do gb $m "$side" --prompt-len 128 --gen-len 128 --batch 1 --repeat 3; done
    done
    for side in ${GEMV_SIDES_8B:-}; do gb qwen3-8b "$side" --prompt-len 128 --gen-len 128 --batch 1 --repeat 3; done
    [ "${GEMV_B16:-1}" = 1 ] && for side in "${sides[0]}" "${sides[@]: -1}"; do gb qwen3-8b "$side" --prompt-len 128 --gen-len 128 --batch 16 --repeat 2; done
  } 2>&1 | tee "$OUT/bench_gemv.txt"
  if [ "${GEMV_PROFILE:-1}" = 1 ]; then  # unstacked q|k|v / gate|up layers show as rms_norm / swiglu calls
    for side in "${sides[0]}" "${sides[@]: -1}"; do
      echo "-- qwen3-8b ${side%%:*}: separate norms and swiglu per decode step"
      env $(echo "${side#*:}" | tr ',' ' ') timeout 60 "$bin/generate_bench" --dummy-weights --config bench/configs/qwen3-8b.json \
        --device cuda --prompt-len 16 --gen-len 16 --batch 1 --repeat 1 --profile 2>&1 | grep -E "^\| (rms_norm|swiglu|gemm_parts|rms_norm_gemm) "
    done 2>&1 | tee "$OUT/stacked_8b.txt"
  fi
  if [ "${GEMV_PARITY:-0}" = 1 ]; then
    checkpoints gpt2 qwen3-0.6b
    echo "== parity"
    timeout 100 python3 tests/reference/cuda_parity.py /tmp/b "$OUT/parity_small.json" /tmp/models/gpt2 /tmp/models/qwen3-0.6b 2>&1 | grep -v Warning | tail -8
  fi
elif [ "$stage" = attn ]; then
  run_cuda_tests 100
  before=(XSERV_CUDA_ATTN_TILES=0)  # the register attention kernel
  ab() {  # label, command...: the command with the change off, then on
    echo "== $1"
    echo "-- before"; env "${before[@]}" timeout 100 "${@:2}" 2>&1 | grep -E "^\| [0-9]"
    echo "-- after"; timeout 100 "${@:2}" 2>&1 | grep -E "^\| [0-9]"
  }
  dummy() { echo --dummy-weights --config bench/configs/$1.json --device cuda; }
  {
    ab "generate_bench Qwen3-8B, decode after a 16384-token prompt" "$bin/generate_bench" $(dummy qwen3-8b) --prompt-len 16384 --gen-len 16 --batch 1 --repeat 1
    ab "serve_bench Qwen3-8B, 1 and 128 at once, 128+128" "$bin/serve_bench" $(dummy qwen3-8b) --concurrency 1,128 --max-batch-tokens 2048
    if [ -n "${ATTN_17B:-}" ]; then
      ab "generate_bench Qwen3-1.7B, decode after a 4096-token prompt" "$bin/generate_bench" $(dummy qwen3-1.7b) --prompt-len 4096 --gen-len 64 --batch 1 --repeat 1
    fi
  } 2>&1 | tee "$OUT/ab.txt"
elif [ "$stage" = skinny ]; then
  echo "== GEMM, engine and graph tests under compute-sanitizer memcheck, then without"
  timeout 150 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 "$bin/xserv_tests" \
    "cuda gemm*,cuda skinny*" >"$OUT/sanitizer.txt" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|passed|failed|FAILED|with expansion|:[0-9]+: " "$OUT/sanitizer.txt" | tail -12
  timeout 150 "$bin/xserv_tests" "cuda engine*,cuda: decode steps*,cuda: tiny*,cuda gemm*,cuda skinny*" >"$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|with expansion|:[0-9]+: " "$OUT/tests.txt" | tail -12
  dummy() { echo --dummy-weights --config bench/configs/$1.json --device cuda; }
  ab() {  # label, command...: 5..32-row GEMMs on cuBLASLt (before), then on the skinny kernel
    echo "== $1"
    echo "-- before"; XSERV_CUDA_SKINNY_ROWS=0 timeout 120 "${@:2}" 2>&1 | grep -E "^\| [0-9]|rror"
    echo "-- after"; timeout 120 "${@:2}" 2>&1 | grep -E "^\| [0-9]|rror"
  }
  {
    for m in qwen3-8b qwen3-1.7b; do
      ab "generate_bench $m, decode at 8/16/32 rows (128+64)" "$bin/generate_bench" $(dummy $m) --batch 8,16,32 --prompt-len 128 --gen-len 64 --repeat 1
    done
    if [ "${SKINNY_SERVE:-1}" = 1 ]; then
      ab "serve_bench Qwen3-8B, 16 and 64 at once, 128+128" "$bin/serve_bench" $(dummy qwen3-8b) --concurrency 16,64 --max-batch-tokens 2048
      ab "serve_bench Qwen3-1.7B, 16 and 64 at once, 128+128" "$bin/serve_bench" $(dummy qwen3-1.7b) --concurrency 16,64 --max-batch-tokens 2048
    fi
    if [ "${SKINNY_NCU:-0}" = 1 ]; then
      mkdir -p /tmp/ncu
      ncu_step bench/configs/qwen3-8b.json 16 skinny16
      ncu_step bench/configs/qwen3-8b.json 16 cublas16 XSERV_CUDA_SKINNY_ROWS=0
    fi
  } 2>&1 | tee "$OUT/ab.txt"
elif [ "$stage" = prefill ]; then
  if [ -n "${FULL_TESTS:-}" ]; then run_cuda_tests 200; fi
  echo "== prefill attention tests under compute-sanitizer memcheck"
  timeout 200 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 "$bin/xserv_tests" \
    "cuda prefill attention kernels*,cuda qk_transform_store*" >"$OUT/sanitizer.txt" 2>&1
  echo "sanitizer+tests rc=$?"; grep -E "ERROR SUMMARY|passed|failed|FAILED|with expansion|:[0-9]+: " "$OUT/sanitizer.txt" | tail -20
  mkdir -p /tmp/ncu
  gb16k() { timeout 100 "$bin/generate_bench" --dummy-weights --config bench/configs/qwen3-8b.json --device cuda \
    --prompt-len 16384 --batch 1 --repeat 1 "$@" 2>&1; }
  {
    echo "== generate_bench Qwen3-8B, 16384-token prompt (chunks of 8192): wmma (XSERV_CUDA_PREFILL_MMA=0, before), mma at 6 (default) / 4 / 8 warps (XSERV_CUDA_PREFILL_WARPS)"
    for v in "MMA=0" "WARPS=6" "WARPS=4" "WARPS=8"; do
      echo "-- $v"; (export "XSERV_CUDA_PREFILL_$v"; gb16k --gen-len 16 | grep -E "^\| [0-9]|rror")
    done
    # Model::warm_up runs 17 forwards of 2 .. 8192 tokens (612 prefill-attention launches), then
    # the warm-up run's 16k prompt: its 72 launches (36 layers x 2 chunks of 8192) are profiled.
    if [ "${PREFILL_NCU:-1}" = 1 ]; then
    echo "== ncu: attention of one 16k prefill (36 layers x 2 chunks), default kernel (6 warps)"
    timeout 150 ncu --clock-control none -k regex:attention_prefill --launch-skip 612 --launch-count 72 \
      --metrics gpu__time_duration.sum,lts__t_sectors_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active \
      --csv "$bin/generate_bench" --dummy-weights --config bench/configs/qwen3-8b.json --device cuda \
      --prompt-len 16384 --gen-len 2 --batch 1 --repeat 1 >/tmp/ncu/prefill.csv 2>&1
    if ! grep -q gpu__time_duration /tmp/ncu/prefill.csv; then  # a metric this ncu lacks: time only
      tail -3 /tmp/ncu/prefill.csv
      timeout 150 ncu --clock-control none -k regex:attention_prefill --launch-skip 612 --launch-count 72 \
        --metrics gpu__time_duration.sum --csv "$bin/generate_bench" --dummy-weights \
        --config bench/configs/qwen3-8b.json --device cuda --prompt-len 16384 --gen-len 2 --batch 1 \
        --repeat 1 >/tmp/ncu/prefill.csv 2>&1
    fi
    python3 scripts/ncu_table.py /tmp/ncu/prefill.csv || tail -5 /tmp/ncu/prefill.csv
    python3 - /tmp/ncu/prefill.csv <<'PY' || true
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
ix = {h: i for i, h in enumerate(rows[0])}
m = collections.defaultdict(list)
for r in rows[1:]:
  m[(r[ix["Grid Size"]], r[ix["Metric Name"]])].append(float(r[ix["Metric Value"]].replace(",", "") or 0))
for (g, name), v in sorted(m.items()):
  print(f"grid {g} {name}: n {len(v)} sum {sum(v):.4g} mean {sum(v) / len(v):.4g}")
PY
    fi
  } 2>&1 | tee "$OUT/prefill.txt"
  tar czf "$OUT/ncu_csv.tgz" -C /tmp ncu
elif [ "$stage" = dattn ]; then
  # Issue 12 / 10: the mma decode attention (default) against the tile kernel before it.
  [ "${SKIP_TESTS:-0}" = 1 ] || run_cuda_tests 200
  [ "${SANITIZE:-1}" = 1 ] && sanitize "cuda decode attention kernels*,cuda run_graph*" sanitizer.txt
  side_env() {  # side name -> env assignments
    case $1 in
      before) echo XSERV_CUDA_ATTN_MMA=0 ;;
      after) echo XSERV_CUDA_NOTHING=1 ;;
      stages2) echo XSERV_CUDA_ATTN_STAGES=2 ;;
      stages4) echo XSERV_CUDA_ATTN_STAGES=4 ;;
      split16) echo XSERV_CUDA_ATTN_SPLIT_KEYS=16 ;;
      split128) echo XSERV_CUDA_ATTN_SPLIT_KEYS=128 ;;
      split256) echo XSERV_CUDA_ATTN_SPLIT_KEYS=256 ;;
      fuseqk) echo XSERV_CUDA_ATTN_FUSE_QK=1 ;;
      *) echo "$1" ;;  # NAME=VALUE
    esac
  }
  ab() {  # sides, binary, model, args...: one line per side
    local sides=$1 exe=$2 m=$3
    for side in $sides; do
      printf -- "-- %s %s %s: " "$(basename "$exe")" "$m ${*:4}" "$side"
      env $(side_env "$side") timeout 120 "$bin/$exe" --dummy-weights --config bench/configs/$m.json \
        --device cuda "${@:4}" 2>&1 | grep -E "^\| [0-9]|rror" | tr '\n' ' '; echo
    done
  }
  {
    ab "before after ${VARIANTS:-}" generate_bench qwen3-8b --prompt-len 16384 --gen-len 16 --batch 1 --repeat 1
    ab "before after ${VARIANTS:-}" generate_bench qwen3-1.7b --prompt-len 4096 --gen-len 64 --batch 1 --repeat 1
    for m in qwen3-0.6b qwen3-1.7b; do
      ab "before after ${B1_VARIANTS:-}" generate_bench $m --prompt-len 128 --gen-len 128 --batch 1 --repeat 2
    done
    ab "before after" generate_bench qwen3-8b --prompt-len 128 --gen-len 128 --batch 1 --repeat 2
    [ "${SERVE:-1}" = 1 ] && ab "before after" serve_bench qwen3-8b --concurrency 16,128 --max-batch-tokens 2048
  } 2>&1 | tee "$OUT/ab.txt"
  if [ "${NCU:-1}" = 1 ]; then
    mkdir -p /tmp/ncu
    ncu_attn() {  # config, prompt length, rows, name, env...: the attention kernels of one step
      echo "== ncu: attention of one decode step, $(basename "$1" .json), prompt $2, $3 rows ${*:5}"
      env XSERV_CUDA_PROFILE_REPLAY=3 "${@:5}" timeout 150 ncu --clock-control none --cache-control none \
        --profile-from-start off -k regex:"attention_(decode|tiles|merge|rows)" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv "$bin/generate_bench" --dummy-weights \
        --config "$1" --device cuda --batch "$3" --prompt-len "$2" --gen-len 8 --repeat 1 >"/tmp/ncu/$4.csv" 2>&1
      python3 scripts/ncu_table.py "/tmp/ncu/$4.csv" || tail -5 "/tmp/ncu/$4.csv"
    }
    {
      [ "${NCU_BEFORE:-1}" = 1 ] && ncu_attn bench/configs/qwen3-8b.json 16384 1 attn_8b_16k_before XSERV_CUDA_ATTN_MMA=0
      ncu_attn bench/configs/qwen3-8b.json 16384 1 attn_8b_16k
      [ "${NCU_BEFORE:-1}" = 1 ] && ncu_attn bench/configs/qwen3-0.6b.json 128 1 attn_06b_b1_before XSERV_CUDA_ATTN_MMA=0
      ncu_attn bench/configs/qwen3-0.6b.json 128 1 attn_06b_b1
      [ "${NCU_128:-0}" = 1 ] && ncu_attn bench/configs/qwen3-8b.json 128 128 attn_8b_128_before XSERV_CUDA_ATTN_MMA=0
      [ "${NCU_128:-0}" = 1 ] && ncu_attn bench/configs/qwen3-8b.json 128 128 attn_8b_128
    } 2>&1 | tee "$OUT/ncu_attn.txt"
    tar czf "$OUT/ncu_csv.tgz" -C /tmp ncu
  fi
elif [ "$stage" = gpt2prof ]; then
  # Issue 12: GPT-2's batch-1 decode (after 128 and 1000 tokens) and 512-token prefill, before
  # (Conv1D weights as stored, the f32 attention's split merge and k/v write as kernels of their
  # own), with the weights transposed (conv1d) and as default (after); the kernels of one
  # graph-replayed decode step before and after (ncu). GPT2_TESTS: the tests run first.
  timeout 200 "$bin/xserv_tests" "${GPT2_TESTS:-cuda layer_norm_gemm*,cuda transpose*,cuda gemm*,cuda: tiny*,cuda: decode steps*,cuda decode attention*,cuda qk_transform_store*,cuda run_graph*}" \
    --durations yes >"$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|:[0-9]+: " "$OUT/tests.txt" | tail -20
  sanitize "cuda layer_norm_gemm*,cuda transpose*,cuda decode attention*" sanitizer.txt
  mkdir -p /tmp/ncu
  {
    old=XSERV_CUDA_ATTN_MERGE_KERNEL=1,XSERV_CUDA_ATTN_STORE_KV=0
    for side in before:XSERV_CUDA_CONV1D=in_out,$old conv1d:$old after:XSERV_CUDA_NOTHING=1 before:XSERV_CUDA_CONV1D=in_out,$old conv1d:$old after:XSERV_CUDA_NOTHING=1; do
      for args in "--prompt-len 128 --gen-len 128 --batch 1 --repeat 3" "--prompt-len 512 --gen-len 2 --batch 1 --repeat 5" "--prompt-len 1000 --gen-len 24 --batch 1 --repeat 2"; do
        printf -- "-- gpt2 %s %s: " "${side%%:*}" "$args"
        env $(echo "${side#*:}" | tr ',' ' ') timeout 60 "$bin/generate_bench" --dummy-weights --config bench/configs/gpt2.json --device cuda $args 2>&1 | grep -E "^\| [0-9]|rror" | tr '\n' ' '; echo
      done
    done
    ncu_step bench/configs/gpt2.json 1 ncu_gpt2_b1_before XSERV_CUDA_CONV1D=in_out XSERV_CUDA_ATTN_MERGE_KERNEL=1 XSERV_CUDA_ATTN_STORE_KV=0
    ncu_step bench/configs/gpt2.json 1 ncu_gpt2_b1
  } 2>&1 | tee "$OUT/gpt2prof.txt"
  tar czf "$OUT/ncu_csv.tgz" -C /tmp ncu
elif [ "$stage" = profile ]; then
  run_cuda_tests 100
  mkdir -p /tmp/ncu  # the raw logs come back as one archive ($OUT takes at most 8 files)
  {
    ncu_step bench/configs/qwen3-8b.json 128 ncu_8b_128_before XSERV_CUDA_ATTN_TILES=0
    ncu_step bench/configs/qwen3-8b.json 128 ncu_8b_128
    ncu_step bench/configs/qwen3-8b.json 64 ncu_8b_64
    ncu_step bench/configs/qwen3-8b.json 16 ncu_8b_16
    ncu_step bench/configs/qwen3-1.7b.json 128 ncu_17b_128
  } 2>&1 | tee "$OUT/ncu.txt"
  tar czf "$OUT/ncu_csv.tgz" -C /tmp ncu
elif [ "$stage" = serveprof ]; then
  # Issue 10: where a batched decode step goes. Step time (generate_bench) and serving figures
  # (serve_bench, with the decode-only steps' share of the wall time on stderr) of Qwen3-1.7B and
  # 8B at 16/64/128, opt-in variants of 1.7B serving (SERVE_VARIANTS="ENV=V ..."), then ncu
  # per-kernel tables of one graph-replayed step at each batch size, sampling included
  # (scripts/ncu_steps.py). SKIP_TESTS=0 runs the [cuda] tests first; MODELS picks the models.
  [ "${SKIP_TESTS:-1}" = 1 ] || run_cuda_tests 150
  mkdir -p /tmp/ncu
  {
    for m in ${MODELS:-qwen3-1.7b}; do
      echo "== $m: generate_bench decode at 16/64/128 rows, serve_bench 16/64/128 at once"
      timeout 90 "$bin/generate_bench" --dummy-weights --config bench/configs/$m.json --device cuda \
        --batch 16,64,128 --prompt-len 128 --gen-len 64 --repeat 1 2>&1 | grep -E "^\| [0-9]|rror"
      timeout 90 "$bin/serve_bench" --dummy-weights --config bench/configs/$m.json --device cuda \
        --concurrency 16,64,128 --max-batch-tokens 2048 2>&1 | grep -E "^\| [0-9]|rror|wall"
    done
    for v in ${SERVE_VARIANTS:-}; do
      echo "-- qwen3-1.7b serve_bench with $v"
      env "$v" timeout 60 "$bin/serve_bench" --dummy-weights --config bench/configs/qwen3-1.7b.json \
        --device cuda --concurrency 16,64,128 --max-batch-tokens 2048 2>&1 | grep -E "^\| [0-9]|rror|wall"
    done
  } 2>&1 | tee "$OUT/steps.txt"
  for m in ${NCU_MODELS:-qwen3-1.7b qwen3-8b}; do
    echo "== ncu: one decode step (and its sampling) of $m at 16/64/128 rows"
    XSERV_CUDA_PROFILE_REPLAY=3 timeout 200 ncu --clock-control none --cache-control none \
      --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
      "$bin/generate_bench" --dummy-weights --config bench/configs/$m.json --device cuda \
      --batch 16,64,128 --prompt-len 128 --gen-len 8 --repeat 1 >"/tmp/ncu/$m.csv" 2>&1
    python3 scripts/ncu_steps.py "/tmp/ncu/$m.csv" "${LAYER_KERNELS:-16}" >"$OUT/ncu_$m.txt" 2>&1 ||
      tail -5 "/tmp/ncu/$m.csv"
    grep -E "^===" "$OUT/ncu_$m.txt"
  done
  tar czf "$OUT/ncu_csv.tgz" -C /tmp ncu
elif [ "$stage" = batched ]; then
  # Issue 10, batched decode: the sampling tests (memcheck over the new one), then before
  # (BEFORE_ENV, default XSERV_CUDA_SAMPLE_ONE_PASS=0: the greedy rows' two sampling kernels)
  # and after, same build: generate_bench (GB_MODELS) and serve_bench (MODELS) at 16/64/128,
  # serving with the defaults alone (AFTER_MODELS), variants of 1.7B's decode (VARIANTS="ENV=V
  # ..."), the sampling kernels of one 128-row step (ncu, NCU_SIDES; NCU=0: none).
  echo "== sampling and engine tests"
  timeout 120 "$bin/xserv_tests" "${TEST_SPEC:-cuda sample*,cuda logprobs*,cuda engine*}" >"$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|:[0-9]+: " "$OUT/tests.txt" | tail -12
  sanitize "${SANITIZE_SPEC:-cuda sample, many greedy*,cuda sample, split-row*}" sanitizer.txt
  before_env=${BEFORE_ENV:-XSERV_CUDA_SAMPLE_ONE_PASS=0}
  ab() {  # binary, model, args...: before, after
    for side in before after; do
      printf -- "-- %s %s %s: " "$1" "$2" "$side"
      if [ $side = before ]; then e=$before_env; else e=XSERV_CUDA_NOTHING=1; fi
      env $e timeout 120 "$bin/$1" --dummy-weights --config bench/configs/$2.json --device cuda "${@:3}" 2>&1 |
        grep -E "^\| [0-9]|rror|wall" | tr '\n' ' '; echo
    done
  }
  {
    for m in ${GB_MODELS:-qwen3-1.7b}; do
      ab generate_bench $m --batch 16,64,128 --prompt-len 128 --gen-len 64 --repeat 1
    done
    for m in ${MODELS-qwen3-1.7b qwen3-8b}; do
      ab serve_bench $m --concurrency 16,64,128 --max-batch-tokens 2048
    done
    for m in ${AFTER_MODELS:-}; do  # serving, current defaults only
      printf -- "-- serve_bench %s: " "$m"
      timeout 120 "$bin/serve_bench" --dummy-weights --config bench/configs/$m.json --device cuda \
        --concurrency 16,64,128 --max-batch-tokens 2048 2>&1 | grep -E "^\| [0-9]|rror|wall" | tr '\n' ' '; echo
    done
    for v in ${VARIANTS:-}; do
      printf -- "-- generate_bench qwen3-1.7b %s: " "$v"
      env "$v" timeout 60 "$bin/generate_bench" --dummy-weights --config bench/configs/qwen3-1.7b.json \
        --device cuda --batch 16,64,128 --prompt-len 128 --gen-len 64 --repeat 1 2>&1 |
        grep -E "^\| [0-9]|rror" | tr '\n' ' '; echo
    done
  } 2>&1 | tee "$OUT/ab.txt"
  if [ "${NCU:-1}" = 1 ]; then
    mkdir -p /tmp/ncu
    for side in ${NCU_SIDES:-before after}; do
      if [ $side = before ]; then e=$before_env; else e=XSERV_CUDA_NOTHING=1; fi
      echo "== ncu: sampling kernels of one 128-row Qwen3-1.7B step, $side"
      env $e XSERV_CUDA_PROFILE_REPLAY=3 timeout 90 ncu --clock-control none --cache-control none \
        --profile-from-start off -k regex:topk --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
        "$bin/generate_bench" --dummy-weights --config bench/configs/qwen3-1.7b.json --device cuda \
        --batch 128 --prompt-len 128 --gen-len 8 --repeat 1 >"/tmp/ncu/topk_$side.csv" 2>&1
      python3 scripts/ncu_table.py "/tmp/ncu/topk_$side.csv" || tail -5 "/tmp/ncu/topk_$side.csv"
    done 2>&1 | tee "$OUT/ncu_topk.txt"
  fi
elif [ "$stage" = check ]; then
  run_cuda_tests 150
  sanitize "cuda embedding*,cuda layer_norm*,cuda gelu*,cuda run_graph*,cuda sample matches*,cuda qk_transform_store*" sanitizer.txt
  checkpoints gpt2 qwen3-0.6b
  echo "== parity"
  timeout 100 python3 tests/reference/cuda_parity.py /tmp/b "$OUT/parity_small.json" /tmp/models/gpt2 /tmp/models/qwen3-0.6b 2>&1 | grep -v Warning | tail -12
  echo "== benchmarks"
  timeout 150 bash -c "$(declare -f bench); bin=$bin; {
    bench /tmp/models/gpt2 --prompt-len 128 --gen-len 128 --batch 1,16
    bench /tmp/models/gpt2 --prompt-len 512 --gen-len 2 --batch 1
    XSERV_CUDA_GEMV=0 bench /tmp/models/qwen3-0.6b --prompt-len 128 --gen-len 128 --batch 1
    bench /tmp/models/qwen3-0.6b --prompt-len 128 --gen-len 128 --batch 1,16,64
    bench /tmp/models/qwen3-0.6b --prompt-len 512 --gen-len 2 --batch 1
    bench /tmp/models/qwen3-0.6b --prompt-len 4096 --gen-len 128 --batch 1 --repeat 1
  }" | tee "$OUT/bench_small.txt"
  echo "== transformers"
  timeout 60 python3 "$tools/hf_baseline.py" /tmp/models/gpt2 float32 "$OUT/hf_gpt2.json" 1 2>&1 | grep -v Warn | tail -2
elif [ "$stage" = tests ]; then
  run_cuda_tests 200
  sanitize "cuda sample*" sanitizer.txt
elif [ "$stage" = serve ]; then
  run_cuda_tests 200
  checkpoints qwen3-1.7b qwen3-8b
  serve() { timeout "$1" "$bin/serve_bench" --device cuda "${@:2}" 2>&1; }
  {
    echo "== serve_bench Qwen3-8B, 128+128, all at once"
    serve 150 -m /tmp/models/qwen3-8b --concurrency 1,16,64,128 --max-batch-tokens 2048
    echo "== serve_bench Qwen3-8B, Poisson arrivals"
    serve 90 -m /tmp/models/qwen3-8b --poisson 40 --requests 256 --max-batch-tokens 2048
    echo "== serve_bench Qwen3-8B, 256 requests sharing a 1024-token prefix"
    serve 120 -m /tmp/models/qwen3-8b --shared-prefix 1024 --requests 256 --max-batch-tokens 2048
    echo "== serve_bench Qwen3-1.7B, 128+128, all at once"
    serve 90 -m /tmp/models/qwen3-1.7b --concurrency 16,64,128 --max-batch-tokens 2048
    echo "== c_api_bench Qwen3-8B"
    timeout 60 "$bin/c_api_bench" -m /tmp/models/qwen3-8b --device cuda --lengths 1,6,32,100
  } | tee "$OUT/serve.txt"
elif [ "$stage" = sampling ]; then
  echo "== [cuda] sampling tests"
  timeout 100 "$bin/xserv_tests" "cuda sample*,cuda logprobs*" 2>&1 | tail -4 | tee "$OUT/tests.txt"
  sanitize "cuda sample*" sanitizer.txt
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/xserv_tests" "*many blocks per row*" 2>&1 |
    tail -4 | tee "$OUT/racecheck.txt"
  checkpoints qwen3-0.6b qwen3-8b
  for m in qwen3-0.6b qwen3-8b; do
    echo "== greedy vs sampled decode through the C API: $m"
    timeout 90 "$bin/c_api_bench" -m /tmp/models/$m --device cuda --lengths 1
  done 2>&1 | tee "$OUT/c_api_bench.txt"
elif [ "$stage" = latency ]; then
  run_cuda_tests 150
  checkpoints qwen3-0.6b qwen3-8b
  for m in qwen3-8b qwen3-0.6b; do
    echo "== load, host RSS, first token, greedy vs sampled decode: $m"
    timeout 90 "$bin/c_api_bench" -m /tmp/models/$m --device cuda --lengths 1,6,11,17,32,100,500
  done 2>&1 | tee "$OUT/c_api_bench.txt"
elif [ "$stage" = decode ]; then
  run_cuda_tests 120
  checkpoints gpt2 qwen3-0.6b qwen3-8b
  echo "== benchmarks"
  timeout 200 bash -c "$(declare -f bench); bin=$bin; {
    bench /tmp/models/qwen3-8b --prompt-len 128 --gen-len 128 --batch 1
    XSERV_CUDA_PDL=1 bench /tmp/models/qwen3-8b --prompt-len 128 --gen-len 128 --batch 1
    bench /tmp/models/qwen3-8b --prompt-len 128 --gen-len 128 --batch 8,16 --repeat 1
    bench /tmp/models/qwen3-0.6b --prompt-len 128 --gen-len 128 --batch 1
    bench /tmp/models/gpt2 --prompt-len 128 --gen-len 128 --batch 1
  }" | tee "$OUT/bench_decode.txt"
  ncu_decode_step
elif [ "$stage" = final ]; then
  run_cuda_tests 100
  sanitize "cuda rms_norm_gemm*,cuda qk_transform_store*,cuda run_graph*" sanitizer.txt
  checkpoints gpt2 qwen3-0.6b qwen3-8b
  echo "== benchmarks"
  timeout 240 bash -c "$(declare -f bench); bin=$bin; {
    bench /tmp/models/qwen3-8b --prompt-len 128 --gen-len 128 --batch 1
    XSERV_CUDA_PDL=1 bench /tmp/models/qwen3-8b --prompt-len 128 --gen-len 128 --batch 1
    bench /tmp/models/qwen3-8b --prompt-len 512 --gen-len 2 --batch 1
    bench /tmp/models/qwen3-8b --prompt-len 128 --gen-len 128 --batch 4,8,16,64 --repeat 1
    bench /tmp/models/gpt2 --prompt-len 128 --gen-len 128 --batch 1,16
    bench /tmp/models/qwen3-0.6b --prompt-len 128 --gen-len 128 --batch 1,16,64
  }" | tee "$OUT/bench_final.txt"
  echo "== transformers"
  timeout 100 python3 "$tools/hf_baseline.py" /tmp/models/qwen3-8b bfloat16 "$OUT/hf_8b.json" 1 2>&1 | grep -v -i warn | tail -2
  echo "== parity (with HF float32 references for bf16)"
  timeout 200 python3 tests/reference/cuda_parity.py /tmp/b "$OUT/parity_final.json" /tmp/models/gpt2 /tmp/models/qwen3-0.6b /tmp/models/qwen3-8b 2>&1 | grep -v -i "warn\|Loading" | tail -8
  ncu_decode_step
elif [ "$stage" = tp ]; then
  export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the shared machine (KINDS.md)
  nvidia-smi topo -m 2>&1 | head -4 | tee "$OUT/topo.txt"
  tpb() {  # config, extra args: generate_bench on dummy weights
    timeout 100 "$bin/generate_bench" --dummy-weights --config "bench/configs/$1.json" --device cuda \
      --prompt-len 128 --gen-len 128 --repeat 2 "${@:2}" 2>&1 | grep -E "^\||tensor|backend|rror"
  }
  if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then
    echo "== one GPU: every [cuda] test (the 2-GPU ones skip), Qwen3-8B / 14B batch-1 decode at TP=1"
    run_cuda_tests 150
    grep -B3 -A3 "NCCL\|tensor parallel" "$OUT/tests.txt" | grep -v "^--$" | head -20
    if [ "${TP_BENCH:-1}" = 1 ]; then  # TP_BENCH=0: the tests alone
      { echo "-- qwen3-8b tp1"; tpb qwen3-8b --batch 1; echo "-- qwen3-14b tp1"; tpb qwen3-14b --batch 1; } |
        tee "$OUT/tp_bench.txt"
    fi
    echo "== done"
    exit 0
  fi
  checkpoints gpt2 qwen3-0.6b
  echo "== tensor-parallel tests (2 GPUs vs 1)"
  XSERV_TP_MODELS=/tmp/models/gpt2:/tmp/models/qwen3-0.6b timeout 90 "$bin/xserv_tests" "[parallel]" \
    -s >"$OUT/tp_tests.txt" 2>&1
  echo "tests rc=$?"; grep -E "passed|failed|FAILED|f32:|16-bit:|skipped" "$OUT/tp_tests.txt" | tail -12
  # TP=1 batch-1 figures of the same commands: the one-GPU branch above (docs/benchmarks.md).
  echo "== decode: Qwen3-8B TP=2, TP=2 without all-reduces; Qwen3-14B TP=2"
  {
    echo "-- qwen3-8b tp2"; tpb qwen3-8b --batch 1,16 --tp 2
    echo "-- qwen3-8b tp2 no all-reduce (wrong results; timing only)"
    XSERV_TP_NO_ALLREDUCE=1 tpb qwen3-8b --batch 1,16 --tp 2
  } | tee "$OUT/tp_bench.txt"
  echo "== serve_bench Qwen3-8B, 128 requests at once (128 in, 128 out)"
  {
    for tp in 1 2; do
      echo "-- tp$tp"
      timeout 50 "$bin/serve_bench" --dummy-weights --config bench/configs/qwen3-8b.json --device cuda \
        --concurrency 128 --max-batch-tokens 2048 --tp $tp 2>&1 | grep -E "^\||model|rror"
    done
  } | tee "$OUT/tp_serve.txt"
  { echo "-- qwen3-14b tp2"; tpb qwen3-14b --batch 1 --tp 2; } | tee -a "$OUT/tp_bench.txt"
else
  run_cuda_tests 100
  sanitize "cuda gemm*,cuda sample*,cuda: decode steps*" sanitizer2.txt
  checkpoints gpt2 qwen3-0.6b qwen3-8b
  echo "== benchmarks"
  timeout 200 bash -c "$(declare -f bench); bin=$bin; {
    bench /tmp/models/qwen3-8b --prompt-len 128 --gen-len 128 --batch 1
    bench /tmp/models/qwen3-8b --prompt-len 512 --gen-len 2 --batch 1
    bench /tmp/models/qwen3-8b --prompt-len 128 --gen-len 128 --batch 16,64 --repeat 1
    XSERV_CUDA_GEMV=0 bench /tmp/models/gpt2 --prompt-len 128 --gen-len 128 --batch 1
    bench /tmp/models/gpt2 --prompt-len 128 --gen-len 128 --batch 1,16
    bench /tmp/models/qwen3-0.6b --prompt-len 128 --gen-len 128 --batch 1
  }" | tee "$OUT/bench_8b.txt"
  echo "== parity"
  timeout 150 python3 tests/reference/cuda_parity.py /tmp/b "$OUT/parity_8b.json" /tmp/models/qwen3-8b 2>&1 | grep -v -i "warn\|Loading" | tail -6
  echo "== transformers"
  timeout 90 python3 "$tools/hf_baseline.py" /tmp/models/qwen3-8b bfloat16 "$OUT/hf_8b.json" 1 2>&1 | grep -v -i warn | tail -2
  echo "== tokenizers (xserv vs HF, this machine's CPU)"
  timeout 90 bash bench/run_tokenizer_bench.sh /tmp/b /tmp/tokbench 2>&1 | tail -12
fi
echo "== done"
