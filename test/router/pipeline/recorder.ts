/**
 * Drives two routing policies (the frozen pre-pipeline implementation in ./legacy and a preset
 * of the pipeline) through one seeded sequence of requests, KV events (a real KvIndex fed by
 * `applyEvents`), load changes, in-flight/pending changes and worker removals, and records
 * each one's choices. Both read the same WorkerState objects and index; neither mutates them.
 */
import type { WorkerRecord } from "../../../src/discovery/types.ts";
import { KvIndex } from "../../../src/kv/index.ts";
import type { RoutingPolicy, RoutingRequest, Selection, WorkerState } from "../../../src/router/types.ts";
import { getDefaultTokenizer } from "../../../src/tokenizer/tokenizer.ts";
import { blockRemoved, storedPrefix } from "../../helpers/kv-events.ts";

const tok = getDefaultTokenizer();

/** mulberry32: a small seeded PRNG. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface WorkerSpec {
  id: string;
  role?: "mixed" | "prefill" | "decode";
  connector?: "none" | "nixl" | "mooncake";
  blockSize?: number;
  /** Publishes KV events (tracked by the index). */
  kv?: boolean;
  engine?: "vllm" | "sim";
  /** DP ranks listed in the record (vLLM DP worker). */
  ranks?: number[];
}

export function makeWorker(s: WorkerSpec): WorkerState {
  const record: WorkerRecord = {
    id: s.id,
    model: "m",
    servedModelNames: ["m"],
    engine: s.engine ?? "sim",
    role: s.role ?? "mixed",
    url: `http://${s.id}`,
    connector: { kind: s.connector ?? "none" },
    blockSize: s.blockSize ?? 16,
    kvEvents:
      s.kv === false
        ? undefined
        : {
            endpoint: "tcp://127.0.0.1:1",
            topic: "",
            framing: "seq",
            ranks: s.ranks?.map((dpRank) => ({ dpRank, endpoint: `tcp://127.0.0.1:${2 + dpRank}` })),
          },
    dpSize: s.ranks?.length ?? 1,
    tpSize: 1,
    maxModelLen: 32768,
    startedAt: "",
  };
  return { record, inFlight: 0, pendingPrefillTokens: 0, available: true };
}

const DOCS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"].map((w, k) =>
  Array.from({ length: 12 + k * 9 }, (_, i) => `The ${w} guide, part ${i}, lists item ${w}-${i * 7}.`).join(
    " ",
  ),
);

export interface Recorded {
  op: number;
  kind: "select" | "pair";
  worker: string;
  decode?: string;
  reason: string;
  overlapBlocks?: number;
  dpRank?: number;
}

export interface Side {
  policy: RoutingPolicy;
  /** PD pair choice (the disagg router's choosePair), for the PD scenario. */
  choosePair?: (
    req: RoutingRequest,
    p: readonly WorkerState[],
    d: readonly WorkerState[],
    policy: RoutingPolicy,
    ex: ReadonlySet<WorkerState>,
  ) => { prefill: Selection; decode: WorkerState } | null;
}

export interface Scenario {
  seed: number;
  steps: number;
  workers: WorkerSpec[];
  /** Probability a step is an imbalance spike on one worker. */
  imbalance?: number;
  salts?: boolean;
}

function request(id: string, text: string, salt?: string): RoutingRequest {
  let tokens: number[] | null = null;
  return {
    requestId: id,
    model: "m",
    endpoint: "completion",
    body: { model: "m", prompt: text },
    stream: false,
    cacheSalt: salt,
    promptText: () => text,
    promptTokens: () => {
      tokens ??= tok.encode(text);
      return tokens;
    },
  };
}

