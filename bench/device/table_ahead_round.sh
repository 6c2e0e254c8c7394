#!/bin/bash
# Issues 10 and 12: the decode attention's block-table reads two chunks ahead of their copies
# (2026-12-06; ncu of that day had a third of the 8B long-context kernel's stall samples and a
# quarter of the 128-row kernel's on the first use of a table entry read one chunk ahead) against
# the tree before it, on one GPU. From the repository root, as a request's run.sh
# (scripts/device_round.sh) or alone (~480 s):
#   OUT=... BUDGET=480 BASE_SRC=/path/to/old/attention_decode.cu bash bench/device/table_ahead_round.sh
# Builds this tree into /tmp/b and, with BASE_SRC, a copy with cuda/attention_decode.cu replaced
# into /tmp/b0 (the same compiler cache: only that file compiles twice); runs the decode attention
# tests first, then base / new interleaved, one process a figure: Qwen3-8B decode after 16384
# tokens and Qwen3-1.7B after 4096 (the block kernel, split keys), Qwen3-1.7B decode steps at 64
# and 128 rows and serving 64 / 128 at once (one kv head a warp); ncu's duration and DRAM
# throughput of both forms' launches; then every [cuda] case in what is left of BUDGET.
ROUND_TARGETS="serve_bench" ROUND_BUDGET=480
source bench/device/cuda_round_common.sh
if [ -n "${BASE_SRC:-}" ]; then
  rm -rf /tmp/t0 && mkdir -p /tmp/t0 && tar --exclude=./.devdeps -cf - . | tar -xf - -C /tmp/t0
  cp "$BASE_SRC" /tmp/t0/cuda/attention_decode.cu
  (cd /tmp/t0 && cmake -S . -B /tmp/b0 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF >"$OUT/build0.txt" 2>&1 &&
    cmake --build /tmp/b0 -j16 --target generate_bench serve_bench >>"$OUT/build0.txt" 2>&1) ||
    { tail -20 "$OUT/build0.txt"; exit 1; }
  echo "== $(ts) base built"
  V="base:/tmp/b0 new:/tmp/b"
else
  V="new:/tmp/b"
fi
# Variants are NAME:BUILD[:ENV=V,...]; ROUND_VARIANTS adds some (e.g. stages2:/tmp/b:XSERV_CUDA_ATTN_STAGES=2).
V="$V ${ROUND_VARIANTS:-}"
dir_of() { local r=${1#*:}; echo "${r%%:*}"; }
env_of() { local r=${1#*:}; [[ $r == *:* ]] && echo "${r#*:}" | tr ',' ' '; }
tests attn "${ROUND_TEST_LIMIT:-120}" "${ROUND_TESTS:-cuda decode attention*,cuda batched decode attention*,cuda qk_attention*,cuda qk_transform_store and paged*}"
long() {  # model, prompt tokens, generated tokens
  local v n f
  for v in $V; do
    n=${v%%:*}; f="$OUT/long_$1_${n}.txt"
    [ "$(left)" -ge 35 ] || { echo "$(ts) skip $1 after $2 $n"; continue; }
    env $(env_of "$v") timeout 45 "$(dir_of "$v")/bench/generate_bench" --dummy-weights --config "bench/configs/$1.json" --device cuda \
      --prompt-len "$2" --gen-len "$3" --batch 1 --repeat 1 >"$f" 2>&1
    echo "$(ts) $1 after $2 tokens $n: $(grep -E '^\| 1 ' "$f" | tr -s ' ')"
  done
}
steps() {  # pass
  local v n f
  for v in $V; do
    n=${v%%:*}; f="$OUT/steps17_${n}_$1.txt"
    [ "$(left)" -ge 15 ] || { echo "$(ts) skip steps $n"; continue; }
    env $(env_of "$v") timeout 30 "$(dir_of "$v")/bench/generate_bench" --dummy-weights --config bench/configs/qwen3-1.7b.json --device cuda \
      --batch 64,128 --prompt-len 128 --gen-len 32 --repeat 1 >"$f" 2>&1
    echo "$(ts) 1.7B decode $n: $(grep -E '^\| (64|128) ' "$f" | awk -F'|' '{printf "%s rows %s tok/s %s ms; ", $2, $4, $5}' | tr -s ' ')"
  done
}
serve() {  # pass
  local v n f
  for v in $V; do
    n=${v%%:*}; f="$OUT/serve17_${n}_$1.txt"
    [ "$(left)" -ge 30 ] || { echo "$(ts) skip serve $n"; continue; }
    env $(env_of "$v") timeout 40 "$(dir_of "$v")/bench/serve_bench" --dummy-weights --config bench/configs/qwen3-1.7b.json --device cuda \
      --concurrency 64,128 >"$f" 2>&1
    echo "$(ts) serve 1.7B 64,128 $n: tok/s $(grep -E '^\| [0-9]' "$f" | awk -F'|' '{printf "%s/", $3}' | tr -d ' ')" \
      "decode-only ms $(grep -oE '[0-9.]+ ms each' "$f" | awk '{printf "%s/", $1}')"
  done
}
sol() {  # label, generate_bench arguments...: ncu's duration and DRAM throughput of one launch a form
  local label=$1 v n; shift
  for v in $V; do
    n=${v%%:*}
    [ "$(left)" -ge 40 ] || { echo "$(ts) skip ncu $label $n"; continue; }
    env $(env_of "$v") XSERV_CUDA_PROFILE_REPLAY=3 timeout 60 ncu --clock-control none --cache-control none --profile-from-start off \
      -k "regex:attention_decode_mma" -c 1 --section SpeedOfLight "$(dir_of "$v")/bench/generate_bench" --dummy-weights \
      --device cuda --repeat 1 "$@" >"$OUT/sol_${label}_$n.txt" 2>&1
    echo "$(ts) ncu $label $n: $(grep -E '^\s+(Duration|DRAM Throughput)' "$OUT/sol_${label}_$n.txt" | tr -s ' ' | tr '\n' ';')"
  done
}
# ROUND_STAGES: what runs after the tests, in order (default: the first call's).
for stage in ${ROUND_STAGES:-long8 long17 steps1 serve1 long8 long17 steps2 serve2 sol8 sol128}; do
  case $stage in
    long8) long qwen3-8b 16384 32 ;;
    long17) long qwen3-1.7b 4096 64 ;;
    long8b4) long qwen3-8b 8192 32 ;;
    steps*) steps "${stage#steps}" ;;
    serve*) serve "${stage#serve}" ;;
    sol8) sol long8b --config bench/configs/qwen3-8b.json --batch 1 --prompt-len 16384 --gen-len 8 ;;
    sol128) sol rows128 --config bench/configs/qwen3-1.7b.json --batch 128 --prompt-len 128 --gen-len 8 ;;
  esac
done
[ -z "${ROUND_NO_SUITE:-}" ] && [ "$(left)" -gt 60 ] && tests all $(( $(left) - 15 )) "[cuda]"
echo "== $(ts) done"
