/**
 * Each filter, scorer and picker alone: built from the registry with its params, run on a
 * hand-made StepContext, checked against the rule its file documents.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { KvIndex } from "../../../src/kv/index.ts";
import { filters, pickers, scorers } from "../../../src/router/pipeline/registry.ts";
import { RowArena } from "../../../src/router/pipeline/rows.ts";
import type { ModelScope, StepContext } from "../../../src/router/pipeline/types.ts";
import { requestLoad } from "../../../src/router/pipeline/util.ts";
import type { RoutingRequest, WorkerState } from "../../../src/router/types.ts";
import { createLogger } from "../../../src/util/log.ts";
import { blockStored } from "../../helpers/kv-events.ts";
import { makeWorker, type WorkerSpec } from "./recorder.ts";

const logger = createLogger("test");
logger.level = "silent";

function scope(kvIndex?: KvIndex): ModelScope {
  const m = new Map<string, unknown>();
  return {
    model: "m",
    logger,
    kvIndex,
    shared: <T>(k: string, make: () => T): T => {
      if (!m.has(k)) m.set(k, make());
      return m.get(k) as T;
    },
    onClose: () => {},
    reportBridge: () => {},
  };
}

function req(text = "hello world", id = "r1", model = "m"): RoutingRequest {
  const tokens = Array.from({ length: text.length }, (_, i) => i + 1);
  return {
    requestId: id,
    model,
    endpoint: "completion",
    body: {},
    stream: false,
    promptText: () => text,
    promptTokens: () => tokens,
  };
}

/** A StepContext with fixed signals (overlap, held per position). */
function ctx(
  all: WorkerState[],
  o: { req?: RoutingRequest; overlaps?: number[]; held?: number[]; sc?: ModelScope } = {},
): StepContext {
  const r = o.req ?? req();
  return {
    req: r,
    step: "mixed",
    scope: o.sc ?? scope(),
    all,
    rows: new RowArena(),
    overlaps: () => Int32Array.from(o.overlaps ?? all.map(() => 0)),
    ranks: () => new Int32Array(all.length).fill(-1),
    bridged: () => null,
    blockSize: (i) => all[i].record.blockSize,
    promptBlocks: (i) => Math.floor(r.promptTokens().length / all[i].record.blockSize),
    promptBlocksRow: () =>
      Int32Array.from(all, (w) => Math.floor(r.promptTokens().length / w.record.blockSize)),
    held: (i) => o.held?.[i] ?? 0,
    loads: () => Float64Array.from(all, requestLoad),
  };
}

const ws = (...specs: (WorkerSpec | string)[]) =>
  specs.map((s) => makeWorker(typeof s === "string" ? { id: s } : s));
const at = (n: number) => Array.from({ length: n }, (_, i) => i);
const filter = (name: string, params?: Record<string, unknown>) => filters.get(name)!.build(scope(), params);
const scorer = (name: string, params?: Record<string, unknown>, sc = scope()) =>
  scorers.get(name)!.build(sc, params);
const picker = (name: string, params?: Record<string, unknown>, sc = scope()) =>
  pickers.get(name)!.build(sc, params);
function scores(name: string, c: StepContext, weight = 1, params?: Record<string, unknown>, sc?: ModelScope) {
  const out = new Float64Array(c.all.length);
  scorer(name, params, sc ?? c.scope).score(c, at(c.all.length), weight, out);
  return Array.from(out);
}

