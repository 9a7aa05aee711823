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

describe("the load signal behind several replicas", () => {
  // bench/fleet-routing/RESULTS.md Run L: 4 replicas each counted only their own dispatches
  // since a reading, so a worker that had just freed took up to 4 × maxWaiting of them.
  const scoped = (replicas: number) => ({ ...scope, replicas: () => replicas });

  it("counts its own dispatches since the reading once per replica", () => {
    const w = worker(0);
    const alone = load.build(scoped(1), {});
    const four = load.build(scoped(4), {});
    assert.deepEqual(four.check(req(1), [w]).fits, [0], "the reading itself: an empty engine queue");
    assert.deepEqual(alone.check(req(1), [w]).fits, [0]);
    w.inFlight = 1;
    assert.deepEqual(four.check(req(1), [w]).fits, [0], "1 here ≈ 4 in the fleet ≤ 5");
    w.inFlight = 2;
    const v = four.check(req(1), [w]);
    assert.deepEqual(v.fits, [], "2 here ≈ 8 in the fleet > 5");
    assert.equal(v.reason, "engine-queue");
    assert.deepEqual(alone.check(req(1), [w]).fits, [0], "alone: 2 ≤ 5");
    w.inFlight = 5;
    assert.deepEqual(alone.check(req(1), [w]).fits, [0]);
    w.inFlight = 6;
    assert.deepEqual(alone.check(req(1), [w]).fits, [], "alone: 6 > 5");
  });

  it("follows the replica count as it changes, and perReplicaGrowth: false counts once", () => {
    let n = 4;
    const w = worker(0);
    const sig = load.build({ ...scope, replicas: () => n }, {});
    const off = load.build(scoped(4), { perReplicaGrowth: false });
    assert.deepEqual(sig.check(req(1), [w]).fits, [0]);
    assert.deepEqual(off.check(req(1), [w]).fits, [0]);
    w.inFlight = 2;
    assert.deepEqual(sig.check(req(1), [w]).fits, []);
    assert.deepEqual(off.check(req(1), [w]).fits, [0], "as before Run L");
    n = 2;
    assert.deepEqual(sig.check(req(1), [w]).fits, [0], "2 replicas: 2 × 2 ≤ 5");
    // A new reading resets the count: its queue holds what was sent before it.
    w.inFlight = 4;
    w.engineLoad = { running: 4, waiting: 1, kvUsage: 0.1, scrapedAt: Date.now() + 1 };
    assert.deepEqual(sig.check(req(1), [w]).fits, [0]);
    w.inFlight = 6;
    assert.deepEqual(sig.check(req(1), [w]).fits, [0], "1 waiting + 2 × 2 since ≤ 5");
    w.inFlight = 7;
    assert.deepEqual(sig.check(req(1), [w]).fits, [], "1 waiting + 2 × 3 since > 5");
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
