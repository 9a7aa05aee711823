/**
 * Locality of release (src/router/flow/locality.ts) in the admission queue, without processes
 * (the end-to-end behaviour is test/server/flow-locality.test.ts): two workers, the `load`
 * signal at one in-flight request each, and each request's cached prompt tokens per worker as
 * the policy's overlap source would report them.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { HeadroomRequest } from "../../../src/router/flow/headroom.ts";
import load from "../../../src/router/flow/load.ts";
import { DEFAULT_LOCALITY, type LocalityConfig } from "../../../src/router/flow/locality.ts";
import { type Admission, FlowQueue } from "../../../src/router/flow/queue.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { RequestAbort } from "../../../src/util/abort.ts";
import { mixedRecord } from "../../helpers/records.ts";

const mk = (id: string): WorkerState => ({
  record: mixedRecord({ id, model: "m", url: "http://127.0.0.1:1" }),
  inFlight: 0,
  pendingPrefillTokens: 0,
  available: true,
});

function setup(locality: Partial<LocalityConfig>, bandCount = 1, workerCount = 2) {
  const workers = Array.from({ length: workerCount }, (_, i) => mk(`w${i + 1}`));
  const signal = load.build({ model: "m", shared: (_k, make) => make() }, { maxInFlight: 1 });
  const outcomes: string[] = [];
  const q = new FlowQueue({
    bands: Array.from({ length: bandCount }, (_, i) => ({
      name: `b${i}`,
      maxWaitMs: 10_000,
      agingMs: 5_000,
    })),
    maxQueue: 100,
    signals: () => [signal],
    candidates: () => workers,
    locality: { ...DEFAULT_LOCALITY, ...locality },
    observer: { onLocality: (o) => outcomes.push(o) },
  });
  let n = 0;
  /** Admits a request whose prompt (`prompt` tokens) is cached as `cached` on w1, w2, …. */
  const admit = (cached: readonly number[], prompt = 3000, band = 0): Promise<Admission> => {
    const req: HeadroomRequest = {
      requestId: `r${n++}`,
      model: "m",
      promptTokens: prompt,
      expectedOutputTokens: 0,
      band,
      bandName: `b${band}`,
    };
    return q.admit(req, "f", 1, new RequestAbort(), (cands) =>
      cands.map((c) => cached[Number(c.record.id.slice(1)) - 1] ?? 0),
    );
  };
  return { q, workers, admit, outcomes };
}

const ids = (a: Admission) => [...a.fits].sort().join(",");
const tick = (ms = 5) => new Promise((r) => setTimeout(r, ms));

describe("FlowQueue locality", () => {
  it("holds a request for the busy worker holding its prefix; one behind it takes the free worker", async () => {
    const { q, workers, admit, outcomes } = setup({ waitMs: 2_000 });
    workers[0].inFlight = 1; // w1, the home, is busy; w2 is free
    let homeAt = 0;
    const home = admit([2500, 0]).then((a) => {
      homeAt = performance.now();
      return a;
    });
    const other = await admit([0, 0]);
    assert.equal(ids(other), "w2", "the request with no home takes the free worker first");
    assert.equal(homeAt, 0, "the one with a home still waits");
    workers[1].inFlight = 1;
    const t0 = performance.now();
    await tick(30);
    workers[0].inFlight = 0;
    q.wake();
    const a = await home;
    assert.equal(ids(a), "w1", "released to its home when it freed");
    assert.ok(homeAt - t0 >= 25);
    assert.deepEqual(outcomes, ["deferred", "local", "local"]);
  });

  it("escapes to a worker with headroom after waitMs, counted from when it was first passed over", async () => {
    const { workers, admit, outcomes } = setup({ waitMs: 60 });
    workers[0].inFlight = 1;
    const t0 = performance.now();
    const a = await admit([2500, 0]);
    assert.equal(ids(a), "w2");
    assert.ok(performance.now() - t0 >= 55, "waited its locality wait");
    assert.deepEqual(outcomes, ["deferred", "escaped"]);
  });

  it("does not wait when the free worker holds nearly as much (within minGainTokens)", async () => {
    const { workers, admit } = setup({ waitMs: 10_000, minGainTokens: 512 });
    workers[0].inFlight = 1;
    const a = await admit([2500, 2200]);
    assert.equal(ids(a), "w2");
  });

  it("releases only to the workers with headroom holding the most of the prompt", async () => {
    const { workers, admit } = setup({ waitMs: 10_000 }, 1, 3);
    workers[0].inFlight = 1;
    assert.equal(ids(await admit([0, 0, 2000])), "w3");
    assert.equal(
      ids(await admit([0, 100, 50])),
      "w2,w3",
      "nothing worth keeping: every worker with headroom",
    );
  });

  it("does nothing while every worker has headroom: the scheduler chooses (hot-prefix spreading included)", async () => {
    const { admit, outcomes } = setup({ waitMs: 10_000 });
    assert.equal(ids(await admit([0, 2000])), "w1,w2");
    assert.deepEqual(outcomes, ["local"]);
  });

  /**
   * Both workers busy; `first` then `second` queue (cached tokens on w1, w2, band); w2 frees,
   * then w1. Each released request holds its worker (the router's claim, in the server).
   * Returns the release order.
   */
  async function race(
    locality: Partial<LocalityConfig>,
    bands: number,
    first: [string, [number, number], number],
    second: [string, [number, number], number],
  ): Promise<string[][]> {
    const { q, workers, admit } = setup(locality, bands);
    workers[0].inFlight = 1;
    workers[1].inFlight = 1;
    const order: string[] = [];
    const hold = (name: string) => (a: Admission) => {
      order.push(name);
      for (const w of workers) if (a.fits.has(w.record.id)) w.inFlight = 1;
    };
    const all = [first, second].map(([name, cached, band]) => admit(cached, 3000, band).then(hold(name)));
    await tick();
    workers[1].inFlight = 0;
    q.wake();
    await tick(20);
    const afterOne = [...order];
    workers[0].inFlight = 0;
    workers[1].inFlight = 0;
    q.wake();
    await Promise.all(all);
    return [afterOne, order];
  }

  it("pick cheapest: of the window, the request with the fewest uncached tokens goes first", async () => {
    const [one, all] = await race(
      { waitMs: 10_000, pick: "cheapest" },
      1,
      ["cold", [0, 0], 0],
      ["warm", [0, 2900], 0],
    );
    assert.deepEqual(one, ["warm"]);
    assert.deepEqual(all, ["warm", "cold"]);
  });

  it("pick cheapest never lets a lower band's cheap request go before a higher band's", async () => {
    const [one, all] = await race(
      { waitMs: 10_000, pick: "cheapest" },
      2,
      ["low-warm", [0, 2900], 1],
      ["high-cold", [0, 0], 0],
    );
    assert.deepEqual(one, ["high-cold"]);
    assert.deepEqual(all, ["high-cold", "low-warm"]);
  });

  it("off (waitMs 0): released at once wherever there is headroom", async () => {
    const { workers, admit, outcomes } = setup({ waitMs: 0 });
    workers[0].inFlight = 1;
    const a = await admit([2500, 0]);
    assert.equal(ids(a), "w2");
    assert.deepEqual(outcomes, []);
  });
});
