import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import { completeRecord } from "../../../src/discovery/static.ts";
import type { RoutingRequest } from "../../../src/router/types.ts";
import { WorkerSet } from "../../../src/router/worker-set.ts";
import { createLogger } from "../../../src/util/log.ts";
import { presetScheduler } from "./preset.ts";

const logger = createLogger("test");

describe("round-robin preset over a WorkerSet", () => {
  const rec = (id: string) =>
    completeRecord({ id, url: `http://127.0.0.1:1/${id}`, model: "m", servedModelNames: ["m"] });

  it("round-robin is an exact spread over the candidates", () => {
    const memory = new MemoryDiscovery([rec("a"), rec("b"), rec("c")]);
    const ws = new WorkerSet(memory, { logger });
    ws.attach();
    const p = presetScheduler("round-robin", { logger });
    const counts: Record<string, number> = {};
    const cands = ws.group("m")!.available;
    for (let i = 0; i < 300; i++) {
      const id = p.select({} as RoutingRequest, cands).worker.record.id;
      counts[id] = (counts[id] ?? 0) + 1;
    }
    assert.deepEqual(counts, { a: 100, b: 100, c: 100 });
  });
});
