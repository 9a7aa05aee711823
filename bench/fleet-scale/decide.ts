/**
 * The kv-aware routing decision alone, in one process, at fleet scale (issue #32): the server's
 * Scheduler (`buildScheduling`, preset `kv-aware`) over N workers whose KV index is fed by
 * simulated engines, timed around `select` + `onRouted` as the server runs them per request.
 * No HTTP, no other process: the figure is the pipeline's own CPU, without the box's noise.
 *
 *   node bench/fleet-scale/decide.ts [--workers 256] [--requests 20000] [--in-flight 16]
 *     [--blocks 256] [--tokenize] [--root DIR] [--rounds 3] [--cpu-prof-window] [--cold KB]
 *
 * The load is the fleet-scale bench's (load.ts): one of 64 shared ~35-token "system" prefixes
 * and a distinct tail, so each request stores one new block and pools of `--blocks` blocks per
 * engine fill and evict. An engine's answer to a request comes `--in-flight` requests later: its
 * prefill is then done (the claim tells the pending bridge) and its blocks are stored in the
 * index (BlockStored, with BlockRemoved for what the engine's LRU pool evicts), as the KV events
 * would report them. Engine load (running, waiting) is refreshed every 500 requests, as the
 * scraper would. Prompts are tokenized ahead (the server tokenizes in `select` when a policy
 * needs the ids: `--tokenize` times that too).
 *
 * `--root DIR`: the same load against another checkout's pipeline (a baseline worktree), so
 * before and after run side by side. Prints one JSON line per round: CPU µs per decision (this
 * thread's, so other processes on the box do not inflate it) and wall µs (mean, p50, p99).
 */
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { Mulberry32 } from "../../src/util/mulberry32.ts";
// Plain event objects (its only import of src is a type), so they suit a --root checkout too.
import { blockRemoved, blockStored } from "../../test/helpers/kv-events.ts";
import { exitWithUsageIfAsked } from "../usage.ts";

const argv = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, argv);
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : def;
};
const N = Number(opt("workers", "256"));
const REQUESTS = Number(opt("requests", "20000"));
const IN_FLIGHT = Number(opt("in-flight", "16"));
const BLOCKS = Number(opt("blocks", "256"));
const ROUNDS = Number(opt("rounds", "3"));
const TOKENIZE = argv.includes("--tokenize");
/**
 * `--cold KB`: before each decision (outside the timing) write one byte per cache line of a
 * KB-sized buffer, so the decision finds its data evicted as in a busy server, where the HTTP
 * path, KV ingest, GC and the other processes on the core run between two decisions. In a loop
 * alone the 256 workers' state stays cached, which a server at 1,000 req/s never sees.
 */
const COLD_KB = Number(opt("cold", "0"));
const cold = new Uint8Array(COLD_KB * 1024);
let coldSeq = 0;
function evict(): void {
  coldSeq = (coldSeq + 1) & 0xff;
  for (let i = 0; i < cold.length; i += 64) cold[i] = coldSeq;
}
const ROOT = opt("root", join(import.meta.dirname, "../.."));
const BS = 16;

const from = async <T>(rel: string): Promise<T> => (await import(pathToFileURL(join(ROOT, rel)).href)) as T;

// The checkout's own modules (a baseline's may differ in everything but these entry points).
type Any = Record<string, unknown>;
interface Sched {
  select(req: Any, ws: readonly Any[]): { worker: Any };
  onRouted(req: Any, w: Any, route: { watch(x: Watcher): void }): void;
}
interface Watcher {
  prefilled(): void;
  dropped(r: string): void;
}
interface Index {
  addWorker(id: string, bs: number, expected?: number, kvBlocks?: number): void;
  applyEvents(id: string, evs: readonly unknown[], bs?: number, rank?: number): void;
  syncOf(id: string): unknown;
}
const { KvIndex } = await from<{ KvIndex: new () => Index }>("src/kv/index.ts");
const { buildScheduling } = await from<{
  buildScheduling(i: Any): { create(o: Any): Sched };
}>("src/router/pipeline/build.ts");
const { DecisionLog } = await from<{ DecisionLog: new () => { syncOf?: (id: string) => unknown } }>(
  "src/router/pipeline/decisions.ts",
);
const { getDefaultTokenizer } = await from<{
  getDefaultTokenizer(): { encode(t: string, add?: boolean): number[] };
}>("src/tokenizer/tokenizer.ts");
const { createLogger } = await from<{ createLogger(n: string): { level: string } }>("src/util/log.ts");

