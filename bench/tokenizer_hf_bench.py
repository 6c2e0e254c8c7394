#!/usr/bin/env python3
"""Hugging Face tokenizers' encode throughput on the inputs of xserv's tokenizer_bench.

Single-threaded (RAYON_NUM_THREADS=1 so nothing runs in parallel), two ways: one encode() of the
whole file, and ~4 KB documents through encode_batch (tokenizer_bench's encode_chunks split),
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


def chunks(text):
    """Whole lines joined until a chunk reaches 4096 bytes: tokenizer_bench's encode_chunks split."""
    data = text.encode("utf-8")
    out, start = [], 0
    while start < len(data):
        end = start
        while end < len(data) and end - start < 4096:
            nl = data.find(b"\n", end)
            end = len(data) if nl < 0 else nl + 1
        out.append(data[start:end].decode("utf-8"))
        start = end
    return out


def best_time(fn, repeat):
    fn()  # warm-up: fills the word cache
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


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
            n_tokens = len(tok.encode(text, add_special_tokens=False).ids)
            docs = chunks(text)
            # "whole": one encode() of the whole file; "chunks": ~4 KB documents through
            # encode_batch on one rayon thread (no Python loop overhead per document).
            for mode, fn in (("whole", lambda: tok.encode(text, add_special_tokens=False)),
                             ("chunks", lambda: tok.encode_batch(docs, add_special_tokens=False))):
                best = best_time(fn, args.repeat)
                mbps = nbytes / 1e6 / best
                prefix = "encode" if mode == "whole" else "encode_chunks"
                results.append({"tokenizer": name, "input": text_name, "mode": mode, "bytes": nbytes,
                                "tokens": n_tokens, "seconds": best, "MB_per_s": mbps})
                print(f"hf_{prefix}/{name}/{text_name:8s} {best * 1e3:9.1f} ms  MB_per_s={mbps:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokenizers": tokenizers.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
