/**
 * Adding a scorer is one file (here inline: `defineScorer` registers it) and one registry
 * import: profiles can then name it, its params are validated with their path, its needs reach
 * the server.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { z } from "zod";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import { defineScorer } from "../../../src/router/pipeline/plugin.ts";
import { createLogger } from "../../../src/util/log.ts";
import { makeWorker } from "./recorder.ts";

const logger = createLogger("test");
logger.level = "silent";

defineScorer("test-kv-usage", {
  doc: "the engine's KV cache usage",
  params: z.object({ scale: z.number().default(1) }).strict(),
  needs: ["engineLoad"],
  create: (_scope, p) => ({
    name: "test-kv-usage",
    needs: ["engineLoad"],
    score(ctx, at, weight, out) {
      for (let k = 0; k < at.length; k++)
        out[k] = weight * p.scale * (ctx.all[at[k]].engineLoad?.kvUsage ?? 0);
    },
  }),
});

test("a newly registered scorer is usable from a profile, with its params and needs", () => {
  const profiles = {
    mixed: {
      scorers: [{ name: "test-kv-usage", weight: 1, params: { scale: 2 } }],
      picker: { name: "argmin" },
    },
  };
  const s = buildScheduling({ policy: "round-robin", profiles, router: "mixed" });
  assert.deepEqual([...s.needs], ["engineLoad"]);
  const [a, b] = [makeWorker({ id: "a" }), makeWorker({ id: "b" })];
  a.engineLoad = { running: 0, waiting: 0, kvUsage: 0.9, scrapedAt: 0 };
  b.engineLoad = { running: 0, waiting: 0, kvUsage: 0.2, scrapedAt: 0 };
  const sched = s.create({ model: "m", logger });
  const req = {
    requestId: "r",
    model: "m",
    endpoint: "completion" as const,
    body: {},
    stream: false,
    promptText: () => "",
    promptTokens: () => [],
  };
  assert.equal(sched.select(req, [a, b]).worker.record.id, "b");
  assert.throws(
    () =>
      buildScheduling({
        policy: "round-robin",
        profiles: {
          mixed: {
            ...profiles.mixed,
            scorers: [{ name: "test-kv-usage", weight: 1, params: { scale: "x" } }],
          },
        },
      }),
    /profiles\.mixed\.scorers\[0\]\.params\.scale/,
  );
});