test("filters: imbalance-guard narrows to the least loaded only past both thresholds", () => {
  const w = ws("a", "b", "c");
  const g = filter("imbalance-guard", { balanceAbsThreshold: 4, balanceRelThreshold: 1.5 });
  assert.deepEqual(g.filter(ctx(w), at(3)), [0, 1, 2], "idle fleet: all kept");
  w[0].inFlight = 6; // 6 − 1 > 4 and 6 > 1 × 1.5
  w[1].inFlight = 1;
  w[2].inFlight = 1;
  const c = ctx(w, { overlaps: [0, 2, 7] });
  assert.deepEqual(g.filter(c, at(3)), [2], "tie on load → larger overlap");
  assert.equal(c.reason, "load-balance");
  const none = filters.get("imbalance-guard")!.build(scope(), { balanceAbsThreshold: 4, prefer: "none" });
  assert.deepEqual(none.filter(ctx(w, { overlaps: [0, 2, 7] }), at(3)), [1], "tie → smaller id");
  w[0].inFlight = 2; // 2 − 1 ≤ 4
  assert.deepEqual(g.filter(ctx(w), at(3)), [0, 1, 2]);
  assert.throws(() => filter("imbalance-guard", { balanceAbs: 3 }), /Unrecognized key/);
});

test("filters: load-ceiling drops only the workers above ratio × mean + slack", () => {
  const w = ws("a", "b", "c", "d");
  const f = filter("load-ceiling", { ratio: 1.5, slack: 1 });
  assert.deepEqual(f.filter(ctx(w), at(4)), [0, 1, 2, 3], "idle fleet: all kept");
  w[0].inFlight = 6; // mean 2.25 → ceiling 4.375: a is out, the rest stay (unlike the guard)
  w[1].inFlight = 2;
  w[2].inFlight = 1;
  w[3].inFlight = 0;
  const c = ctx(w);
  assert.deepEqual(f.filter(c, at(4)), [1, 2, 3]);
  assert.equal(c.reason, undefined, "it names no decision: the scorers still choose");
  w[0].inFlight = 4; // mean 1.75 → ceiling 3.625: still out
  assert.deepEqual(f.filter(ctx(w), at(4)), [1, 2, 3]);
  w[0].inFlight = 3; // mean 1.5 → ceiling 3.25: kept
  assert.deepEqual(f.filter(ctx(w), at(4)), [0, 1, 2, 3]);
  assert.deepEqual(f.filter(ctx(w), [0]), [0], "a lone candidate is kept");
  assert.throws(() => filter("load-ceiling", { ratio: 0.5 }), /ratio/);
});

test("filters: health, model, role, connector", () => {
  const w = ws(
    "a",
    { id: "b", role: "prefill", connector: "nixl" },
    { id: "c", role: "decode", connector: "mooncake" },
  );
  w[0].available = false;
  assert.deepEqual(filter("health").filter(ctx(w), at(3)), [1, 2]);
  w[1].record.servedModelNames = ["other"];
  assert.deepEqual(filter("model").filter(ctx(w), at(3)), [0, 2]);
  assert.deepEqual(filter("role", { roles: ["prefill", "decode"] }).filter(ctx(w), at(3)), [1, 2]);
  assert.deepEqual(filter("connector", { kinds: ["mooncake"] }).filter(ctx(w), at(3)), [2]);
  assert.throws(() => filter("role", { roles: [] }));
});

test("scorers: kv-prefix counts uncached blocks from the index, approximating workers without events", () => {
  const index = new KvIndex();
  const w = ws("a", "b", { id: "c", kv: false });
  index.addWorker("a", 16);
  index.addWorker("b", 16);
  const r = req("x".repeat(64));
  const tokens = r.promptTokens();
  index.applyEvents("a", [blockStored([1, 2], tokens.slice(0, 32), 16)], 16);
  const sc = scope(index);
  const s = scorer("kv-prefix", {}, sc);
  const c: StepContext = { ...ctx(w, { req: r, sc }) };
  // The real overlap source drives ctx.overlaps here.
  c.overlaps = () => s.overlapSource!.overlaps(c).overlaps;
  const out = new Float64Array(3);
  s.score(c, at(3), 2, out);
  assert.deepEqual(Array.from(out), [2 * (4 - 2), 2 * 4, 2 * 4], "a holds 2 of 4 blocks; c unknown");
  s.overlapSource!.onRouted!(r, w[2]); // c learns from routing (no events)
  s.score(c, at(3), 1, out);
  assert.equal(out[2], 0, "c was sent this prompt: all of it counts as cached");
  assert.equal(s.overlapSource!.held("a"), 2);
});

