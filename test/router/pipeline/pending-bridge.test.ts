/**
 * kv-prefix's `bridgePending`: a prompt routed to a worker counts as cached there while it waits
 * for its prefill (the KV events report blocks only once computed), and no longer once the
 * worker's pending prefill shows it past its first token and the grace is over.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { KvIndex } from "../../../src/kv/index.ts";
import { getDefaultTokenizer } from "../../../src/kv/tokenizer.ts";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import { PendingPrefixes } from "../../../src/router/pipeline/pending-prefixes.ts";
import type { RoutingRequest } from "../../../src/router/types.ts";
import { createLogger } from "../../../src/util/log.ts";
import { makeWorker } from "./recorder.ts";

const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();

let nextId = 0;
function request(text: string): RoutingRequest {
  const tokens = tok.encode(text);
  return {
    requestId: `p${nextId++}`,
    model: "m",
    endpoint: "completion",
    body: { model: "m", prompt: text },
    stream: false,
    promptText: () => text,
    promptTokens: () => tokens,
  };
}

const doc = Array.from(
  { length: 80 },
  (_, i) => `Section ${i} of the tenant's manual covers item ${i * 3}.`,
).join(" ");

test("PendingPrefixes: entries live while pending, then for the grace, and share nodes by count", () => {
  let now = 1000;
  const p = new PendingPrefixes(500, () => now);
  p.add("w", [1, 2, 3], 100);
  p.add("w", [1, 2, 4], 50);
  assert.equal(p.match("w", [1, 2, 3, 9], 150), 3, "both pending");
  assert.equal(p.match("x", [1, 2, 3], 150), 0, "another worker holds nothing");
  // The first request passed its first token: 50 tokens still pending, the oldest is done.
  assert.equal(p.match("w", [1, 2, 3], 50), 3, "done, but within the grace");
  now += 499;
  assert.equal(p.match("w", [1, 2, 3], 50), 3);
  now += 1;
  assert.equal(p.match("w", [1, 2, 3], 50), 2, "grace over: node 3 left, 1 and 2 are still the second's");
  assert.equal(p.match("w", [1, 2, 4], 50), 3);
  assert.equal(p.size("w"), 1);
  assert.equal(p.match("w", [1, 2, 4], 0), 3, "the second is done now, in its grace");
  now += 500;
  assert.equal(p.match("w", [1, 2, 4], 0), 0);
  assert.equal(p.size("w"), 0);
  p.add("w", [7], 10);
  p.removeWorker("w");
  assert.equal(p.match("w", [7], 10), 0);
});

test("kv-prefix bridgePending keeps a queued tenant together until its blocks are reported", () => {
  const index = new KvIndex();
  const ws = [makeWorker({ id: "a" }), makeWorker({ id: "b" }), makeWorker({ id: "c" })];
  for (const w of ws) index.addWorker(w.record.id, 16);
  const profile = (bridgePending: boolean) => ({
    mixed: {
      scorers: [
        { name: "kv-prefix", weight: 1, params: { bridgePending, bridgeGraceMs: 0 } },
        // Weighted below the prefix so that a queued prompt's own prefill (the backlog it leaves)
        // does not outweigh what it will have cached; without the bridge the backlog alone
        // decides among workers that hold nothing.
        { name: "prefill-backlog", weight: 0.1 },
      ],
      picker: { name: "argmin" },
    },
  });
  for (const bridge of [false, true]) {
    for (const w of ws) w.pendingPrefillTokens = 0;
    const sched = buildScheduling({ policy: "kv-aware", profiles: profile(bridge), router: "mixed" }).create({
      model: "m",
      logger,
      kvIndex: index,
    });
    const r1 = request(`${doc} Question one?`);
    const s1 = sched.select(r1, ws);
    sched.onRouted?.(r1, s1.worker);
    // The router's claim: r1's prompt is pending prefill on its worker (no KV event yet).
    s1.worker.pendingPrefillTokens += r1.promptTokens().length;
    const r2 = request(`${doc} Question two?`);
    const s2 = sched.select(r2, ws);
    if (bridge) {
      assert.equal(s2.worker.record.id, s1.worker.record.id, "the same tenant follows its queued prompt");
      assert.ok((s2.overlapBlocks ?? 0) > 20, `overlap ${s2.overlapBlocks}`);
    } else {
      assert.notEqual(
        s2.worker.record.id,
        s1.worker.record.id,
        "without the bridge the backlog pushes it away",
      );
      assert.equal(s2.overlapBlocks, 0);
    }
    if (bridge) {
      // r1 passed its first token (nothing pending) with no grace: only the events count again.
      s1.worker.pendingPrefillTokens = 0;
      const s3 = sched.select(request(`${doc} Question three?`), ws);
      assert.equal(s3.overlapBlocks, 0);
    }
  }
});
