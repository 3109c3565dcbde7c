// Open one memlsp HTML page from file:// in headless Chromium and print how long it took:
//   node open.cjs PAGE.html  →  `load_ms open_ms` (navigation to `load`; the page's own drawing time)
// Used by `cargo bench --bench page`. env CHROMIUM (default /usr/bin/chromium).
"use strict";
const { chromium } = require("playwright-core");
(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const t0 = Date.now();
  await page.goto("file://" + require("path").resolve(process.argv[2]), { waitUntil: "load" });
  const load = Date.now() - t0;
  const open = Number(await page.evaluate(() => document.body.dataset.openMs));
  await browser.close();
  if (errors.length) {
    console.error(errors.join("\n"));
    process.exit(1);
  }
  console.log(`${load} ${open}`);
})();
