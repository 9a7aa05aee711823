/**
 * The gate tells its headroom signals how many replicas route to the engines
 * (HeadroomScope.replicas): the peer plane's live set when the scrape is shared, else
 * `flow.replicas`. The `load` signal counts this replica's dispatches since an engine reading
 * once per replica (bench/fleet-routing/RESULTS.md Run L: behind 4 replicas each let up to
 * maxWaiting through onto a worker that had just freed). The signal itself:
 * test/router/flow/load.test.ts; the live count: test/router/peers/load-share.test.ts.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Registry } from "prom-client";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { FlowConfigLayer } from "../../src/router/flow/config-schema.ts";
import type { SharedLoad } from "../../src/router/peers/types.ts";
import { WorkerSet } from "../../src/router/worker-set.ts";
import { createFlowGate } from "../../src/server/flow-gate.ts";
import { LoadScraper } from "../../src/server/load-scraper.ts";
import { RequestAbort } from "../../src/util/abort.ts";
import { createLogger } from "../../src/util/log.ts";
import { mixedRecord } from "../helpers/records.ts";

const logger = createLogger("test", {});
logger.level = "silent";

/** A stand-in peer plane's shared scrape that counts `live` replicas. */
const shareOf = (live: number): SharedLoad => ({
  replicaId: "me",
  isMine: () => true,
  busyElsewhere: () => false,
  liveCount: () => live,
  report: () => {},
  leave: () => {},
  onReadings: null,
});

/**
 * Whether a request goes at once on a worker whose reading shows an empty engine queue and to
 * which this replica has sent 2 requests since (maxWaiting 5: alone 2 ≤ 5; as one of 4,
 * 2 × 4 > 5).
 */
async function goesAtOnce(layer: FlowConfigLayer, share: SharedLoad | null): Promise<boolean> {
  const ws = new WorkerSet(
    new MemoryDiscovery([mixedRecord({ id: "w0", model: "m", url: "http://127.0.0.1:1" })]),
    { logger },
  );
  ws.attach();
  const scraper = new LoadScraper(ws, 0);
  if (share) scraper.shareWith(share);
  const gate = createFlowGate(
    { enabled: true, maxWaitMs: 60_000, headroom: [{ name: "load" }], ...layer },
    ws,
    new Registry(),
    scraper,
  );
  assert.ok(gate);
  const w = ws.list()[0];
  w.engineLoad = { running: 0, waiting: 0, kvUsage: 0.1, scrapedAt: Date.now() };
  const req = (id: string) => ({ requestId: id, model: "m", body: {}, promptTokens: 10 });
  const abort = new RequestAbort();
  // The first check takes the reading; then 2 of this replica's requests go there.
  await gate.admit(req("a"), {}, abort);
  w.inFlight = 2;
  let went = false;
  const p = gate.admit(req("b"), {}, abort).then(() => {
    went = true;
  });
  await new Promise((r) => setImmediate(r));
  gate.queue.close(new Error("done"));
  await p.catch(() => {});
  return went;
}

describe("flow gate: replicas behind one balancer", () => {
  it("alone, counts its own dispatches once", async () => {
    assert.equal(await goesAtOnce({}, null), true);
  });

  it("with a shared scrape, counts them once per live replica", async () => {
    assert.equal(await goesAtOnce({}, shareOf(4)), false);
    assert.equal(await goesAtOnce({}, shareOf(1)), true, "the peers gone: alone again");
  });

  it("without a peer plane, takes flow.replicas", async () => {
    assert.equal(await goesAtOnce({ replicas: 4 }, null), false);
  });
});
