/**
 * OpenTelemetry tracing of requests (issue #31 item 4), off unless `--otlp-endpoint` (config
 * `otlpEndpoint`) names an OTLP/HTTP collector (e.g. `http://collector:4318`; `/v1/traces` is
 * appended unless the URL already has a path). Spans are exported in batches, as OTLP/HTTP JSON
 * (@opentelemetry/exporter-trace-otlp-http's encoding).
 *
 * One tree per request: the root `infera.request` (SERVER kind; its parent is the client's W3C
 * `traceparent` when one came) with children `intake` (auth, body read and parse), `queue` (a
 * hook for an admission queue: `trace.phase("queue")`), `route` (one per decision: candidates,
 * winner, reason, the pipeline's per-candidate scores as attributes), `upstream` (CLIENT kind,
 * one per attempt and one per PD half, `infera.role` = mixed | prefill | decode; its context
 * goes to the engine as `traceparent`, which vLLM started with `--otlp-traces-endpoint` uses as
 * the parent of its own request span), `kv_transfer` (from P's answer to D's first byte) and
 * `stream` (relaying the answer).
 *
 * No context manager and no global provider: spans are parented explicitly, so nothing here
 * depends on async-context propagation, and with tracing off the server holds no tracer at all
 * (the request's `trace` stays undefined; see src/router/trace.ts).
 */
