// The chat page (GET /) in a real browser: headless Chromium (Debian package) driven by
// puppeteer-core. Types a message, sees the reply stream in (the text grows over several
// observations), presses Stop mid-reply (the server then cancels the request), checks that a
// second turn works, and saves a screenshot (XSERV_SCREENSHOT, under the build folder).
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

    // A long reply (200 tokens) streams in.
    await page.$eval("#max_tokens", (el) => { el.value = "200"; });
    await page.$eval("#temperature", (el) => { el.value = "1"; });
    await page.type("#input", "ROMEO:");
    await page.click("#send");
    await page.waitForFunction(() => {
      const m = document.querySelector(".msg.assistant.streaming");
      return m && m.textContent.length > 0;
    }, { timeout: 20000 });
    const lengths = [];
    for (let i = 0; i < 5; ++i) {
      lengths.push(await page.$eval(".msg.assistant", (el) => el.textContent.length));
      await sleep(30);
    }
    const streaming = await page.$(".msg.assistant.streaming");
    check(lengths[0] > 0, "streamed text appears", lengths);
    // Stop (if the reply has not already ended on its own).
    if (streaming) {
      check(!(await page.$eval("#stop", (el) => el.disabled)), "stop enabled while streaming");
      await page.click("#stop");
    }
    await page.waitForSelector(".msg.assistant.done", { timeout: 20000 });
    const stopped = await page.$eval(".msg.assistant.done .meta", (el) => el.textContent);
    check(["stopped", "stop", "length"].includes(stopped), "reply ended", stopped);
    check(await page.$eval("#stop", (el) => el.disabled), "stop disabled after the reply");
    if (streaming && stopped === "stopped") {
      // The aborted fetch closed the connection: the server cancels the request.
      let h;
      for (let i = 0; i < 200; ++i) {
        h = await health(server.url);
        if (h.running === 0 && h.waiting === 0) break;
        await sleep(100);
      }
      check(h.running === 0 && h.waiting === 0, "stop cancels the request on the server", h);
    }

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
