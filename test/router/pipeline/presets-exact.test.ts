/**
 * The presets choose exactly what the former policies chose: the frozen pre-pipeline code
 * (./legacy, commit a5c2372) and the preset Schedulers run side by side (the former kv-aware is
 * the `kv-aware-classic` preset since `kv-aware` became the bridged default), live, on seeded
 * sequences of requests, KV events, load and pending changes, worker removals, imbalance spikes
 * and temperature > 0, and every choice (worker, reason, overlap, DP rank, PD pair) must match.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { KvIndex } from "../../../src/kv/index.ts";
import { choosePair } from "../../../src/router/disagg/select.ts";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import { createLogger } from "../../../src/util/log.ts";
import { createApproxPrefix as legacyApprox } from "./legacy/approx-prefix.ts";
import { createKvAware as legacyKv } from "./legacy/kv-aware.ts";
import { createRoundRobin as legacyRr } from "./legacy/round-robin.ts";
import { choosePair as legacyChoosePair } from "./legacy/select.ts";
import type { PolicyFactory } from "./legacy/types.ts";
import { record, type Scenario, type WorkerSpec } from "./recorder.ts";

const logger = createLogger("test");
logger.level = "silent";

const legacy: Record<string, PolicyFactory> = {
  "kv-aware-classic": legacyKv,
  "approx-prefix": legacyApprox,
  "round-robin": legacyRr,
};

const MIXED: WorkerSpec[] = [
  { id: "w1" },
  { id: "w2", blockSize: 32 },
  { id: "w3", kv: false },
  { id: "w4", engine: "vllm", ranks: [0, 1] },
  { id: "w5" },
  { id: "w6", kv: false, blockSize: 8 },
];

const PD: WorkerSpec[] = [
  ...MIXED.slice(0, 3),
  { id: "p1", role: "prefill", connector: "nixl" },
  { id: "p2", role: "prefill", connector: "nixl", kv: false },
  { id: "p3", role: "prefill", connector: "mooncake", engine: "vllm", ranks: [0, 1] },
  { id: "d1", role: "decode", connector: "nixl" },
  { id: "d2", role: "decode", connector: "nixl" },
  { id: "d3", role: "decode", connector: "mooncake" },
];

function compare(policy: string, options: Record<string, unknown>, sc: Scenario, pd = false) {
  const index = new KvIndex();
  const kvIndex = policy === "kv-aware-classic" ? index : undefined;
  const old = legacy[policy]!({ logger, options, kvIndex });
  const neu = buildScheduling({ policy, policyOptions: options }).create({ model: "m", logger, kvIndex });
  const [a, b] = record(
    sc,
    [
      { policy: old, choosePair: pd ? legacyChoosePair : undefined },
      { policy: neu, choosePair: pd ? choosePair : undefined },
    ],
    index,
  );
  assert.ok(a!.length > sc.steps / 5, `enough decisions recorded (${a!.length})`);
  for (let i = 0; i < a!.length; i++) assert.deepEqual(b![i], a![i], `decision ${i} (op ${a![i]!.op})`);
  assert.equal(b!.length, a!.length);
  return a!;
}

const reasons = (rs: { reason: string }[]) => new Set(rs.map((r) => r.reason));

test("kv-aware-classic preset = the former kv-aware policy (defaults, imbalance spikes, salts, DP ranks)", () => {
  for (const seed of [1, 2, 3]) {
    const rs = compare(
      "kv-aware-classic",
      {},
      { seed, steps: 1500, workers: MIXED, imbalance: 0.3, salts: true },
    );
    // The sequence exercised every branch.
    assert.deepEqual([...reasons(rs)].sort(), ["load", "load-balance", "overlap"]);
    assert.ok(
      rs.some((r) => r.dpRank !== undefined),
      "a DP rank was pinned",
    );
  }
});

test("kv-aware-classic preset with temperature > 0, other weights, low guard thresholds and recentRoutingMs", () => {
  const opts = [
    { temperature: 0.7 },
    { temperature: 0.2, overlapWeight: 0.3, prefillWeight: 1.7, decodeWeight: 0.25, waitingWeight: 3 },
    { pressureWeight: 0.37, balanceAbsThreshold: 3, balanceRelThreshold: 1.2, chunkChars: 32 },
    { recentRoutingMs: 600_000, maxNodesPerWorker: 50, temperature: "0.4" },
  ];
  for (const [k, o] of opts.entries())
    compare("kv-aware-classic", o, { seed: 10 + k, steps: 1200, workers: MIXED, imbalance: 0.2 });
});

test("approx-prefix preset = the former approx-prefix policy", () => {
  for (const [k, o] of [{}, { cacheThreshold: 0.3, balanceAbsThreshold: 4 }, { chunkChars: 16 }].entries()) {
    const rs = compare("approx-prefix", o, { seed: 20 + k, steps: 1500, workers: MIXED, imbalance: 0.2 });
    assert.deepEqual([...reasons(rs)].sort(), ["least-cache", "load-balance", "prefix-match"]);
  }
});

test("round-robin preset = the former round-robin policy", () => {
  compare("round-robin", {}, { seed: 30, steps: 800, workers: MIXED });
});

test("PD: the prefill step shares the model's state with the mixed step; decode stays least-load", () => {
  for (const policy of ["kv-aware-classic", "approx-prefix", "round-robin"]) {
    const rs = compare(policy, {}, { seed: 40, steps: 1500, workers: PD, imbalance: 0.2 }, true);
    assert.ok(rs.some((r) => r.kind === "pair") && rs.some((r) => r.kind === "select"));
  }
});
