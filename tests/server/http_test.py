#!/usr/bin/env python3
"""xserv-server over plain HTTP (Python standard library client): every endpoint, every
parameter the server takes, every error status, with the embedded GPT-2 Shakespeare model on the
CPU, loopback only.

Usage: http_test.py XSERV_SERVER_BINARY MODEL_DIR
Exits non-zero on the first failed check, naming it.

Independent references used by the checks: the plain chat rendering (docs/server.md) means chat
== completions on "<content>\\n"; greedy streaming == greedy non-streaming; usage.prompt_tokens of
a token-id prompt is its length; top_logprobs[0] of a greedy token is the token itself.
"""
import json
import socket
import subprocess
import sys
import time

from xserv_server import Server, env_args, sse_data, stream_text

CHECKS = 0


def check(cond, what, detail=""):
    global CHECKS
    CHECKS += 1
    if not cond:
        print(f"FAIL: {what} {detail}", flush=True)
        sys.exit(1)


def error_of(status, body, want_status, what, param=None, code=None):
    check(status == want_status, f"{what}: status {want_status}", f"got {status} {body}")
    check(isinstance(body, dict) and isinstance(body.get("error"), dict), f"{what}: error body", body)
    e = body["error"]
    check(set(e) >= {"message", "type", "param", "code"} and e["message"], f"{what}: error fields", e)
    if param is not None:
        check(e["param"] == param, f"{what}: param {param}", e)
    if code is not None:
        check(e["code"] == code, f"{what}: code {code}", e)


def chat(messages, **kw):
    return {"model": "shakespeare", "messages": messages, **kw}


def test_basics(s):
    status, body = s.get("/health")
    check(status == 200 and body["status"] == "ok", "health", body)
    status, body = s.get("/v1/models")
    check(status == 200 and body["object"] == "list", "models", body)
    check([m["id"] for m in body["data"]] == ["shakespeare"], "models: the id", body)
    status, page, headers = s.request("GET", "/", raw=True)
    check(status == 200 and "<title>xserv chat</title>" in page, "chat page served")
    check(headers.get("Content-Type", "").startswith("text/html"), "chat page type", headers)


def test_chat_and_completions(s):
    greedy = {"temperature": 0, "max_tokens": 24}
    status, c = s.post("/v1/chat/completions", chat([{"role": "user", "content": "ROMEO:"}], **greedy))
    check(status == 200, "chat", c)
    check(c["object"] == "chat.completion" and c["id"].startswith("chatcmpl-"), "chat object/id", c)
    check(isinstance(c["created"], int) and c["model"] == "shakespeare", "chat created/model", c)
    ch = c["choices"][0]
    check(ch["index"] == 0 and ch["message"]["role"] == "assistant", "chat choice", ch)
    check(ch["finish_reason"] in ("stop", "length") and ch["message"]["content"], "chat text", ch)
    u = c["usage"]
    check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "chat usage total", u)
    check(u["completion_tokens"] <= 24 and "cached_tokens" in u["prompt_tokens_details"], "usage", u)
    if ch["finish_reason"] == "length":
        check(u["completion_tokens"] == 24, "length means max_tokens", u)

    # The documented plain rendering: each message's content and a newline.
    status, p = s.post("/v1/completions", {"model": "shakespeare", "prompt": "ROMEO:\n", **greedy})
    check(status == 200 and p["object"] == "text_completion" and p["id"].startswith("cmpl-"), "completion", p)
    check(p["choices"][0]["text"] == ch["message"]["content"], "plain rendering == completions",
          (p["choices"][0]["text"], ch["message"]["content"]))
    check(p["usage"]["prompt_tokens"] == u["prompt_tokens"], "same prompt tokens", (p["usage"], u))

    # Multi-turn: system, user, assistant, user all rendered in order.
    msgs = [{"role": "system", "content": "A play."}, {"role": "user", "content": "ROMEO:"},
            {"role": "assistant", "content": "Good morrow."}, {"role": "user", "content": "JULIET:"}]
    status, m = s.post("/v1/chat/completions", chat(msgs, **greedy))
    status2, p2 = s.post("/v1/completions", {"prompt": "A play.\nROMEO:\nGood morrow.\nJULIET:\n", **greedy})
    check(status == 200 and status2 == 200 and
          m["choices"][0]["message"]["content"] == p2["choices"][0]["text"], "multi-turn rendering")
    # Content as a list of text parts; "developer" read as system.
    parts = [{"role": "developer", "content": [{"type": "text", "text": "A "}, {"type": "text", "text": "play."}]},
             {"role": "user", "content": "ROMEO:"}]
    status, m2 = s.post("/v1/chat/completions", chat(parts, **greedy))
    status3, p3 = s.post("/v1/completions", {"prompt": "A play.\nROMEO:\n", **greedy})
    check(status == 200 and m2["choices"][0]["message"]["content"] == p3["choices"][0]["text"], "content parts")

    # Token-id prompts, and several prompts in one request.
    ids = [49, 2662, 46, 25, 198]
    status, t = s.post("/v1/completions", {"prompt": ids, "max_tokens": 5, "temperature": 0})
    check(status == 200 and t["usage"]["prompt_tokens"] == 5, "token prompt usage", t)
    status, multi = s.post("/v1/completions", {"prompt": ["ROMEO:\n", ids], "max_tokens": 5, "temperature": 0})
    check(status == 200 and [c["index"] for c in multi["choices"]] == [0, 1], "two prompts", multi)
    check(multi["usage"]["prompt_tokens"] == u["prompt_tokens"] + 5, "two prompts usage", multi["usage"])
    check(multi["choices"][1]["text"] == t["choices"][0]["text"], "prompt list == single", multi)
    # max_completion_tokens wins over max_tokens.
    status, mc = s.post("/v1/chat/completions", chat([{"role": "user", "content": "ROMEO:"}], temperature=0,
                                                      max_tokens=30, max_completion_tokens=3, ignore_eos=True))
    check(status == 200 and mc["usage"]["completion_tokens"] == 3, "max_completion_tokens", mc)
    check(mc["choices"][0]["finish_reason"] == "length", "finish length", mc)
    return ch["message"]["content"], u


