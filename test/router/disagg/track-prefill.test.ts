/**
 * Whether P's prompt tokens count as pending prefill follows the scheduling's needs, for the
 * DisaggRouter as for the MixedRouter: a policy that reads no backlog (round-robin) costs no
 * tokenization; one that does (kv-aware's prefill-backlog scorer) sees P's prompt counted.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import { AutoRouter } from "../../../src/router/auto.ts";
import { createDisaggRouter } from "../../../src/router/disagg/index.ts";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import { WorkerSet } from "../../../src/router/worker-set.ts";
import { createLogger } from "../../../src/util/log.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { FakeExecutor, jsonAnswer } from "./fake-exec.ts";
import { routingRequest } from "./fixtures.ts";

const logger = createLogger("test", {});
logger.level = "silent";

const connector = { kind: "nixl", bootstrapHost: "127.0.0.1", bootstrapPort: 9 } as const;
const nixlParams = { do_remote_prefill: true, remote_block_ids: [1], remote_host: "h", remote_port: 1 };

async function onePdRequest(policy: string) {
  const mem = new MemoryDiscovery([
    mixedRecord({ id: "p", model: "m", url: "http://127.0.0.1:1/p", role: "prefill", connector }),
    mixedRecord({ id: "d", model: "m", url: "http://127.0.0.1:1/d", role: "decode", connector }),
  ]);
  const ws = new WorkerSet(mem, { logger });
  ws.attach();
  const auto = new AutoRouter({
    workers: ws,
    scheduling: buildScheduling({ policy, router: "disagg" }),
    mode: "disagg",
    logger,
    disaggFactory: createDisaggRouter,
  });
  let pendingOnP = -1;
  const exec = new FakeExecutor({
    p: () => {
      pendingOnP = ws.group("m")?.all.find((w) => w.record.id === "p")?.pendingPrefillTokens ?? -1;
      return jsonAnswer(200, { id: "x", kv_transfer_params: nixlParams });
    },
    d: () => jsonAnswer(200, { id: "y" }),
  });
  let tokenized = 0;
  const req = routingRequest({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 8 });
  req.promptTokens = () => {
    tokenized++;
    return [1, 2, 3, 4, 5];
  };
  const up = await auto.routerFor("m").handle(req, exec, new AbortController().signal);
  for await (const _ of up.body);
  auto.close();
  return { pendingOnP, tokenized, trackPrefill: auto.scheduling.trackPrefill };
}

describe("PD pending prefill follows the scheduling's needs", () => {
  test("round-robin needs no prompt tokens: P's are not counted and the prompt is not tokenized", async () => {
    const r = await onePdRequest("round-robin");
    assert.equal(r.trackPrefill, false);
    assert.equal(r.pendingOnP, 0);
    assert.equal(r.tokenized, 0);
  });

  test("kv-aware reads the backlog: P's prompt counts while P works", async () => {
    const r = await onePdRequest("kv-aware");
    assert.equal(r.trackPrefill, true);
    assert.equal(r.pendingOnP, 5);
  });
});
