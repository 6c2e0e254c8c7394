#!/usr/bin/env bash
# xserv-cli tokenize / detokenize from the outside: each line's result streams out as soon as the
# line is read (a pipe filter: the first answer arrives while stdin is still open), the lines
# before a bad one are still answered, bad input exits 1 naming the line, and a missing -m path
# says what -m takes. Usage: cli_tokenize_test.sh XSERV_CLI MODEL_DIR
set -euo pipefail
cli=$1 model=$2
work=$(mktemp -d /tmp/xserv-tokenize-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "cli_tokenize_test: $*"; exit 1; }

# Streaming: write one line, read its answer with stdin still open, then end the input.
for mode in detokenize tokenize; do
  if [ $mode = detokenize ]; then first='[15496, 995]' want='"Hello world"'
  else first='"Hello world"' want='[15496,995]'; fi
  flags=(); [ $mode = tokenize ] && flags=(--jsonl)
  coproc filter { "$cli" $mode -m "$model" "${flags[@]}" 2>/dev/null; }
  echo "$first" >&"${filter[1]}"
  IFS= read -r -t 60 got <&"${filter[0]}" || fail "$mode: no answer while stdin is open"
  [ "$got" = "$want" ] || fail "$mode: got $got, want $want"
  exec {filter[1]}>&-
  wait "$filter_PID" || true
done

# The lines before a bad one are answered; the bad one stops with exit 1 and names its line.
printf '[15496, 995]\n[15496]\n[1, "x"]\n[995]\n' > "$work/ids"
if "$cli" detokenize -m "$model" < "$work/ids" > "$work/out" 2> "$work/err"; then
  fail "a bad line must exit 1"
fi
[ "$(cat "$work/out")" = $'"Hello world"\n"Hello"' ] || fail "lines before the bad one: $(cat "$work/out")"
grep -q "line 3" "$work/err" || fail "the message must name line 3: $(cat "$work/err")"
printf '"ok"\n"\xff"\n' > "$work/text"
if "$cli" tokenize -m "$model" --jsonl < "$work/text" > "$work/out" 2> "$work/err"; then
  fail "invalid UTF-8 must exit 1"
fi
[ "$(wc -l < "$work/out")" -eq 1 ] || fail "the valid line must be answered"
grep -q "line 2" "$work/err" || fail "the message must name line 2: $(cat "$work/err")"

# A path that does not exist: the message names it and says what -m takes.
if "$cli" detokenize -m /nonexistent < /dev/null 2> "$work/err"; then fail "-m /nonexistent must fail"; fi
grep -q "cannot open '/nonexistent': no such file or directory" "$work/err" || fail "$(cat "$work/err")"
grep -q "model directory or a tokenizer.json" "$work/err" || fail "$(cat "$work/err")"
echo "cli_tokenize_test: ok"
