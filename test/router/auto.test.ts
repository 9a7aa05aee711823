import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { buildScheduling } from "../../src/router/pipeline/build.ts";
import { WorkerSet } from "../../src/router/worker-set.ts";
import { createLogger } from "../../src/util/log.ts";

const logger = createLogger("test");
const rr = () => buildScheduling({ policy: "round-robin" });

describe("AutoRouter", () => {
  const rec = (id: string, role: "mixed" | "prefill" | "decode") =>
    completeRecord({ id, url: `http://127.0.0.1:1/${id}`, model: "m", servedModelNames: ["m"], role });

  it("picks mixed until prefill and decode workers exist (with a factory), re-deciding on changes", async () => {
    const { AutoRouter } = await import("../../src/router/auto.ts");
    const memory = new MemoryDiscovery([rec("a", "mixed")]);
    const ws = new WorkerSet(memory, { logger });
    ws.attach();
    let built = 0;
    const factory = () => {
      built++;
      return { kind: "disagg" as const, handle: async () => Promise.reject(new Error("unused")) };
    };
    const auto = new AutoRouter({ workers: ws, scheduling: rr(), logger, disaggFactory: factory });
    assert.equal(auto.routerFor("m").kind, "mixed");
    memory.put(rec("p", "prefill"));
    assert.equal(auto.routerFor("m").kind, "mixed", "prefill alone is not enough");
    memory.put(rec("d", "decode"));
    assert.equal(auto.routerFor("m").kind, "disagg");
    assert.equal(auto.routerFor("m").kind, "disagg");
    assert.equal(built, 1, "the router is cached until membership changes");
    memory.remove("d");
    assert.equal(auto.routerFor("m").kind, "mixed");
    const noFactory = new AutoRouter({ workers: ws, scheduling: rr(), logger });
    memory.put(rec("d", "decode"));
    assert.equal(noFactory.routerFor("m").kind, "mixed");
    const forced = new AutoRouter({
      workers: ws,
      scheduling: buildScheduling({ policy: "round-robin", router: "mixed" }),
      logger,
      mode: "mixed",
      disaggFactory: factory,
    });
    assert.equal(forced.routerFor("m").kind, "mixed");
    assert.throws(() => auto.routerFor("nope"), /does not exist/);
    assert.throws(
      () =>
        new AutoRouter({ workers: ws, scheduling: buildScheduling({ policy: "no-such-policy" }), logger }),
      /unknown routing policy/,
    );
    assert.throws(() => new AutoRouter({ workers: ws, scheduling: rr(), logger, mode: "disagg" }), /disagg/);
    auto.close();
  });
});
