/**
 * Prometheus metric names per personality. Absent = the engine has no such metric.
 *
 * - vLLM: vllm/v1/metrics/loggers.py (PrometheusStatLogger); `vllm:gpu_cache_usage_perc` was
 *   retired in favour of `vllm:kv_cache_usage_perc` and is not served.
 * - SGLang: python/sglang/srt/observability/metrics_collector.py (SchedulerMetricsCollector,
 *   TokenizerMetricsCollector); labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank,
 *   dp_rank when DP is on.
 * - ATOM: ROCm/ATOM atom/entrypoints/openai/metrics.py @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21
 *   (unlabelled; gauges summed across DP ranks; CounterMetricFamily adds `_total`).
 */
import type { EngineKind } from "./engine-flags.ts";

export interface MetricNames {
  running?: string;
  waiting?: string;
  kvUsage?: string;
  blocksUsed?: string;
  blocksFree?: string;
  blocksTotal?: string;
  snapshotAvailable?: string;
  cacheHitRate?: string;
  prefillPrealloc?: string;
  prefillInflight?: string;
  decodePrealloc?: string;
  decodeTransfer?: string;
  cacheConfigInfo?: string;
  promptTokens?: string;
  generationTokens?: string;
  prefixQueries?: string;
  prefixHits?: string;
  preemptions?: string;
  promptBySource?: string;
  success?: string;
  /** Label of the success counter carrying the finish reason, if any. */
  successLabel?: string;
  ttft?: string;
  itl?: string;
  e2e?: string;
  queue?: string;
  promptHist?: string;
  genHist?: string;
}

export const METRIC_NAMES: Record<EngineKind, MetricNames> = {
  vllm: {
    running: "vllm:num_requests_running",
    waiting: "vllm:num_requests_waiting",
    kvUsage: "vllm:kv_cache_usage_perc",
    cacheConfigInfo: "vllm:cache_config_info",
    promptTokens: "vllm:prompt_tokens_total",
    generationTokens: "vllm:generation_tokens_total",
    prefixQueries: "vllm:prefix_cache_queries_total",
    prefixHits: "vllm:prefix_cache_hits_total",
    preemptions: "vllm:num_preemptions_total",
    promptBySource: "vllm:prompt_tokens_by_source_total",
    success: "vllm:request_success_total",
    successLabel: "finished_reason",
    ttft: "vllm:time_to_first_token_seconds",
    itl: "vllm:inter_token_latency_seconds",
    e2e: "vllm:e2e_request_latency_seconds",
    queue: "vllm:request_queue_time_seconds",
    promptHist: "vllm:request_prompt_tokens",
    genHist: "vllm:request_generation_tokens",
  },
  sglang: {
    running: "sglang:num_running_reqs",
    waiting: "sglang:num_queue_reqs",
    kvUsage: "sglang:token_usage",
    cacheHitRate: "sglang:cache_hit_rate",
    prefillPrealloc: "sglang:num_prefill_prealloc_queue_reqs",
    prefillInflight: "sglang:num_prefill_inflight_queue_reqs",
    decodePrealloc: "sglang:num_decode_prealloc_queue_reqs",
    decodeTransfer: "sglang:num_decode_transfer_queue_reqs",
    promptTokens: "sglang:prompt_tokens_total",
    generationTokens: "sglang:generation_tokens_total",
    success: "sglang:num_requests_total",
    ttft: "sglang:time_to_first_token_seconds",
    itl: "sglang:inter_token_latency_seconds",
    e2e: "sglang:e2e_request_latency_seconds",
    queue: "sglang:queue_time_seconds",
  },
  atom: {
    snapshotAvailable: "atom:metrics_snapshot_available",
    running: "atom:requests_running",
    waiting: "atom:requests_waiting",
    kvUsage: "atom:kv_cache_usage_ratio",
    blocksUsed: "atom:kv_cache_blocks_used",
    blocksFree: "atom:kv_cache_blocks_free",
    blocksTotal: "atom:kv_cache_blocks_total",
    success: "atom:requests_finished_total",
    promptTokens: "atom:prompt_tokens_total",
    generationTokens: "atom:generation_tokens_total",
    preemptions: "atom:preemptions_total",
    prefixQueries: "atom:prefix_cache_wanted_tokens_total",
    prefixHits: "atom:prefix_cache_cached_tokens_total",
  },
};
