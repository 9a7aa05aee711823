import {
  AggregatorRegistry,
  Counter,
  Gauge,
  Histogram,
  type MetricObjectWithValues,
  type MetricValue,
  Registry,
} from "prom-client";
import { FastHistogramFamily } from "../../util/fast-metrics.ts";
import type { MetricNames } from "./metric-names.ts";
import type { FinishReason } from "./output.ts";
import type { Personality } from "./personalities/types.ts";
import type { SchedulerObserver } from "./scheduler.ts";
import type { Sequence } from "./sequence.ts";

/** What the metrics read from the engine at scrape time. */
export interface EngineGauges {
  running(): number;
  waiting(): number;
  kvUsage(): number;
  /** Blocks in use / in the pool. */
  blocksUsed?(): number;
  blocksTotal?(): number;
  /** PD backlogs: prefill requests whose KV waits for the decode side; decode requests waiting for their pull. */
  prefillInflight?(): number;
  decodePrealloc?(): number;
}

export interface SimMetricsOptions {
  /** Whose metric names and labels (personalities/). */
  personality: Personality;
  modelName: string;
  dpRank: number;
  /** Labels carry the DP rank (SGLang adds `dp_rank` only when DP is on). */
  dpSize: number;
  role: "mixed" | "prefill" | "decode";
  gauges: EngineGauges;
  cache: { blockSize: number; numGpuBlocks: number; prefixCaching?: boolean };
  /** Shared by the ranks of one process so /metrics renders one family. */
  itlFamily?: FastHistogramFamily;
}

const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640,
  2560,
];
const ITL_BUCKETS = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
];
const E2E_BUCKETS = [
  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680,
];
const SIZES = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000];

/** The engine's own label set for one rank (see metric-names.ts for the sources). */
export function rankLabels(
  o: Pick<SimMetricsOptions, "personality" | "modelName" | "dpRank" | "dpSize" | "role">,
): Record<string, string> {
  return o.personality.rankLabels(o);
}

export function itlFamilyFor(
  o: Pick<SimMetricsOptions, "personality" | "modelName" | "dpRank" | "dpSize" | "role">,
): FastHistogramFamily | null {
  const n = o.personality.metricNames.itl;
  if (!n) return null;
  return new FastHistogramFamily(
    n,
    "Histogram of inter-token latency in seconds.",
    ITL_BUCKETS,
    Object.keys(rankLabels(o)),
  );
}

/** The gauges (read at scrape time) and vLLM's cache-config info, under the personality's names. */
function registerGauges(r: Registry, n: MetricNames, o: SimMetricsOptions, hitRate: () => number): void {
  const g = o.gauges;
  const gauge = (name: string | undefined, help: string, read: () => number): void => {
    if (!name) return;
    new Gauge({
      name,
      help,
      registers: [r],
      collect() {
        this.set(read());
      },
    });
  };
  gauge(n.running, "Number of running requests.", g.running);
  gauge(n.waiting, "Number of waiting requests.", g.waiting);
  gauge(n.kvUsage, "KV-cache usage. 1 means 100 percent usage.", g.kvUsage);
  gauge(n.blocksUsed, "Number of allocated KV-cache blocks.", () => g.blocksUsed?.() ?? 0);
  gauge(
    n.blocksFree,
    "Number of free KV-cache blocks.",
    () => (g.blocksTotal?.() ?? 0) - (g.blocksUsed?.() ?? 0),
  );
  gauge(n.blocksTotal, "Total number of KV-cache blocks.", () => g.blocksTotal?.() ?? 0);
  gauge(n.snapshotAvailable, "Whether a runtime metrics snapshot has been collected successfully.", () => 1);
  gauge(n.cacheHitRate, "The prefix cache hit rate.", hitRate);
  gauge(n.prefillPrealloc, "The number of requests in the prefill prealloc queue.", () => 0);
  gauge(
    n.prefillInflight,
    "The number of requests in the prefill inflight queue.",
    () => g.prefillInflight?.() ?? 0,
  );
  gauge(
    n.decodePrealloc,
    "The number of requests in the decode prealloc queue.",
    () => g.decodePrealloc?.() ?? 0,
  );
  gauge(n.decodeTransfer, "The number of requests in the decode transfer queue.", () => 0);
  if (n.cacheConfigInfo) {
    const info = new Gauge({
      name: n.cacheConfigInfo,
      help: "Information of the LLMEngine CacheConfig",
      labelNames: ["block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"],
      registers: [r],
    });
    info.set(
      {
        block_size: String(o.cache.blockSize),
        num_gpu_blocks: String(o.cache.numGpuBlocks),
        enable_prefix_caching: o.cache.prefixCaching === false ? "False" : "True",
        cache_dtype: "auto",
      },
      1,
    );
  }
}

