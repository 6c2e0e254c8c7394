#!/usr/bin/env bash
# xserv-cli chat from the outside: a scripted multi-turn session on the embedded model (no chat
# template: the plain-transcript fallback must say so and still answer every turn), --help, and
# a bad option. Usage: cli_chat_test.sh XSERV_CLI MODEL_DIR
set -euo pipefail
cli=$1 model=$2
work=$(mktemp -d /tmp/xserv-chat-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$cli" chat --help | grep -q "usage: xserv-cli chat"
if "$cli" chat -m "$model" --bogus < /dev/null 2> "$work/err"; then
  echo "a bad option must fail"; exit 1
fi
grep -q "bogus" "$work/err"

if [ ! -f "$model/model.safetensors" ]; then
  echo "cli_chat_test: $model/model.safetensors missing; session not run"; exit 0
fi
printf 'ROMEO: What light is this?\n\n/reset\nJULIET: It is the east.\n/quit\nnever read\n' |
  "$cli" chat -m "$model" -n 16 --seed 7 > "$work/out" 2> "$work/err"
grep -q "no chat template" "$work/err"
# Two answered turns, each ending in a newline; nothing after /quit.
test "$(wc -c < "$work/out")" -gt 10
echo "cli_chat_test: ok"
