/**
 * What every routed request handler shares (the completion endpoints in ./proxy.ts, the
 * gateway's translated and pass-through ones in ./api/): the server context they run in, the
 * request's id and abort, and the steps that do not differ between them. A neutral module, so
 * that ./proxy.ts and ./api/ import it and not each other.
 */
import { randomUUID } from "node:crypto";
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";
import type { ChatCompletionRequest, CompletionRequest } from "../protocol/openai.ts";
import type { AutoRouter } from "../router/auto.ts";
import type { TraceSpan } from "../router/trace.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import type { RequestExecutor, RoutedEndpoint } from "../transport/types.ts";
import { RequestAbort } from "../util/abort.ts";
import type { Logger } from "../util/log.ts";
import { traceParsed } from "./admission.ts";
import type { ApiKeyAuth } from "./auth.ts";
import type { BodyParserPool } from "./body-parser-pool.ts";
import type { FlowGate } from "./flow-gate.ts";
import { BodyAbortedError, discardRefusedBody } from "./http-util.ts";
import type { ServerMetrics } from "./metrics.ts";
import { type PromptLimits, ServerRoutingRequest } from "./routing-request.ts";
import type { RequestTracer, ServerRequestTrace } from "./tracing.ts";

export interface ProxyContext {
  router: AutoRouter;
  executor: RequestExecutor;
  tokenizer: Tokenizer;
  metrics: ServerMetrics;
  auth: ApiKeyAuth;
  maxBodyBytes: number;
  /** A non-streamed answer larger than this is relayed as it arrives instead of buffered whole. */
  maxResponseBufferBytes: number;
  /** Whether routing reads the prompt (tokenize long prompts ahead, in slices). */
  preparePrompt: boolean;
  /** Tokenizing budget and the cache of earlier prompts' ids (default: 100 ms, no cache). */
  promptLimits?: PromptLimits;
  logger: Logger;
  /** Where bodies past OFF_LOOP_BODY_BYTES are parsed (default: the process's shared pool). */
  bodyParser?: BodyParserPool;
  /** The aborts of requests in flight: a drain whose grace period ran out cuts them (DrainCutError). */
  inFlight?: Set<RequestAbort>;
  /** OpenTelemetry (./tracing.ts); absent when tracing is off, and then nothing is traced. */
  tracer?: RequestTracer;
  /** Flow control (config `flow`): limits and the admission queue in front of the router. */
  flow?: FlowGate;
}

/**
 * The reason a drain's grace period gives when it cuts the requests still in flight: a stream
 * ends with an error event and `[DONE]` (not a bare reset), an unanswered request gets a 503.
 */
export class DrainCutError extends Error {
  constructor() {
    super("drain grace period over");
  }
}

const REQUEST_ID_RE = /^[\x21-\x7e]{1,200}$/;

export function requestIdOf(req: IncomingMessage): string {
  const given = req.headers["x-request-id"];
  return typeof given === "string" && REQUEST_ID_RE.test(given) ? given : randomUUID();
}

/** The request's abort: fired when the client leaves before the answer ended; a drain may cut it. */
export function requestAbort(ctx: ProxyContext, res: ServerResponse): RequestAbort {
  const abort = new RequestAbort();
  ctx.inFlight?.add(abort);
  res.once("close", () => {
    if (!res.writableFinished) abort.abort();
  });
  return abort;
}

/** A gateway request's start: its clock, its id, and its abort (registered for the drain). */
export function startRequest(
  ctx: ProxyContext,
  req: IncomingMessage,
  res: ServerResponse,
): { started: number; requestId: string; abort: RequestAbort } {
  return { started: performance.now(), requestId: requestIdOf(req), abort: requestAbort(ctx, res) };
}

/** The parsed request as routing sees it, its intake phase ended on the trace. */
export function routingRequestOf(
  ctx: ProxyContext,
  headers: IncomingHttpHeaders,
  requestId: string,
  endpoint: RoutedEndpoint,
  body: ChatCompletionRequest | CompletionRequest,
  tr: ServerRequestTrace | undefined,
  intake: TraceSpan | undefined,
): ServerRoutingRequest {
  const rreq = new ServerRoutingRequest(
    requestId,
    body.model,
    endpoint,
    body,
    body.stream === true,
    typeof body.cache_salt === "string" ? body.cache_salt : undefined,
    ctx.tokenizer,
    ctx.promptLimits,
  );
  rreq.headers = headers;
  traceParsed(tr, intake, rreq);
  return rreq;
}

/**
 * For a request that failed because its client left (or whose response is gone): counts the
 * abort, destroys the response and says true; otherwise false, and the failure is answered.
 */
export function droppedForClient(
  ctx: ProxyContext,
  err: unknown,
  res: ServerResponse,
  model: string,
  abort: RequestAbort | null,
): boolean {
  if (!(err instanceof BodyAbortedError || abort?.aborted || res.destroyed)) return false;
  ctx.metrics.clientAborts.inc({ model });
  if (!res.destroyed) res.destroy();
  return true;
}

/**
 * Counts a failed request about to be answered with `status`. Only models the fleet knows are
 * labelled, so arbitrary client strings cannot grow the series. A refused upload may still be
 * arriving: it is read and dropped (bounded) so the client reads the answer; only one past the
 * bound gets `connection: close`.
 */
export function countFailure(
  ctx: ProxyContext,
  req: IncomingMessage,
  res: ServerResponse,
  model: string,
  label: string,
  status: number,
): void {
  const known = model !== "" && ctx.router.knows(model);
  ctx.metrics.countRequest(known ? model : "", label, status);
  if (status === 413 && !discardRefusedBody(req)) res.setHeader("connection", "close");
}