/**
 * One rank's Prometheus metrics under the personality's names and labels (metric-names.ts).
 * Gauges are read at scrape time; counters and histograms move as requests progress.
 */
export class SimMetrics implements SchedulerObserver {
  readonly registry = new Registry();
  readonly itlFamily: FastHistogramFamily | null;
  private readonly n: MetricNames;
  private readonly promptTokens?: Counter;
  private readonly prefixQueries?: Counter;
  private readonly prefixHits?: Counter;
  private readonly bySource?: { compute: Counter; hit: Counter; external: Counter };
  private readonly preemptions?: Counter;
  private readonly success?: Counter;
  private readonly ttft?: Histogram;
  private readonly itl: { observe(v: number): void } | null;
  /** Generated tokens not yet added to the counter (added at scrape time, off the hot path). */
  private pendingGenerated = 0;
  private readonly e2e?: Histogram;
  private readonly queue?: Histogram;
  private readonly promptHist?: Histogram;
  private readonly genHist?: Histogram;
  /** For SGLang's cache_hit_rate gauge. */
  private queried = 0;
  private hit = 0;

  constructor(o: SimMetricsOptions) {
    const r = this.registry;
    const n = o.personality.metricNames;
    this.n = n;
    const labels = rankLabels(o);
    r.setDefaultLabels(labels);
    registerGauges(r, n, o, () => (this.queried > 0 ? this.hit / this.queried : 0));
    const counter = (
      name: string | undefined,
      help: string,
      labelNames: string[] = [],
    ): Counter | undefined => (name ? new Counter({ name, help, labelNames, registers: [r] }) : undefined);
    this.promptTokens = counter(n.promptTokens, "Number of prefill tokens processed.");
    const self = this;
    if (n.generationTokens)
      new Counter({
        name: n.generationTokens,
        help: "Number of generation tokens processed.",
        registers: [r],
        collect() {
          if (self.pendingGenerated > 0) this.inc(self.pendingGenerated);
          self.pendingGenerated = 0;
        },
      });
    this.prefixQueries = counter(n.prefixQueries, "Prefix cache queries, in terms of tokens.");
    this.prefixHits = counter(n.prefixHits, "Prefix cache hits, in terms of tokens.");
    this.preemptions = counter(n.preemptions, "Cumulative number of preemption from the engine.");
    const src = counter(n.promptBySource, "Number of prompt tokens by source.", ["source"]);
    if (src) {
      this.bySource = {
        compute: src.labels({ source: "local_compute" }) as unknown as Counter,
        hit: src.labels({ source: "local_cache_hit" }) as unknown as Counter,
        external: src.labels({ source: "external_kv_transfer" }) as unknown as Counter,
      };
      for (const c of Object.values(this.bySource)) c.inc(0);
    }
    this.success = counter(
      n.success,
      "Count of successfully processed requests.",
      n.successLabel ? [n.successLabel] : [],
    );
    const hist = (name: string | undefined, help: string, buckets: number[]): Histogram | undefined =>
      name ? new Histogram({ name, help, buckets, registers: [r] }) : undefined;
    this.ttft = hist(n.ttft, "Histogram of time to first token in seconds.", TTFT_BUCKETS);
    this.itlFamily = o.itlFamily ?? itlFamilyFor(o);
    this.itl = this.itlFamily ? this.itlFamily.child(...Object.values(labels)) : null;
    this.e2e = hist(n.e2e, "Histogram of e2e request latency in seconds.", E2E_BUCKETS);
    this.queue = hist(n.queue, "Histogram of time spent in WAITING phase.", E2E_BUCKETS);
    this.promptHist = hist(n.promptHist, "Number of prefill tokens processed.", SIZES);
    this.genHist = hist(n.genHist, "Number of generation tokens processed.", SIZES);
  }

