/**
 * The AutoRouter's choice for a model with PD and mixed workers (issue #17), request by
 * request: disaggregated while an available prefill and decode worker share a connector, the
 * mixed workers once the pair is out of rotation, disaggregated again when it is back.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import { AutoRouter } from "../../../src/router/auto.ts";
import { makeDisaggRouterFactory } from "../../../src/router/disagg/index.ts";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import { WorkerSet } from "../../../src/router/worker-set.ts";
import { createLogger } from "../../../src/util/log.ts";
import { FakeExecutor, jsonAnswer } from "./fake-exec.ts";
import { record, routingRequest } from "./fixtures.ts";

const logger = createLogger("test", {});
logger.level = "silent";

describe("AutoRouter: PD only while a healthy pair exists", () => {
  test("breaker-open prefill worker → mixed workers; pair back → disaggregated", async () => {
    const memory = new MemoryDiscovery([
      record("m1", "mixed", { kind: "none" }),
      record("p1", "prefill", { kind: "nixl" }),
      record("d1", "decode", { kind: "nixl" }),
    ]);
    let healthy = false;
    const ws = new WorkerSet(memory, {
      logger,
      breaker: { cooldownMs: 20, maxCooldownMs: 20 },
      probe: async () => healthy,
    });
    ws.attach();
    const auto = new AutoRouter({
      workers: ws,
      scheduling: buildScheduling({ policy: "round-robin" }),
      logger,
      disaggFactory: makeDisaggRouterFactory(),
    });
    const exec = new FakeExecutor({
      m1: () => jsonAnswer(200, { from: "mixed" }),
      p1: () => jsonAnswer(200, { kv_transfer_params: { do_remote_prefill: true, remote_block_ids: [1] } }),
      d1: () => jsonAnswer(200, { from: "decode" }),
    });
    const ask = async () => {
      const up = await auto
        .routerFor("m")
        .handle(routingRequest({ model: "m" }), exec, new AbortController().signal);
      return ((await up.json()) as { from: string }).from;
    };

    assert.equal(auto.kindFor("m"), "disagg");
    assert.equal(await ask(), "decode");

    ws.reportFailure(ws.get("p1")!, "connect"); // opens p1's breaker at once
    assert.equal(ws.get("p1")!.available, false);
    assert.equal(auto.kindFor("m"), "mixed");
    const before = exec.to("p1").length;
    assert.equal(await ask(), "mixed");
    assert.equal(exec.to("p1").length, before, "the unavailable prefill worker was not tried");

    healthy = true;
    await new Promise((r) => setTimeout(r, 80)); // half-open probe closes the breaker
    assert.equal(ws.get("p1")!.available, true);
    assert.equal(auto.kindFor("m"), "disagg");
    assert.equal(await ask(), "decode");
    auto.close();
    await ws.close();
  });
});