def test_streaming(s, greedy_text, greedy_usage):
    body = chat([{"role": "user", "content": "ROMEO:"}], temperature=0, max_tokens=24, stream=True,
                stream_options={"include_usage": True})
    status, events, done = s.stream("/v1/chat/completions", body)
    check(status == 200 and done, "stream ends with [DONE]", events)
    check(all(e["object"] == "chat.completion.chunk" for e in events), "chunk objects")
    check(len({e["id"] for e in events}) == 1, "one id per stream")
    check(events[0]["choices"][0]["delta"].get("role") == "assistant", "first chunk has the role", events[0])
    check(stream_text(events)[0] == greedy_text, "greedy stream == non-stream", (stream_text(events), greedy_text))
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    check(len(finishes) == 1 and finishes[0] in ("stop", "length"), "one finish_reason", finishes)
    check(events[-1]["choices"] == [] and events[-1]["usage"] == greedy_usage, "usage chunk",
          (events[-1], greedy_usage))
    check(all(e["usage"] is None for e in events[:-1]), "usage null before the last chunk")

    # Without include_usage there is no usage chunk; completions stream too.
    status, events, done = s.stream("/v1/completions", {"prompt": "ROMEO:\n", "temperature": 0,
                                                         "max_tokens": 24, "stream": True})
    check(status == 200 and done and all(e["object"] == "text_completion" for e in events), "completions stream")
    check(stream_text(events, "completions")[0] == greedy_text, "completions stream text")
    check(all(e.get("usage") is None for e in events), "no usage chunk unless asked")


