// memlsp's HTML report pages in real Chromium (headless), opened from file:// as a user would.
// Run by tests/e2e/html.sh over a folder of pages (`memlsp report X --format html -o X.html` for
// every capture in ../shared). For each page it checks what the user sees:
//   - no console error and no uncaught exception; the open time (the page's own measure, and
//     navigation to `load`) is logged, and must stay under 1 s;
//   - PyTorch: every timeline canvas has its bands drawn (pixels of the band colours); hovering a
//     band shows a tooltip naming the band's site and its bytes at that moment; clicking it
//     targets the band's file and line (#opened, what a VS Code webview posts);
//     snapshots without a trace say so and still draw their segments; every device whose replay
//     validates draws the allocator state at its peak (and at its first OOM, naming the failed
//     request against the largest free block of its pool), blocks coloured by state, labelled
//     simulated with the reason beside it;
//   - JAX: the heap curve is drawn, its tooltip reads the heap at that point, a click on a
//     buffer targets that buffer's file and line;
//   - every finding of the data is listed;
//   - hostile__*.html (a snapshot whose frame name holds `<!--<script>`, `</script>`, HTML, a
//     Markdown link, ESC, NUL and U+2028/2029; HOSTILE_NAME is that name as JSON): the data block
//     parses, the page is drawn like any other, the name is shown as text, no element or script
//     comes from it and nothing calls alert.
// env: PAGES (folder of *.html), SHOT_DIR (screenshots), SHOTS ("name.html=shot.png,…"),
// CHROMIUM (browser binary), MAX_OPEN_MS (default 1000).
"use strict";
const fs = require("fs");
const path = require("path");
const { chromium } = require("playwright-core");

const PAGES = process.env.PAGES;
const SHOT_DIR = process.env.SHOT_DIR || ".";
const MAX_OPEN_MS = Number(process.env.MAX_OPEN_MS || 1000);
const HOSTILE_NAME = process.env.HOSTILE_NAME ? JSON.parse(process.env.HOSTILE_NAME) : null;
const SHOTS = Object.fromEntries((process.env.SHOTS || "").split(",").filter(Boolean).map((s) => s.split("=")));

let passed = 0;
let failed = 0;
function check(name, ok, detail) {
  if (ok) passed++;
  else {
    failed++;
    console.log(`FAILED ${name}${detail === undefined ? "" : ": " + JSON.stringify(detail).slice(0, 600)}`);
  }
  return ok;
}

// Canvas pixels of the given colours (CSS hex), in CSS pixels: a point well inside a run of
// each colour (the pixel and its four neighbours share it), and the count.
async function findColour(page, selector, hex) {
  return page.evaluate(({ selector, hex }) => {
    const c = document.querySelector(selector);
    if (!c) return null;
    const g = c.getContext("2d");
    const { width: w, height: h } = c;
    const px = g.getImageData(0, 0, w, h).data;
    const want = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
    const is = (x, y) => {
      if (x < 0 || y < 0 || x >= w || y >= h) return false;
      const o = (y * w + x) * 4;
      return px[o] === want[0] && px[o + 1] === want[1] && px[o + 2] === want[2] && px[o + 3] === 255;
    };
    let count = 0, best = null;
    for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
      if (!is(x, y)) continue;
      count++;
      if (!best && is(x - 1, y) && is(x + 1, y) && is(x, y - 1) && is(x, y + 1)) best = { x, y };
    }
    const r = c.getBoundingClientRect();
    const sx = r.width / w, sy = r.height / h;
    return { count, at: best && { x: r.left + (best.x + 0.5) * sx, y: r.top + (best.y + 0.5) * sy } };
  }, { selector, hex });
}

async function tipText(page) {
  return page.evaluate(() => {
    const t = document.getElementById("tip");
    return t && t.style.display === "block" ? t.innerText : null;
  });
}

async function opened(page) {
  return page.evaluate(() => {
    const o = document.getElementById("opened");
    return { file: o.dataset.file, line: Number(o.dataset.line) };
  });
}

