/**
 * The dashboard in a real browser: Debian's headless Chromium (installed by
 * scripts/install-system-deps.sh), driven with puppeteer-core, against `infera up --workers 4
 * --policy kv-aware --api-key …` under a little load. The page renders the four workers, its
 * numbers change as requests flow, a decision's explanation names the worker that served the
 * request, and the page works with the API key and is refused without it.
 *
 * INFERA_DASHBOARD_SCREENSHOT=1 saves the loaded page to docs/dashboard.png (the README's image).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { parseMetric } from "../helpers/sim.ts";

const KEY = "browser-secret";
const SCREENSHOT = fileURLToPath(new URL("../../docs/dashboard.png", import.meta.url));

function chromiumPath(): string {
  if (process.env.CHROMIUM_BIN) return process.env.CHROMIUM_BIN;
  if (existsSync("/usr/bin/chromium")) return "/usr/bin/chromium";
  try {
    return execFileSync("sh", ["-c", "command -v chromium"], { encoding: "utf8" }).trim();
  } catch {
    throw new Error("chromium not found: scripts/install-system-deps.sh installs Debian's chromium");
  }
}

const PREFIX = "You are a helpful assistant who answers questions about the solar system. ".repeat(8);

async function waitFor<T>(
  what: string,
  f: () => Promise<T | null | undefined | false>,
  ms = 20_000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const text = (page: Page, sel: string): Promise<string | null> =>
  page.$eval(sel, (e) => e.textContent).catch(() => null);

describe("dashboard in headless Chromium", { timeout: 180_000 }, () => {
  let up: ReturnType<typeof spawnInfera>;
  let browser: Browser;
  let url: string;
  let stdout = "";
  let client: OpenAI;

  before(async () => {
    const port = await freePort();
    up = spawnInfera(
      ["up", "--workers", "4", "--policy", "kv-aware", "--port", String(port), "--speed", "20"],
      { logLevel: "warn", stdout: true, keepChars: 20_000, env: { INFERA_API_KEYS: KEY } },
    );
    up.proc.stdout!.on("data", (d: Buffer) => {
      stdout += d.toString();
    });
    await waitFor(
      "infera up",
      async () => {
        if (up.proc.exitCode !== null) throw new Error(`infera up exited: ${up.output()}`);
        return stdout.includes("Press Ctrl-C");
      },
      60_000,
    );
    url = `http://127.0.0.1:${port}`;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEY, maxRetries: 0 });
    browser = await puppeteer.launch({
      executablePath: chromiumPath(),
      headless: true,
      // Root in a container has no user namespaces for Chromium's sandbox.
      args: [
        ...(process.getuid?.() === 0 ? ["--no-sandbox"] : []),
        "--disable-dev-shm-usage",
        "--disable-gpu",
      ],
    });
  });
  after(async () => {
    await browser?.close();
    if (up && up.proc.exitCode === null) {
      const exited = new Promise((r) => up.proc.once("exit", r));
      up.proc.kill("SIGINT");
      await exited;
    }
  });

  it("`infera up` prints the dashboard URL beside the curl example", () => {
    assert.ok(stdout.includes(`Dashboard: ${url}/dashboard?key=<your key>`), stdout);
    assert.match(stdout, /curl http:\/\/127\.0\.0\.1:\d+\/v1\/chat\/completions/);
  });

  it("refuses the page without the API key", async () => {
    const page = await browser.newPage();
    try {
      for (const u of [`${url}/dashboard`, `${url}/dashboard?key=wrong`]) {
        const res = await page.goto(u);
        assert.equal(res?.status(), 401);
        assert.match(await page.content(), /authentication_error|invalid_api_key|API key/i);
        assert.equal(await page.$("tr[data-worker]"), null);
      }
    } finally {
      await page.close();
    }
  });

  // Issue #30 item 9: the page was framable, sent no nosniff, and `?key=` travelled in the
  // Referer of 10 of its 12 sub-requests.
  it("takes the key out of the URL; no sub-request carries it; the page cannot be framed", async () => {
    const page = await browser.newPage();
    const seen: Array<{ url: string; referer: string | undefined }> = [];
    page.on("request", (r) => seen.push({ url: r.url(), referer: r.headers().referer }));
    try {
      const res = await page.goto(`${url}/dashboard?key=${KEY}&interval=300`);
      assert.equal(res?.status(), 200);
      const h = res!.headers();
      assert.match(h["content-security-policy"] ?? "", /frame-ancestors 'none'/);
      assert.equal(h["x-frame-options"], "DENY");
      assert.equal(h["x-content-type-options"], "nosniff");
      assert.equal(h["referrer-policy"], "no-referrer");
      // The session that lets a reload poll without the key: an HMAC, not the key.
      assert.match(
        h["set-cookie"] ?? "",
        /^infera_dashboard=[\w-]+; Path=\/dashboard; HttpOnly; SameSite=Strict$/,
      );
      assert.ok(!(h["set-cookie"] ?? "").includes(KEY));
      await waitFor(
        "a few polls",
        async () => seen.filter((r) => r.url.includes("/dashboard/state")).length >= 3,
      );
      assert.ok(!page.url().includes(KEY), `the address still holds the key: ${page.url()}`);
      assert.ok(page.url().includes("interval=300"), page.url());
      const leaks = seen.slice(1).filter((r) => r.url.includes(KEY) || (r.referer ?? "").includes(KEY));
      assert.deepEqual(leaks, [], `of ${seen.length} requests`);
      // A reload (no key in the address any more) still works, for this tab.
      await page.reload();
      await waitFor("polls after reload", async () => (await text(page, "#status"))?.startsWith("policy"));
    } finally {
      await page.close();
    }
    // Every answer is nosniff; the dashboard's, errors included, are not framable either.
    for (const [path, status] of [
      ["/dashboard/app.js", 200],
      ["/dashboard/app.css", 200],
      ["/dashboard/state", 401],
      ["/dashboard", 401],
    ] as const) {
      const r = await fetch(`${url}${path}`);
      await r.arrayBuffer();
      assert.equal(r.status, status, path);
      assert.equal(r.headers.get("x-content-type-options"), "nosniff", path);
      assert.equal(r.headers.get("x-frame-options"), "DENY", path);
      assert.match(r.headers.get("content-security-policy") ?? "", /frame-ancestors 'none'/, path);
      assert.equal(r.headers.get("referrer-policy"), "no-referrer", path);
    }
    const forged = await fetch(`${url}/dashboard/state`, { headers: { cookie: "infera_dashboard=forged" } });
    assert.equal(forged.status, 401);
    await forged.arrayBuffer();
    for (const path of ["/v1/models", "/health", "/nope"]) {
      const r = await fetch(`${url}${path}`);
      await r.arrayBuffer();
      assert.equal(r.headers.get("x-content-type-options"), "nosniff", path);
    }
  });

  it("renders the four workers, moves under load, and explains who served a request", async () => {
    const page = await browser.newPage();
    await page.setViewport({ width: 1500, height: 1100 });
    const elsewhere: string[] = [];
    page.on("request", (r) => {
      if (!r.url().startsWith(url)) elsewhere.push(r.url());
    });
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    try {
      const res = await page.goto(`${url}/dashboard?key=${KEY}&interval=500`);
      assert.equal(res?.status(), 200);
      await waitFor("four workers", async () => (await page.$$("tr[data-worker]")).length === 4);
      const ids = await page.$$eval("tr[data-worker]", (rows) =>
        rows.map((r) => r.getAttribute("data-worker")),
      );
      assert.ok(
        ids.every((id) => /^sim-\d@127\.0\.0\.1:\d+$/.test(id ?? "")),
        String(ids),
      );
      const states = await page.$$eval("tr[data-worker] td.state", (c) => c.map((x) => x.textContent));
      assert.deepEqual(states, ["healthy", "healthy", "healthy", "healthy"]);
      const requests0 = await text(page, "[data-field=requests]");
      assert.equal(requests0, "0 requests");

      // A little load: a few clients with shared prefixes, streaming.
      let stop = false;
      const load = Promise.all(
        Array.from({ length: 3 }, async (_, c) => {
          for (let i = 0; !stop; i++) {
            const s = await client.chat.completions.create({
              model: "sim-model",
              messages: [{ role: "user", content: `${PREFIX} Client ${c} asks question ${i % 5}.` }],
              max_tokens: 12,
              stream: true,
            });
            for await (const _ of s) {
              // drain
            }
          }
        }),
      );
      try {
        await waitFor("the request count to move", async () => {
          const t = await text(page, "[data-field=requests]");
          return t !== null && t !== requests0 && Number.parseInt(t, 10) >= 10;
        });
        const routed1 = await page.$$eval("tr[data-worker] td[data-field=routed]", (c) =>
          c.reduce((a, x) => a + Number(x.textContent), 0),
        );
        await waitFor("routed counts to grow", async () => {
          const r = await page.$$eval("tr[data-worker] td[data-field=routed]", (c) =>
            c.reduce((a, x) => a + Number(x.textContent), 0),
          );
          return r > routed1;
        });
        await waitFor("a non-zero request rate", async () => {
          const t = await text(page, "[data-field=rps]");
          return t !== null && Number.parseFloat(t) > 0;
        });
        await waitFor("the index's blocks", async () =>
          (
            await page.$$eval("tr[data-worker] td[data-field=indexBlocks]", (c) =>
              c.map((x) => x.textContent),
            )
          ).some((t) => Number(t) > 0),
        );
        assert.ok((await page.$$("[data-chart] canvas")).length >= 5, "uPlot charts drawn");
        // For the README's screenshot: some history in the charts.
        if (process.env.INFERA_DASHBOARD_SCREENSHOT) await new Promise((r) => setTimeout(r, 20_000));
      } finally {
        stop = true;
        await load;
      }

      // One request alone: which sim served it is read from the sims' own request counters.
      const count = async (u: string) =>
        // vLLM's request counter, a prometheus_client Counter "vllm:request_success" (exposed with _total):
        // vllm-project/vllm vllm/v1/metrics/loggers.py @ 005a810bc40faa25b8870fbc8559c3462581eee3
        parseMetric(await (await fetch(`${u}/metrics`)).text(), "vllm:request_success_total") ?? 0;
      const workers = (await (
        await fetch(`${url}/v1/workers`, { headers: { authorization: `Bearer ${KEY}` } })
      ).json()) as { data: Array<{ id: string; url: string }> };
      const c0 = await Promise.all(workers.data.map((w) => count(w.url)));
      const rid = `browser-${Date.now()}`;
      const r = await fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}`, "x-request-id": rid },
        body: JSON.stringify({
          model: "sim-model",
          messages: [{ role: "user", content: PREFIX }],
          max_tokens: 2,
        }),
      });
      assert.equal(r.status, 200);
      await r.json();
      const c1 = await Promise.all(workers.data.map((w) => count(w.url)));
      const served = workers.data.filter((_, i) => c1[i]! > c0[i]!);
      assert.equal(served.length, 1);

      const row = await waitFor("the request in the decisions feed", () =>
        page.$(`tr[data-request="${rid}"]`),
      );
      await row.click();
      const winner = await waitFor("the explanation", () =>
        text(page, `[data-explain="${rid}"] .explain-winner`),
      );
      assert.equal(winner, served[0]!.id);
      const heads = await page.$$eval(`[data-explain="${rid}"] th`, (c) => c.map((x) => x.textContent));
      assert.ok(heads.includes("kv-prefix"), String(heads));
      const candidates = await page.$$eval(`[data-explain="${rid}"] tr[data-candidate]`, (c) =>
        c.map((x) => ({ id: x.getAttribute("data-candidate"), winner: x.classList.contains("winner") })),
      );
      assert.equal(candidates.length, 4);
      assert.deepEqual(
        candidates.filter((c) => c.winner).map((c) => c.id),
        [served[0]!.id],
      );
      // Each candidate's absolute overlap, "cached / prompt blocks", the numbers the decision
      // recorded (the same JSON the page polls). PREFIX was just sent under load, so some worker
      // caches part of it.
      assert.ok(heads.includes("prompt cached (blocks / prompt blocks)"), String(heads));
      const shown = await page.$$eval(`[data-explain="${rid}"] tr[data-candidate]`, (rows) =>
        rows.map((x) => [x.getAttribute("data-candidate"), x.querySelector("td.overlap")?.textContent]),
      );
      // The pending bridge's part of it per candidate (issue #28 item 6): kv-aware has a bridge,
      // so every candidate shows a number, the one the decision recorded.
      assert.ok(heads.includes("of which pending bridge (blocks)"), String(heads));
      const bridgeShown = await page.$$eval(`[data-explain="${rid}"] tr[data-candidate]`, (rows) =>
        rows.map((x) => x.querySelector("td.bridge-blocks")?.textContent),
      );
      const st = (await (
        await fetch(`${url}/dashboard/state`, { headers: { authorization: `Bearer ${KEY}` } })
      ).json()) as {
        decisions: Array<{
          requestId: string;
          candidates: Array<{
            worker: string;
            cachedBlocks: number | null;
            promptBlocks: number | null;
            bridgeBlocks: number | null;
          }>;
        }>;
      };
      const rec = st.decisions.find((x) => x.requestId === rid)!;
      assert.deepEqual(
        shown,
        rec.candidates.map((c) => [c.worker, `${c.cachedBlocks} / ${c.promptBlocks}`]),
      );
      assert.deepEqual(
        bridgeShown,
        rec.candidates.map((c) => String(c.bridgeBlocks)),
      );
      assert.ok(
        rec.candidates.every((c) => typeof c.bridgeBlocks === "number" && c.bridgeBlocks <= c.cachedBlocks!),
        JSON.stringify(rec.candidates),
      );
      assert.ok(
        rec.candidates.every((c) => c.promptBlocks! > 0),
        JSON.stringify(rec.candidates),
      );
      assert.ok(
        rec.candidates.some((c) => c.cachedBlocks! > 0),
        JSON.stringify(rec.candidates),
      );
      // The explanation stays open across polls.
      await new Promise((r) => setTimeout(r, 1200));
      assert.equal(await text(page, `[data-explain="${rid}"] .explain-winner`), served[0]!.id);

      assert.deepEqual(elsewhere, [], "nothing fetched from anywhere but the server");
      assert.deepEqual(errors, []);
      if (process.env.INFERA_DASHBOARD_SCREENSHOT)
        await page.screenshot({ path: SCREENSHOT, fullPage: true });
    } finally {
      await page.close();
    }
  });
});