test("scorers: kv-prefix routes a worker whose index is not in sync on what this server sent it, not as empty", () => {
  // Issue #28: a rank whose history could not be had (or is still replaying) is unknown.
  const index = new KvIndex();
  const w = ws("a", "b");
  index.addWorker("a", 16);
  index.addWorker("b", 16);
  index.setSync("b", 0, "unknown");
  const r = req("z".repeat(64));
  const sc = scope(index);
  const s = scorer("kv-prefix", {}, sc);
  const c: StepContext = { ...ctx(w, { req: r, sc }) };
  c.overlaps = () => s.overlapSource!.overlaps(c).overlaps;
  const out = new Float64Array(2);
  s.overlapSource!.onRouted!(r, w[1]); // routed to b while unknown: the fallback tree learns it
  s.score(c, at(2), 1, out);
  assert.deepEqual(Array.from(out), [4, 0], "b: all 4 blocks from what was sent there; a: the index, none");
  assert.ok(s.overlapSource!.held("b") > 0, "held comes from the fallback tree");
  index.setSync("b", 0, "synced"); // rebuilt: the engine's events are believed again
  s.score(c, at(2), 1, out);
  assert.deepEqual(Array.from(out), [4, 4]);
});

test("scorers: prefill-backlog counts only the uncached part of requests still in prefill (FIFO ledger)", () => {
  const w = ws("a", "b");
  const sc = scope();
  const s = scorer("prefill-backlog", {}, sc);
  const r = req("y".repeat(160));
  const c = ctx(w, { req: r, sc, overlaps: [8, 0] }); // a: 8 of 10 blocks cached
  s.onRouted!(r, w[0], { ...c, overlaps: c.overlaps });
  w[0].pendingPrefillTokens = 160;
  w[1].pendingPrefillTokens = 160; // unknown to the ledger: counted in full
  const out = new Float64Array(2);
  s.score(c, at(2), 1, out);
  assert.deepEqual(Array.from(out), [32 / 16, 160 / 16]);
  w[0].pendingPrefillTokens = 0; // first token came: the entry leaves the ledger
  s.score(c, at(2), 1, out);
  assert.equal(out[0], 0);
});

test("scorers: active-decode, engine-queue, cache-pressure", () => {
  const w = ws("a", "b");
  w[0].inFlight = 3;
  w[1].engineLoad = { running: 5, waiting: 2, kvUsage: 0.5, scrapedAt: 0 };
  assert.deepEqual(scores("active-decode", ctx(w), 0.5), [1.5, 2.5]);
  assert.deepEqual(scores("engine-queue", ctx(w), 4), [0, 8]);
  const r = req("z".repeat(64)); // 4 blocks
  assert.deepEqual(
    scores("cache-pressure", ctx(w, { req: r, held: [50, 100], overlaps: [0, 2] }), 1),
    [2, 2],
  );
  assert.deepEqual(scores("cache-pressure", ctx(w, { req: r, held: [0, 0] }), 1), [0, 0]);
});

