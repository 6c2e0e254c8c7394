#!/usr/bin/env bash
# xserv-cli batch from the outside: JSONL requests in (prompts, a chat "messages" request, a
# malformed line, an unknown field, absurd params, a blank line), one JSONL result per request
# out in input order with its fields; a greedy request's text and ids equal `xserv-cli generate`
# with the same prompt and params, and the messages request equals `generate --chat` (the
# Shakespeare model has no chat template: the contents joined by "\n"); --max-seqs 2 with a small
# KV pool gives the same results; exit code 1 when a line failed, 0 otherwise.
# Usage: cli_batch_test.sh XSERV_CLI MODEL_DIR
set -euo pipefail
cli=$1 model=$2
work=$(mktemp -d /tmp/xserv-batch-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "cli_batch_test: $*"; exit 1; }

cat > "$work/in" <<'JSONL'
{"prompt": "ROMEO:", "max_tokens": 12, "temperature": 0}
{"prompt": "JULIET:", "max_tokens": 10, "temperature": 0.8, "top_k": 40, "seed": 7, "stop": ["\n\n"]}
{"prompt": "ROMEO:", "max_tokens": 8, "bogus": 1}
this is not json

{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0}
{"prompt": "KING:", "max_tokens": 0}
{"prompt": "NURSE:", "max_tokens": 5, "temperature": -1}
{"prompt": "First Citizen:", "max_tokens": 9, "temperature": 0, "repetition_penalty": 1.3, "stop": "zzz"}
JSONL

# batch OUT ARGS...: runs the batch on $work/in; must exit 1 (some lines fail) within 2 minutes.
batch() {
  local out=$1; shift
  local rc=0
  timeout 120 "$cli" batch -m "$model" "$@" < "$work/in" > "$out" 2> "$work/err" || rc=$?
  [ "$rc" = 1 ] || fail "batch $* exited $rc (expected 1): $(cat "$work/err")"
}
batch "$work/out"
[ "$(wc -l < "$work/out")" = 8 ] || fail "expected 8 results: $(cat "$work/out")"
for i in 0 1 2 3 4 5 6 7; do  # input order, one line each
  sed -n "$((i + 1))p" "$work/out" | grep -q "^{\"index\":$i," || fail "line $((i + 1)) is not index $i"
done
ok='"text":"([^"\\]|\\.)*","ids":\[[-0-9,]*\],"finish_reason":"(stop|length)","usage":\{"prompt_tokens":[0-9]+,"cached_tokens":[0-9]+,"completion_tokens":[0-9]+\}\}$'
for i in 0 1 4 5 7; do
  sed -n "$((i + 1))p" "$work/out" | grep -Eq "^\{\"index\":$i,$ok" || fail "result $i: $(sed -n "$((i + 1))p" "$work/out")"
done
line() { sed -n "$(($1 + 1))p" "$work/out"; }
line 2 | grep -q '"error":"unknown field \\"bogus\\""' || fail "unknown field: $(line 2)"
line 3 | grep -q '"error":"not a JSON request' || fail "malformed line: $(line 3)"
line 6 | grep -q '"error":".*temperature' || fail "bad temperature: $(line 6)"
line 0 | grep -q '"finish_reason":"length","usage":{"prompt_tokens":[0-9]*,"cached_tokens":[0-9]*,"completion_tokens":12}' ||
  fail "result 0 must have 12 tokens: $(line 0)"
line 5 | grep -q '"text":"","ids":\[\],"finish_reason":"length"' || fail "max_tokens 0: $(line 5)"

# same_as_generate I ARGS...: result I's ids and text equal `xserv-cli generate ARGS`.
same_as_generate() {
  local i=$1; shift
  local ids text want_ids want_text
  ids=$(line "$i" | grep -o '"ids":\[[-0-9,]*\]' | sed 's/"ids"://')
  text=$(line "$i" | grep -Eo '"text":"([^"\\]|\\.)*"' | sed 's/^"text":"//; s/"$//; s/\\n$//')
  want_ids=$(timeout 120 "$cli" generate -m "$model" --quiet --ids "$@" | tail -n 1 | tr -d ' ')
  # generate's text (without --ids) JSON-escaped; its last newline is its own or added.
  want_text=$(timeout 120 "$cli" generate -m "$model" --quiet "$@" |
              awk 'BEGIN { ORS = "" } { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); if (NR > 1) print "\\n"; print }')
  [ "$ids" = "$want_ids" ] || fail "result $i ids $ids, generate gives $want_ids"
  [ "$text" = "$want_text" ] || fail "result $i text '$text', generate gives '$want_text'"
}
same_as_generate 0 -p "ROMEO:" -n 12 --temperature 0
same_as_generate 1 -p "JULIET:" -n 10 --temperature 0.8 --top-k 40 --seed 7 --stop $'\n\n'
same_as_generate 4 -p "Hello" --chat -n 6 --temperature 0
same_as_generate 7 -p "First Citizen:" -n 9 --temperature 0 --repetition-penalty 1.3 --stop zzz

# Two at a time in a small KV pool: the same results (batching changes no text).
batch "$work/out2" --max-seqs 2 --kv-cache-tokens 128 --device cpu --threads 2
diff <(sed 's/"cached_tokens":[0-9]*//' "$work/out") <(sed 's/"cached_tokens":[0-9]*//' "$work/out2") > /dev/null ||
  fail "--max-seqs 2 changed the results: $(diff "$work/out" "$work/out2")"

# Steps of 4 tokens (prompts in chunks, decodes queued behind the budget): the same results.
batch "$work/out4" --max-batch-tokens 4 --device cpu --threads 2
diff <(sed 's/"cached_tokens":[0-9]*//' "$work/out") <(sed 's/"cached_tokens":[0-9]*//' "$work/out4") > /dev/null ||
  fail "--max-batch-tokens 4 changed the results: $(diff "$work/out" "$work/out4")"

# Only good lines: exit 0.
head -n 2 "$work/in" | timeout 120 "$cli" batch -m "$model" > "$work/out3" 2> "$work/err" ||
  fail "a batch of good lines must exit 0: $(cat "$work/err")"
[ "$(wc -l < "$work/out3")" = 2 ] || fail "expected 2 results"

# Option checks, before any model is loaded.
expect_error() {
  local pattern=$1; shift
  if "$cli" batch "$@" < /dev/null > /dev/null 2> "$work/err"; then fail "'batch $*' must fail"; fi
  grep -q -- "$pattern" "$work/err" || fail "'batch $*': stderr lacks '$pattern': $(cat "$work/err")"
}
expect_error "-m DIR (the model directory) is required"
expect_error "cannot open '/nonexistent'" -m /nonexistent
expect_error "--max-seqs: 'x' is not a valid number" -m "$model" --max-seqs x
expect_error "unknown option '--bogus'" -m "$model" --bogus
expect_error "--max-batch-tokens takes 1 ..= 1048576" -m "$model" --max-batch-tokens 2000000
expect_error "--max-batch-tokens takes 1 ..= 1048576" -m "$model" --max-batch-tokens -3
"$cli" batch --help | grep -q "max_tokens" || fail "--help must describe the request fields"
echo "cli_batch_test: ok"
