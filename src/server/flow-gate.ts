/**
 * Flow control at the server (issue #29 items 1–3, 5): reads a request's band
 * (`x-infera-priority`, else vLLM's `priority` body field), flow key (`x-infera-tenant` when
 * allowed, else the API key's digest) and TTFT target, applies the flow's RPM/TPM limits, and
 * waits in the replica's admission queue (src/router/flow/queue.ts) until a worker has
 * headroom. Nothing is written to the client before that: headers go out at dispatch.
 *
 * Replicas share nothing of the queue: each holds its own entries, counters and limits
 * (limits split by `flow.replicas`). What they do share is what every headroom signal reads —
 * the engines' scraped queues and KV usage, which count every replica's requests — and the
 * peers' routed prompts (src/router/peers) that the kv-prefix scorer counts as pending.
 */
import { createHash } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import { BadRequestError } from "../protocol/errors.ts";
import {
  type FlowConfig,
  type FlowConfigLayer,
  resolveFlowConfig,
  type TenantConfig,
} from "../router/flow/config-schema.ts";
import type { HeadroomRequest, HeadroomScope, HeadroomSignal } from "../router/flow/headroom.ts";
import { FlowRejectedError, RateLimiter } from "../router/flow/limits.ts";
import type { CachedTokensOf } from "../router/flow/locality.ts";
import { type Admission, FlowQueue } from "../router/flow/queue.ts";
import { headroomSignals } from "../router/flow/registry.ts";
import type { TtftPredictor } from "../router/predict/ttft.ts";
import type { RoutingPolicy, RoutingRequest } from "../router/types.ts";
import type { WorkerSet } from "../router/worker-set.ts";
import type { AbortLike } from "../util/abort.ts";
import { apiKeyOf } from "./auth.ts";
import type { FlowView } from "./dashboard/wire.ts";
import type { LoadScraper } from "./load-scraper.ts";

const TENANT_RE = /^[A-Za-z0-9._:-]{1,64}$/;
const WAIT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

/** What the gate needs of a parsed request. */
export interface GateRequest {
  readonly requestId: string;
  readonly model: string;
  readonly body: Readonly<Record<string, unknown>>;
  /** Prompt tokens (exact when tokenized ahead, else an estimate). */
  readonly promptTokens: number;
  /** The prompt's cached tokens per candidate (locality: src/router/flow/locality.ts), if known. */
  readonly cachedTokens?: CachedTokensOf;
}

export class FlowGate {
  readonly queue: FlowQueue;
  private readonly cfg: FlowConfig;
  private readonly limiter: RateLimiter;
  private readonly signals = new Map<string, HeadroomSignal[]>();
  private readonly rejected: Record<string, number> = {};
  private readonly waits: number[] = [];
  private readonly rejections: Counter<"band" | "reason">;

  /** The server's TTFT predictor, for the `predicted-ttft` signal (HeadroomScope.ttft). */
  private readonly ttft: TtftPredictor | undefined;

  /** The model's routing policy: its overlap source tells locality where a prompt is cached. */
  private readonly policyFor: ((model: string) => RoutingPolicy) | undefined;

  /** Replicas sharing the engines (HeadroomScope.replicas): the peer plane's live set, if any. */
  private readonly liveReplicas: () => number | null;

  constructor(
    cfg: FlowConfig,
    workers: WorkerSet,
    registry: Registry,
    ttft?: TtftPredictor,
    policyFor?: (model: string) => RoutingPolicy,
    liveReplicas: () => number | null = () => null,
  ) {
    this.liveReplicas = liveReplicas;
    this.ttft = ttft;
    this.policyFor = policyFor;
    this.cfg = cfg;
    this.limiter = new RateLimiter(cfg.replicas);
    const registers = [registry];
    const waitHist = new Histogram({
      name: "infera_flow_queue_wait_seconds",
      help: "Time requests waited in the admission queue before dispatch (queued ones only)",
      labelNames: ["band"],
      buckets: WAIT_BUCKETS,
      registers,
    });
    const dispatched = new Counter({
      name: "infera_flow_dispatched_total",
      help: "Requests let through by flow control, by band and whether they waited",
      labelNames: ["band", "queued"],
      registers,
    });
    const rejections = new Counter({
      name: "infera_flow_rejections_total",
      help: "Requests refused by flow control, by band and reason (queue_full, queue_timeout, rate_limit_rpm, rate_limit_tpm, no_worker)",
      labelNames: ["band", "reason"],
      registers,
    });
    const depthGauge = new Gauge({
      name: "infera_flow_queue_depth",
      help: "Requests waiting in this replica's admission queue, by band and flow (unlisted tenants: other)",
      labelNames: ["band", "flow"],
      registers,
      collect: () => {
        depthGauge.reset();
        for (const b of this.queue.snapshot()) {
          depthGauge.set({ band: b.band, flow: "other" }, 0);
          for (const f of b.flows) depthGauge.inc({ band: b.band, flow: this.flowLabel(f.flow) }, f.depth);
        }
      },
    });
    const locality = new Counter({
      name: "infera_flow_locality_total",
      help: "Locality of release (flow.locality): local (released where its prompt is cached best, or nowhere notably better), escaped (elsewhere after the wait), deferred (passed over for it)",
      labelNames: ["outcome"],
      registers,
    });
    this.queue = new FlowQueue({
      bands: cfg.bands,
      maxQueue: cfg.maxQueue,
      locality: cfg.locality,
      candidates: (m) => workers.group(m)?.available ?? [],
      signals: (m) => this.signalsFor(m),
      observer: {
        onDispatched: (band, _flow, waitedMs, queued) => {
          dispatched.inc({ band, queued: String(queued) });
          if (!queued) return;
          waitHist.observe({ band }, waitedMs / 1000);
          this.waits.push(Math.round(waitedMs));
          if (this.waits.length > 200) this.waits.shift();
        },
        onRejected: (band, _flow, reason) => this.countReject(band, reason, rejections),
        onLocality: (outcome) => locality.inc({ outcome }),
      },
    });
    this.rejections = rejections;
    workers.onChange((ev) => {
      if (ev.type === "removed")
        for (const list of this.signals.values()) for (const s of list) s.onWorkerRemoved?.(ev.worker.id);
      this.queue.wake();
    });
  }

