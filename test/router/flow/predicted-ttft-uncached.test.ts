/**
 * The `predicted-ttft` headroom signal predicts on the prompt's tokens NOT cached on each
 * candidate (`HeadroomRequest.cachedTokens`, the routing policy's overlap source, as the flow
 * gate fills it), not on the whole prompt: a follow-up whose history a worker holds fits there
 * under a target its whole prompt would miss, and the sample it teaches carries the same feature.
 * The signal alone, with the server's predictor fitted by hand (the end-to-end path, through a
 * real server and sim, is ./predicted-ttft.test.ts).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { HeadroomRequest } from "../../../src/router/flow/headroom.ts";
import predictedTtft from "../../../src/router/flow/predicted-ttft.ts";
import { TtftPredictor } from "../../../src/router/predict/ttft.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { mixedRecord } from "../../helpers/records.ts";

const worker = (id: string): WorkerState => ({
  record: mixedRecord({ id, model: "m", url: "http://127.0.0.1:1" }),
  inFlight: 0,
  pendingPrefillTokens: 0,
  available: true,
});

/** A predictor that learnt TTFT = 100 ms + 1 ms per uncached prompt token on both workers. */
function fitted(ids: string[]): TtftPredictor {
  const p = new TtftPredictor();
  for (const id of ids)
    for (let k = 0; k < 40; k++) {
      const tokens = 500 + ((k * 377) % 6000);
      p.observe("m", id, new Float64Array([1, tokens / 1000, 0, 0]), 100 + tokens);
    }
  return p;
}

test("a candidate holding most of the prompt fits a target its whole prompt would miss", () => {
  const [a, b] = [worker("a"), worker("b")];
  const predictor = fitted(["a", "b"]);
  const signal = predictedTtft.build({ model: "m", ttft: predictor, shared: (_k, make) => make() }, {});
  let lookups = 0;
  const req: HeadroomRequest = {
    requestId: "r1",
    model: "m",
    promptTokens: 4000,
    expectedOutputTokens: 16,
    band: 0,
    bandName: "normal",
    targetTtftMs: 2000,
    cachedTokens: (cands) => {
      lookups++;
      return cands.map((w) => (w.record.id === "a" ? 3000 : 0));
    },
  };
  const v = signal.check(req, [a, b]);
  // a: 100 + 1000 = 1,100 ms ≤ 2,000; b: 100 + 4,000 = 4,100 ms > 2,000. On the whole prompt
  // (before) both were 4,100 ms: none fitted.
  assert.deepEqual(v.fits, [0]);
  assert.equal(lookups, 1);
  // Without a cache reading the whole prompt counts: none fits, the wait is the excess.
  const cold = signal.check({ ...req, requestId: "r2", cachedTokens: undefined }, [a, b]);
  assert.deepEqual(cold.fits, []);
  assert.ok(cold.waitMs !== undefined && cold.waitMs > 1500 && cold.waitMs < 2500, `wait ${cold.waitMs}`);

  // Dispatched to a, its first token teaches the fit with the uncached feature (1,000 tokens):
  // an observation of 1,100 ms leaves the line where it was (a whole-prompt feature would pull
  // the per-token cost down to ~0.25 ms).
  const x4k = new Float64Array([1, 4, 0, 0]);
  const fit = predictor.predictFeatures("m", "a", x4k);
  signal.onDispatched?.(req, a);
  const before = predictor.samplesOf("a");
  signal.onFirstToken?.({ requestId: "r1", workerId: "a", ttftMs: 1100 });
  assert.equal(predictor.samplesOf("a"), before + 1, "learnt at the first token");
  const again = predictor.predictFeatures("m", "a", x4k);
  assert.ok(Math.abs(again - fit) < 0.05 * fit, `4k uncached tokens still ≈ ${fit} ms: ${again}`);
  // The end teaches nothing more.
  signal.observe?.({
    requestId: "r1",
    workerId: "a",
    promptTokens: 4000,
    ttftMs: 1100,
    e2eMs: 3000,
    ok: true,
  });
  assert.equal(predictor.samplesOf("a"), before + 1);
});
