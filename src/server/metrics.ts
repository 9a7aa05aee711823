/**
 * The server's Prometheus metrics, one `Registry` per server instance. Per-worker gauges are
 * computed at scrape time from the WorkerSet (collect callbacks), so the hot path only
 * touches counters and histograms.
 */
import { Counter, Gauge, Registry } from "prom-client";
import type { Selection } from "../router/types.ts";
import type { WorkerSet } from "../router/worker-set.ts";
import {
  type FastCounter,
  FastCounterFamily,
  type FastHistogram,
  FastHistogramFamily,
} from "../util/fast-metrics.ts";

const LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];
/** Routing decisions take microseconds to milliseconds (a KV index walk over hundreds of workers). */
const DECISION_BUCKETS = [
  0.000005, 0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
];
const ITL_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.5];

export interface ModelMetrics {
  ttft: { observe(v: number): void };
  itl: { observe(v: number): void };
  promptTokens: { inc(v: number): void };
  completionTokens: { inc(v: number): void };
}

export class ServerMetrics {
  readonly registry = new Registry();
  // Moved on every request or chunk: the fast families, appended to the registry's text.
  readonly requests: FastCounterFamily;
  readonly ttft: FastHistogramFamily;
  readonly itl: FastHistogramFamily;
  readonly e2e: FastHistogramFamily;
  readonly promptTokens: FastCounterFamily;
  readonly completionTokens: FastCounterFamily;
  readonly decisions: FastCounterFamily;
  readonly decisionSeconds: FastHistogramFamily;
  readonly retries: Counter<"model" | "reason">;
  readonly clientAborts: Counter<"model">;

  constructor(workers: WorkerSet) {
    const registers = [this.registry];
    this.requests = new FastCounterFamily(
      "infera_requests_total",
      "Requests answered, by model, endpoint and HTTP status",
      ["model", "endpoint", "status"],
    );
    this.ttft = new FastHistogramFamily(
      "infera_time_to_first_token_seconds",
      "Time from request arrival to the first streamed chunk",
      LATENCY_BUCKETS,
      ["model"],
    );
    this.itl = new FastHistogramFamily(
      "infera_inter_token_latency_seconds",
      "Gap between streamed chunks",
      ITL_BUCKETS,
      ["model"],
    );
    this.e2e = new FastHistogramFamily(
      "infera_e2e_request_latency_seconds",
      "Time from request arrival to the end of the answer",
      LATENCY_BUCKETS,
      ["model", "endpoint"],
    );
    this.promptTokens = new FastCounterFamily(
      "infera_prompt_tokens_total",
      "Prompt tokens reported by workers' usage",
      ["model"],
    );
    this.completionTokens = new FastCounterFamily(
      "infera_generation_tokens_total",
      "Completion tokens reported by workers' usage",
      ["model"],
    );
    this.decisions = new FastCounterFamily(
      "infera_routing_decisions_total",
      "Routing decisions by policy, reason and router kind",
      ["policy", "reason", "router"],
    );
    this.decisionSeconds = new FastHistogramFamily(
      "infera_routing_decision_seconds",
      "Time the routing policy took to choose a worker (prompt tokenizing and KV index lookup included)",
      DECISION_BUCKETS,
      ["policy", "router"],
    );
    this.retries = new Counter({
      name: "infera_retries_total",
      help: "Requests retried on another worker, by reason",
      labelNames: ["model", "reason"],
      registers,
    });
    this.clientAborts = new Counter({
      name: "infera_client_aborts_total",
      help: "Requests whose client went away before the answer ended",
      labelNames: ["model"],
      registers,
    });
    new Gauge({
      name: "infera_worker_in_flight",
      help: "Requests this server has in flight per worker",
      labelNames: ["worker", "model"],
      registers,
      collect() {
        this.reset();
        for (const w of workers.list()) this.set({ worker: w.id, model: w.record.model }, w.inFlight);
      },
    });
    new Gauge({
      name: "infera_worker_available",
      help: "1 while the worker is in rotation, 0 while its circuit breaker is open",
      labelNames: ["worker", "model"],
      registers,
      collect() {
        this.reset();
        for (const w of workers.list())
          this.set({ worker: w.id, model: w.record.model }, w.available ? 1 : 0);
      },
    });
    new Gauge({
      name: "infera_discovery_workers",
      help: "Live workers known from discovery, per served model name",
      labelNames: ["model"],
      registers,
      collect() {
        this.reset();
        for (const name of workers.modelNames())
          this.set({ model: name }, workers.group(name)?.all.length ?? 0);
      },
    });
    new Gauge({
      name: "infera_discovery_degraded",
      help: "1 while the discovery backend is unreachable and the last known set is served",
      registers,
      collect() {
        this.set(workers.degraded ? 1 : 0);
      },
    });
  }

  private readonly perModel = new Map<string, ModelMetrics>();

  /** Label children of one model, cached: the hot path skips prom-client's label hashing. */
  /** Routing's prompt tokenizing: pieced prompts, partial scores, ids reused from the cache. */
  watchPrompts(stats: { pieced: number; partial: number }, cache: { reusedTokens: number } | null): void {
    this.countedAt(
      "infera_prompt_tokenized_total",
      "Prompts tokenized for routing piece by piece (longer than one 512-character piece)",
      () => stats.pieced,
    );
    this.countedAt(
      "infera_prompt_partial_total",
      "Prompts scored on their head: the tokenizing budget (promptBudgetMs) ran out first",
      () => stats.partial,
    );
    this.countedAt(
      "infera_prompt_cache_reused_tokens_total",
      "Prompt token ids reused from the token prefix cache instead of tokenized",
      () => cache?.reusedTokens ?? 0,
    );
  }

