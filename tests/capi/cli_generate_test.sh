#!/usr/bin/env bash
# xserv-cli generate's input checks from the outside: --version, a --stop or prompt that is not
# UTF-8, -m naming a missing path or a file, --device cuda where no GPU is usable, bad numbers,
# a --kv-cache-dtype it does not know.
# Each must exit non-zero with a message that says what is wrong and what to do, before any
# model is loaded. Usage: cli_generate_test.sh XSERV_CLI MODEL_DIR
set -euo pipefail
cli=$1 model=$2
work=$(mktemp -d /tmp/xserv-generate-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "cli_generate_test: $*"; exit 1; }
# expect_error PATTERN ARGS...: xserv-cli ARGS must fail, its stderr matching PATTERN.
expect_error() {
  local pattern=$1; shift
  if "$cli" "$@" > "$work/out" 2> "$work/err"; then fail "'$*' must fail"; fi
  grep -q -- "$pattern" "$work/err" || fail "'$*': stderr lacks '$pattern': $(cat "$work/err")"
}

# --version and the version command agree; the usage mentions --version.
version=$("$cli" --version)
[ "$version" = "$("$cli" version)" ] || fail "--version differs from version"
[[ "$version" =~ ^xserv\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "--version printed '$version'"
"$cli" --help | grep -q -- "--version" || fail "the usage must mention --version"

expect_error "--stop is not valid UTF-8" generate -m "$model" -p "ROMEO:" --stop $'a\xffb'
expect_error "the prompt (-p) is not valid UTF-8" generate -m "$model" -p $'\xc3('
expect_error "cannot open '/nonexistent': no such file or directory (-m takes a Hugging Face model directory" \
  generate -m /nonexistent -p x
expect_error "is a file: -m takes a Hugging Face model directory .*; try -m $model" \
  generate -m "$model/config.json" -p x
mkdir "$work/empty"
expect_error "has no config.json" generate -m "$work/empty" -p x
expect_error "-n: 'abc' is not a valid number" generate -m "$model" -p x -n abc
expect_error "--device must be auto, cpu or cuda" generate -m "$model" -p x --device tpu
expect_error "--stop is not valid UTF-8" generate -m "$model" --stop $'\xff'
expect_error "cannot open '/nonexistent'" chat -m /nonexistent
expect_error "--kv-cache-dtype must be auto, f32 or bf16, not 'f8'" generate -m "$model" -p x --kv-cache-dtype f8

# --device cuda where no GPU is usable: a message saying what to do, not a CUDA driver error.
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  expect_error "--device cuda: .*use --device cpu" generate -m "$model" -p x --device cuda
  expect_error "--device cuda: .*use --device cpu" chat -m "$model" --device cuda
fi

if [ -f "$model/model.safetensors" ]; then
  # The automatic device works (the CPU here unless a GPU is usable), and a valid --stop too.
  "$cli" generate -m "$model" -p "ROMEO:" -n 8 --seed 1 --stop "zzz" > "$work/out" 2> "$work/err" ||
    fail "generate failed: $(cat "$work/err")"
  test -s "$work/out" || fail "no text generated"
  # A bf16 K/V cache on the CPU generates; an f16 one is refused with the reason.
  "$cli" generate -m "$model" -p "ROMEO:" -n 8 --seed 1 --device cpu --kv-cache-dtype bf16 > "$work/out" 2> "$work/err" ||
    fail "generate --kv-cache-dtype bf16 failed: $(cat "$work/err")"
  test -s "$work/out" || fail "no text generated with a bf16 K/V cache"
fi
echo "cli_generate_test: ok"
