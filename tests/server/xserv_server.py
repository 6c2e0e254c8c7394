"""Test helpers for xserv-server (Python 3 standard library only): start a server on a free
loopback port, wait until it is ready, send requests, read Server-Sent Events.

Used by http_test.py and load_test.py. A server is started with --port 0 and the port is read
from its "listening on http://HOST:PORT" line, so parallel tests never collide.
"""
import http.client
import json
import os
import re
import subprocess
import threading
import time


class Server:
    def __init__(self, binary, model, *args, env=None, ready_timeout=120):
        self.proc = subprocess.Popen([binary, "-m", model, "--port", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.log = []
        self.port = None
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, ready_timeout):
        deadline = time.time() + ready_timeout
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("xserv-server exited: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        # Keep draining stderr so the server never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()
        while True:
            try:
                status, _ = self.get("/health")
                if status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("xserv-server not ready: " + "".join(self.log))
            time.sleep(0.05)

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def connection(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, raw=False):
        """(status, parsed JSON or text) of one request on a fresh connection."""
        c = self.connection()
        h = {"Content-Type": "application/json", **(headers or {})}
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode("utf-8")
        c.close()
        if raw:
            return r.status, text, dict(r.getheaders())
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def get(self, path, headers=None):
        return self.request("GET", path, headers=headers)

    def post(self, path, body, headers=None):
        return self.request("POST", path, body, headers)

    def stream(self, path, body, headers=None):
        """(status, [parsed data events], done) of a streaming request; done: '[DONE]' came."""
        c = self.connection()
        c.request("POST", path, body=json.dumps(body),
                  headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        if r.status != 200:
            out = json.loads(r.read().decode("utf-8"))
            c.close()
            return r.status, out, False
        events, done = [], False
        for data in sse_data(r):
            if data == "[DONE]":
                done = True
                break
            events.append(json.loads(data))
        c.close()
        return r.status, events, done

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def sse_data(response):
    """Yields the data of each SSE event of an http.client response (comments skipped)."""
    buf = b""
    while True:
        chunk = response.read1(65536) if hasattr(response, "read1") else response.read(1)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            for line in block.decode("utf-8").split("\n"):
                if line.startswith("data: "):
                    yield line[6:]


def stream_text(events, endpoint="chat"):
    """Concatenated text per choice index of streamed chunks."""
    out = {}
    for e in events:
        for c in e.get("choices", []):
            piece = c.get("delta", {}).get("content") if endpoint == "chat" else c.get("text")
            out[c["index"]] = out.get(c["index"], "") + (piece or "")
    return out


def env_args():
    """(server binary, model dir) from the command line or the environment."""
    import sys
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ["XSERV_SERVER"]
    model = sys.argv[2] if len(sys.argv) > 2 else os.environ["XSERV_MODEL"]
    return binary, model
