import assert from "node:assert/strict";
import { test } from "node:test";
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { ApproxPrefixTree } from "../../../src/kv/approx-tree.ts";
import { KvIndex } from "../../../src/kv/index.ts";
import type { Scheduler } from "../../../src/router/pipeline/scheduler.ts";
import type { RoutingPolicy, RoutingRequest, WorkerState } from "../../../src/router/types.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { createLogger } from "../../../src/util/log.ts";
import { blockRemoved, storedPrefix } from "../../helpers/kv-events.ts";
import { presetScheduler } from "./preset.ts";

const BS = 16;
const logger = createLogger("test");
logger.level = "silent";
const tok = getDefaultTokenizer();

function worker(id: string, kv = true): WorkerState {
  const record: WorkerRecord = {
    id,
    model: "m",
    servedModelNames: ["m"],
    engine: "sim",
    role: "mixed",
    url: `http://${id}`,
    connector: { kind: "none" },
    blockSize: BS,
    kvEvents: kv ? { endpoint: "tcp://127.0.0.1:1", topic: "", framing: "seq" } : undefined,
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 32768,
    startedAt: "",
  };
  return { record, inFlight: 0, pendingPrefillTokens: 0, available: true };
}

let nextId = 0;
function request(text: string, salt?: string, id?: string): RoutingRequest {
  const tokens = tok.encode(text);
  return {
    requestId: id ?? `r${nextId++}`,
    model: "m",
    endpoint: "completion",
    body: { model: "m", prompt: text },
    stream: false,
    cacheSalt: salt,
    promptText: () => text,
    promptTokens: () => tokens,
  };
}

/** What an engine would publish after caching `tokens`: one BlockStored with all full blocks. */
const storedFor = (tokens: readonly number[], hashBase: number, salt?: string) =>
  storedPrefix(tokens, BS, hashBase, { extraKeys: salt ? [[salt]] : null });

const doc = Array.from(
  { length: 120 },
  (_, i) => `Paragraph ${i} of the handbook explains topic ${i * 7}.`,
).join(" ");

function kvPolicy(index: KvIndex, options: Record<string, unknown> = {}, preset = "kv-aware"): Scheduler {
  return presetScheduler(preset, { logger, options, kvIndex: index });
}

test("kv-aware sends a request to the worker holding its prefix, and not after BlockRemoved", () => {
  const index = new KvIndex();
  const ws = [worker("a"), worker("b"), worker("c")];
  for (const w of ws) index.addWorker(w.record.id, BS);
  const req = request(`${doc} Question: what is topic 70?`);
  const docTokens = tok.encode(doc);
  index.apply("b", storedFor(docTokens, 1000));
  const p = kvPolicy(index);
  const sel = p.select(req, ws);
  assert.equal(sel.worker.record.id, "b");
  assert.equal(sel.reason, "overlap");
  assert.ok(sel.overlapBlocks! >= Math.floor(docTokens.length / BS) - 1);
  // The engine evicts the first block: nothing of the prefix is reachable any more.
  index.apply("b", blockRemoved([1000]));
  const after = p.select(request(`${doc} Question: what is topic 70?`), ws);
  assert.equal(after.worker.record.id, "a"); // all equal now: smallest id
  assert.equal(after.reason, "load");
});

test("kv-aware and round-robin selections carry the time the scheduler took to choose", () => {
  const index = new KvIndex();
  const ws = Array.from({ length: 300 }, (_, i) => worker(`w${i}`));
  for (const w of ws) index.addWorker(w.record.id, BS);
  index.apply("w7", storedFor(tok.encode(doc), 5000));
  const sel = kvPolicy(index).select(request(`${doc} Question: what is topic 7?`), ws);
  assert.equal(sel.worker.record.id, "w7");
  // The server's infera_routing_decision_seconds observes this: a positive time under a second.
  assert.ok(sel.seconds !== undefined && sel.seconds > 0 && sel.seconds < 1, `seconds ${sel.seconds}`);
  const rr = presetScheduler("round-robin", { logger }).select(request("hi"), ws);
  assert.ok(rr.seconds !== undefined && rr.seconds >= 0 && rr.seconds < 1, `seconds ${rr.seconds}`);
});

test("cache salts isolate tenants", () => {
  const index = new KvIndex();
  const ws = [worker("a"), worker("b")];
  for (const w of ws) index.addWorker(w.record.id, BS);
  index.apply("b", storedFor(tok.encode(doc), 1, "tenant-x"));
  const p = kvPolicy(index);
  assert.equal(p.select(request(doc, "tenant-x"), ws).worker.record.id, "b");
  assert.equal(p.select(request(doc, "tenant-y"), ws).overlapBlocks, 0);
  assert.equal(p.select(request(doc), ws).overlapBlocks, 0);
});

test("kv-aware-classic: load terms and the imbalance guard beat cache locality on a hot worker", () => {
  const index = new KvIndex();
  const ws = [worker("a"), worker("b")];
  for (const w of ws) index.addWorker(w.record.id, BS);
  index.apply("b", storedFor(tok.encode(doc), 1));
  const p = kvPolicy(index, { balanceAbsThreshold: 8, balanceRelThreshold: 1.5 }, "kv-aware-classic");
  ws[1].inFlight = 8;
  assert.equal(p.select(request(doc), ws).worker.record.id, "b"); // 8 − 0 > 8 is false: overlap wins
  ws[1].inFlight = 9;
  const sel = p.select(request(doc), ws);
  assert.equal(sel.worker.record.id, "a");
  assert.equal(sel.reason, "load-balance");
  // Without the guard, a big enough prefill backlog also moves the request.
  const q = kvPolicy(index, { balanceAbsThreshold: 1e9 }, "kv-aware-classic");
  ws[1].inFlight = 1;
  ws[1].pendingPrefillTokens = 64 * 1024;
  assert.equal(q.select(request(doc), ws).worker.record.id, "a");
  assert.ok(p.stats.decisions["load-balance"] === 1 && p.stats.decisions.overlap === 1);
});

