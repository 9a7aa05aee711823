/**
 * The admission queue's order and bounds without processes (the end-to-end behaviour is
 * test/server/flow.test.ts): one worker whose in-flight count the test moves, the `load`
 * signal at one in-flight request, and `wake()` where the server would call it.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { HeadroomRequest } from "../../../src/router/flow/headroom.ts";
import { FlowRejectedError, RateLimiter } from "../../../src/router/flow/limits.ts";
import load from "../../../src/router/flow/load.ts";
import { type Admission, type BandSpec, FlowQueue } from "../../../src/router/flow/queue.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { RequestAbort } from "../../../src/util/abort.ts";
import { mixedRecord } from "../../helpers/records.ts";

const worker: WorkerState = {
  record: mixedRecord({ id: "w1", model: "m", url: "http://127.0.0.1:1" }),
  inFlight: 0,
  pendingPrefillTokens: 0,
  available: true,
};

function queue(bands: BandSpec[], workers: WorkerState[] = [worker]) {
  const signal = load.build({ model: "m", shared: (_k, make) => make() }, { maxInFlight: 1 });
  return new FlowQueue({ bands, maxQueue: 100, signals: () => [signal], candidates: () => workers });
}

let n = 0;
const req = (band: number, tokens = 100): HeadroomRequest => ({
  requestId: `r${n++}`,
  model: "m",
  promptTokens: tokens,
  expectedOutputTokens: 0,
  band,
  bandName: String(band),
});

/** Runs the queue like the server: each admitted request holds the worker until `done`. */
async function drain(entries: Array<[string, Promise<Admission>]>): Promise<string[]> {
  const order: string[] = [];
  await Promise.all(
    entries.map(async ([name, p]) => {
      const a = await p;
      worker.inFlight++;
      order.push(name);
      await new Promise((r) => setTimeout(r, 5));
      worker.inFlight--;
      a.finish({ ok: true, outputTokens: 0 });
    }),
  );
  return order;
}

describe("FlowQueue", () => {
  it("gives a flow of weight 2 twice the tokens of a flow of weight 1 while both are backlogged", async () => {
    const q = queue([{ name: "n", maxWaitMs: 10_000, agingMs: 10_000 }]);
    worker.inFlight = 1;
    const entries: Array<[string, Promise<Admission>]> = [];
    for (let i = 0; i < 6; i++) entries.push(["a", q.admit(req(0), "a", 2, new RequestAbort())]);
    for (let i = 0; i < 6; i++) entries.push(["b", q.admit(req(0), "b", 1, new RequestAbort())]);
    worker.inFlight = 0;
    q.wake();
    const order = await drain(entries);
    // The first 6 dispatched: 4 of a's, 2 of b's (a's counter grows half as fast).
    assert.equal(order.slice(0, 6).filter((x) => x === "a").length, 4, order.join(""));
  });

  it("passes a lower band over, but not past its agingMs", async () => {
    const q = queue([
      { name: "high", maxWaitMs: 10_000, agingMs: 10_000 },
      { name: "low", maxWaitMs: 10_000, agingMs: 30 },
    ]);
    worker.inFlight = 1;
    const entries: Array<[string, Promise<Admission>]> = [
      ["low", q.admit(req(1), "x", 1, new RequestAbort())],
    ];
    await new Promise((r) => setTimeout(r, 40));
    entries.push(["high", q.admit(req(0), "x", 1, new RequestAbort())]);
    worker.inFlight = 0;
    q.wake();
    assert.deepEqual(await drain(entries), ["low", "high"]);

    worker.inFlight = 1;
    const fresh: Array<[string, Promise<Admission>]> = [["low", q.admit(req(1), "x", 1, new RequestAbort())]];
    fresh.push(["high", q.admit(req(0), "x", 1, new RequestAbort())]);
    worker.inFlight = 0;
    q.wake();
    assert.deepEqual(await drain(fresh), ["high", "low"]);
  });

  it("answers 503 no_worker_available when the model's last worker leaves while queued", async () => {
    const ws = [worker];
    const q = queue([{ name: "n", maxWaitMs: 10_000, agingMs: 10_000 }], ws);
    worker.inFlight = 1;
    const p = q.admit(req(0), "x", 1, new RequestAbort());
    ws.length = 0;
    q.wake();
    await assert.rejects(p, (e: { status?: number; code?: string }) => e.status === 503);
    // And a newcomer while none is there: 503 at once, not a wait.
    await assert.rejects(
      q.admit(req(0), "x", 1, new RequestAbort()),
      (e: { status?: number }) => e.status === 503,
    );
    ws.push(worker);
    worker.inFlight = 0;
  });

  it("takes a cancelled entry out at once and rejects with the abort's reason", async () => {
    const q = queue([{ name: "n", maxWaitMs: 10_000, agingMs: 10_000 }]);
    worker.inFlight = 1;
    const ab = new RequestAbort();
    const p = q.admit(req(0), "x", 1, ab);
    assert.equal(q.depth, 1);
    const why = new Error("gone");
    ab.abort(why);
    assert.equal(q.depth, 0);
    await assert.rejects(p, (e) => e === why);
    worker.inFlight = 0;
  });
});

