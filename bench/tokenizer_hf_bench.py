#!/usr/bin/env python3
"""Hugging Face tokenizers' encode throughput on the inputs of xserv's tokenizer_bench.

Single-threaded (one encode() call per text; RAYON_NUM_THREADS=1 so nothing runs in parallel),
the cache warm (a first untimed call), best of --repeat runs, in MB/s of UTF-8 input: the unit
of tokenizer_bench's MB_per_s counter. Run next to it:

  build/bench/tokenizer_bench --xserv_dump_inputs=/tmp/tokbench   # english/code/cjk.txt
  build/bench/tokenizer_bench --benchmark_filter=encode
  python3 bench/tokenizer_hf_bench.py --inputs /tmp/tokbench --tokenizers "$XSERV_TOKENIZERS"
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", required=True, help="folder written by tokenizer_bench --xserv_dump_inputs")
    ap.add_argument("--tokenizers", default=os.environ.get("XSERV_TOKENIZERS", "../shared/tokenizers"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    results = []
    print(f"HF tokenizers {tokenizers.__version__}, single-threaded encode")
    for name in ("gpt2", "qwen3"):
        tok = Tokenizer.from_file(os.path.join(args.tokenizers, name, "tokenizer.json"))
        for text_name in ("english", "code", "cjk"):
            with open(os.path.join(args.inputs, f"{text_name}.txt"), encoding="utf-8") as f:
                text = f.read()
            nbytes = len(text.encode("utf-8"))
            n_tokens = len(tok.encode(text, add_special_tokens=False).ids)  # warm-up
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                tok.encode(text, add_special_tokens=False)
                best = min(best, time.perf_counter() - t0)
            mbps = nbytes / 1e6 / best
            results.append({"tokenizer": name, "input": text_name, "bytes": nbytes, "tokens": n_tokens,
                            "seconds": best, "MB_per_s": mbps})
            print(f"hf_encode/{name}/{text_name:8s} {best * 1e3:9.1f} ms  MB_per_s={mbps:.2f}  tokens={n_tokens}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokenizers": tokenizers.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