def test_sampling(s):
    base = chat([{"role": "user", "content": "JULIET:"}], max_tokens=20, ignore_eos=True)
    # Same seed, same text; every sampling parameter accepted.
    knobs = dict(temperature=0.9, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5,
                 frequency_penalty=0.5, repetition_penalty=1.1, seed=1234)
    a = s.post("/v1/chat/completions", {**base, **knobs})
    b = s.post("/v1/chat/completions", {**base, **knobs})
    check(a[0] == 200 and b[0] == 200, "sampling params accepted", a)
    check(a[1]["choices"][0]["message"]["content"] == b[1]["choices"][0]["message"]["content"], "seed repeats")
    texts = set()
    for seed in range(4):
        st, r = s.post("/v1/chat/completions", {**base, "temperature": 1.0, "seed": seed})
        texts.add(r["choices"][0]["message"]["content"])
    check(len(texts) > 1, "different seeds differ", texts)

    # n: n choices, usage sums the completions, prompt counted once.
    st, r = s.post("/v1/chat/completions", {**base, "n": 3, "temperature": 1.0, "seed": 7})
    check(st == 200 and [c["index"] for c in r["choices"]] == [0, 1, 2], "n=3 choices", r)
    check(r["usage"]["completion_tokens"] == 60, "n=3 usage", r["usage"])
    st1, one = s.post("/v1/chat/completions", {**base, "temperature": 0})
    check(r["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"], "n: prompt once", r["usage"])
    st, events, done = s.stream("/v1/chat/completions", {**base, "n": 2, "temperature": 1.0, "seed": 7,
                                                         "stream": True})
    check(st == 200 and done and set(stream_text(events)) == {0, 1}, "n=2 stream", events[:3])

    # stop: the greedy text cut before the stop string, finish_reason stop.
    st, g = s.post("/v1/chat/completions", {**base, "temperature": 0})
    text = g["choices"][0]["message"]["content"]
    cut = text[len(text) // 2: len(text) // 2 + 3]
    check(len(cut) == 3 and text.index(cut) > 0, "a stop string inside the greedy text", text)
    for stop in (cut, [cut, "zzzz"]):
        st, r = s.post("/v1/chat/completions", {**base, "temperature": 0, "stop": stop})
        got = r["choices"][0]
        check(got["message"]["content"] == text[:text.index(cut)] and got["finish_reason"] == "stop",
              "stop", (stop, got, text))
        st, events, done = s.stream("/v1/chat/completions", {**base, "temperature": 0, "stop": stop, "stream": True})
        check(stream_text(events)[0] == text[:text.index(cut)], "stop streaming", stream_text(events))


def test_logprobs(s):
    body = chat([{"role": "user", "content": "ROMEO:"}], temperature=0, max_tokens=8, ignore_eos=True,
                logprobs=True, top_logprobs=3)
    st, r = s.post("/v1/chat/completions", body)
    check(st == 200, "logprobs request", r)
    content = r["choices"][0]["logprobs"]["content"]
    check(len(content) == 8, "one logprob per token", content)
    check("".join(c["token"] for c in content) == r["choices"][0]["message"]["content"], "tokens join to text")
    for c in content:
        check(c["logprob"] <= 0 and len(c["top_logprobs"]) == 3, "top_logprobs", c)
        check(c["top_logprobs"][0]["token"] == c["token"], "greedy = most likely", c)
        check(abs(c["top_logprobs"][0]["logprob"] - c["logprob"]) < 1e-5, "same logprob", c)
        check(c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"], "sorted", c)
        check(bytes(c["bytes"]) == c["token"].encode(), "bytes", c)
    st, r = s.post("/v1/chat/completions", {**body, "top_logprobs": 0})
    check(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == [], "logprobs without top", r)
    st, r = s.post("/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": 0})
    check(r["choices"][0]["logprobs"] is None, "no logprobs: null", r)
    st, events, done = s.stream("/v1/chat/completions", {**body, "stream": True})
    lps = [c for e in events for ch in e["choices"] if ch.get("logprobs") for c in ch["logprobs"]["content"]]
    check(len(lps) == 8, "streamed logprobs", lps)
    # Legacy completions shape.
    st, r = s.post("/v1/completions", {"prompt": "ROMEO:\n", "temperature": 0, "max_tokens": 6,
                                       "ignore_eos": True, "logprobs": 2})
    lp = r["choices"][0]["logprobs"]
    check(len(lp["tokens"]) == 6 and len(lp["token_logprobs"]) == 6 and len(lp["top_logprobs"]) == 6,
          "completions logprobs", lp)
    check(all(len(t) <= 2 for t in lp["top_logprobs"]) and lp["text_offset"][0] == 0, "completions top", lp)


def test_prefix_cache(s):
    # A prompt of many blocks sent twice: the second reuses the cached blocks.
    prompt = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east. " * 3
    first = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})[1]["usage"]
    second = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})[1]["usage"]
    check(first["prompt_tokens"] == second["prompt_tokens"] > 32, "same prompt", (first, second))
    cached = second["prompt_tokens_details"]["cached_tokens"]
    check(0 < cached < second["prompt_tokens"], "cached prompt tokens reported", second)