  /**
   * The engine load scraper (./load-scraper.ts): `/metrics` requests this replica made, and
   * peers' readings it filed instead (one scrape shared among replicas, src/router/peers).
   */
  watchScraper(scraper: { scrapes: number; peerReadings: number }): void {
    this.countedAt(
      "infera_engine_scrapes_total",
      "Engine /metrics requests this replica made (its share of the scrapes, with peers)",
      () => scraper.scrapes,
    );
    this.countedAt(
      "infera_engine_load_peer_readings_total",
      "Engine load readings taken from peer replicas' scrapes instead of scraping",
      () => scraper.peerReadings,
    );
  }

  /**
   * The raw front (src/server/front/front.ts): requests it served itself, and client
   * connections it handed to node:http (a request it would not take: see request-head.ts).
   */
  watchFront(front: { served: number; handedOff: number }): void {
    this.countedAt(
      "infera_http_front_requests_total",
      "Requests the raw HTTP front served itself (the rest went to node:http)",
      () => front.served,
    );
    this.countedAt(
      "infera_http_front_handoffs_total",
      "Client connections the raw HTTP front handed to node:http (a request it does not take)",
      () => front.handedOff,
    );
  }

  /** A counter whose value is read from its owner at scrape time (no call on the counted path). */
  private countedAt(name: string, help: string, read: () => number): void {
    new Counter({
      name,
      help,
      registers: [this.registry],
      collect() {
        this.reset();
        this.inc(read());
      },
    });
  }

  /**
   * The pending bridges' entries (src/router/pipeline/pending-prefixes.ts) per model: `added`,
   * then how each left (confirmed by KV events, failed, cancelled, unconfirmed after the grace,
   * evicted, expired at the TTL, capped). Peers' announcements are counted by the peer mesh
   * (`infera_peer_announcements_*`).
   */
  watchBridges(read: () => Iterable<[model: string, counters: Readonly<Record<string, number>>]>): void {
    new Counter({
      name: "infera_routing_bridge_entries_total",
      help: "Pending-bridge entries per model: added, and by how they ended (confirmed, failed, cancelled, unconfirmed, evicted, expired, capped)",
      labelNames: ["model", "event"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const [model, c] of read())
          for (const [event, n] of Object.entries(c)) this.inc({ model, event }, n);
      },
    });
  }

  forModel(model: string): ModelMetrics {
    let m = this.perModel.get(model);
    if (!m) {
      m = {
        ttft: this.ttft.child(model),
        itl: this.itl.child(model),
        promptTokens: this.promptTokens.child(model),
        completionTokens: this.completionTokens.child(model),
      };
      this.perModel.set(model, m);
    }
    return m;
  }

  /**
   * The label children used last, by their label values: consecutive requests nearly always
   * repeat them, and comparing three values is cheaper than the family's lookup (a key string
   * joined per call, then hashed; ≈ 1–2.5 µs per request in the server's profile).
   */
  private readonly lastRequest = { model: "", endpoint: "", status: 0, child: null as FastCounter | null };
  private readonly lastE2e = { model: "", endpoint: "", child: null as FastHistogram | null };
  private readonly lastDecision = { policy: "", reason: "", router: "", child: null as FastCounter | null };

  /** `requests.inc({model, endpoint, status})`. */
  countRequest(model: string, endpoint: string, status: number): void {
    const l = this.lastRequest;
    if (l.child === null || l.status !== status || l.model !== model || l.endpoint !== endpoint) {
      l.child = this.requests.child(model, endpoint, String(status));
      l.model = model;
      l.endpoint = endpoint;
      l.status = status;
    }
    l.child.inc();
  }

  /** `e2e.observe({model, endpoint}, seconds)`. */
  observeE2e(model: string, endpoint: string, seconds: number): void {
    const l = this.lastE2e;
    if (l.child === null || l.model !== model || l.endpoint !== endpoint) {
      l.child = this.e2e.child(model, endpoint);
      l.model = model;
      l.endpoint = endpoint;
    }
    l.child.observe(seconds);
  }

  /** Prometheus text: the registry (with any extension's metrics) and the fast histograms. */
  async text(): Promise<string> {
    let out = await this.registry.metrics();
    for (const f of [this.requests, this.promptTokens, this.completionTokens, this.decisions])
      out += f.text();
    return out + this.ttft.text() + this.itl.text() + this.e2e.text() + this.decisionSeconds.text();
  }

  onDecision = (_model: string, policy: string, router: string, sel: Selection): void => {
    const l = this.lastDecision;
    if (l.child === null || l.reason !== sel.reason || l.policy !== policy || l.router !== router) {
      l.child = this.decisions.child(policy, sel.reason, router);
      l.policy = policy;
      l.reason = sel.reason;
      l.router = router;
    }
    l.child.inc();
    if (sel.seconds !== undefined) this.decisionHistogram(policy, router).observe(sel.seconds);
  };

  /** policy → router → histogram child: two lookups, no key string built per decision. */
  private readonly decisionChildren = new Map<string, Map<string, FastHistogram>>();

  private decisionHistogram(policy: string, router: string): FastHistogram {
    let byRouter = this.decisionChildren.get(policy);
    if (!byRouter) {
      byRouter = new Map();
      this.decisionChildren.set(policy, byRouter);
    }
    let h = byRouter.get(router);
    if (!h) {
      h = this.decisionSeconds.child(policy, router);
      byRouter.set(router, h);
    }
    return h;
  }

  onRetry = (model: string, reason: string): void => {
    this.retries.inc({ model, reason });
  };
}
