/**
 * The `load` signal's per-band thresholds (`bands`, `higherActiveMs`) and how the admission
 * queue treats a band they hold back, without processes (end to end:
 * test/server/flow-bands.test.ts; the common thresholds: test/router/flow/queue.test.ts).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { HeadroomRequest } from "../../../src/router/flow/headroom.ts";
import load from "../../../src/router/flow/load.ts";
import { type Admission, FlowQueue } from "../../../src/router/flow/queue.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { RequestAbort } from "../../../src/util/abort.ts";
import { mixedRecord } from "../../helpers/records.ts";

const BANDS = ["high", "normal", "low"];
const scope = { model: "m", shared: <T>(_k: string, make: () => T) => make() };
let n = 0;
const req = (band: number): HeadroomRequest => ({
  requestId: `r${n++}`,
  model: "m",
  promptTokens: 100,
  expectedOutputTokens: 0,
  band,
  bandName: BANDS[band],
});
const worker = (inFlight: number, waiting = 0): WorkerState => ({
  record: mixedRecord({ id: `w${n++}`, model: "m", url: "http://127.0.0.1:1" }),
  inFlight,
  pendingPrefillTokens: 0,
  available: true,
  engineLoad: { running: inFlight, waiting, kvUsage: 0.1, scrapedAt: Date.now() },
});

describe("the load signal, per band", () => {
  it("holds a band to its own thresholds and the others to the common ones", () => {
    const sig = load.build(scope, { maxInFlight: 0, bands: { low: { maxInFlight: 4, maxWaiting: 0 } } });
    const busy = worker(4);
    const queued = worker(1, 1);
    const idle = worker(1);
    const cands = [busy, queued, idle];
    assert.deepEqual(sig.check(req(2), cands).fits, [2], "low: in-flight < 4 and an empty engine queue");
    const v = sig.check(req(2), [busy]);
    assert.deepEqual(v.fits, []);
    assert.equal(v.reason, "in-flight");
    assert.deepEqual(sig.check(req(1), cands).fits, [0, 1, 2], "normal: no override, GIE's defaults");
    assert.deepEqual(sig.check(req(0), cands).fits, [0, 1, 2], "high: no override");
  });

  it("with higherActiveMs, applies a band's thresholds only while a higher band was seen", (t) => {
    t.mock.timers.enable({ apis: ["Date"], now: 1_000_000 });
    const sig = load.build(scope, { bands: { low: { maxInFlight: 1 } }, higherActiveMs: 1000 });
    const w = worker(3);
    w.engineLoad = undefined;
    assert.deepEqual(sig.check(req(2), [w]).fits, [0], "no higher band yet: the common thresholds");
    sig.check(req(1), [w]);
    assert.deepEqual(sig.check(req(2), [w]).fits, [], "normal was just seen");
    t.mock.timers.tick(1001);
    assert.deepEqual(sig.check(req(2), [w]).fits, [0], "past the window");
    sig.check(req(2), [w]);
    assert.deepEqual(sig.check(req(2), [w]).fits, [0], "its own band does not count");
  });

  it("refuses an unknown threshold name in a band", () => {
    assert.throws(() => load.build(scope, { bands: { low: { maxInflight: 1 } } }));
  });
});

describe("the queue with a band held back by its own bound", () => {
  it("lets a higher band pass an aged lower entry that does not fit", async () => {
    const w = worker(0);
    w.engineLoad = undefined;
    const sig = load.build(scope, { bands: { low: { maxInFlight: 1 } } });
    const q = new FlowQueue({
      bands: [
        { name: "high", maxWaitMs: 10_000, agingMs: 10_000 },
        { name: "normal", maxWaitMs: 10_000, agingMs: 10_000 },
        // Ages at once: tried first on every pass.
        { name: "low", maxWaitMs: 10_000, agingMs: 0 },
      ],
      maxQueue: 10,
      signals: () => [sig],
      candidates: () => [w],
    });
    w.inFlight = 1;
    const low = q.admit(req(2), "x", 1, new RequestAbort());
    let lowOut = false;
    void low.then(() => {
      lowOut = true;
    });
    assert.equal(q.depth, 1);
    // The model has a queued (aged) entry, so the high request queues too, then passes it.
    const high: Admission = await q.admit(req(0), "x", 1, new RequestAbort());
    assert.equal(high.fits.size, 1);
    assert.equal(lowOut, false);
    assert.equal(q.depth, 1);
    w.inFlight = 0;
    q.wake();
    await low;
    assert.equal(q.depth, 0);
  });
});