def test_errors(s):
    p = "/v1/chat/completions"
    user = [{"role": "user", "content": "ROMEO:"}]
    st, b = s.post(p, "{not json")
    error_of(st, b, 400, "malformed JSON", code="invalid_json")
    error_of(*s.post(p, "[1, 2]"), 400, "not an object")
    error_of(*s.post(p, {"model": "shakespeare"}), 400, "no messages", param="messages")
    error_of(*s.post(p, chat("hi")), 400, "messages not a list", param="messages")
    error_of(*s.post(p, chat([{"role": "tool", "content": "x"}])), 400, "bad role", param="messages[0].role")
    error_of(*s.post(p, chat(user, temperature="hot")), 400, "wrong type", param="temperature")
    error_of(*s.post(p, chat(user, temperature=3)), 400, "out of range", param="temperature")
    error_of(*s.post(p, chat(user, max_tokens=0)), 400, "max_tokens 0", param="max_tokens")
    error_of(*s.post(p, chat(user, n=0)), 400, "n 0", param="n")
    error_of(*s.post(p, chat(user, stop=[1])), 400, "stop type", param="stop")
    error_of(*s.post(p, chat(user, top_logprobs=3)), 400, "top_logprobs without logprobs", param="top_logprobs")
    error_of(*s.post(p, chat(user, tools=[{"type": "function"}])), 400, "tools refused", param="tools")
    error_of(*s.post("/v1/completions", {"prompt": 5}), 400, "prompt type", param="prompt")
    error_of(*s.post("/v1/completions", {"prompt": [99999999]}), 400, "token past vocab", param="prompt")
    error_of(*s.post("/v1/completions", {"prompt": ""}), 400, "empty prompt", param="prompt")
    long_prompt = "ROMEO: " * 400
    error_of(*s.post(p, chat([{"role": "user", "content": long_prompt}])), 400, "prompt past the context",
             param="messages", code="context_length_exceeded")
    error_of(*s.post(p, {"model": "gpt-4", "messages": user}), 404, "unknown model", param="model",
             code="model_not_found")
    error_of(*s.get("/v1/nothing"), 404, "unknown endpoint")
    error_of(*s.post(p, chat([{"role": "user", "content": "x" * 70000}])), 413, "body over the limit")
    # The streaming form of an error before the stream starts is a plain error response.
    st, b, done = s.stream(p, chat(user, temperature=-1, stream=True))
    error_of(st, b, 400, "stream: bad parameter", param="temperature")
    # Still serving.
    st, b = s.post(p, chat(user, max_tokens=2))
    check(st == 200, "serves after errors", b)


