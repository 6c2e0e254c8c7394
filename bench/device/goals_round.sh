#!/usr/bin/env bash
# Every generate_bench / serve_bench goal row of issues 12 and 10 on the tree as it is, after the
# tests of the CUDA kernels it touches: the figures that docs/status.md copies. No before/after:
# each row is a goal's latest figure on this lease (rerun a baseline beside it to compare kernels).
# From the repository root, as a request's run.sh or alone (~330 s on an H200: build ~70, tests
# <= TESTS_S, batch-1 ~100, serving ~120):
#   OUT=... [TESTS="spec"] [TESTS_S=90] [TESTS_ENV="ENV=V ..." [TESTS_ENV_SPEC="spec"]] [BUDGET=380] \
#     [VARIANTS="label:ENV=V,ENV=V ..."] \
#     bash bench/device/goals_round.sh
set -uo pipefail
ROUND_TARGETS="serve_bench handoff_bench"
BUDGET=${BUDGET:-380}
source bench/device/cuda_round_common.sh
tests main "${TESTS_S:-90}" "${TESTS:-cuda decode attention: the one-pass*,cuda qk_attention*,cuda: *}"
# The same model and engine cases again under an opt-in switch's settings (TESTS_ENV="ENV=V ...").
# shellcheck disable=SC2086  # TESTS_ENV is a list of settings
[ -n "${TESTS_ENV:-}" ] && tests switched "${TESTS_S:-90}" "${TESTS_ENV_SPEC:-cuda: *,cuda engine*}" $TESTS_ENV
S=/tmp/b/bench/serve_bench
# What a kernel-to-kernel hand-off costs (bench/handoff_bench.cu), with and without a producer body.
for w in 0 400; do timeout -k 5 30 /tmp/b/bench/handoff_bench --work $w | tee "$OUT/handoff_w$w.txt"; done
gb() {  # model, repeat, [label, env settings]
  local f="$OUT/gb_$1${3:+_$3}.$(date -u +%H%M%S).txt"
  env ${4:-} timeout 60 "$G" --dummy-weights --config "bench/configs/$1.json" --device cuda --batch 1 \
    --prompt-len 128 --gen-len 128 --repeat "$2" >"$f" 2>&1
  echo "$(ts) $1 b1${3:+ $3}: $(grep -E '^\| 1 ' "$f" | tail -1 | awk -F'|' '{printf "decode %s tok/s, %s ms a step", $4, $5}' | tr -s ' ')"
}
sb() {  # model, concurrency list
  local f="$OUT/sb_$1.$(date -u +%H%M%S).txt"
  timeout 90 "$S" --dummy-weights --config "bench/configs/$1.json" --device cuda --concurrency "$2" >"$f" 2>&1
  echo "$(ts) serve $1 $2: output tok/s $(grep -E '^\| [0-9]' "$f" | awk -F'|' '{printf "%s/", $3}' | tr -d ' ')"
}
for round in 1 2; do
  for m in qwen3-0.6b qwen3-1.7b gpt2; do gb $m 2; done
done
gb qwen3-8b 1; gb qwen3-8b 1
# Launch switches that were measured before the early trigger's default (6) and the lean copies,
# or on an H100 only, again on this card beside the defaults (VARIANTS="label:ENV=V,ENV=V ...").
for v in ${VARIANTS:-}; do
  for m in qwen3-1.7b qwen3-0.6b; do gb $m 2 "${v%%:*}" "$(echo "${v#*:}" | tr , ' ')"; gb $m 2; done
done
sb qwen3-1.7b 16,64,128; sb qwen3-1.7b 16,64,128
if [ "$(left)" -ge 70 ]; then sb qwen3-8b 16,64,128; else echo "$(ts) Qwen3-8B serving skipped: $(left) s left"; fi
echo "== $(ts) done, $(left) s of the budget left"
