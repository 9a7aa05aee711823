/**
 * What every routed endpoint (chat/completions in ./proxy.ts, the translated /v1/responses and
 * /v1/messages in ./api/translated.ts) does between parsing a request and routing it: the trace's
 * intake ends and the request joins its trace, then flow control's admission (traced as `queue`).
 */
import type { IncomingHttpHeaders } from "node:http";
import type { TraceSpan } from "../router/trace.ts";
import type { AbortLike } from "../util/abort.ts";
import type { FlowGate, FlowTicket } from "./flow-gate.ts";
import type { ServerRoutingRequest } from "./routing-request.ts";
import type { ServerRequestTrace } from "./tracing.ts";

/** The parsed request joins its trace (routing adds its spans there); the intake phase ends. */
export function traceParsed(
  tr: ServerRequestTrace | undefined,
  intake: TraceSpan | undefined,
  rreq: ServerRoutingRequest,
): void {
  if (!tr) return;
  intake?.end();
  tr.root.setAttribute("gen_ai.request.model", rreq.model);
  rreq.trace = tr;
}

/** A request that failed: its open phases end (the one in progress with the error), then its root. */
export function traceFailed(
  tr: ServerRequestTrace | undefined,
  intake: TraceSpan | undefined,
  relay: TraceSpan | undefined,
  err: unknown,
): void {
  if (!tr) return;
  intake?.end();
  relay?.end(err);
  tr.finish((err as { status?: number }).status ?? 499, err);
}

/**
 * Flow control: waits, no headers sent, until a worker has headroom; null when flow control is
 * off. Rejects with the gate's 400/429/503 (Retry-After in its headers) or the abort's reason.
 * The caller must not await between this and `router.handle`, which claims the worker
 * synchronously (the queue's next dispatch must see that claim). The prompt's size is its
 * token count when tokenized ahead, else an estimate from the body's bytes.
 */
export async function admit(
  flow: FlowGate | undefined,
  rreq: ServerRoutingRequest,
  bodyBytes: number,
  headers: IncomingHttpHeaders,
  abort: AbortLike,
  tr: ServerRequestTrace | undefined,
  tokenized: boolean,
): Promise<FlowTicket | null> {
  if (!flow) return null;
  const tokens = tokenized ? rreq.promptTokens().length : Math.ceil(bodyBytes / 4);
  const queued = tr?.phase("queue");
  try {
    return await flow.ticket(rreq, tokens, headers, abort);
  } finally {
    queued?.end();
  }
}