def test_disconnect(s):
    """A client that goes away mid-stream: its request is cancelled (nothing left running)."""
    body = json.dumps(chat([{"role": "user", "content": "ROMEO:"}], max_tokens=200, ignore_eos=True,
                           stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 4:
        chunk = sock.recv(4096)
        check(chunk, "stream before disconnect")
        got += chunk
    sock.close()
    deadline = time.time() + 20
    while True:
        h = s.get("/health")[1]
        if h["running"] == 0 and h["waiting"] == 0:
            break
        check(time.time() < deadline, "disconnect cancels the request", h)
        time.sleep(0.1)


def test_api_key(binary, model):
    s = Server(binary, model, "--api-key", "sekrit", "--model-name", "bard", "--no-chat-page", "--verbose")
    try:
        check(s.get("/health")[0] == 200, "health needs no key")
        error_of(*s.get("/"), 404, "--no-chat-page")
        error_of(*s.get("/v1/models"), 401, "missing key", code="invalid_api_key")
        error_of(*s.get("/v1/models", {"Authorization": "Bearer nope"}), 401, "wrong key", code="invalid_api_key")
        st, b = s.get("/v1/models", {"Authorization": "Bearer sekrit"})
        check(st == 200 and b["data"][0]["id"] == "bard", "right key, --model-name", b)
        st, b = s.post("/v1/chat/completions", {"model": "bard", "messages": [{"role": "user", "content": "x"}],
                                                "max_tokens": 2}, {"Authorization": "Bearer sekrit"})
        check(st == 200 and b["model"] == "bard", "chat with key", b)
    finally:
        check(s.stop() == 0, "clean exit on SIGTERM", "".join(s.log))
    check(any("POST /v1/chat/completions -> 200" in line for line in s.log), "--verbose logs requests", s.log)


def test_queue_full(binary, model):
    """--max-seqs 1 --max-queue 1: one running, one waiting, the third is refused with 429."""
    s = Server(binary, model, "--max-seqs", "1", "--max-queue", "1")
    body = json.dumps(chat([{"role": "user", "content": "ROMEO:"}], max_tokens=200, ignore_eos=True,
                           stream=True))
    try:
        running = s.connection()
        running.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r1 = running.getresponse()
        events = sse_data(r1)
        for _ in range(3):
            next(events)  # role chunk, then generated tokens: it is running
        waiting = s.connection()
        waiting.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r2 = waiting.getresponse()
        check(r2.status == 200, "the second request waits")
        deadline = time.time() + 10
        while s.get("/health")[1]["waiting"] < 1:
            check(time.time() < deadline, "second request queued")
            time.sleep(0.05)
        st, b = s.post("/v1/chat/completions", json.loads(body))
        error_of(st, b, 429, "queue full", code="queue_full")
        # SIGTERM with one request running and one waiting: both are cancelled, a clean exit.
        t0 = time.time()
        check(s.stop() == 0, "clean exit with requests in flight", "".join(s.log[-30:]))
        check(time.time() - t0 < 20, "shutdown does not wait for the generations")
        running.close()
        waiting.close()
    finally:
        s.stop()


def test_error_after_headers(binary, model):
    """A request that can never fit in the KV pool (the engine admits it, then fails it with an
    event): streaming, the stream ends with an error event and [DONE]; not streaming, a 400."""
    s = Server(binary, model, "--kv-cache-tokens", "32")
    try:
        prompt = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east. " * 2
        st, events, done = s.stream("/v1/completions", {"prompt": prompt, "max_tokens": 8, "stream": True})
        check(st == 200 and done, "stream of a failing request ends with [DONE]", events)
        check("error" in events[-1] and events[-1]["error"]["message"], "then an error event", events)
        error_of(*s.post("/v1/completions", {"prompt": prompt, "max_tokens": 8}), 400,
                 "too large for the KV pool", code="context_length_exceeded")
        check(s.post("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2})[0] == 200, "serves after it")
        check(s.stop() == 0, "clean exit", "".join(s.log[-30:]))
    finally:
        s.stop()


def test_tensor_parallel(binary, model, one_rank_text):
    """--tp 2 on the CPU (two ranks of threads): the same greedy completion as one rank; a size
    that does not divide the model's 4 heads is refused at start with the reason."""
    s = Server(binary, model, "--device", "cpu", "--tp", "2", "--threads", "1")
    try:
        status, p = s.post("/v1/completions", {"model": "shakespeare", "prompt": "ROMEO:\n",
                                                "temperature": 0, "max_tokens": 24})
        check(status == 200 and p["choices"][0]["text"] == one_rank_text, "--tp 2 text", p)
    finally:
        s.stop()
    proc = subprocess.run([binary, "-m", model, "--port", "0", "--device", "cpu", "--tp", "3"],
                          capture_output=True, text=True, timeout=120)
    check(proc.returncode != 0 and "does not divide the model's 4 attention heads" in proc.stderr,
          "--tp 3 refused", proc.stderr)


def main():
    binary, model = env_args()
    t0 = time.time()
    s = Server(binary, model, "--max-body-bytes", "65536")
    try:
        test_basics(s)
        text, usage = test_chat_and_completions(s)
        test_streaming(s, text, usage)
        test_sampling(s)
        test_logprobs(s)
        test_prefix_cache(s)
        test_errors(s)
        test_disconnect(s)
        # SIGTERM: a clean exit (status 0; under the sanitizer build also no leak report).
        check(s.stop() == 0, "clean exit", "".join(s.log[-30:]))
    finally:
        s.stop()
    test_tensor_parallel(binary, model, text)
    test_api_key(binary, model)
    test_queue_full(binary, model)
    test_error_after_headers(binary, model)
    print(f"http_test: {CHECKS} checks passed in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
