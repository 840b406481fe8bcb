// The web chat in headless Chromium (Debian's, driven by playwright-core): settings kept in
// localStorage, a message sent, the answer seen streaming in, the stop button pressed, the
// markdown renderer escaping HTML, nothing fetched from anywhere but the server. Run by
// crates/server/tests/webui.rs with BASE, CHROMIUM, PLAYWRIGHT_CORE and SCREENSHOT set.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { chromium } = require(process.env.PLAYWRIGHT_CORE);

const BASE = process.env.BASE;
let passed = 0;
function ok(what) {
  passed++;
  console.log("ok: " + what);
}
function check(cond, what) {
  if (!cond) throw new Error("failed: " + what);
}
const sleep = ms => new Promise(r => setTimeout(r, ms));

async function main() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "anelm-webui-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM,
    headless: true,
    viewport: { width: 1100, height: 800 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = context.pages()[0] || (await context.newPage());
    const foreign = [];
    const errors = [];
    page.on("request", r => { if (!r.url().startsWith(BASE) && !r.url().startsWith("data:")) foreign.push(r.url()); });
    page.on("pageerror", e => errors.push(String(e)));
    page.on("console", m => { if (m.type() === "error") errors.push(m.text()); });

    await page.goto(BASE + "/");
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("SmolLM2"));
    ok("the page loads and names the model");

    // Settings survive a reload (localStorage).
    await page.click("#settings-button");
    await page.fill("#set-temperature", "0");
    await page.fill("#set-max-tokens", "400");
    await page.fill("#set-system", "You are a storyteller.");
    await page.reload();
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("SmolLM2"));
    const kept = await page.evaluate(() => [document.getElementById("set-temperature").value,
      document.getElementById("set-max-tokens").value, document.getElementById("set-system").value]);
    check(kept[0] === "0" && kept[1] === "400" && kept[2] === "You are a storyteller.", "settings kept: " + kept);
    ok("settings are kept in localStorage");

    // Send; the answer must grow while the stop button shows.
    await page.fill("#input", "Tell me a long story about a dragon who learns to bake bread.");
    await page.press("#input", "Enter");
    await page.waitForSelector("#stop", { state: "visible" });
    const reply = page.locator(".msg.assistant .body").last();
    const lengths = [];
    const t0 = Date.now();
    while (Date.now() - t0 < 60000) {
      const len = (await reply.textContent()).length;
      if (len > 0 && len !== lengths[lengths.length - 1]) lengths.push(len);
      if (lengths.length >= 4) break;
      check(await page.isVisible("#stop"), "the answer ended before streaming could be seen: " + lengths);
      await sleep(50);
    }
    check(lengths.length >= 4 && lengths.every((l, i) => i === 0 || l > lengths[i - 1]),
          "the answer streams in (lengths " + lengths + ")");
    ok("the answer streams in: " + lengths.join(" < ") + " characters");

    await page.click("#stop");
    await page.waitForSelector("#send", { state: "visible" });
    check(await page.isHidden("#stop"), "the stop button hides");
    const status = await page.textContent("#status");
    check(status === "stopped", "status says stopped: " + status);
    const after = (await reply.textContent()).length;
    await sleep(700);
    check((await reply.textContent()).length === after, "nothing arrives after stop");
    const stats = await page.textContent(".msg.assistant .stats");
    check(/\d+ tokens · [\d.]+ tokens\/s · stopped/.test(stats), "tokens/s shown: " + stats);
    ok("stop ends the answer: " + stats);
    await page.screenshot({ path: process.env.SCREENSHOT, fullPage: true });
    console.log("screenshot: " + process.env.SCREENSHOT);

    // A short answer to the end, in the same conversation.
    await page.click("#settings-button");
    await page.fill("#set-max-tokens", "12");
    await page.click("#settings-button");
    await page.fill("#input", "Now say goodbye.");
    await page.click("#send");
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("done"), null, { timeout: 60000 });
    const last = await page.locator(".msg.assistant .stats").last().textContent();
    check(/\d+ tokens · [\d.]+ tokens\/s · (stop|length)/.test(last), "finished stats: " + last);
    check((await page.locator(".msg.user").count()) === 2, "two user messages shown");
    ok("a second turn completes: " + last);

    // The renderer escapes HTML and renders markdown.
    const html = await page.evaluate(() => renderMarkdown(
      "# Title\n**bold** and *it* <img src=x onerror=alert(1)> `<b>code</b>`\n\n- a\n- b\n\n```\n<script>x</script>\n```\n[link](javascript:alert(1)) [ok](https://example.org/a?b=1&c=2)"));
    check(html.includes("<h1>Title</h1>") && html.includes("<strong>bold</strong>") && html.includes("<em>it</em>"), html);
    check(html.includes("&lt;img src=x onerror=alert(1)&gt;") && !html.includes("<img"), "HTML is escaped: " + html);
    check(html.includes("<code>&lt;b&gt;code&lt;/b&gt;</code>") && html.includes("<ul><li>a</li><li>b</li></ul>"), html);
    check(html.includes("&lt;script&gt;x&lt;/script&gt;") && !html.includes("<script"), html);
    check(!html.includes('href="javascript') && html.includes('href="https://example.org/a?b=1&amp;c=2"'), html);
    ok("markdown renders and HTML is escaped");

    check(foreign.length === 0, "requests outside the server: " + foreign);
    check(errors.length === 0, "page errors: " + errors);
    ok("nothing fetched from elsewhere, no page errors");
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  console.log(passed + " passed, 0 failed");
}

main().catch(e => {
  console.error(e.stack || String(e));
  process.exit(1);
});