const prng = new Mulberry32(1);
const rand = () => prng.next();
const WORDS =
  "time year people way day man thing woman life child world school state family student group country problem hand part place case week company system program question work government number night point home water room mother area money story fact month lot right study book".split(
    " ",
  );
const word = () => WORDS[Math.floor(rand() * WORDS.length)];
const prefixes = Array.from(
  { length: 64 },
  (_, i) => `System ${i}: ${Array.from({ length: 30 }, word).join(" ")}.`,
);

const tok = getDefaultTokenizer();
let nextId = 0;
function request(): Any {
  const text = `${prefixes[Math.floor(rand() * prefixes.length)]} User ${nextId}: ${Array.from({ length: 8 }, word).join(" ")}?`;
  const body = { model: "m", prompt: text, max_tokens: 2 };
  let tokens: number[] | undefined = TOKENIZE ? undefined : tok.encode(text, false);
  return {
    requestId: `r${nextId++}`,
    model: "m",
    endpoint: "completion",
    body,
    stream: false,
    cacheSalt: undefined,
    trace: undefined,
    promptText: () => text,
    promptTokens: () => {
      tokens ??= tok.encode(text, false);
      return tokens;
    },
    header: () => undefined,
  };
}

/** One engine's KV pool: an LRU of block content keys → its engine hash; events as vLLM sends them. */
class Engine {
  private readonly pool = new Map<string, number>();
  private static nextHash = 1;
  readonly id: string;
  private readonly index: Index;
  constructor(id: string, index: Index) {
    this.id = id;
    this.index = index;
  }
  /** The request's prefill is done: its full blocks are stored (missing ones), the oldest evicted. */
  prefill(tokens: readonly number[]): void {
    const full = Math.floor(tokens.length / BS);
    let parent: number | null = null;
    let key = "";
    const stored: number[] = [];
    let first = -1;
    for (let b = 0; b < full; b++) {
      key += `${tokens.slice(b * BS, (b + 1) * BS).join(",")};`;
      const h = this.pool.get(key);
      if (h !== undefined) {
        this.pool.delete(key);
        this.pool.set(key, h);
        parent = h;
        continue;
      }
      if (first < 0) first = b;
      const nh = Engine.nextHash++;
      this.pool.set(key, nh);
      stored.push(nh);
    }
    const evs: unknown[] = [];
    if (stored.length > 0)
      evs.push(
        blockStored(stored, tokens.slice(first * BS, full * BS), BS, {
          parentBlockHash: first > 0 ? parent : null,
        }),
      );
    const removed: number[] = [];
    for (const [k, h] of this.pool) {
      if (this.pool.size <= BLOCKS) break;
      this.pool.delete(k);
      removed.push(h);
    }
    if (removed.length > 0) evs.push(blockRemoved(removed));
    if (evs.length > 0) this.index.applyEvents(this.id, evs, BS);
  }
}