// The page's byte format.
function bytes(b) {
  if (b == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let v = b, i = 0;
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return i === 0 ? b + " B" : v.toFixed(2) + " " + u[i];
}

let statePanels = 0;

// The allocator state at the peak and at the first OOM of each device: one panel per state of
// the data, a peak panel for every device whose replay validates, blocks drawn in the state colours.
async function checkStates(page, name, t) {
  const drawn = await page.$$eval(".panel.segs.state", (x) => x.length);
  const want = t.devices.reduce((n, d) => n + (d.states || []).filter((s) => s.segments.length).length, 0);
  check(`${name}: one allocator-state panel per replayed state`, drawn === want, { drawn, want });
  for (const dev of t.devices) {
    const states = dev.states || [];
    if (dev.validated && dev.peak) check(`${name} device ${dev.device}: validated, so its state at the peak is drawn`,
      states.some((s) => s.moment === "peak" && s.entry === dev.peak[0]), states.map((s) => [s.moment, s.entry]));
    if (!dev.validated) check(`${name} device ${dev.device}: no replayed state without validation`, states.length === 0);
    for (const st of states) {
      const sel = `.panel.segs.state[data-device="${dev.device}"][data-moment="${st.moment}"]`;
      const p = await page.$eval(sel, (b) => {
        b.scrollIntoView({ block: "center" });
        const colour = (c) => { const e = b.querySelector(".b-" + c); return e && getComputedStyle(e).backgroundColor; };
        return { title: b.querySelector("h3").innerText, text: b.innerText, rows: b.querySelectorAll(".seg").length,
          allocated: colour("allocated"), free: colour("free"), label: !!b.querySelector("h3 .label.l-simulated") };
      }).catch(() => null);
      const title = st.moment === "peak" ? `Allocator state at the peak (entry #${st.entry}, replayed)` : `Allocator state at the OOM (entry #${st.entry}, replayed)`;
      if (!check(`${name} device ${dev.device}: "${title}" panel`, p && p.title.includes(title), p)) continue;
      statePanels++;
      check(`${name} device ${dev.device} ${st.moment}: one bar per segment`, p.rows === st.segments.length, { rows: p.rows, want: st.segments.length });
      const has = (s) => st.segments.some((g) => g.blocks.some((b) => b[1] === s));
      check(`${name} device ${dev.device} ${st.moment}: blocks coloured by state`,
        (!has("allocated") || p.allocated === "rgb(9, 105, 218)") && (!has("free") || p.free === "rgb(208, 215, 222)"), p);
      check(`${name} device ${dev.device} ${st.moment}: labelled simulated, with why`,
        p.label && p.text.includes("the model reproduces every recorded segment event"), p.text);
      if (st.moment === "oom") {
        const r = st.request;
        const line = `request ${bytes(r.bytes)} (${r.pool} pool, stream ${r.stream})`;
        check(`${name} device ${dev.device}: the OOM panel names the request against the largest free block`,
          p.text.includes(line) && p.text.includes(`vs largest free block ${bytes(r.largest_free_bytes)} of that pool`), { line, text: p.text });
      }
    }
  }
  // The one real snapshot with a recorded OOM: its panel must be there whatever the data says.
  if (name.startsWith("Constructor-Sun__memory_snapshot.pickle")) {
    const text = await page.$eval('.panel.segs.state[data-device="1"][data-moment="oom"]', (b) => b.innerText).catch(() => "");
    check(`${name}: the OOM panel of device 1 names the 4.94 GiB request`, text.includes("request 4.94 GiB (large pool, stream 0)"), text);
  }
}

const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

// The search box: the largest allocation found by a word of its site and its size, counted as
// the data says; a query nothing has finds nothing. Results are text (the hostile page too).
async function checkSearch(page, name, t) {
  const entries = (t.trace_index || []).flatMap((d) => d.entries.map((e) => ({ d, e })));
  const box = await page.$("#trace-search");
  // A trace without an allocation (segment events, an OOM alone) has nothing to search.
  if (!entries.length) return void check(`${name}: no search box without an allocation`, box === null);
  if (!check(`${name}: a search box over ${entries.length} allocations`, box !== null && entries.length > 0, entries.length)) return;
  let top = entries[0];
  for (const x of entries) if (x.e[1] > top.e[1]) top = x;
  const site = top.d.sites[top.e[2]];
  let word = site.split("/").pop().split(":").slice(0, 2).join(":");
  if (/[\s<>]/.test(word) || !word) word = "#" + top.e[0];
  const hay = ({ d, e }) => ("#" + e[0] + " " + d.sites[e[2]] + " " + (e[3] >= 0 ? d.stages[e[3]] : "") + " device " + d.device).toLowerCase();
  const want = entries.filter((x) => x.e[1] >= top.e[1] && hay(x).includes(word.toLowerCase())).length;
  const q = word + " >= " + top.e[1] + " B";
  await page.fill("#trace-search", q);
  const got = await page.evaluate(() => ({
    count: document.getElementById("trace-search-count").textContent,
    rows: [...document.querySelectorAll("#trace-search-results .hit")].map((r) => r.textContent),
    imgs: document.querySelectorAll("img").length,
  }));
  check(`${name}: searching "${q}" lists its ${want} allocation(s)`,
    want >= 1 && got.count.startsWith(want + " allocation") && got.rows.length === Math.min(want, 200) &&
    got.rows.some((r) => r.includes("#" + top.e[0])) && got.imgs === 0, { want, got: { count: got.count, rows: got.rows.slice(0, 3) } });
  const stage = top.e[3] >= 0 ? top.d.stages[top.e[3]] : null;
  if (stage) {
    const w = stage.split(/[\s<>]/)[0].toLowerCase();
    const n = entries.filter((x) => hay(x).includes(w)).length;
    await page.fill("#trace-search", w);
    const c = await page.evaluate(() => document.getElementById("trace-search-count").textContent);
    check(`${name}: searching the stage "${w}" lists ${n} allocation(s)`, c.startsWith(n + " allocation"), c);
  }
  await page.fill("#trace-search", "no-such-site-xyzzy");
  const none = await page.evaluate(() => document.getElementById("trace-search-count").textContent);
  check(`${name}: a query nothing has finds nothing`, none.startsWith("0 allocations"), none);
  await page.fill("#trace-search", "");
}

async function checkTorch(page, name, cap) {
  const t = cap.torch;
  if (!t.devices.length) {
    const said = await page.evaluate(() => document.body.innerText.includes("No trace in this snapshot"));
    check(`${name}: says it has no trace`, said);
    const segs = (t.untraced || []).filter((d) => d.segments.length).length;
    const drawn = await page.$$eval(".panel.segs", (x) => x.length);
    check(`${name}: draws the segments of every device without a trace`, drawn === segs, { drawn, segs });
    return;
  }
  await checkStates(page, name, t);
  await checkSearch(page, name, t);
  for (const dev of t.devices) {
    const sel = `.panel.timeline[data-device="${dev.device}"] canvas`;
    if (!dev.peak) continue; // nothing allocated or freed in this trace
    // Where the page draws each band: the geometry of its canvas (PAD 46, height 260, the
    // scale's top ymax as the page computes it).
    const box = await page.$eval(sel, (c) => {
      c.scrollIntoView({ block: "center" });
      const r = c.getBoundingClientRect();
      return { left: r.left, top: r.top, width: r.width };
    });
    const H = 260, PAD = 46, n = dev.columns.length, W = box.width - PAD - 8;
    let ymax = 1;
    for (const k of dev.columns) ymax = Math.max(ymax, k[4], k[5]);
    const sims = t.simulated.filter((s) => s.device === dev.device);
    for (const s of sims) ymax = Math.max(ymax, s.after);
    for (const o of dev.ooms) ymax = Math.max(ymax, o.capacity || 0);
    const Y = (v) => 8 + (H - 24) * (1 - v / ymax);
    // The tallest slice of a site band (else of any band): its middle, away from the lines
    // drawn over the bands (the peak and OOM markers, the reserved line, simulated peaks).
    const marked = (i) => {
      return [i - 1, i, i + 1].some((j) => j >= 0 && j < n && ((dev.peak && dev.peak[0] >= dev.columns[j][0] && dev.peak[0] <= dev.columns[j][1])
        || dev.ooms.some((o) => o.index >= dev.columns[j][0] && o.index <= dev.columns[j][1])));
    };
    let best = null;
    dev.bands.forEach((b, bi) => dev.columns.forEach((k, i) => {
      const acc = k[6].slice(0, bi).reduce((a, v) => a + v, 0), v = k[6][bi];
      const h = Y(acc) - Y(acc + v);
      const y = (Y(acc) + Y(acc + v)) / 2;
      // Markers are drawn at a column's centre: wide columns are pointed at a quarter in.
      const wide = W / n >= 8;
      const clear = (wide || !marked(i)) && Math.abs(y - Y(k[5])) > 4 && sims.every((s) => Math.abs(y - Y(s.after)) > 4);
      const score = h + (b.kind === "site" ? 1e6 : 0);
      if (h >= 4 && clear && (!best || score > best.score)) best = { bi, i, score, x: box.left + PAD + (i + (wide ? 0.25 : 0.5)) * W / n, y: box.top + y };
    }));
    if (!check(`${name} device ${dev.device}: a band is tall enough to point at`, best, dev.bands.length)) continue;
    const b = dev.bands[best.bi];
    const colour = b.kind === "site" ? PALETTE[best.bi % PALETTE.length] : b.kind === "other" ? "#bab0ac" : "#8c959f";
    const pixel = await page.evaluate(({ sel, x, y }) => {
      const c = document.querySelector(sel), r = c.getBoundingClientRect();
      const d = c.getContext("2d").getImageData(Math.floor((x - r.left) * c.width / r.width), Math.floor((y - r.top) * c.height / r.height), 1, 1).data;
      return "#" + [d[0], d[1], d[2]].map((v) => v.toString(16).padStart(2, "0")).join("");
    }, { sel, x: best.x, y: best.y });
    // Within a few levels per channel (edges are blended).
    const close = [1, 3, 5].every((o) => Math.abs(parseInt(pixel.slice(o, o + 2), 16) - parseInt(colour.slice(o, o + 2), 16)) <= 6);
    check(`${name} device ${dev.device}: band ${best.bi} is drawn where its bytes are`, close, { pixel, colour, best });
    await page.mouse.move(best.x, best.y);
    const tip = await tipText(page);
    const label = b.kind === "site" ? (b.at ? `${b.at.shown}:${b.at.line}` : "") : b.kind === "other" ? "other sites" : "allocated before";
    check(`${name} device ${dev.device}: hovering the band shows its site and bytes at that moment`,
      tip && tip.includes(label) && tip.includes("at that moment") && tip.includes("live "), { tip, label });
    if (b.at) {
      await page.mouse.click(best.x, best.y);
      const o = await opened(page);
      check(`${name} device ${dev.device}: a click on the band targets ${b.at.shown}:${b.at.line}`,
        o.file === b.at.file && o.line === b.at.line, { o, at: b.at });
    }
    await page.mouse.move(1, 1);
  }
}

async function checkXla(page, name, cap) {
  const x = cap.xla;
  if (!x.module) {
    check(`${name}: says it has no plan`, await page.evaluate(() => document.body.innerText.includes("No HLO plan")));
    return;
  }
  if (!x.heap_peak) {
    check(`${name}: says the heap stays empty`, await page.evaluate(() => !!document.querySelector(".empty-heap")));
    return;
  }
  const found = await findColour(page, ".panel.heap canvas", "#4e79a7");
  if (check(`${name}: the heap over the program order is drawn`, found && found.count > 0 && found.at, found)) {
    await page.mouse.move(found.at.x, found.at.y);
    const tip = await tipText(page);
    check(`${name}: hovering the heap shows the heap there`, tip && tip.includes("heap-simulator events") && tip.includes("heap "), tip);
    await page.mouse.move(1, 1);
  }
  const rows = await page.$$eval(".panel.bars .row", (rs) => rs.map((r) => ({ file: r.dataset.file, line: Number(r.dataset.line) })));
  const i = rows.findIndex((r) => r.file);
  if (i >= 0) {
    await (await page.$$(".panel.bars .row"))[i].click();
    const o = await opened(page);
    check(`${name}: a click on a buffer targets its line`, o.file === rows[i].file && o.line === rows[i].line, { o, row: rows[i] });
  }
}

// The hostile page: everything of the name is text.
async function checkHostile(page, name, data) {
  check(`${name}: HOSTILE_NAME is given`, !!HOSTILE_NAME);
  if (!HOSTILE_NAME) return;
  check(`${name}: the data holds the name intact`, JSON.stringify(data).includes(JSON.stringify(HOSTILE_NAME).slice(1, -1)));
  const dom = await page.evaluate(() => ({
    scripts: [...document.scripts].map((s) => s.id || s.type || "inline"),
    imgs: document.querySelectorAll("img").length,
    links: [...document.querySelectorAll("a[href]")].map((a) => a.getAttribute("href")).filter((h) => h.includes("evil")),
    text: document.body.innerText,
    alerts: window.__alerts,
    sections: document.querySelectorAll(".panel").length,
  }));
  check(`${name}: no script element but the page's own`, dom.scripts.length === 2, dom.scripts);
  check(`${name}: no image or link made of the name`, dom.imgs === 0 && dom.links.length === 0, dom);
  check(`${name}: nothing called alert`, dom.alerts.length === 0, dom.alerts);
  check(`${name}: the page is drawn (panels)`, dom.sections > 0, dom.sections);
  // What a finding shows of the name: up to its first control character, as text.
  const visible = HOSTILE_NAME.split("\u001b")[0];
  check(`${name}: the name is shown as text`, dom.text.includes(visible), { visible, text: dom.text.slice(0, 400) });
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking"],
  });
  const files = fs.readdirSync(PAGES).filter((f) => f.endsWith(".html")).sort();
  const times = [];
  for (const f of files) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    const errors = [];
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    page.on("pageerror", (e) => errors.push(String(e)));
    // Anything the page asks the network for is a failure: it must be self-contained.
    const requests = [];
    page.on("request", (r) => { if (!r.url().startsWith("file:") && !r.url().startsWith("data:")) requests.push(r.url()); });
    // An injected `<img onerror=alert(1)>` or script would call this.
    await page.addInitScript(() => { window.__alerts = []; window.alert = (m) => window.__alerts.push(String(m)); });
    const file = path.join(PAGES, f);
    const size = fs.statSync(file).size;
    const t0 = Date.now();
    await page.goto("file://" + file, { waitUntil: "load" });
    const loadMs = Date.now() - t0;
    const openMs = Number(await page.evaluate(() => document.body.dataset.openMs));
    times.push({ f, size, loadMs, openMs });
    const before = failed;
    // A data block that a string closed early (or never) does not parse: the page is blank.
    const data = await page.evaluate(() => JSON.parse(document.getElementById("memlsp-data").textContent)).catch((e) => String(e));
    if (!check(`${f}: the data block parses`, typeof data === "object" && Array.isArray(data.captures), data)) {
      console.log(`FAILED ${f}`);
      await page.close();
      continue;
    }
    const cap = data.captures[0];
    if (f.startsWith("hostile__")) await checkHostile(page, f, data);
    check(`${f}: opens in under ${MAX_OPEN_MS} ms`, loadMs < MAX_OPEN_MS && openMs < MAX_OPEN_MS, { loadMs, openMs });
    check(`${f}: is under 2 MB`, size < 2 << 20, size);
    const listed = await page.$$eval(".finding", (x) => x.length);
    const want = data.captures.reduce((n, c) => n + c.findings.length, 0);
    check(`${f}: lists its ${want} findings`, listed === want, { listed, want });
    // A ranks page: the comparison is in the data once, drawn in each rank's section.
    const ranked = data.captures.filter((c) => c.torch && c.torch.rank_group != null);
    if (ranked.length) {
      const drawn = await page.$$eval(".panel.bars h3", (x) => x.filter((h) => h.textContent.startsWith("Ranks: live memory")).length);
      check(`${f}: a ranks panel in each of its ${ranked.length} ranks' sections`, drawn === ranked.length, { drawn });
      check(`${f}: one comparison of ${ranked.length} ranks in the data`,
        data.rank_groups.length === 1 && data.rank_groups[0].length === ranked.length, data.rank_groups.length);
    }
    // The drawing checks count the page's panels against one capture: single-capture pages (the
    // ranks page's snapshots each have their own page too).
    const single = data.captures.length === 1;
    if (single && cap.torch) await checkTorch(page, f, cap);
    else if (single && cap.xla) await checkXla(page, f, cap);
    check(`${f}: no console error`, errors.length === 0, errors);
    check(`${f}: no network request`, requests.length === 0, requests);
    if (SHOTS[f]) {
      await page.mouse.move(1, 1);
      await page.evaluate(() => window.scrollTo(0, 0));
      await page.screenshot({ path: path.join(SHOT_DIR, SHOTS[f]), fullPage: false });
    }
    console.log(`${failed === before ? "ok    " : "FAILED"} ${f} (${(size / 1024).toFixed(0)} KiB, open ${openMs.toFixed(0)} ms, load ${loadMs} ms)`);
    await page.close();
  }
  await browser.close();
  const worst = times.reduce((a, b) => (b.loadMs > a.loadMs ? b : a), times[0] || {});
  console.log(`${files.length} pages; slowest load ${worst.loadMs} ms (${worst.f}); ${statePanels} replayed allocator-state panels`);
  check("some pages draw replayed allocator states", statePanels > 0 || !files.some((f) => f.endsWith(".pickle.html")), statePanels);
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 && files.length > 0 ? 0 : 1);
})();
