/**
 * The pending bridge keys a prompt by its head up to BRIDGE_TEXT_CAP (issue #28 item 4): a
 * 40 k-token prompt queued on a worker counts there as cached whole, not only its first 32 Ki
 * characters (16 % of its blocks) as when it shared the fallback tree's cap.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { APPROX_TEXT_CAP, BRIDGE_TEXT_CAP } from "../../../src/kv/approx-tree.ts";
import { KvIndex } from "../../../src/kv/index.ts";
import { Prng, words } from "../../../src/loadgen/prng.ts";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import type { RoutingRequest } from "../../../src/router/types.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { createLogger } from "../../../src/util/log.ts";
import { makeWorker } from "./recorder.ts";

const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();

function request(id: string, text: string): RoutingRequest {
  const tokens = tok.encode(text);
  return {
    requestId: id,
    model: "m",
    endpoint: "completion",
    body: { model: "m", prompt: text },
    stream: false,
    promptText: () => text,
    promptTokens: () => tokens,
  };
}

test("a queued 40 k-token prompt counts as cached whole on its worker", () => {
  const doc = words(new Prng(17), 40_000);
  assert.ok(doc.length > 5 * APPROX_TEXT_CAP && doc.length < BRIDGE_TEXT_CAP, `${doc.length} chars`);
  const index = new KvIndex();
  const ws = [makeWorker({ id: "a" }), makeWorker({ id: "b" })];
  for (const w of ws) index.addWorker(w.record.id, 16);
  const sched = buildScheduling({
    policy: "kv-aware",
    profiles: {
      mixed: {
        scorers: [{ name: "kv-prefix", weight: 1, params: { bridgePending: true, bridgeGraceMs: 60_000 } }],
        picker: { name: "argmin" },
      },
    },
    router: "mixed",
  }).create({ model: "m", logger, kvIndex: index });
  const r1 = request("r1", `${doc} Question one?`);
  const s1 = sched.select(r1, ws);
  sched.onRouted?.(r1, s1.worker);
  s1.worker.pendingPrefillTokens += r1.promptTokens().length;
  const r2 = request("r2", `${doc} Question two?`);
  const s2 = sched.select(r2, ws);
  assert.equal(s2.worker.record.id, s1.worker.record.id);
  const blocks = Math.floor(r2.promptTokens().length / 16);
  // All but the last chunk or two (the questions differ there); 32 Ki characters gave ≈ 16 %.
  assert.ok((s2.overlapBlocks ?? 0) >= blocks - 3, `overlap ${s2.overlapBlocks} of ${blocks} blocks`);
});
