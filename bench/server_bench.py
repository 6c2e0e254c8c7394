#!/usr/bin/env python3
"""HTTP serving speed of xserv-server: C concurrent streaming chat requests (Python standard
library clients, one thread each, all started together), each with a prompt of about P tokens
and exactly G generated tokens (ignore_eos). Prints output tok/s over the wall time, and the time
to first token (TTFT: request sent -> first chunk carrying generated text or a finish) p50/p99.

Usage: server_bench.py URL MODEL_NAME [--clients 64] [--prompt-words 113] [--gen 128] [--rounds 2]
The first round warms up (CUDA graphs, allocator); the best of the following rounds is reported.
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse

WORDS = ("the of and to in is that for it as with was on be by at this from or have an are not "
         "but had his they you were her she which their all there been one has would will what "
         "when more out so up said into than them can only other new some could time these two "
         "may then do first any my now such like our over man me even most made after also did "
         "many before must through back years where much your way well down should because each "
         "just those people how too little state good very make world still own see men work").split()


def one(url, model, words, gen, seed, out, i):
    u = urllib.parse.urlparse(url)
    rng = random.Random(seed)
    content = " ".join(rng.choice(WORDS) for _ in range(words))
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": content}],
                       "max_tokens": gen, "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out[i] = ("error", r.status, r.read()[:200])
        return
    ttft = None
    usage = None
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            if not block.startswith(b"data: ") or block == b"data: [DONE]":
                continue
            e = json.loads(block[6:])
            if e.get("usage"):
                usage = e["usage"]
            for ch in e.get("choices", []):
                if ttft is None and (ch.get("delta", {}).get("content") or ch.get("finish_reason")):
                    ttft = time.perf_counter() - t0
    out[i] = ("ok", ttft, usage["completion_tokens"] if usage else 0, usage["prompt_tokens"] if usage else 0,
              time.perf_counter())
    c.close()


def round_(args, seed0):
    out = [None] * args.clients
    threads = [threading.Thread(target=one, args=(args.url, args.model, args.prompt_words, args.gen,
                                                  seed0 + i, out, i)) for i in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [o for o in out if o is None or o[0] != "ok"]
    if bad:
        raise SystemExit(f"{len(bad)} requests failed, e.g. {bad[0]}")
    wall = max(o[4] for o in out) - t0
    tokens = sum(o[2] for o in out)
    ttfts = sorted(o[1] for o in out)
    p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))]
    return {"tok_s": tokens / wall, "wall_s": wall, "tokens": tokens,
            "prompt_tokens": statistics.mean(o[3] for o in out),
            "ttft_p50_ms": 1000 * statistics.median(ttfts), "ttft_p99_ms": 1000 * p99}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=113)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    results = [round_(args, 1000 * r) for r in range(args.rounds + 1)]
    for k, r in enumerate(results):
        print(f"round {k}{' (warm-up)' if k == 0 else ''}: {r['tok_s']:.0f} output tok/s, "
              f"{r['tokens']} tokens in {r['wall_s']:.2f} s, prompt {r['prompt_tokens']:.0f} tokens, "
              f"TTFT p50 {r['ttft_p50_ms']:.0f} ms p99 {r['ttft_p99_ms']:.0f} ms")
    best = max(results[1:] or results, key=lambda r: r["tok_s"])
    print(json.dumps({"clients": args.clients, "gen": args.gen, **{k: round(v, 1) for k, v in best.items()}}))


if __name__ == "__main__":
    main()
