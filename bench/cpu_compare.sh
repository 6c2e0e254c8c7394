#!/usr/bin/env bash
# The CPU backend on the GPU machine's CPU (issue 16): GPT-2 124M f32, Qwen3-0.6B bf16 and
# Qwen3-1.7B bf16 at 2, 8 and 16 threads pinned with taskset (cores 0..N-1), prompt 128 then 32
# generated (generate_bench --device cpu, greedy), next to the streaming-read ceiling of the same
# cores (stream_read_bench, best of 10 passes over 1 GB). Writes a markdown table to OUT_FILE and
# prints it. About 3-4 minutes on 16 cores, build included.
#
#   bench/cpu_compare.sh [OUT_FILE]            (from the repository root)
#
# Checkpoints: make_random_model.py checkpoints in $MODELS (default /tmp/models) when torch is
# there (the files the issue's llama.cpp GGUFs were converted from; made once, kept), else
# generate_bench --dummy-weights with bench/configs/*.json (same shapes, weights in anonymous
# memory instead of the page cache). BUILD (default /tmp/bcpu) holds a CPU-only Release build,
# made or updated first; THREADS="2 8" and MODEL_NAMES="gpt2" run a subset (MODEL_NAMES may name
# "shakespeare", the embedded model in examples/models). VARIANTS="label:VAR=v[,VAR=v] ..." adds a
# row per variant (an environment for the run, e.g. XSERV_CPU_CONV1D=in_out) for the models in
# VARIANT_MODELS (default gpt2) at every thread count.
set -uo pipefail
out=${1:-${OUT:-/tmp/out}/cpu_compare.md}
build=${BUILD:-/tmp/bcpu}
models=${MODELS:-/tmp/models}
threads=""
for n in ${THREADS:-2 8 16}; do [ "$n" -le "$(nproc)" ] && threads="$threads $n"; done  # cores there are
names=${MODEL_NAMES:-"gpt2 qwen3-0.6b qwen3-1.7b"}
mkdir -p "$(dirname "$out")"
root=$(pwd)

if [ ! -x "$build/bench/generate_bench" ] || [ "${REBUILD:-1}" = 1 ]; then
  [ -f .devdeps/env.sh ] && source scripts/device-env.sh
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF \
    -DXSERV_BUILD_TESTS=OFF -DXSERV_BUILD_EXAMPLES=OFF -DXSERV_BUILD_BENCH=ON >/tmp/cpu_compare_build.txt 2>&1 &&
    cmake --build "$build" -j"$(nproc)" --target generate_bench stream_read_bench >>/tmp/cpu_compare_build.txt 2>&1 ||
    { tail -30 /tmp/cpu_compare_build.txt; exit 1; }
fi

maker=""
for m in "$root/.devdeps/tools/make_random_model.py" /work/shared/device/make_random_model.py; do
  [ -f "$m" ] && python3 -c "import torch, transformers" 2>/dev/null && maker=$m && break
done
declare -A config=([gpt2]=bench/configs/gpt2.json [qwen3-0.6b]=bench/configs/qwen3-0.6b.json
                   [qwen3-1.7b]=bench/configs/qwen3-1.7b.json)
model_args() {  # name -> generate_bench model arguments
  if [ "$1" = shakespeare ]; then
    echo "-m examples/models/shakespeare"
  elif [ -n "$maker" ]; then
    [ -f "$models/$1/config.json" ] || timeout 200 python3 "$maker" "$models" "$1" 2>&1 | grep make_models >&2
    cat "$models/$1"/*.safetensors >/dev/null  # into the page cache, as a warm machine has them
    echo "-m $models/$1"
  else
    echo "--dummy-weights --config ${config[$1]}"
  fi
}

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
{
  echo "CPU: $cpu; $(nproc) cores visible; $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD 2>/dev/null)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); weights: ${maker:+make_random_model.py checkpoints}${maker:-dummy (bench/configs)}"
  echo "flags: $(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16\|amx_tile\|avx2\|f16c' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo
  echo "| model | threads | prefill tok/s | decode tok/s | weights MB | decode GB/s | stream read GB/s | decode / stream |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
} | tee "$out"

declare -A stream
for n in $threads; do
  cores="0-$((n - 1))"
  stream[$n]=$(taskset -c "$cores" "$build/bench/stream_read_bench" --threads "$n" --mb 1024 --repeat 10 |
               sed -n 's/.*: \([0-9.]*\) GB\/s.*/\1/p')
done
run_row() {  # model threads label env-assignments...
  local model=$1 n=$2 label=$3
  shift 3
  local cores="0-$((n - 1))" repeat=2
  [ "$n" -le 2 ] && [ "$model" != gpt2 ] && [ "$model" != shakespeare ] && repeat=1
  # stdbuf: the lines printed before a crash or a hang still reach the log; rc says which
  # (124: the 240 s timeout, 128 + N: signal N).
  local log rc row mb prefill decode
  log=$(env "$@" timeout 240 taskset -c "$cores" stdbuf -oL "$build/bench/generate_bench" $args \
          --device cpu --threads "$n" --prompt-len 128 --gen-len 32 --repeat "$repeat" 2>&1)
  rc=$?
  echo "$log" >>"$(dirname "$out")/cpu_compare_runs.log"
  row=$(echo "$log" | grep '^| 1 |')
  mb=$(echo "$log" | sed -n 's/.*, \([0-9.]*\) MB).*/\1/p')
  if [ -z "$row" ]; then
    echo "| $model$label | $n | failed (exit $rc): $(echo "$log" | tail -2 | tr '\n|' '  ') |" | tee -a "$out"
    return
  fi
  prefill=$(echo "$row" | awk -F'|' '{gsub(/ /,"",$3); print $3}')
  decode=$(echo "$row" | awk -F'|' '{gsub(/ /,"",$4); print $4}')
  awk -v m="$model$label" -v n="$n" -v p="$prefill" -v d="$decode" -v mb="$mb" -v s="${stream[$n]}" 'BEGIN {
    gbs = mb * d / 1000; printf "| %s | %d | %.0f | %.1f | %.0f | %.1f | %.1f | %.0f%% |\n", m, n, p, d, mb, gbs, s, 100 * gbs / s }' |
    tee -a "$out"
}
for model in $names; do
  args=$(model_args "$model")
  for n in $threads; do
    run_row "$model" "$n" ""
    for v in ${VARIANTS:-}; do
      case " ${VARIANT_MODELS:-gpt2} " in *" $model "*) ;; *) continue ;; esac
      IFS=, read -ra assignments <<<"${v#*:}"
      run_row "$model" "$n" " (${v%%:*})" "${assignments[@]}"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
