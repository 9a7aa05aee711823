/**
 * GET /dashboard/state: one JSON snapshot of the router's own state, built when asked (the page
 * polls it; the tests read the same endpoint). It reads what the server keeps anyway: the
 * WorkerSet (breaker, in-flight, scraped engine load), the KV index per model, the decision ring
 * and ServerMetrics' counters (through TrafficWindow). The request path is not touched.
 */

import type { Counter, Registry } from "prom-client";
import type { KvSyncReport, PrefixIndex } from "../../kv/prefix-index.ts";
import type { AutoRouter } from "../../router/auto.ts";
import type { DecisionLog } from "../../router/pipeline/decisions.ts";
import type { DecisionExplanation } from "../../router/pipeline/types.ts";
import type { LiveWorker, WorkerSet } from "../../router/worker-set.ts";
import { maskUrlUserinfo } from "../../util/mask.ts";
import type { ServerMetrics } from "../metrics.ts";
import { TrafficWindow } from "./window.ts";
import type {
  DashboardModel,
  DashboardSnapshotValue,
  DashboardWorker,
  FlowView,
  PdTransfer,
  WorkerHealth,
} from "./wire.ts";

export interface DashboardSources {
  workers: WorkerSet;
  router: AutoRouter;
  metrics: ServerMetrics;
  decisions: DecisionLog;
  policy: string;
  kvIndexFor?: (model: string) => PrefixIndex | undefined;
  /** Per-rank KV index sync (the KV ingest's report). */
  kvSync?: () => KvSyncReport | undefined;
  draining: () => boolean;
  /** The TTFT predictor's error per model (src/server/ttft-sink.ts). */
  ttftErrors?: () => Array<{ model: string; samples: number; median: number; p90: number }>;
  /** Flow control's queue view, when the server runs it. */
  flow?: () => FlowView;
  /** Called on every snapshot (the server starts its engine-load scraper here). */
  onView?: () => void;
}

/** The prom-client counter KV ingest keeps (src/kv/server-ingest.ts), read at snapshot time. */
const OVERLAP_BLOCKS = "infera_kv_routing_overlap_blocks_total";

async function readCounter(registry: Registry, name: string): Promise<number | null> {
  const c = registry.getSingleMetric(name) as Counter | undefined;
  if (!c) return null;
  const v = await c.get();
  return v.values.reduce((a, x) => a + x.value, 0);
}

export class DashboardState {
  private readonly src: DashboardSources;
  readonly window: TrafficWindow;

  constructor(src: DashboardSources) {
    this.src = src;
    this.window = new TrafficWindow(src.metrics, () => readCounter(src.metrics.registry, OVERLAP_BLOCKS));
  }

  async snapshot(opts: { limit?: number; model?: string } = {}): Promise<DashboardSnapshotValue> {
    this.src.onView?.();
    await this.window.sample();
    const draining = this.src.draining();
    const recent = this.src.decisions.list({ model: opts.model });
    const models: DashboardModel[] = [];
    for (const name of this.src.workers.modelNames()) {
      if (opts.model !== undefined && name !== opts.model) continue;
      const g = this.src.workers.group(name);
      if (!g) continue;
      const index = this.src.kvIndexFor?.(name);
      const blockSize = g.all[0]?.record.blockSize || 16;
      models.push({
        name,
        router: this.src.router.kindFor(name),
        workers: g.all.map((w) => workerView(w, index, draining)),
        pd: pdView(recent, name),
        traffic: this.window.view(name, blockSize),
      });
    }
    const limit = opts.limit ?? 50;
    const kvIndex = this.src.kvSync?.();
    const flow = this.src.flow?.();
    return {
      object: "dashboard.state",
      at: Date.now(),
      server: { policy: this.src.policy, draining, decisionCapacity: this.src.decisions.capacity },
      models,
      ...(kvIndex ? { kvIndex } : {}),
      ttftPrediction: this.src.ttftErrors?.() ?? [],
      ...(flow ? { flow } : {}),
      decisions: recent.slice(Math.max(0, recent.length - limit)).reverse(),
    };
  }
}

function workerView(w: LiveWorker, index: PrefixIndex | undefined, draining: boolean): DashboardWorker {
  const load = w.engineLoad;
  const state: WorkerHealth = draining
    ? "draining"
    : w.breaker === "open"
      ? "breaker-open"
      : w.breaker === "half-open"
        ? "half-open"
        : "healthy";
  return {
    id: w.id,
    url: maskUrlUserinfo(w.record.url),
    role: w.record.role,
    engine: w.record.engine,
    connector: w.record.connector?.kind ?? "none",
    state,
    inFlight: w.inFlight,
    routed: w.routed,
    running: load?.running ?? null,
    waiting: load?.waiting ?? null,
    kvUsage: load?.kvUsage ?? null,
    indexBlocks: tracked(index, w.id) ? (index?.blockCount(w.id) ?? null) : null,
    indexSync: index?.syncOf ? index.syncOf(w.id) : null,
  };
}

/** Tracked by the index, in sync or not (hasWorker alone is false while a rank is unsynced). */
function tracked(index: PrefixIndex | undefined, id: string): boolean {
  if (!index) return false;
  return index.syncOf ? index.syncOf(id) !== null : index.hasWorker(id);
}

/** PD pairs from the decision ring: a request's prefill step and decode step, joined by id. */
function pdView(recent: readonly DecisionExplanation[], model: string): DashboardModel["pd"] {
  // Either step may be recorded first (the decode worker can be picked before the prefill).
  const byId = new Map<string, { prefill?: string; decode?: string; at: number }>();
  for (const d of recent) {
    if (d.model !== model || (d.step !== "prefill" && d.step !== "decode")) continue;
    const e = byId.get(d.requestId) ?? { at: d.at };
    e[d.step] = d.winner;
    e.at = Math.max(e.at, d.at);
    byId.set(d.requestId, e);
  }
  const transfers: PdTransfer[] = [];
  for (const [requestId, e] of byId)
    if (e.prefill && e.decode) transfers.push({ requestId, prefill: e.prefill, decode: e.decode, at: e.at });
  const counts = new Map<string, { prefill: string; decode: string; count: number }>();
  for (const t of transfers) {
    const k = `${t.prefill}\0${t.decode}`;
    const c = counts.get(k) ?? { prefill: t.prefill, decode: t.decode, count: 0 };
    c.count++;
    counts.set(k, c);
  }
  return { pairs: [...counts.values()], transfers: transfers.slice(-20).reverse() };
}
