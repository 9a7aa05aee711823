/**
 * What the routers tell a request's trace (OpenTelemetry, src/server/tracing.ts): the routing
 * decision, each upstream attempt, the KV transfer between a PD pair's halves. The interface
 * lives here so the routers depend on no tracing package; a request without tracing has
 * `trace === undefined`, and every call site is `req.trace?.…`: with tracing off nothing is
 * built, looked up or allocated on the hot path.
 */
/** What a span names of a worker (a WorkerState fits; no import, so no cycle with ./types.ts). */
export interface TraceWorker {
  readonly record: { readonly id: string; readonly url: string };
}

/** Attribute values a span takes (OpenTelemetry's primitive and array values). */
export type TraceValue = string | number | boolean | readonly string[] | readonly number[];

/** One open span: attributes, then `end` (with the error that ended it, if one did). */
export interface TraceSpan {
  set(key: string, value: TraceValue): void;
  end(err?: unknown): void;
}

/** An upstream attempt's span: the headers to send (the request's own plus `traceparent`). */
export interface UpstreamSpan extends TraceSpan {
  readonly headers: Record<string, string>;
  /** The answer's HTTP status. */
  status(code: number): void;
}

/** The role an upstream attempt plays: a whole request, or one half of a PD pair. */
export type UpstreamRole = "mixed" | "prefill" | "decode";

export interface RequestTrace {
  /** A span for a phase of the request under its root (`intake`, `queue`, `stream`, …). */
  phase(name: string): TraceSpan;
  /**
   * The routing decision for `step` among `candidates`; the pipeline adds its scores to the open
   * decision (`scores`), the router names the winner and reason (`chose`) and ends it.
   */
  route(step: string, candidates: readonly TraceWorker[]): RouteSpan;
  /** One attempt on `worker`; `headers` are the request's own, `traceparent` is added. */
  upstream(role: UpstreamRole, worker: TraceWorker, headers: Record<string, string>): UpstreamSpan;
  /**
   * The pipeline's per-candidate totals (lower is better) and per-scorer weighted values of the
   * decision open for `step`, candidates given as positions in `all`.
   */
  scores(
    step: string,
    all: readonly TraceWorker[],
    kept: readonly number[],
    scorerNames: readonly string[],
    values: Float64Array | null,
    totals: Float64Array,
  ): void;
}

export interface RouteSpan extends TraceSpan {
  /** The chosen worker and the policy's reason; ends the span. */
  chose(winner: TraceWorker | null, reason: string, extra?: Record<string, TraceValue>): void;
}
