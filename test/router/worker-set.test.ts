import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { WorkerSet } from "../../src/router/worker-set.ts";
import { createLogger } from "../../src/util/log.ts";
import { isStable } from "../../src/util/stable-lists.ts";

const logger = createLogger("test");

describe("WorkerSet circuit breaker", () => {
  const rec = (id: string) =>
    completeRecord({ id, url: `http://127.0.0.1:1/${id}`, model: "m", servedModelNames: ["m"] });

  it("connect errors open at once, 5xx after the threshold; the half-open probe closes it", async () => {
    const memory = new MemoryDiscovery([rec("a"), rec("b")]);
    let healthy = false;
    let probes = 0;
    const ws = new WorkerSet(memory, {
      logger,
      breaker: { cooldownMs: 20, failureThreshold: 3 },
      probe: async () => {
        probes++;
        return healthy;
      },
    });
    ws.attach();
    const a = ws.get("a")!;
    const b = ws.get("b")!;
    ws.reportFailure(a, "connect");
    assert.equal(a.available, false);
    assert.deepEqual(ws.group("m")!.available, [b]);
    ws.reportFailure(b, "5xx");
    ws.reportFailure(b, "5xx");
    ws.reportSuccess(b);
    ws.reportFailure(b, "5xx");
    ws.reportFailure(b, "5xx");
    assert.equal(b.available, true, "successes reset the 5xx streak");
    ws.reportFailure(b, "5xx");
    assert.equal(b.available, false);
    await new Promise((r) => setTimeout(r, 80));
    assert.ok(probes >= 2, "half-open probes ran");
    assert.equal(a.available, false);
    healthy = true;
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(a.available, true);
    assert.equal(b.available, true);
    assert.equal(a.breaker, "closed");
    await ws.close();
  });
});

describe("WorkerSet groups", () => {
  const rec = (id: string, role: "mixed" | "prefill" = "mixed") =>
    completeRecord({ id, url: `http://127.0.0.1:1/${id}`, model: "m", servedModelNames: ["m"], role });

  it("hands out stable candidate lists, the same arrays until membership changes", async () => {
    const memory = new MemoryDiscovery([rec("a"), rec("b"), rec("p", "prefill")]);
    const ws = new WorkerSet(memory, { logger });
    ws.attach();
    const g = ws.group("m")!;
    // Routing keeps what it derives from a list by the list's identity (pipeline/util.ts).
    for (const list of [g.all, g.available, g.availableByRole.mixed, g.availableByRole.prefill])
      assert.ok(isStable(list));
    assert.equal(ws.group("m")!.availableByRole.mixed, g.availableByRole.mixed);
    ws.reportFailure(ws.get("a")!, "connect");
    const h = ws.group("m")!;
    assert.notEqual(h.available, g.available);
    assert.deepEqual(
      h.available.map((w) => w.id),
      ["b", "p"],
    );
    assert.ok(isStable(h.available));
    await ws.close();
  });
});
