#!/usr/bin/env bash
# xserv's tokenizer encode speed next to Hugging Face tokenizers', on one machine, same inputs.
# Usage: bench/run_tokenizer_bench.sh BUILD_DIR [OUT_DIR]
#   needs BUILD_DIR/bench/tokenizer_bench, python3 with `tokenizers`, the tokenizers in
#   $XSERV_TOKENIZERS (set by .devdeps/env.sh) and tinyshakespeare in $XSERV_BENCH_TEXT (on the
#   GPU machine: copy /work/shared/data/tinyshakespeare.txt into .devdeps/ before the call).
# Prints a table of MB/s (single thread) and writes the raw results to OUT_DIR.
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [OUT_DIR]}
out=${2:-${OUT:-/tmp/tokenizer_bench}}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
if [ -z "${XSERV_BENCH_TEXT:-}" ] && [ -f "$here/../.devdeps/tinyshakespeare.txt" ]; then
  export XSERV_BENCH_TEXT="$here/../.devdeps/tinyshakespeare.txt"
fi
"$build/bench/tokenizer_bench" --xserv_dump_inputs="$out/inputs"
"$build/bench/tokenizer_bench" --benchmark_filter='encode|load' --benchmark_min_time=1 \
  --benchmark_out="$out/xserv_tokenizer.json" --benchmark_out_format=json | tee "$out/xserv_tokenizer.txt"
python3 "$here/tokenizer_hf_bench.py" --inputs "$out/inputs" --json "$out/hf_tokenizer.json" \
  | tee "$out/hf_tokenizer.txt"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
xs = {b["name"]: b["MB_per_s"] for b in json.load(open(f"{out}/xserv_tokenizer.json"))["benchmarks"]
      if "MB_per_s" in b}
hf = json.load(open(f"{out}/hf_tokenizer.json"))
print(f"\nencode MB/s, one thread (HF tokenizers {hf['tokenizers']})")
print(f"{'benchmark':32s} {'xserv':>8s} {'HF':>8s} {'ratio':>6s}")
for r in hf["results"]:
    prefix = "encode" if r.get("mode", "whole") == "whole" else "encode_chunks"
    key = f"{prefix}/{r['tokenizer']}/{r['input']}"
    x = xs.get(key, float("nan"))
    print(f"{key:32s} {x:8.1f} {r['MB_per_s']:8.1f} {x / r['MB_per_s']:6.2f}")
PY
