#!/usr/bin/env bash
# xserv-cli chat from the outside: a scripted multi-turn session on the embedded model (no chat
# template: the plain-transcript fallback must say so and still answer every turn), --help, a
# bad option, and a line of invalid UTF-8: rejected with a message naming it, the conversation
# goes on exactly as if it had not been typed, and the exit code is 1.
# Usage: cli_chat_test.sh XSERV_CLI MODEL_DIR
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

# Invalid UTF-8 on line 2: rejected, and the greedy replies equal those of a session without it
# (the history kept the first turn and nothing of the bad line).
printf 'ROMEO: What light is this?\nJULIET: \xff\xfe\nJULIET: It is the east.\n' > "$work/bad_in"
printf 'ROMEO: What light is this?\nJULIET: It is the east.\n' > "$work/good_in"
"$cli" chat -m "$model" -n 12 --temperature 0 < "$work/good_in" > "$work/good" 2> "$work/err"
if "$cli" chat -m "$model" -n 12 --temperature 0 < "$work/bad_in" > "$work/bad" 2> "$work/err"; then
  echo "a rejected line must make the exit code 1"; exit 1
fi
grep -q "line 2 is not valid UTF-8 (bad byte at offset 8); the line was ignored" "$work/err" ||
  { echo "no message for the bad line:"; cat "$work/err"; exit 1; }
cmp "$work/good" "$work/bad" || { echo "the bad line changed the conversation"; exit 1; }
test -s "$work/bad" || { echo "no replies"; exit 1; }
echo "cli_chat_test: ok"