import type { IncomingHttpHeaders } from "node:http";
import {
  type Attributes,
  type Context,
  defaultTextMapGetter,
  defaultTextMapSetter,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";

export { otlpTracesUrl } from "../util/otlp-url.ts";

import type {
  RequestTrace,
  RouteSpan,
  TraceSpan,
  TraceValue,
  TraceWorker,
  UpstreamRole,
  UpstreamSpan,
} from "../router/trace.ts";
import { otlpTracesUrl } from "../util/otlp-url.ts";

export interface TracingOptions {
  /** OTLP/HTTP collector: base URL (`/v1/traces` appended) or the full traces URL. */
  endpoint: string;
  /** `service.name` of the spans (default `infera-server`). */
  serviceName?: string;
  /** Batch export delay (default 1000 ms; tests use less). */
  exportDelayMs?: number;
}

const propagator = new W3CTraceContextPropagator();

/** The server's tracer: one per process, started when tracing is on. */
export class RequestTracer {
  private readonly provider: TracerProvider;
  private readonly tracer: Tracer;

  constructor(o: TracingOptions) {
    this.provider = new TracerProvider({
      resource: resourceFromAttributes({ "service.name": o.serviceName ?? "infera-server" }),
      spanProcessors: [
        new BatchSpanProcessor({
          exporter: new OTLPTraceExporter({ url: otlpTracesUrl(o.endpoint) }),
          scheduledDelayMillis: o.exportDelayMs ?? 1000,
        }),
      ],
    });
    this.tracer = this.provider.getTracer("infera.server");
  }

  /** A request's trace, its root parented on the client's `traceparent` when valid. */
  start(headers: IncomingHttpHeaders, requestId: string, endpoint: string): ServerRequestTrace {
    const parent = propagator.extract(ROOT_CONTEXT, headers, defaultTextMapGetter);
    const root = this.tracer.startSpan(
      "infera.request",
      {
        kind: SpanKind.SERVER,
        attributes: { "infera.request_id": requestId, "infera.endpoint": endpoint },
      },
      parent,
    );
    return new ServerRequestTrace(this.tracer, root);
  }

  /** Exports what is buffered (tests, shutdown). */
  flush(): Promise<void> {
    return this.provider.forceFlush();
  }

  shutdown(): Promise<void> {
    return this.provider.shutdown();
  }
}

function endSpan(span: Span, err?: unknown): void {
  if (err !== undefined) {
    span.setStatus({
      code: SpanStatusCode.ERROR,
      message: err instanceof Error ? err.message : String(err),
    });
  }
  span.end();
}

class PhaseSpan implements TraceSpan {
  protected readonly span: Span;
  private ended = false;
  constructor(span: Span) {
    this.span = span;
  }
  set(key: string, value: TraceValue): void {
    this.span.setAttribute(key, value as Attributes[string]);
  }
  end(err?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    endSpan(this.span, err);
  }
}

class Upstream extends PhaseSpan implements UpstreamSpan {
  readonly headers: Record<string, string>;
  constructor(span: Span, headers: Record<string, string>) {
    super(span);
    const h = { ...headers };
    propagator.inject(trace.setSpan(ROOT_CONTEXT, span), h, defaultTextMapSetter);
    this.headers = h;
  }
  status(code: number): void {
    this.span.setAttribute("http.response.status_code", code);
    if (code >= 500) this.span.setStatus({ code: SpanStatusCode.ERROR, message: `HTTP ${code}` });
  }
}

class Route extends PhaseSpan implements RouteSpan {
  readonly step: string;
  constructor(span: Span, step: string) {
    super(span);
    this.step = step;
  }
  chose(winner: TraceWorker | null, reason: string, extra?: Record<string, TraceValue>): void {
    if (winner) this.span.setAttribute("infera.route.winner", winner.record.id);
    this.span.setAttribute("infera.route.reason", reason);
    if (extra) for (const k in extra) this.set(k, extra[k]);
    this.end();
  }
}

/** One request's spans; `root` ends with `finish`. */
export class ServerRequestTrace implements RequestTrace {
  private readonly tracer: Tracer;
  readonly root: Span;
  private readonly ctx: Context;
  private openRoute: Route | null = null;

  constructor(tracer: Tracer, root: Span) {
    this.tracer = tracer;
    this.root = root;
    this.ctx = trace.setSpan(ROOT_CONTEXT, root);
  }

  phase(name: string): TraceSpan {
    return new PhaseSpan(this.tracer.startSpan(name, undefined, this.ctx));
  }

  route(step: string, candidates: readonly TraceWorker[]): RouteSpan {
    const span = this.tracer.startSpan(
      "route",
      {
        attributes: {
          "infera.route.step": step,
          "infera.route.candidates": candidates.map((w) => w.record.id),
        },
      },
      this.ctx,
    );
    const r = new Route(span, step);
    this.openRoute = r;
    return r;
  }

  // The parameters are RequestTrace's (documented there), not a second copy of the list.
  scores(...[step, all, kept, scorerNames, values, totals]: Parameters<RequestTrace["scores"]>): void {
    const r = this.openRoute;
    if (!r || (r.step !== step && !(r.step === "pd" && (step === "prefill" || step === "decode")))) return;
    const prefix = r.step === step ? "infera.route" : `infera.route.${step}`;
    r.set(
      `${prefix}.scored`,
      kept.map((k) => all[k].record.id),
    );
    r.set(`${prefix}.scores`, Array.from(totals));
    if (values) {
      const n = kept.length;
      scorerNames.forEach((name, s) => {
        r.set(`${prefix}.scorer.${name}`, Array.from(values.subarray(s * n, (s + 1) * n)));
      });
    }
  }

  upstream(role: UpstreamRole, worker: TraceWorker, headers: Record<string, string>): UpstreamSpan {
    const span = this.tracer.startSpan(
      "upstream",
      {
        kind: SpanKind.CLIENT,
        attributes: {
          "infera.role": role,
          "infera.worker": worker.record.id,
          "server.address": worker.record.url,
        },
      },
      this.ctx,
    );
    return new Upstream(span, headers);
  }

  /** Ends the root with the answer's status (and the error, if one ended the request). */
  finish(status: number, err?: unknown): void {
    this.root.setAttribute("http.response.status_code", status);
    if (err === undefined && status >= 500)
      this.root.setStatus({ code: SpanStatusCode.ERROR, message: `HTTP ${status}` });
    endSpan(this.root, err);
  }
}
