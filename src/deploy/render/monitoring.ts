/**
 * Prometheus Operator scrape objects and a Grafana dashboard (sidecar-discovered ConfigMap).
 * Every series named here is one the code exports: the server's (src/server/metrics.ts,
 * src/kv/server-ingest.ts), kvd's (src/kvd/metrics.ts), and the engines' load gauges the
 * server's scraper reads (src/server/load-scraper.ts).
 */
import { PodMonitor, ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import { ConfigMap } from "kubernetes-models/v1";
import { componentLabels, meta, names, type RenderContext } from "./context.ts";

/** The dashboard's queries, exported so a test can check each metric name exists in the code. */
export const DASHBOARD_PANELS: readonly { title: string; unit: string; exprs: readonly string[] }[] = [
  {
    title: "Time to first token (p50 / p95)",
    unit: "s",
    exprs: [
      "histogram_quantile(0.5, sum by (le, model) (rate(infera_time_to_first_token_seconds_bucket[5m])))",
      "histogram_quantile(0.95, sum by (le, model) (rate(infera_time_to_first_token_seconds_bucket[5m])))",
    ],
  },
  {
    title: "Inter-token latency (p50 / p95)",
    unit: "s",
    exprs: [
      "histogram_quantile(0.5, sum by (le, model) (rate(infera_inter_token_latency_seconds_bucket[5m])))",
      "histogram_quantile(0.95, sum by (le, model) (rate(infera_inter_token_latency_seconds_bucket[5m])))",
    ],
  },
  {
    title: "Throughput (tokens/s, requests/s)",
    unit: "short",
    exprs: [
      "sum by (model) (rate(infera_generation_tokens_total[1m]))",
      "sum by (model) (rate(infera_prompt_tokens_total[1m]))",
      "sum by (model, status) (rate(infera_requests_total[1m]))",
    ],
  },
  {
    title: "Prefix hit rate (kv-aware overlap, kvd tiers)",
    unit: "percentunit",
    exprs: [
      "sum(rate(infera_kv_routing_overlap_ratio_sum[5m])) / sum(rate(infera_kv_routing_overlap_ratio_count[5m]))",
      "sum by (tier) (kvd_hit_ratio)",
    ],
  },
  {
    title: "Routing decisions",
    unit: "short",
    exprs: [
      "sum by (policy, reason, router) (rate(infera_routing_decisions_total[5m]))",
      "sum by (reason) (rate(infera_kv_routing_decisions_total[5m]))",
      "sum by (reason) (rate(infera_retries_total[5m]))",
    ],
  },
  {
    title: "Per-worker load (in flight, available)",
    unit: "short",
    exprs: ["sum by (worker) (infera_worker_in_flight)", "min by (worker) (infera_worker_available)"],
  },
  {
    title: "KV cache usage per worker",
    unit: "percentunit",
    exprs: [
      "vllm:kv_cache_usage_perc",
      "sglang:token_usage",
      "atom:kv_cache_usage_ratio",
      "sum by (tier) (kvd_tier_bytes) / sum by (tier) (kvd_tier_capacity_bytes)",
    ],
  },
  {
    title: "Discovery",
    unit: "short",
    exprs: ["sum by (model) (infera_discovery_workers)", "max(infera_discovery_degraded)"],
  },
];

export function dashboardJson(ctx: RenderContext): string {
  const panels = DASHBOARD_PANELS.map((p, i) => ({
    id: i + 1,
    type: "timeseries",
    title: p.title,
    // Grafana template variable, not a JS placeholder.
    datasource: { type: "prometheus", uid: ["$", "{datasource}"].join("") },
    gridPos: { h: 8, w: 12, x: (i % 2) * 12, y: Math.floor(i / 2) * 8 },
    fieldConfig: { defaults: { unit: p.unit }, overrides: [] },
    targets: p.exprs.map((expr, j) => ({ refId: String.fromCharCode(65 + j), expr })),
  }));
  return JSON.stringify(
    {
      title: `Infera ${ctx.name}`,
      uid: `infera-${ctx.name}`.slice(0, 40),
      schemaVersion: 39,
      time: { from: "now-1h", to: "now" },
      templating: {
        list: [{ name: "datasource", type: "datasource", query: "prometheus", label: "Prometheus" }],
      },
      panels,
    },
    null,
    2,
  );
}

export function monitoringObjects(ctx: RenderContext): (ServiceMonitor | PodMonitor | ConfigMap)[] {
  const m = ctx.spec.monitoring;
  const out: (ServiceMonitor | PodMonitor | ConfigMap)[] = [];
  if (m.serviceMonitor) {
    out.push(
      new ServiceMonitor({
        metadata: meta(ctx, "server", ctx.name),
        spec: {
          selector: {
            matchLabels: { "app.kubernetes.io/instance": ctx.name },
            matchExpressions: [
              { key: "app.kubernetes.io/component", operator: "In", values: ["server", "worker"] },
            ],
          },
          endpoints: [{ port: "http", path: "/metrics", interval: "15s" }],
        },
      }),
    );
    if (ctx.spec.kvd.enabled) {
      out.push(
        new PodMonitor({
          metadata: meta(ctx, "kvd", names.kvd(ctx)),
          spec: {
            selector: { matchLabels: componentLabels(ctx, "kvd") },
            podMetricsEndpoints: [{ port: "metrics", path: "/metrics", interval: "15s" }],
          },
        }),
      );
    }
  }
  if (m.dashboard) {
    out.push(
      new ConfigMap({
        // The Grafana sidecar (kube-prometheus-stack) loads ConfigMaps with this label.
        metadata: {
          ...meta(ctx, "server", names.dashboard(ctx)),
          labels: { ...meta(ctx, "server", "").labels, grafana_dashboard: "1" },
        },
        data: { [`infera-${ctx.name}.json`]: dashboardJson(ctx) },
      }),
    );
  }
  return out;
}
