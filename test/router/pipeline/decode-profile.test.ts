/**
 * Decode selection is a profile: least-load in every preset, kv-aware when the config file says
 * so under `profiles.decode` (the YAML is parsed as the server's config loader parses it).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { parse as parseYaml } from "yaml";
import { KvIndex } from "../../../src/kv/index.ts";
import { choosePair } from "../../../src/router/disagg/select.ts";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import type { RoutingRequest } from "../../../src/router/types.ts";
import { createLogger } from "../../../src/util/log.ts";
import { storedPrefix } from "../../helpers/kv-events.ts";
import { makeWorker } from "./recorder.ts";

const logger = createLogger("test");
logger.level = "silent";

const tokens = Array.from({ length: 128 }, (_, i) => 1000 + i);
const req: RoutingRequest = {
  requestId: "r1",
  model: "m",
  endpoint: "completion",
  body: {},
  stream: false,
  promptText: () => "x".repeat(512),
  promptTokens: () => tokens,
};

function fleet() {
  const p = makeWorker({ id: "p1", role: "prefill", connector: "nixl" });
  const d1 = makeWorker({ id: "d1", role: "decode", connector: "nixl" });
  const d2 = makeWorker({ id: "d2", role: "decode", connector: "nixl" });
  d2.inFlight = 1; // least-load prefers d1
  const index = new KvIndex();
  for (const w of [p, d1, d2]) index.addWorker(w.record.id, 16);
  index.applyEvents("d2", [storedPrefix(tokens, 16, 50)], 16); // d2 holds the whole prompt (8 blocks)
  return { p, d1, d2, index };
}

test("decode: least-load in the presets", () => {
  const { p, d1, d2, index } = fleet();
  for (const policy of ["round-robin", "kv-aware", "approx-prefix"]) {
    const s = buildScheduling({ policy }).create({ model: "m", logger, kvIndex: index });
    assert.equal(choosePair(req, [p], [d1, d2], s, new Set())!.decode.record.id, "d1", policy);
  }
});

test("decode: kv-aware through profiles.decode in the config file", () => {
  const { p, d1, d2, index } = fleet();
  const cfg = parseYaml(`
policy: round-robin
profiles:
  decode:
    scorers:
      - {name: kv-prefix, weight: 1}
      - {name: active-decode, weight: 0.5}
    picker: {name: argmin}
`) as { policy: string; profiles: unknown };
  const sched = buildScheduling({ policy: cfg.policy, profiles: cfg.profiles });
  assert.ok(sched.needs.has("kvIndex"), "the decode profile's needs reach the server");
  const s = sched.create({ model: "m", logger, kvIndex: index });
  const pair = choosePair(req, [p], [d1, d2], s, new Set())!;
  assert.equal(pair.prefill.worker.record.id, "p1");
  assert.equal(pair.decode.record.id, "d2", "the decode worker holding the prompt's blocks");
  assert.equal(pair.prefill.reason, "round-robin", "P stays the preset's");
});
