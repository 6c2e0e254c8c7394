// Starts xserv-server for a Node test on a free loopback port (--port 0; the port is read from
// its "listening on" line) and resolves once /health answers 200.
const { spawn } = require("node:child_process");

function startServer(binary, model, args = []) {
  return new Promise((resolve, reject) => {
    const proc = spawn(binary, ["-m", model, "--port", "0", ...args], { stdio: ["ignore", "ignore", "pipe"] });
    let log = "";
    let port = 0;
    proc.on("exit", (code) => { if (!port) reject(new Error(`xserv-server exited ${code}: ${log}`)); });
    proc.stderr.on("data", async (d) => {
      log += d;
      const m = !port && /listening on http:\/\/[^:]+:(\d+)/.exec(log);
      if (!m) return;
      port = Number(m[1]);
      const url = `http://127.0.0.1:${port}`;
      for (let i = 0; i < 1200; ++i) {
        try {
          if ((await fetch(url + "/health")).status === 200) return resolve({ proc, url, log: () => log });
        } catch (e) { /* not listening yet */ }
        await new Promise((r) => setTimeout(r, 50));
      }
      reject(new Error("xserv-server not ready: " + log));
    });
  });
}

let checks = 0;
function check(cond, what, detail) {
  checks += 1;
  if (!cond) {
    console.error(`FAIL: ${what}`, detail === undefined ? "" : JSON.stringify(detail));
    process.exit(1);
  }
}

module.exports = { startServer, check, checks: () => checks };