  onFirstScheduled(seq: Sequence, nowMs: number): void {
    const cached = seq.numCachedPromptTokens;
    const external = Math.min(seq.numExternalTokens, cached);
    this.queried += seq.numPromptTokens;
    this.hit += cached - external;
    this.promptTokens?.inc(seq.numPromptTokens);
    this.prefixQueries?.inc(seq.numPromptTokens);
    this.prefixHits?.inc(cached - external);
    if (this.bySource) {
      this.bySource.compute.inc(seq.numPromptTokens - cached);
      this.bySource.hit.inc(cached - external);
      this.bySource.external.inc(external);
    }
    this.queue?.observe((nowMs - seq.arrivalMs) / 1000);
  }

  onToken(seq: Sequence, nowMs: number): void {
    this.pendingGenerated++;
    if (seq.firstTokenMs === nowMs && seq.lastTokenMs === 0)
      this.ttft?.observe((nowMs - seq.arrivalMs) / 1000);
    else if (seq.lastTokenMs > 0) this.itl?.observe((nowMs - seq.lastTokenMs) / 1000);
  }

  onFinished(seq: Sequence, reason: FinishReason): void {
    if (this.success) {
      if (this.n.successLabel) this.success.inc({ [this.n.successLabel]: reason }, 1);
      else if (reason !== "abort") this.success.inc(1);
    }
    if (reason === "abort") return;
    this.e2e?.observe((performance.now() - seq.arrivalMs) / 1000);
    this.promptHist?.observe(seq.numPromptTokens);
    this.genHist?.observe(seq.numOutputTokens);
  }

  onPreempted(): void {
    this.preemptions?.inc(1);
  }

  /** Prometheus text exposition of this rank alone. */
  async text(): Promise<string> {
    return (await this.registry.metrics()) + (this.itlFamily?.text() ?? "");
  }
}

/**
 * /metrics of a process serving several DP ranks: each rank's series under its own labels
 * (vLLM `engine`, SGLang `dp_rank`), or summed where the engine does not label ranks (ATOM).
 * The ITL family is shared by the ranks, so it is rendered once.
 */
export async function combinedMetricsText(ranks: readonly SimMetrics[]): Promise<string> {
  if (ranks.length === 1) return ranks[0].text();
  const jsons = await Promise.all(ranks.map((m) => m.registry.getMetricsAsJSON()));
  // Fold each rank's default labels into its values (getMetricsAsJSON may leave them out).
  const withLabels = jsons.map((list, i) => {
    const defaults =
      (ranks[i].registry as unknown as { _defaultLabels?: Record<string, string> })._defaultLabels ?? {};
    return list.map((m) => {
      const mv = m as MetricObjectWithValues<MetricValue<string>>;
      return { ...mv, values: mv.values.map((v) => ({ ...v, labels: { ...defaults, ...v.labels } })) };
    });
  });
  const merged = AggregatorRegistry.aggregate(
    withLabels as Parameters<typeof AggregatorRegistry.aggregate>[0],
  );
  return (await merged.metrics()) + (ranks[0].itlFamily?.text() ?? "");
}