test("scorers: approx-prefix, lora-affinity, round-robin", () => {
  const w = ws("a", "b");
  const sc = scope();
  const ap = scorer("approx-prefix", { chunkChars: 4 }, sc);
  const r = req("abcdefgh");
  ap.onRouted!(r, w[1], null);
  const out = new Float64Array(2);
  ap.score(ctx(w, { req: r, sc }), at(2), 1, out);
  assert.deepEqual(Array.from(out), [-0, -8]);
  assert.equal(ap.cacheView!.held("b"), 2);

  const la = scorer("lora-affinity", { maxAdaptersPerWorker: 1 }, sc);
  const lr = req("q", "r2", "sql-adapter");
  la.score(ctx(w, { req: lr }), at(2), 1, out);
  assert.deepEqual(Array.from(out), [1, 1], "nobody runs the adapter yet");
  la.onRouted!(lr, w[0], null);
  la.score(ctx(w, { req: lr }), at(2), 1, out);
  assert.deepEqual(Array.from(out), [0, 1]);
  la.score(ctx(w), at(2), 1, out);
  assert.deepEqual(Array.from(out), [0, 0], "base-model requests: no preference");

  const rr = scorer("round-robin", {}, sc);
  const three = ws("a", "b", "c");
  const o3 = new Float64Array(3);
  rr.score(ctx(three), at(3), 1, o3);
  assert.deepEqual(Array.from(o3), [0, 1, 2]);
  rr.onRouted!(req(), three[0], null);
  rr.score(ctx(three), at(3), 1, o3);
  assert.deepEqual(Array.from(o3), [2, 0, 1]);
});

test("pickers: argmin ties → fewest held, then smallest id; softmax seeded by the request id", () => {
  const w = ws("b", "a", "c");
  const p = picker("argmin");
  assert.equal(
    p.pick(ctx(w, { held: [5, 5, 1] }), at(3), Float64Array.from([2, 2, 3])),
    1,
    "tie, same held → a",
  );
  assert.equal(
    p.pick(ctx(w, { held: [1, 5, 1] }), at(3), Float64Array.from([2, 2, 3])),
    0,
    "tie → fewer held",
  );
  assert.equal(p.pick(ctx(w), at(3), Float64Array.from([3, 2, 1])), 2);
  const soft = picker("argmin", { temperature: 5 });
  const picks = new Set<number>();
  for (let i = 0; i < 64; i++) {
    const c = ctx(w, { req: req("t", `req-${i}`) });
    const k = soft.pick(c, at(3), Float64Array.from([1, 1.1, 1.2]));
    assert.equal(soft.pick(c, at(3), Float64Array.from([1, 1.1, 1.2])), k, "same request → same draw");
    picks.add(k);
  }
  assert.equal(picks.size, 3, "a high temperature spreads");
});

test("pickers: round-robin, least-load, prefix-threshold", () => {
  const w = ws("a", "b", "c");
  const rr = picker("round-robin");
  const c = ctx(w);
  assert.deepEqual(
    [0, 1, 2, 3].map(() => rr.pick(c, at(3), new Float64Array(3))),
    [0, 1, 2, 0],
  );
  assert.equal(c.reason, "round-robin");

  const ll = picker("least-load");
  w[0].inFlight = 1;
  w[1].engineLoad = { running: 2, waiting: 0, kvUsage: 0.1, scrapedAt: 0 };
  w[2].engineLoad = { running: 1, waiting: 1, kvUsage: 0.05, scrapedAt: 0 };
  assert.equal(
    ll.pick(ctx(w), at(3), new Float64Array(3)),
    2,
    "in-flight, then running+waiting, then kv usage",
  );

  w[1].engineLoad = { running: 3, waiting: 0, kvUsage: 0.1, scrapedAt: 0 }; // load 3 > c's 2
  const pt = picker("prefix-threshold", { cacheThreshold: 0.5 });
  const r = req("0123456789");
  const c2 = ctx(w, { req: r, held: [3, 1, 2] });
  assert.equal(pt.pick(c2, at(3), Float64Array.from([0, -8, -8])), 2, "best match, tie → lower load");
  assert.equal(c2.reason, "prefix-match");
  const c3 = ctx(w, { req: r, held: [3, 1, 2] });
  assert.equal(pt.pick(c3, at(3), Float64Array.from([0, -4, 0])), 1, "40% ≤ 50%: the smallest cache");
  assert.equal(c3.reason, "least-cache");
});
