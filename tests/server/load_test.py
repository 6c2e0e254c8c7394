#!/usr/bin/env python3
"""Load test of xserv-server: rounds of 64 concurrent streaming chat clients (the embedded
Shakespeare model on the CPU). Every stream must complete with [DONE], finish_reason "length"
and its usage; after each round nothing is left running, and the server exits cleanly.

RSS: the baseline is taken after five warm-up rounds, because the first rounds legitimately touch
memory for good (the KV pool's pages, HTTP worker thread stacks, the malloc arenas of threads
that run for the first time). Measured on the 2-core dev machine: 55 MB at start, 119 MB after
two rounds, then +3.5, +2.7, +2.6, +0.5, +0.1, +0.07, +0.05, +0.05 MB per round. After three
more rounds RSS must be within RSS_SLACK_KIB of that baseline: state kept per request (events,
text, channels, callbacks, KV blocks) would grow it every round. Under the
sanitizer build (--no-rss) the RSS check is skipped (ASan's quarantine holds freed memory) and
LeakSanitizer checks the server's exit instead.

Usage: load_test.py XSERV_SERVER_BINARY MODEL_DIR [--no-rss]
"""
import sys
import threading
import time

from xserv_server import Server, env_args

CLIENTS = 64
MAX_TOKENS = 32
RSS_SLACK_KIB = 4 * 1024
WARM_UP_ROUNDS = 5
CHECK_RSS = "--no-rss" not in sys.argv


def client(s, i, results):
    body = {"model": "shakespeare", "messages": [{"role": "user", "content": f"Speaker {i}:"}],
            "max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": i, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    try:
        status, events, done = s.stream("/v1/chat/completions", body)
        usage = events[-1].get("usage") if status == 200 and events else None
        finish = [c["finish_reason"] for e in events if status == 200 for c in e["choices"] if c["finish_reason"]]
        ok = status == 200 and done and finish == ["length"] and usage and usage["completion_tokens"] == MAX_TOKENS
        results[i] = "ok" if ok else f"status {status}, done {done}, finish {finish}, usage {usage}"
    except Exception as e:  # noqa: BLE001 - report any failure of a client
        results[i] = f"exception {e!r}"


def round_(s):
    results = [None] * CLIENTS
    threads = [threading.Thread(target=client, args=(s, i, results)) for i in range(CLIENTS)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    bad = [(i, r) for i, r in enumerate(results) if r != "ok"]
    if bad:
        print(f"FAIL: {len(bad)} of {CLIENTS} clients failed, e.g. {bad[:3]}")
        sys.exit(1)
    return time.time() - t0


def idle(s):
    deadline = time.time() + 30
    while True:
        h = s.get("/health")[1]
        if h["running"] == 0 and h["waiting"] == 0:
            return h
        if time.time() > deadline:
            print(f"FAIL: requests left after the round: {h}")
            sys.exit(1)
        time.sleep(0.1)


def main():
    binary, model = env_args()
    s = Server(binary, model, "--max-seqs", str(CLIENTS))
    try:
        start = s.rss_kib()
        times = []
        for _ in range(WARM_UP_ROUNDS if CHECK_RSS else 1):
            times.append(round_(s))
            idle(s)
        baseline = s.rss_kib()
        for _ in range(3 if CHECK_RSS else 1):
            times.append(round_(s))
            h = idle(s)
        after = s.rss_kib()
        best = min(times)
        print(f"load_test: {len(times)} rounds of {CLIENTS} streaming clients x {MAX_TOKENS} tokens, "
              f"best {best:.1f} s ({CLIENTS * MAX_TOKENS / best:.0f} tok/s); RSS {start} KiB at start, "
              f"{baseline} KiB after the warm-up, {after} KiB at the end; {h}")
        if CHECK_RSS and after - baseline > RSS_SLACK_KIB:
            print(f"FAIL: RSS grew by {after - baseline} KiB over three identical rounds after the warm-up")
            sys.exit(1)
        if s.stop() != 0:
            print("FAIL: unclean exit: " + "".join(s.log))
            sys.exit(1)
    finally:
        s.stop()


if __name__ == "__main__":
    main()
