// The chat page (GET /) in a real browser: headless Chromium (Debian package) driven by
// puppeteer-core. Types a message, sees the reply stream in (its text grows over several
// observations while it streams), presses Stop mid-reply (the server then cancels the request),
// checks that a second turn works, and saves a screenshot (XSERV_SCREENSHOT, under the build
// folder).
// Usage: XSERV_CHROMIUM=/usr/bin/chromium node chat_page_test.cjs SERVER_BINARY MODEL_DIR
const puppeteer = require("puppeteer-core");
const { startServer, check, checks } = require("./node_server.cjs");

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function health(url) {
  return (await fetch(url + "/health")).json();
}

async function main() {
  const [binary, model] = process.argv.slice(2);
  const server = await startServer(binary, model);
  const browser = await puppeteer.launch({
    executablePath: process.env.XSERV_CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.setViewport({ width: 1000, height: 700 });
    await page.goto(server.url + "/", { waitUntil: "load" });
    await page.waitForFunction(() => document.getElementById("status").textContent === "shakespeare", { timeout: 20000 });

    // Background load (streaming requests that run until aborted) slows the page's reply down
    // enough that Stop lands in the middle of it even on a fast machine.
    const background = new AbortController();
    const load = [];
    for (let i = 0; i < 24; ++i) {
      load.push(fetch(server.url + "/v1/completions", {
        method: "POST", signal: background.signal, headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ prompt: "KING:", max_tokens: 240, ignore_eos: true, stream: true }),
      }).then((r) => r.body.pipeTo(new WritableStream())).catch(() => {}));
    }

    // A long reply (200 tokens) streams in: its text grows while the bubble is still streaming.
    await page.$eval("#max_tokens", (el) => { el.value = "200"; });
    await page.$eval("#temperature", (el) => { el.value = "1"; });
    await page.type("#input", "ROMEO:");
    await page.click("#send");
    const grew = await page.waitForFunction(() => {
      const m = document.querySelector(".msg.assistant.streaming");
      if (!m) return false;
      window.seen = window.seen || new Set();
      window.seen.add(m.textContent.length);
      return [...window.seen].filter((n) => n > 0).length >= 3;
    }, { timeout: 30000, polling: 5 }).then(() => true, () => false);
    check(grew, "the reply's text grows while it streams");
    check(!(await page.$eval("#stop", (el) => el.disabled)), "stop enabled while streaming");
    await page.click("#stop");
    await page.waitForSelector(".msg.assistant.done", { timeout: 20000 });
    const stopped = await page.$eval(".msg.assistant.done .meta", (el) => el.textContent);
    check(stopped === "stopped", "stop ends the reply mid-way", stopped);
    check(await page.$eval("#stop", (el) => el.disabled), "stop disabled after the reply");
    background.abort();
    await Promise.all(load);
    // The aborted fetches closed their connections: the server cancels all those requests.
    let h;
    for (let i = 0; i < 200; ++i) {
      h = await health(server.url);
      if (h.running === 0 && h.waiting === 0) break;
      await sleep(100);
    }
    check(h.running === 0 && h.waiting === 0, "stop cancels the request on the server", h);

    // A second turn: the history goes along (two user and two assistant bubbles).
    await page.$eval("#max_tokens", (el) => { el.value = "12"; });
    await page.type("#input", "JULIET:");
    await page.keyboard.press("Enter");
    await page.waitForFunction(() => document.querySelectorAll(".msg.assistant.done").length === 2, { timeout: 30000 });
    check((await page.$$(".msg.user")).length === 2, "two user turns");
    check((await page.$$(".msg.error")).length === 0, "no error bubble",
          await page.$$eval(".msg.error", (els) => els.map((e) => e.textContent)));
    check(errors.length === 0, "no page errors", errors);
    await page.screenshot({ path: process.env.XSERV_SCREENSHOT || "chat_page.png" });
    console.log(`chat_page_test: ${checks()} checks passed; screenshot ${process.env.XSERV_SCREENSHOT}`);
  } finally {
    await browser.close();
    server.proc.kill("SIGTERM");
  }
}

main().catch((e) => {
  console.error("FAIL:", e);
  process.exit(1);
});
