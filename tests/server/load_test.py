#!/usr/bin/env python3
"""Load test of xserv-server: 64 concurrent streaming chat clients (the embedded Shakespeare
model on the CPU), run twice. Every stream must complete with [DONE], its finish_reason and its
usage; afterwards nothing is left running and the server's RSS is back near where it was after
a warm-up round (growth bounded below), so finished requests leave nothing behind.

Usage: load_test.py XSERV_SERVER_BINARY MODEL_DIR [CLIENTS]
"""
import sys
import threading
import time

from xserv_server import Server, env_args

CLIENTS = int(sys.argv[3]) if len(sys.argv) > 3 else 64
MAX_TOKENS = 32
# RSS may grow a little between rounds (allocator arenas, thread stacks touched once); a leak of
# the requests' state (64 x 32 events, their text and KV blocks) would keep growing every round.
RSS_SLACK_KIB = 24 * 1024


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
        baseline = s.rss_kib()
        warm = round_(s)
        idle(s)
        after_warm = s.rss_kib()
        timed = round_(s)
        h = idle(s)
        after = s.rss_kib()
        print(f"load_test: {CLIENTS} streaming clients x {MAX_TOKENS} tokens: {warm:.1f} s, {timed:.1f} s "
              f"({CLIENTS * MAX_TOKENS / timed:.0f} tok/s); RSS {baseline} KiB at start, "
              f"{after_warm} KiB after round 1, {after} KiB after round 2; {h}")
        if after - after_warm > RSS_SLACK_KIB:
            print(f"FAIL: RSS grew by {after - after_warm} KiB between two identical rounds")
            sys.exit(1)
        if s.stop() != 0:
            print("FAIL: unclean exit: " + "".join(s.log))
            sys.exit(1)
    finally:
        s.stop()


if __name__ == "__main__":
    main()
