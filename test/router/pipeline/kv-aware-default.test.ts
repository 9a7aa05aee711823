/**
 * The `kv-aware` preset (the default since issue #28) chooses as src/router/pipeline/README.md
 * ("The kv-aware preset") documents: its profile, then its rules one by one against
 * kv-aware-classic on the same inputs: no imbalance guard (an uneven fleet keeps its locality),
 * the pending bridge (a follower joins its prefix's queued prompt), the saturation valve (a worker
 * loaded past 3 × the mean + 16 loses its prefix), and hot-spread (a dominant prefix spills).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { KvIndex } from "../../../src/kv/index.ts";
import { WorkerClaim } from "../../../src/router/dispatch.ts";
import { buildScheduling } from "../../../src/router/pipeline/build.ts";
import type { Scheduler } from "../../../src/router/pipeline/scheduler.ts";
import type { RoutingRequest, WorkerState } from "../../../src/router/types.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { createLogger } from "../../../src/util/log.ts";
import { storedPrefix } from "../../helpers/kv-events.ts";
import { makeWorker } from "./recorder.ts";

const BS = 16;
const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();

let nextId = 0;
function request(text: string): RoutingRequest {
  const tokens = tok.encode(text);
  return {
    requestId: `d${nextId++}`,
    model: "m",
    endpoint: "completion",
    body: { model: "m", prompt: text },
    stream: false,
    promptText: () => text,
    promptTokens: () => tokens,
  };
}

const docOf = (tenant: string) =>
  Array.from({ length: 60 }, (_, i) => `${tenant} manual, section ${i}: item ${i * 7}.`).join(" ");

const stored = (tokens: readonly number[], hashBase: number) => storedPrefix(tokens, BS, hashBase);

function setup(policy: string, n = 4) {
  const index = new KvIndex();
  const ws: WorkerState[] = Array.from({ length: n }, (_, i) => makeWorker({ id: `w${i}` }));
  for (const w of ws) index.addWorker(w.record.id, BS);
  const sched = buildScheduling({ policy }).create({ model: "m", logger, kvIndex: index }) as Scheduler;
  return { index, ws, sched };
}

test("kv-aware's profile: hot-spread and load-ceiling, the bridged kv-prefix weighted 2, no guard", () => {
  const s = buildScheduling({ policy: "kv-aware" });
  for (const step of ["mixed", "prefill"] as const) {
    const p = s.profiles[step];
    assert.deepEqual(
      p.filters?.map((f) => [f.name, f.params]),
      [
        ["hot-spread", { ratio: 1.25, window: 256 }],
        ["load-ceiling", { ratio: 3, slack: 16 }],
      ],
    );
    assert.deepEqual(
      p.scorers.map((x) => [x.name, x.weight]),
      [
        ["kv-prefix", 2],
        ["prefill-backlog", 1],
        ["active-decode", 0.5],
        ["engine-queue", 4],
        ["cache-pressure", 0.1],
      ],
    );
    assert.equal(p.scorers[0]!.params?.bridgePending, true);
    assert.equal(p.picker.name, "argmin");
  }
  assert.equal(s.profiles.decode.picker.name, "least-load");
  // Options switch the new parts off or retune them.
  const off = buildScheduling({ policy: "kv-aware", policyOptions: { hotRatio: 0, ceilingRatio: 0 } });
  assert.deepEqual(off.profiles.mixed.filters, []);
});

test("no imbalance guard: an uneven fleet keeps its locality (kv-aware-classic load-balances)", () => {
  const doc = docOf("tenant-a");
  for (const [policy, expect, reason] of [
    ["kv-aware", "w1", "overlap"],
    ["kv-aware-classic", "w0", "load-balance"],
  ] as const) {
    const { index, ws, sched } = setup(policy);
    index.apply("w1", stored(tok.encode(doc), 1));
    // 18 in flight on w1, none elsewhere: past SGLang's 16 / 1.5× rule, under the valve
    // (3 × mean 4.5 + 16 = 29.5).
    ws[1]!.inFlight = 18;
    const sel = sched.select(request(`${doc} question`), ws);
    assert.equal(sel.worker.record.id, expect, policy);
    assert.equal(sel.reason, reason, policy);
  }
});

test("the saturation valve: a worker past 3 × the mean + 16 requests loses its prefix", () => {
  const doc = docOf("tenant-b");
  const { index, ws, sched } = setup("kv-aware");
  index.apply("w2", stored(tok.encode(doc), 1));
  ws[2]!.inFlight = 40; // mean 10: ceiling 46, kept
  assert.equal(sched.select(request(`${doc} q1`), ws).worker.record.id, "w2");
  ws[2]!.inFlight = 80; // mean 20: ceiling 76, out
  const sel = sched.select(request(`${doc} q2`), ws);
  assert.notEqual(sel.worker.record.id, "w2");
  assert.equal(sel.overlapBlocks, 0);
});

test("the pending bridge: a follower joins its prefix's queued prompt until the claim drops it", () => {
  const doc = docOf("tenant-c");
  for (const policy of ["kv-aware", "kv-aware-classic"]) {
    const { ws, sched } = setup(policy);
    const r1 = request(`${doc} first`);
    const s1 = sched.select(r1, ws);
    const claim = new WorkerClaim(s1.worker, {}, r1.promptTokens().length);
    sched.onRouted(r1, s1.worker, claim);
    const s2 = sched.select(request(`${doc} second`), ws);
    if (policy === "kv-aware") {
      assert.equal(s2.worker, s1.worker, "follows the queued prompt");
      assert.ok((s2.overlapBlocks ?? 0) > 20);
    } else assert.notEqual(s2.worker, s1.worker, "classic sees nothing and spreads by backlog");
    claim.cancel();
    const s3 = sched.select(request(`${doc} third`), ws);
    assert.equal(s3.overlapBlocks, 0, `${policy}: a cancelled prompt counts nowhere`);
  }
});

test("hot-spread: a prefix carrying most of the traffic spills past its first worker", () => {
  const { ws, sched } = setup("kv-aware");
  const hot = docOf("hot-tenant");
  const seen = new Map<string, number>();
  // Quick hits: each request's prefill is done at once and the index has the prefix (so the
  // bridge adds nothing); only routed shares tell a hot prefix apart.
  for (let i = 0; i < 400; i++) {
    const text = i % 2 === 0 ? `${hot} q${i}` : `${docOf(`tenant-${i % 16}`)} q${i}`;
    const r = request(text);
    const s = sched.select(r, ws);
    const claim = new WorkerClaim(s.worker, {}, 0);
    sched.onRouted(r, s.worker, claim);
    claim.firstByte();
    claim.release();
    if (i % 2 === 0 && i >= 200) seen.set(s.worker.record.id, (seen.get(s.worker.record.id) ?? 0) + 1);
  }
  assert.ok(seen.size >= 2, `the hot prefix went to ${[...seen.keys()]}`);
});

test("saturation: once every candidate has a prefill queue the prefix outweighs a deeper backlog", () => {
  const doc = docOf("tenant-s");
  const r = () => request(`${doc} next turn`);
  const P = Math.floor(r().promptTokens().length / BS);
  // w1 holds the conversation; its backlog is 3 × P blocks deeper than the others' (more than
  // the prefix weighted 2 saves: 2 × P).
  const place = (others: number) => {
    const { index, ws, sched } = setup("kv-aware");
    index.apply("w1", stored(tok.encode(doc), 1));
    for (const w of ws) w.pendingPrefillTokens = others;
    ws[1]!.pendingPrefillTokens = others + 3 * P * BS;
    return sched.select(r(), ws);
  };
  // Some worker idle: the work moved there delays nobody, the shorter wait wins.
  assert.notEqual(place(0).worker.record.id, "w1");
  // Every worker has ~20 prompts like this one to prefill: moving the conversation adds its
  // history to a saturated fleet, so it stays with its cache.
  const busy = place(20 * P * BS);
  assert.equal(busy.worker.record.id, "w1");
  assert.equal(busy.reason, "overlap");
});