test("two policy instances over equal indexes make the same choice (also with temperature)", () => {
  const mk = () => {
    const index = new KvIndex();
    for (const id of ["w3", "w1", "w2"]) index.addWorker(id, BS);
    index.apply("w2", storedFor(tok.encode(doc), 7));
    index.apply("w3", storedFor(tok.encode(doc.slice(0, 1000)), 70));
    return index;
  };
  const ws = [worker("w3"), worker("w1"), worker("w2")];
  for (const opts of [{}, { temperature: 0.5 }, { temperature: 5 }]) {
    const p1 = kvPolicy(mk(), opts);
    const p2 = kvPolicy(mk(), opts);
    const seen = new Set<string>();
    for (let i = 0; i < 40; i++) {
      const r = request(`${doc} q${i}`, undefined, `req-${i}`);
      const a = p1.select(r, ws).worker.record.id;
      assert.equal(a, p2.select(r, [...ws].reverse()).worker.record.id);
      seen.add(a);
    }
    if ((opts as { temperature?: number }).temperature === 5) assert.ok(seen.size > 1, "sampling spreads");
    else if (!("temperature" in opts)) assert.deepEqual([...seen], ["w2"]);
  }
});

test("workers without KV events fall back to the approximate tree of what was routed", () => {
  const ws = [worker("a", false), worker("b", false), worker("c", false)];
  const p = kvPolicy(new KvIndex());
  const first = p.select(request(`${doc} first`), ws);
  p.onRouted!(request(`${doc} first`), first.worker);
  ws[0].inFlight = 1; // the first one is busy now, yet the shared doc pulls the next there
  const second = p.select(request(`${doc} second`), ws);
  assert.equal(second.worker.record.id, first.worker.record.id);
  assert.ok(second.overlapBlocks! > 0);
  const other = p.select(request("An unrelated prompt about cooking pasta."), ws);
  assert.notEqual(other.worker.record.id, first.worker.record.id);
});

test("approx-prefix alone: prefix match, spreading new prefixes, load balance", () => {
  const ws = [worker("a", false), worker("b", false), worker("c", false)];
  const p: RoutingPolicy = presetScheduler("approx-prefix", { logger, options: { balanceAbsThreshold: 4 } });
  const route = (text: string) => {
    const r = request(text);
    const s = p.select(r, ws);
    p.onRouted!(r, s.worker);
    return s;
  };
  const docs = ["alpha ", "beta ", "gamma "].map((w) => w.repeat(300));
  const homes = docs.map((d) => route(`${d}q0`).worker.record.id);
  assert.equal(new Set(homes).size, 3, "new prefixes spread over the least-used trees");
  for (let i = 1; i < 5; i++)
    docs.forEach((d, k) => {
      const s = route(`${d}q${i}`);
      assert.equal(s.worker.record.id, homes[k]);
      assert.equal(s.reason, "prefix-match");
    });
  ws.find((w) => w.record.id === homes[0])!.inFlight = 6;
  const s = route(`${docs[0]}q9`);
  assert.equal(s.reason, "load-balance");
  assert.notEqual(s.worker.record.id, homes[0]);
  p.onWorkerRemoved!(homes[1]);
});

test("approximate tree evicts least recently used nodes per worker, keeping shared roots", () => {
  const t = new ApproxPrefixTree({ chunkChars: 4, maxNodesPerWorker: 6 });
  t.insert("aaaabbbbcccc", "w");
  t.insert("aaaaddddeeee", "w");
  assert.equal(t.size("w"), 5);
  t.insert("aaaaffffgggg", "w"); // 7 nodes > 6: the oldest tail goes first
  assert.equal(t.size("w"), 6);
  assert.deepEqual([...t.match("aaaabbbbcccc", ["w"])], [8]);
  assert.deepEqual([...t.match("aaaaffffgggg", ["w", "x"])], [12, 0]);
  t.removeWorker("w");
  assert.deepEqual([...t.match("aaaaffffgggg", ["w"])], [0]);
});

test("kv-aware-classic counts what it routed in the last recentRoutingMs as cached (events trail routing)", async () => {
  const index = new KvIndex();
  const ws = [worker("a"), worker("b"), worker("c")];
  for (const w of ws) index.addWorker(w.record.id, BS);
  index.apply("a", storedFor(tok.encode("unrelated text ".repeat(50)), 1)); // a holds more blocks
  const p = kvPolicy(index, { recentRoutingMs: 150 }, "kv-aware-classic");
  const r1 = request(`${doc} first`);
  const s1 = p.select(r1, ws);
  assert.equal(s1.worker.record.id, "b", "a new prefix goes to an emptiest cache");
  p.onRouted!(r1, s1.worker);
  ws[1].inFlight = 1;
  const s2 = p.select(request(`${doc} second`), ws);
  assert.equal(s2.worker.record.id, "b", "no event yet, but b was just sent this document");
  assert.ok(s2.overlapBlocks! > 50);
  await new Promise((r) => setTimeout(r, 200));
  const s3 = p.select(request(`${doc} third`), ws);
  assert.equal(s3.overlapBlocks, 0, "after the window only the events count");
  assert.equal(s3.worker.record.id, "c");
});