const logger = createLogger("decide");
logger.level = "silent";
const index = new KvIndex();
const workers = Array.from({ length: N }, (_, i) => ({
  record: {
    id: `fleet-${i}`,
    model: "m",
    servedModelNames: ["m"],
    engine: "vllm",
    role: "mixed",
    url: `http://127.0.0.1:${20000 + i}`,
    connector: { kind: "none" },
    blockSize: BS,
    kvBlocks: BLOCKS,
    kvEvents: { endpoint: "tcp://127.0.0.1:1", topic: "kv-events", framing: "seq" },
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 32768,
  },
  inFlight: 0,
  pendingPrefillTokens: 0,
  engineLoad: { running: 0, waiting: 0, kvUsage: 0, scrapedAt: 0 },
  available: true,
  routed: 0,
}));
// The server's WorkerSet marks its candidate lists stable (src/util/stable-lists.ts, where the
// checkout has it).
const stableLists = await from<{ markStable(l: readonly unknown[]): unknown }>(
  "src/util/stable-lists.ts",
).catch(() => null);
stableLists?.markStable(workers);
for (const w of workers) index.addWorker(w.record.id, BS, 0, BLOCKS);
const engines = new Map(workers.map((w) => [w.record.id, new Engine(w.record.id, index)]));
const decisions = new DecisionLog();
decisions.syncOf = (id) => index.syncOf(id);
const sched = buildScheduling({ policy: "kv-aware", policyOptions: {} }).create({
  model: "m",
  logger,
  kvIndex: index,
  decisions,
});

interface Flight {
  w: (typeof workers)[number];
  tokens: readonly number[];
  watchers: Watcher[];
}
const flights: Flight[] = [];
function finish(f: Flight): void {
  for (const x of f.watchers) x.prefilled();
  engines.get(f.w.record.id as string)?.prefill(f.tokens);
  f.w.inFlight--;
  f.w.pendingPrefillTokens -= f.tokens.length;
}

function round(count: number) {
  const times = new Float64Array(count);
  let cpuUs = 0;
  const reqs = Array.from({ length: count }, request);
  for (let k = 0; k < count; k++) {
    if (k % 500 === 0)
      for (const w of workers) {
        w.engineLoad.running = Math.floor(rand() * 8);
        w.engineLoad.waiting = rand() < 0.1 ? 1 : 0;
      }
    const req = reqs[k];
    const f: Flight = { w: workers[0], tokens: [], watchers: [] };
    if (COLD_KB > 0) evict();
    const c0 = process.threadCpuUsage();
    const t0 = performance.now();
    const sel = sched.select(req, workers);
    const w = sel.worker as (typeof workers)[number];
    const tokens = (req.promptTokens as () => number[])();
    w.inFlight++;
    w.pendingPrefillTokens += tokens.length;
    sched.onRouted(req, w, { watch: (x) => f.watchers.push(x) });
    times[k] = performance.now() - t0;
    const c1 = process.threadCpuUsage();
    cpuUs += c1.user - c0.user + c1.system - c0.system;
    f.w = w;
    f.tokens = tokens;
    flights.push(f);
    if (flights.length > IN_FLIGHT) finish(flights.shift()!);
  }
  const sorted = times.slice().sort();
  const us = (ms: number) => Math.round(ms * 1000 * 10) / 10;
  return {
    workers: N,
    decisions: count,
    /** This thread's CPU time in select + onRouted (≈ 1 µs of it the two clock reads): the box's load does not inflate it. */
    cpuUsMean: Math.round((cpuUs / count) * 10) / 10,
    usMean: us(times.reduce((a, b) => a + b, 0) / count),
    usP50: us(sorted[Math.floor(count * 0.5)]),
    usP99: us(sorted[Math.floor(count * 0.99)]),
  };
}

round(Math.min(2000, REQUESTS)); // warm-up: JIT, pools filling
for (let r = 0; r < ROUNDS; r++) {
  if (argv.includes("--cpu-prof-window"))
    process.stderr.write(`window start ${process.hrtime.bigint() / 1000n}\n`);
  const res = round(REQUESTS);
  if (argv.includes("--cpu-prof-window"))
    process.stderr.write(`window end ${process.hrtime.bigint() / 1000n}\n`);
  process.stdout.write(`${JSON.stringify({ root: ROOT, tokenize: TOKENIZE, coldKB: COLD_KB, ...res })}\n`);
}
