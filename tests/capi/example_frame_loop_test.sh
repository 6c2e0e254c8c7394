#!/usr/bin/env bash
# examples/frame_loop.c driven like a user would: four characters stream on one engine, one
# step per frame. Checks that every character's prefixed lines and the summary are printed, that
# each character's text (fixed seeds) does not depend on the frame budget, that running out of
# frames cancels the rest, and that a bad option or model fails with a message.
# Usage: example_frame_loop_test.sh EXAMPLE_FRAME_LOOP MODEL_DIR
set -euo pipefail
prog=$1 model=$2
work=$(mktemp -d /tmp/xserv-frame-loop-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "example_frame_loop_test: $*"; exit 1; }
names="ROMEO JULIET MERCUTIO NURSE"

run() {  # run OUT ARGS...: the example must succeed within a minute
  local out=$1; shift
  timeout 60 "$prog" -m "$model" "$@" > "$out" 2> "$work/err" || fail "'$*' failed: $(cat "$work/err")"
}

run "$work/a" --frames 200 --frame-ms 1 -n 12
run "$work/b" --frames 200 --frame-ms 20 -n 12
grep -q "^== summary: [0-9]* frames, [0-9]* over budget" "$work/a" || fail "no summary: $(cat "$work/a")"
grep -q "^== engine: [0-9]* steps, .* 48 generated" "$work/a" || fail "no engine stats: $(cat "$work/a")"
for n in $names; do
  grep -q "^$n| $n:\$" "$work/a" || fail "$n's stream does not start with its prompt"
  [ "$(grep -c "^$n| " "$work/a")" -ge 2 ] || fail "$n has no generated line"
  grep -Eq "^== $n +12 tokens, finish: length" "$work/a" || fail "$n's summary is wrong: $(cat "$work/a")"
  # Same seeds, other frame budget: the same text (batching and timing change nothing).
  diff <(grep "^$n| " "$work/a") <(grep "^$n| " "$work/b") > /dev/null ||
    fail "$n's text depends on --frame-ms"
done
grep -q "(callback)" "$work/a" && grep -q "(poll)" "$work/a" || fail "both event paths must be used"

# Out of frames: whoever is still talking is cancelled, and the program still ends cleanly.
run "$work/c" --frames 3 -n 50
for n in $names; do
  grep -Eq "^== $n +3 tokens, finish: cancelled" "$work/c" || fail "$n not cancelled: $(cat "$work/c")"
done

if "$prog" --frames abc > /dev/null 2> "$work/err"; then fail "--frames abc must fail"; fi
grep -q -- "--frames: 'abc' must be a whole number" "$work/err" || fail "bad --frames: $(cat "$work/err")"
if "$prog" -m /nonexistent > /dev/null 2> "$work/err"; then fail "-m /nonexistent must fail"; fi
grep -q "cannot load /nonexistent: .*No such file" "$work/err" || fail "bad -m: $(cat "$work/err")"
echo "example_frame_loop_test: ok"