  /** Headroom may have freed (an engine-metrics scrape came in). */
  wake(): void {
    this.queue.wake();
  }

  /**
   * Limits, then the queue: resolves when the request may be routed (its admission tells the
   * router which workers had headroom), rejects with a 400, 429 or 503 InferaError, or with the
   * abort's reason when the client left while queued.
   */
  async admit(r: GateRequest, headers: IncomingHttpHeaders, signal: AbortLike): Promise<Admission> {
    checkPriority(r.body);
    const band = this.bandOf(headers, r.body);
    const flow = this.flowOf(headers);
    const tenant = this.cfg.tenants[flow] ?? this.cfg.defaultTenant;
    const expected = expectedOutput(r.body) ?? this.cfg.expectedOutputTokens;
    const bandName = this.cfg.bands[band].name;
    try {
      this.limiter.take(flow, tenant, r.promptTokens + expected);
    } catch (err) {
      if (err instanceof FlowRejectedError) this.countReject(bandName, err.reason, this.rejections);
      throw err;
    }
    const target = Number(headers["x-infera-ttft-target-ms"]);
    const hr: HeadroomRequest = {
      requestId: r.requestId,
      model: r.model,
      promptTokens: r.promptTokens,
      expectedOutputTokens: expected,
      band,
      bandName,
      priority: typeof r.body.priority === "number" ? r.body.priority : undefined,
      targetTtftMs: Number.isFinite(target) && target > 0 ? target : undefined,
      cachedTokens: r.cachedTokens,
    };
    return this.queue.admit(hr, flow, tenant.weight, signal, r.cachedTokens);
  }

  /**
   * `admit` for the proxy: the request's admission goes on `rreq` for the router, and the
   * ticket reports the first token and the end back to the queue.
   */
  async ticket(
    rreq: RoutingRequest,
    promptTokens: number,
    headers: IncomingHttpHeaders,
    signal: AbortLike,
  ): Promise<FlowTicket> {
    // The policy's overlap source: locality's where-is-it-cached, and the uncached prompt the
    // `predicted-ttft` signal predicts on (HeadroomRequest.cachedTokens).
    const policy = this.policyFor?.(rreq.model);
    const cachedTokens: CachedTokensOf | undefined = policy?.cachedTokens
      ? (cands) => policy.cachedTokens?.(rreq, cands) ?? null
      : undefined;
    const r = { requestId: rreq.requestId, model: rreq.model, body: rreq.body, promptTokens, cachedTokens };
    const admission = await this.admit(r, headers, signal);
    rreq.admission = admission;
    return new FlowTicket(admission, () => this.queue.wake());
  }

  /** The dashboard's view: depth per band and flow, rejections, recent waits. */
  snapshot(): FlowView {
    const w = [...this.waits].sort((a, b) => a - b);
    const q = (p: number) => (w.length === 0 ? null : w[Math.min(w.length - 1, Math.floor(p * w.length))]);
    return {
      depth: this.queue.depth,
      bands: this.queue.snapshot(),
      rejected: { ...this.rejected },
      waits: { count: w.length, p50: q(0.5), p90: q(0.9), max: w.length ? w[w.length - 1] : null },
    };
  }

  private countReject(band: string, reason: string, c: Counter<"band" | "reason">): void {
    c.inc({ band, reason });
    this.rejected[reason] = (this.rejected[reason] ?? 0) + 1;
  }

  private signalsFor(model: string): HeadroomSignal[] {
    let list = this.signals.get(model);
    if (!list) {
      const store = new Map<string, unknown>();
      const scope: HeadroomScope = {
        model,
        ttft: this.ttft,
        replicas: () => this.liveReplicas() ?? this.cfg.replicas,
        shared<T>(key: string, make: () => T): T {
          if (!store.has(key)) store.set(key, make());
          return store.get(key) as T;
        },
      };
      list = this.cfg.headroom.map((ref) => {
        const def = headroomSignals.get(ref.name);
        if (!def) throw new Error(`unknown headroom signal '${ref.name}'`);
        return def.build(scope, ref.params);
      });
      this.signals.set(model, list);
    }
    return list;
  }

