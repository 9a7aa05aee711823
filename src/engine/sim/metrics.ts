import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { FastHistogramFamily } from "../../util/fast-metrics.ts";
import type { FinishReason } from "./output.ts";
import type { SchedulerObserver } from "./scheduler.ts";
import type { Sequence } from "./sequence.ts";

/** What the metrics read from the engine at scrape time. */
export interface EngineGauges {
  running(): number;
  waiting(): number;
  kvUsage(): number;
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

/**
 * vLLM's Prometheus metrics (names, labels `model_name` and `engine`), one Registry per
 * engine. Gauges are read at scrape time; counters and histograms move as requests progress.
 */
export class SimMetrics implements SchedulerObserver {
  readonly registry = new Registry();
  private readonly promptTokens: Counter;
  private readonly prefixQueries: Counter;
  private readonly prefixHits: Counter;
  private readonly bySource: { compute: Counter; hit: Counter; external: Counter };
  private readonly preemptions: Counter;
  private readonly success: Record<string, Counter>;
  private readonly ttft: Histogram;
  private readonly itlFamily: FastHistogramFamily;
  private readonly itl: { observe(v: number): void };
  /** Generated tokens not yet added to the counter (added at scrape time, off the hot path). */
  private pendingGenerated = 0;
  private readonly e2e: Histogram;
  private readonly queue: Histogram;
  private readonly promptHist: Histogram;
  private readonly genHist: Histogram;

  constructor(
    modelName: string,
    engine: string,
    gauges: EngineGauges,
    cache: { blockSize: number; numGpuBlocks: number; prefixCaching?: boolean },
  ) {
    const r = this.registry;
    const labels = { model_name: modelName, engine };
    r.setDefaultLabels(labels);
    const gauge = (name: string, help: string, read: () => number): void => {
      new Gauge({
        name,
        help,
        registers: [r],
        collect() {
          this.set(read());
        },
      });
    };
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", gauges.running);
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", gauges.waiting);
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", gauges.kvUsage);
    gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", gauges.kvUsage);
    const info = new Gauge({
      name: "vllm:cache_config_info",
      help: "Information of the LLMEngine CacheConfig",
      labelNames: ["block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"],
      registers: [r],
    });
    info.set(
      {
        block_size: String(cache.blockSize),
        num_gpu_blocks: String(cache.numGpuBlocks),
        enable_prefix_caching: cache.prefixCaching === false ? "False" : "True",
        cache_dtype: "auto",
      },
      1,
    );
    const counter = (name: string, help: string, labelNames: string[] = []): Counter =>
      new Counter({ name, help, labelNames, registers: [r] });
    this.promptTokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.");
    const self = this;
    new Counter({
      name: "vllm:generation_tokens_total",
      help: "Number of generation tokens processed.",
      registers: [r],
      collect() {
        if (self.pendingGenerated > 0) this.inc(self.pendingGenerated);
        self.pendingGenerated = 0;
      },
    });
    this.prefixQueries = counter(
      "vllm:prefix_cache_queries_total",
      "Prefix cache queries, in terms of tokens.",
    );
    this.prefixHits = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of tokens.");
    this.preemptions = counter(
      "vllm:num_preemptions_total",
      "Cumulative number of preemption from the engine.",
    );
    const src = counter("vllm:prompt_tokens_by_source_total", "Number of prompt tokens by source.", [
      "source",
    ]);
    this.bySource = {
      compute: src.labels({ source: "local_compute" }) as unknown as Counter,
      hit: src.labels({ source: "local_cache_hit" }) as unknown as Counter,
      external: src.labels({ source: "external_kv_transfer" }) as unknown as Counter,
    };
    for (const c of Object.values(this.bySource)) c.inc(0);
    const ok = counter("vllm:request_success_total", "Count of successfully processed requests.", [
      "finished_reason",
    ]);
    this.success = {
      stop: ok.labels({ finished_reason: "stop" }) as unknown as Counter,
      length: ok.labels({ finished_reason: "length" }) as unknown as Counter,
      abort: ok.labels({ finished_reason: "abort" }) as unknown as Counter,
    };
    const hist = (name: string, help: string, buckets: number[]): Histogram =>
      new Histogram({ name, help, buckets, registers: [r] });
    this.ttft = hist(
      "vllm:time_to_first_token_seconds",
      "Histogram of time to first token in seconds.",
      TTFT_BUCKETS,
    );
    this.itlFamily = new FastHistogramFamily(
      "vllm:inter_token_latency_seconds",
      "Histogram of inter-token latency in seconds.",
      ITL_BUCKETS,
      ["model_name", "engine"],
    );
    this.itl = this.itlFamily.child(modelName, engine);
    this.e2e = hist(
      "vllm:e2e_request_latency_seconds",
      "Histogram of e2e request latency in seconds.",
      E2E_BUCKETS,
    );
    this.queue = hist(
      "vllm:request_queue_time_seconds",
      "Histogram of time spent in WAITING phase.",
      E2E_BUCKETS,
    );
    const sizes = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000];
    this.promptHist = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", sizes);
    this.genHist = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", sizes);
  }

  onFirstScheduled(seq: Sequence, nowMs: number): void {
    const cached = seq.numCachedPromptTokens;
    const external = Math.min(seq.numExternalTokens, cached);
    this.promptTokens.inc(seq.numPromptTokens);
    this.prefixQueries.inc(seq.numPromptTokens);
    this.prefixHits.inc(cached - external);
    this.bySource.compute.inc(seq.numPromptTokens - cached);
    this.bySource.hit.inc(cached - external);
    this.bySource.external.inc(external);
    this.queue.observe((nowMs - seq.arrivalMs) / 1000);
  }

  onToken(seq: Sequence, nowMs: number): void {
    this.pendingGenerated++;
    if (seq.firstTokenMs === nowMs && seq.lastTokenMs === 0)
      this.ttft.observe((nowMs - seq.arrivalMs) / 1000);
    else if (seq.lastTokenMs > 0) this.itl.observe((nowMs - seq.lastTokenMs) / 1000);
  }

  onFinished(seq: Sequence, reason: FinishReason): void {
    this.success[reason]?.inc(1);
    if (reason === "abort") return;
    this.e2e.observe((performance.now() - seq.arrivalMs) / 1000);
    this.promptHist.observe(seq.numPromptTokens);
    this.genHist.observe(seq.numOutputTokens);
  }

  onPreempted(): void {
    this.preemptions.inc(1);
  }

  /** Prometheus text exposition. */
  async text(): Promise<string> {
    return (await this.registry.metrics()) + this.itlFamily.text();
  }
}