/** Runs the scenario on several sides at once (same workers, same index); their records. */
export function record(sc: Scenario, sides: Side[], index: KvIndex = new KvIndex()): Recorded[][] {
  const r = rng(sc.seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  const all = sc.workers.map(makeWorker);
  for (const w of all) if (w.record.kvEvents) index.addWorker(w.record.id, w.record.blockSize, 0);
  let live = [...all];
  const held = new Map<string, number[]>();
  let hashBase = 1000;
  const out: Recorded[][] = sides.map(() => []);
  // Workers that left come back 25 steps later (same record), deterministically.
  const later: { at: number; w: WorkerState }[] = [];
  for (let op = 0; op < sc.steps; op++) {
    const x = r();
    if (x < 0.45) {
      // A request: a random candidate subset in random order.
      const cands = live.filter(() => r() < 0.8);
      if (cands.length === 0) continue;
      for (let i = cands.length - 1; i > 0; i--) {
        const j = Math.floor(r() * (i + 1));
        [cands[i], cands[j]] = [cands[j]!, cands[i]!];
      }
      const doc = pick(DOCS);
      const text = r() < 0.15 ? `fresh ${op} ${doc.slice(0, 40)}` : `${doc} question ${Math.floor(r() * 4)}`;
      const salt = sc.salts && r() < 0.2 ? "s1" : undefined;
      const pd = sides[0]!.choosePair && r() < 0.5;
      sides.forEach((side, si) => {
        const req = request(`req-${op}`, text, salt);
        if (pd) {
          const prefills = cands.filter((w) => w.record.role === "prefill");
          const decodes = cands.filter((w) => w.record.role === "decode");
          const pair = side.choosePair!(req, prefills, decodes, side.policy, new Set());
          if (!pair) return;
          side.policy.onRouted?.(req, pair.prefill.worker);
          out[si]!.push({
            op,
            kind: "pair",
            worker: pair.prefill.worker.record.id,
            decode: pair.decode.record.id,
            reason: pair.prefill.reason,
            overlapBlocks: pair.prefill.overlapBlocks,
            dpRank: pair.prefill.dpRank,
          });
          return;
        }
        const mixed = cands.filter((w) => w.record.role === "mixed");
        if (mixed.length === 0) return;
        const s = side.policy.select(req, mixed);
        side.policy.onRouted?.(req, s.worker);
        out[si]!.push({
          op,
          kind: "select",
          worker: s.worker.record.id,
          reason: s.reason,
          overlapBlocks: s.overlapBlocks,
          dpRank: s.dpRank,
        });
      });
    } else if (x < 0.65) {
      // KV events: a worker caches (part of) a document, or evicts some blocks.
      const w = pick(live.filter((c) => c.record.kvEvents));
      if (!w) continue;
      const bs = w.record.blockSize;
      if (r() < 0.7) {
        const tokens = tok.encode(`${pick(DOCS)} question ${Math.floor(r() * 4)}`);
        const blocks = Math.max(1, Math.floor(Math.floor(tokens.length / bs) * (0.3 + 0.7 * r())));
        const ranks = w.record.kvEvents!.ranks?.map((x) => x.dpRank) ?? [0];
        const rank = pick(ranks);
        index.applyEvents(w.record.id, [storedPrefix(tokens, bs, hashBase, {}, blocks)], bs, rank);
        const h = held.get(w.record.id) ?? [];
        for (let i = 0; i < blocks; i++) h.push(hashBase + i);
        held.set(w.record.id, h);
        hashBase += blocks + 7;
      } else {
        const h = held.get(w.record.id) ?? [];
        const gone = h.splice(0, Math.ceil(h.length * r() * 0.5));
        if (gone.length > 0) index.applyEvents(w.record.id, [blockRemoved(gone)], bs);
      }
    } else if (x < 0.9) {
      // Load changes: in-flight, pending prefill, engine gauges.
      const w = pick(live);
      w.inFlight = Math.floor(r() * 6);
      w.pendingPrefillTokens = Math.floor(r() * 3000);
      if (r() < 0.6)
        w.engineLoad = {
          running: Math.floor(r() * 8),
          waiting: Math.floor(r() * 4),
          kvUsage: Math.round(r() * 100) / 100,
          scrapedAt: 0,
        };
      else if (r() < 0.3) w.engineLoad = undefined;
      if (sc.imbalance && r() < sc.imbalance) w.inFlight = 20 + Math.floor(r() * 30);
    } else if (x < 0.96) {
      // A load spike ends (everyone idles).
      for (const w of live) {
        w.inFlight = 0;
        w.pendingPrefillTokens = 0;
      }
    } else if (live.length > 3) {
      // A worker leaves; it may come back later (same record id).
      const w = pick(live);
      live = live.filter((c) => c !== w);
      for (const side of sides) side.policy.onWorkerRemoved?.(w.record.id);
      later.push({ at: op + 25, w });
    }
    for (let i = later.length - 1; i >= 0; i--)
      if (later[i]!.at <= op) {
        live.push(later[i]!.w);
        later.splice(i, 1);
      }
  }
  return out;
}
