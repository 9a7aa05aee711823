/**
 * Per-band headroom (issue #29, the bands goal): real processes — a slow sim, `infera server`
 * with a `flow` config whose `load` signal holds the low band to one in-flight request per
 * worker (of any band) and leaves the high band unbounded. Long "blocker" streams hold the
 * worker's slots; what is answered while they are held shows who was let through.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { serverArgs, spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { parseMetric, type SimProcess, startSim } from "../helpers/sim.ts";
import { waitFor200, waitUntil } from "../helpers/wait.ts";

/** Only the in-flight bounds decide: engine queue and KV usage never block here. */
const common = { maxWaiting: 1000, maxKvUsage: 1 };
const flow = (loadParams: object) => ({
  enabled: true,
  headroom: [{ name: "load", params: { ...common, ...loadParams } }],
  maxWaitMs: 120_000,
  // The low band ages at once: an aged low entry that its band's bound holds back must not
  // stall the high band behind it.
  bands: [
    { name: "high", agingMs: 100_000 },
    { name: "low", agingMs: 0 },
  ],
  defaultBand: "low",
});

async function startServer(sim: SimProcess, cfgFlow: object) {
  const port = await freePort();
  const cfg = join(tmpdir(), `infera-flow-bands-${port}.json`);
  writeFileSync(cfg, JSON.stringify({ flow: cfgFlow }));
  const { proc, output } = spawnInfera(
    serverArgs(port, "--worker", sim.url, "--config", cfg, "--scrape-interval", "200"),
    { logLevel: "warn", keepChars: 8000 },
  );
  const url = `http://127.0.0.1:${port}`;
  await waitFor200(`${url}/ready`, { timeoutMs: 30_000, what: "server ready", output });
  return { proc, output, url };
}

function client(url: string, model: string) {
  const post = (band: string, maxTokens: number, signal?: AbortSignal, stream = false) =>
    fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-infera-priority": band },
      body: JSON.stringify({ model, prompt: "bands", max_tokens: maxTokens, ignore_eos: true, stream }),
      signal,
    });
  /** A long stream of `band` whose headers are back (it holds a slot) until `release()`. */
  const blocker = async (band: string) => {
    const ac = new AbortController();
    const r = await post(band, 2000, ac.signal, true);
    assert.equal(r.status, 200);
    // Read the body: an unread Response can be garbage-collected and undici then cancels it.
    const drained = r.body ? r.body.pipeTo(new WritableStream()).catch(() => {}) : Promise.resolve();
    return () => {
      ac.abort();
      return drained;
    };
  };
  const depth = async () =>
    parseMetric(await (await fetch(`${url}/metrics`)).text(), "infera_flow_queue_depth") ?? 0;
  const waitDepth = (n: number) => waitUntil(async () => (await depth()) === n, 10_000, `queue depth ${n}`);
  return { post, blocker, depth, waitDepth };
}

describe("infera server: flow control, per-band headroom (load `bands`)", () => {
  let sim: SimProcess;
  before(async () => {
    sim = await startSim({ args: ["--speed", "0.1"] });
  });
  after(async () => {
    await sim?.stop();
  });

  it("holds the low band at its in-flight bound while the high band goes through", async () => {
    const srv = await startServer(sim, flow({ bands: { low: { maxInFlight: 1 } } }));
    try {
      const c = client(srv.url, sim.model);
      const release = await c.blocker("low");
      let lowAnswered = false;
      const low = c.post("low", 1).then(async (r) => {
        lowAnswered = true;
        assert.equal(r.status, 200);
        await r.text();
      });
      await c.waitDepth(1);
      // Three high-band requests while the worker already runs one (low) request: the low
      // band's bound does not apply to them.
      const highs = await Promise.all([0, 1, 2].map(() => c.post("high", 1)));
      for (const r of highs) {
        assert.equal(r.status, 200);
        await r.text();
      }
      assert.equal(lowAnswered, false, "the queued low request is still held");
      assert.equal(await c.depth(), 1);
      await release();
      await low;
      assert.equal(await c.depth(), 0);
    } finally {
      srv.proc.kill("SIGKILL");
    }
  });

  it("with higherActiveMs, bounds the low band only while the high band was active", async () => {
    const srv = await startServer(sim, flow({ bands: { low: { maxInFlight: 1 } }, higherActiveMs: 3000 }));
    const releases: Array<() => Promise<void>> = [];
    try {
      const c = client(srv.url, sim.model);
      // No high-band request yet: the low band has the common (unbounded) in-flight limit.
      releases.push(await c.blocker("low"), await c.blocker("low"));
      assert.equal(await c.depth(), 0);
      const t0 = Date.now();
      // Streamed, so its headers are back as soon as it was dispatched: the low request below
      // arrives well inside the window even on a slow box.
      const high = await c.post("high", 1, undefined, true);
      assert.equal(high.status, 200);
      // Now the bound holds: two low requests in flight, a third waits...
      const low = c.post("low", 1);
      await high.text();
      // ...until higherActiveMs after the high request, with the blockers still held (a
      // scrape round wakes the queue).
      const r = await low;
      assert.equal(r.status, 200);
      await r.text();
      const ms = Date.now() - t0;
      assert.ok(ms >= 3000, `dispatched ${ms} ms after the high request`);
      // The blockers (2000 tokens at --speed 0.1) run for a minute: it was the window that freed it.
      assert.ok(ms < 20_000, `dispatched ${ms} ms after the high request, not when the window closed`);
      // It waited in the queue (the first two low requests did not).
      const m = await (await fetch(`${srv.url}/metrics`)).text();
      assert.equal(parseMetric(m, "infera_flow_dispatched_total", { band: "low", queued: "true" }), 1);
      assert.equal(parseMetric(m, "infera_flow_dispatched_total", { band: "low", queued: "false" }), 2);
    } finally {
      await Promise.all(releases.map((f) => f()));
      srv.proc.kill("SIGKILL");
    }
  });

  it("refuses a per-band threshold for a band that is not configured", async () => {
    const port = await freePort();
    const cfg = join(tmpdir(), `infera-flow-bands-bad-${port}.json`);
    writeFileSync(cfg, JSON.stringify({ flow: flow({ bands: { lwo: { maxInFlight: 1 } } }) }));
    const { proc, output } = spawnInfera(serverArgs(port, "--worker", sim.url, "--config", cfg), {
      logLevel: "warn",
      keepChars: 8000,
    });
    const code = await new Promise<number | null>((res) => proc.on("exit", (c) => res(c)));
    assert.notEqual(code, 0);
    assert.match(output(), /params\.bands: 'lwo' is not one of high, low/);
  });
});
