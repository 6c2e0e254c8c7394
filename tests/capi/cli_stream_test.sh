#!/usr/bin/env bash
# examples/cpp/stream.cpp (example_stream) from the outside: with stderr not a terminal no
# loading percentages pile up on one line; --chat on a model without a chat template (the
# embedded GPT-2) falls back to plain text as xserv-cli does; bad numbers and unknown options
# are rejected. Usage: cli_stream_test.sh EXAMPLE_STREAM MODEL_DIR
set -euo pipefail
stream=$1 model=$2
work=$(mktemp -d /tmp/xserv-stream-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "cli_stream_test: $*"; exit 1; }

for bad in "-n abc" "-n 5x" "--temperature hot" "--seed -1" "--bogus" "-n"; do
  # shellcheck disable=SC2086
  if "$stream" "$model" ROMEO: $bad > /dev/null 2> "$work/err"; then fail "'$bad' must be rejected"; fi
  grep -q "not a valid number\|unknown option\|needs a value" "$work/err" || fail "'$bad': $(cat "$work/err")"
done

if [ ! -f "$model/model.safetensors" ]; then
  echo "cli_stream_test: $model/model.safetensors missing; generation not run"; exit 0
fi
"$stream" "$model" "ROMEO:" -n 8 --seed 1 --chat > "$work/out" 2> "$work/err" ||
  fail "--chat on GPT-2 failed: $(cat "$work/err")"
grep -q "no chat template: the prompt is sent as plain text" "$work/err" || fail "$(cat "$work/err")"
if grep -q "loading" "$work/err" || grep -q $'\r' "$work/err"; then
  fail "progress drawn into a file: $(cat -A "$work/err")"
fi
[ "$(wc -l < "$work/err")" -eq 3 ] || fail "stderr: $(cat "$work/err")"  # desc, fallback, speed
test -s "$work/out" || fail "no text"
echo "cli_stream_test: ok"