describe("RateLimiter", () => {
  it("refuses the request past the RPM with the seconds until one more is allowed", () => {
    const l = new RateLimiter();
    l.take("k", { rpm: 60, tpm: 0 }, 1, 0);
    for (let i = 1; i < 60; i++) l.take("k", { rpm: 60, tpm: 0 }, 1, 0);
    assert.throws(
      () => l.take("k", { rpm: 60, tpm: 0 }, 1, 0),
      (e) =>
        e instanceof FlowRejectedError && e.reason === "rate_limit_rpm" && e.headers["retry-after"] === "1",
    );
    // One request per second refills: allowed again a second later.
    l.take("k", { rpm: 60, tpm: 0 }, 1, 1000);
  });

  it("splits the limits among replicas and counts tokens for TPM", () => {
    const l = new RateLimiter(2);
    l.take("k", { rpm: 0, tpm: 1000 }, 500, 0);
    assert.throws(
      () => l.take("k", { rpm: 0, tpm: 1000 }, 10, 0),
      (e) => e instanceof FlowRejectedError && e.reason === "rate_limit_tpm" && e.status === 429,
    );
    // 500 tokens a minute here: 10 tokens come back in 1.2 s.
    l.take("k", { rpm: 0, tpm: 1000 }, 10, 1200);
  });
});

describe("the load signal", () => {
  const sig = load.build({ model: "m", shared: (_k, make) => make() }, {});
  const w = (waiting: number, kvUsage: number, ageMs = 0): WorkerState => ({
    record: mixedRecord({ id: `w-${waiting}-${kvUsage}-${ageMs}`, model: "m", url: "http://127.0.0.1:1" }),
    inFlight: 0,
    pendingPrefillTokens: 0,
    available: true,
    engineLoad: { running: 4, waiting, kvUsage, scrapedAt: Date.now() - ageMs },
  });

  it("follows GIE's saturation defaults: queue ≤ 5, KV usage < 0.8; stale readings ignored", () => {
    const cands = [w(6, 0.1), w(0, 0.85), w(9, 0.9, 60_000), w(5, 0.5)];
    const v = sig.check(req(0), cands);
    assert.deepEqual(v.fits, [2, 3]);
  });

  it("counts this replica's in-flight growth since the reading as queued", () => {
    const x = w(3, 0.1);
    assert.deepEqual(sig.check(req(0), [x]).fits, [0]);
    x.inFlight += 2;
    assert.deepEqual(sig.check(req(0), [x]).fits, [0], "3 + 2 is still ≤ 5");
    x.inFlight += 1;
    const v = sig.check(req(0), [x]);
    assert.deepEqual(v.fits, []);
    assert.equal(v.reason, "engine-queue");
    // A new reading resets the growth.
    x.engineLoad = { running: 4, waiting: 0, kvUsage: 0.1, scrapedAt: Date.now() + 1 };
    assert.deepEqual(sig.check(req(0), [x]).fits, [0]);
  });
});