  /** Band index: the header's band name, else the body's vLLM priority, else the default. */
  private bandOf(headers: IncomingHttpHeaders, body: Readonly<Record<string, unknown>>): number {
    const h = headers["x-infera-priority"];
    if (typeof h === "string" && h !== "") {
      const i = this.cfg.bands.findIndex((b) => b.name === h.trim().toLowerCase());
      if (i < 0)
        throw new BadRequestError(
          `Unknown x-infera-priority '${h.slice(0, 40)}'; expected one of ${this.cfg.bands.map((b) => b.name).join(", ")}.`,
          "x-infera-priority",
          "invalid_priority",
        );
      return i;
    }
    const p = body.priority;
    if (typeof p === "number") {
      const i = this.cfg.bands.findIndex((b) => b.bodyPriorityMax !== undefined && p <= b.bodyPriorityMax);
      if (i >= 0) return i;
    }
    return this.cfg.defaultBand;
  }

  /** The flow key: the tenant header when allowed, else the API key's digest, else "default". */
  private flowOf(headers: IncomingHttpHeaders): string {
    if (this.cfg.tenantHeader) {
      const t = headers["x-infera-tenant"];
      if (typeof t === "string" && t !== "") {
        if (!TENANT_RE.test(t))
          throw new BadRequestError(
            "x-infera-tenant must be 1–64 of A-Z a-z 0-9 . _ : -",
            "x-infera-tenant",
            "invalid_tenant",
          );
        return t;
      }
    }
    const key = apiKeyOf(headers);
    return key ? `key-${createHash("sha256").update(key).digest("hex").slice(0, 12)}` : "default";
  }

  /** Metric label of a flow: configured tenants by name, the rest as `other` (bounded series). */
  private flowLabel(flow: string): string {
    return flow in this.cfg.tenants || flow === "default" ? flow : "other";
  }
}

/**
 * `t.first` as a closure, made outside the ticket's own methods: a closure over `this` written
 * into `this` by the method that made it kept every ticket, and with it the request, alive
 * through young-generation collections under Node 24's Maglev tier (src/server/http-util.ts).
 */
const firstReporter = (t: FlowTicket) => (): void => t.first();

/** A dispatched request's report to the queue: first token (prefill backlog freed), end. */
export class FlowTicket {
  private readonly admission: Admission;
  private readonly wake: () => void;
  private readonly dispatchedAt = performance.now();
  private firstAt = 0;
  /** The answer's first streamed token: the prompt's prefill backlog left its worker. */
  readonly onFirst: () => void;

  constructor(admission: Admission, wake: () => void) {
    this.admission = admission;
    this.wake = wake;
    this.onFirst = firstReporter(this);
  }

  /** The first token came (once). */
  first(): void {
    if (this.firstAt > 0) return;
    this.firstAt = performance.now();
    this.admission.first(this.firstAt - this.dispatchedAt);
    this.wake();
  }

  /** The request ended with upstream `status` (0: none came) and its output tokens, if known. */
  end(status: number, outputTokens: number | undefined): void {
    this.admission.finish({
      ok: status >= 200 && status < 300,
      outputTokens,
      ttftMs: this.firstAt > 0 ? this.firstAt - this.dispatchedAt : undefined,
    });
  }
}

function expectedOutput(body: Readonly<Record<string, unknown>>): number | undefined {
  const v = body.max_completion_tokens ?? body.max_tokens;
  return typeof v === "number" && Number.isInteger(v) && v > 0 ? v : undefined;
}

/**
 * vLLM's `priority` is an int (vllm/entrypoints/openai/protocol.py, pydantic: a non-integer is
 * a 400 there too); it is passed on unchanged.
 */
export function checkPriority(body: Readonly<Record<string, unknown>>): void {
  const p = body.priority;
  if (p === undefined || p === null) return;
  if (typeof p !== "number" || !Number.isSafeInteger(p))
    throw new BadRequestError(
      "`priority` must be an integer (lower means earlier).",
      "priority",
      "invalid_priority",
    );
}

export type { TenantConfig };

/** The gate for the config's `flow` section, or undefined when flow control is off. */
export function createFlowGate(
  layer: FlowConfigLayer | undefined,
  workers: WorkerSet,
  registry: Registry,
  scraper: LoadScraper,
  ttft?: TtftPredictor,
  policyFor?: (model: string) => RoutingPolicy,
): FlowGate | undefined {
  const cfg = resolveFlowConfig(layer);
  if (!cfg.enabled) return undefined;
  const gate = new FlowGate(cfg, workers, registry, ttft, policyFor, () => scraper.liveReplicas());
  scraper.onScraped = () => gate.wake();
  return gate;
}
