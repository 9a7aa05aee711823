/**
 * The OpenAI completion endpoints: parse and validate the body, route it, and relay the
 * worker's answer. Streams are relayed event by event with backpressure; a client that goes
 * away aborts the upstream request at once, streamed or not.
 */
import { isUtf8 } from "node:buffer";
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { InvalidJsonError, UpstreamError } from "../protocol/errors.ts";
import { parseChatRequest, parseCompletionRequest } from "../protocol/openai.ts";
import type { AutoRouter } from "../router/auto.ts";
import type { TraceSpan } from "../router/trace.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import {
  contentTypeOf,
  type RequestExecutor,
  type RoutedEndpoint,
  type UpstreamResponse,
} from "../transport/types.ts";
import { RequestAbort } from "../util/abort.ts";
import type { Logger } from "../util/log.ts";
import type { ApiKeyAuth } from "./auth.ts";
import {
  type BodyParserPool,
  bodyParserPool,
  OFF_LOOP_BODY_BYTES,
  parseBodySync,
} from "./body-parser-pool.ts";
import type { FlowGate, FlowTicket } from "./flow-gate.ts";
import { setForwardBody } from "./forward-body.ts";
import { BodyAbortedError, discardRefusedBody, readBody, releaseBody, sendError } from "./http-util.ts";
import type { ServerMetrics } from "./metrics.ts";
import { pump } from "./pump.ts";
import { relayWhole } from "./relay-whole.ts";
import { type PromptLimits, ServerRoutingRequest } from "./routing-request.ts";
import { SseUsageFilter, type Usage } from "./sse.ts";
import type { RequestTracer, ServerRequestTrace } from "./tracing.ts";

export { pump } from "./pump.ts";

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

export async function handleCompletion(
  ctx: ProxyContext,
  endpoint: RoutedEndpoint,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const started = performance.now();
  const requestId = requestIdOf(req);
  const endpointLabel = endpoint === "chat" ? "chat" : "completions";
  let model = "";
  let ac: RequestAbort | null = null;
  let raw: Buffer | null = null;
  /** The upstream answer's status, once one came (0: none). */
  let answered = 0;
  const tr: ServerRequestTrace | undefined = ctx.tracer?.start(req.headers, requestId, endpoint);
  const intake = tr?.phase("intake");
  let relay: TraceSpan | undefined;
  let ticket: FlowTicket | null = null;
  let usage: Usage | null = null;
  try {
    ctx.auth.check(req.headers);
    raw = await readBody(req, ctx.maxBodyBytes);
    if (!isUtf8(raw)) throw new InvalidJsonError("the body is not valid UTF-8");
    let parsed: unknown;
    // A big body's decode and parse took 15–25 ms of this thread in one slice: parse it on a
    // worker (the buffer moves there and back). Small bodies keep the synchronous path.
    if (raw.length > OFF_LOOP_BODY_BYTES)
      ({ value: parsed, raw } = await (ctx.bodyParser ?? bodyParserPool()).parse(raw));
    else parsed = parseBodySync(raw);
    const body = endpoint === "chat" ? parseChatRequest(parsed) : parseCompletionRequest(parsed);
    model = body.model;
    const router = ctx.router.routerFor(model);
    const stream = body.stream === true;
    const clientWantsUsage = setForwardBody(body, parsed, raw);
    const rreq = new ServerRoutingRequest(
      requestId,
      model,
      endpoint,
      body,
      stream,
      typeof body.cache_salt === "string" ? body.cache_salt : undefined,
      ctx.tokenizer,
      ctx.promptLimits,
    );
    rreq.headers = req.headers;
    if (tr) {
      intake!.end();
      tr.root.setAttribute("gen_ai.request.model", model);
      rreq.trace = tr;
    }
    const abort = watchClient(ctx, res);
    ac = abort;
    if (ctx.preparePrompt) {
      const pending = rreq.prepare();
      if (pending) await pending;
    }
    if (res.destroyed) return;
    // Flow control: waits here, no headers sent, until a worker has headroom. Nothing may await
    // between this and router.handle, which claims the worker synchronously (the queue's next
    // dispatch must see that claim).
    if (ctx.flow) {
      const tokens = ctx.preparePrompt ? rreq.promptTokens().length : Math.ceil(raw.length / 4);
      const queued = tr?.phase("queue");
      try {
        ticket = await ctx.flow.ticket(rreq, tokens, req.headers, abort);
      } finally {
        queued?.end();
      }
    }
    const up = await router.handle(rreq, ctx.executor, abort);
    answered = up.status;
    if (abort.aborted) {
      up.abort();
      throw abort.reason;
    }
    relay = tr?.phase("stream");
    usage = await relayAnswer(ctx, res, up, rreq, started, !clientWantsUsage, abort, ticket);
    if (tr) {
      relay!.end();
      tr.finish(up.status);
    }
    countAnswered(ctx, model, endpointLabel, up.status, usage, started);
  } catch (err) {
    if (tr) {
      intake!.end();
      relay?.end(err);
      tr.finish((err as { status?: number }).status ?? 499, err);
    }
    answerFailure(ctx, err, req, res, requestId, model, endpointLabel, ac);
  } finally {
    if (ac) ctx.inFlight?.delete(ac);
    ticket?.end(answered, usage?.completion_tokens);
    if (raw) releaseUnlessSending(raw, answered);
  }
}

/**
 * Returns a body's buffer to the pool once nothing can read it; `answered` is the worker's
 * status (0: none came). undici writes a Buffer body with one socket.write, which may still be
 * sending from it after the call; but an attempt that failed destroyed its connection (a
 * connection error, an abort), and an engine that answered 2xx had read the whole prompt first.
 * An error answer may come before the engine read the body, the connection kept and still
 * sending from this buffer: that one is left to the GC. Over NATS the bytes are copied into
 * nats.js's write buffer a microtask after the publish, before any answer or failure can reach
 * here.
 */
function releaseUnlessSending(raw: Buffer, answered: number): void {
  if (answered === 0 || (answered >= 200 && answered < 300)) releaseBody(raw);
}

/** The request's abort, registered for the drain and fired when the client goes away early. */
function watchClient(ctx: ProxyContext, res: ServerResponse): RequestAbort {
  const abort = new RequestAbort();
  ctx.inFlight?.add(abort);
  res.once("close", () => {
    if (!res.writableFinished) abort.abort();
  });
  return abort;
}

/** Relays the worker's answer; only a 200 is an event stream (a worker's error answer to a
 *  stream request is JSON). Resolves to the answer's usage, when it carried one. */
function relayAnswer(
  ctx: ProxyContext,
  res: ServerResponse,
  up: UpstreamResponse,
  rreq: ServerRoutingRequest,
  started: number,
  stripUsage: boolean,
  abort: RequestAbort,
  ticket: FlowTicket | null,
): Promise<Usage | null> {
  const { requestId, model } = rreq;
  return rreq.stream && up.status === 200
    ? relayStream(ctx, res, up, requestId, model, started, stripUsage, abort, ticket?.onFirst)
    : relayWhole(ctx, res, up, requestId, abort);
}

/** The metrics of a request the worker answered. */
function countAnswered(
  ctx: ProxyContext,
  model: string,
  endpointLabel: string,
  status: number,
  usage: Usage | null,
  started: number,
): void {
  if (usage) {
    const mm = ctx.metrics.forModel(model);
    if (usage.prompt_tokens) mm.promptTokens.inc(usage.prompt_tokens);
    if (usage.completion_tokens) mm.completionTokens.inc(usage.completion_tokens);
  }
  ctx.metrics.countRequest(model, endpointLabel, status);
  ctx.metrics.observeE2e(model, endpointLabel, (performance.now() - started) / 1000);
}

/** Answers (or drops, for a client that left) a request that failed before or while relaying. */
function answerFailure(
  ctx: ProxyContext,
  err: unknown,
  req: IncomingMessage,
  res: ServerResponse,
  requestId: string,
  model: string,
  endpointLabel: string,
  ac: RequestAbort | null,
): void {
  if (ac?.reason instanceof DrainCutError && !res.headersSent && !res.destroyed) {
    sendError(res, new DrainCutAnswer(), requestId, ctx.logger);
    return;
  }
  if (err instanceof BodyAbortedError || ac?.aborted || res.destroyed) {
    ctx.metrics.clientAborts.inc({ model });
    if (!res.destroyed) res.destroy();
    return;
  }
  const status = (err as { status?: number }).status ?? 500;
  // Label only models the fleet knows, so arbitrary client strings cannot grow the series.
  const known = model !== "" && ctx.router.knows(model);
  ctx.metrics.countRequest(known ? model : "", endpointLabel, status);
  // A refused upload may still be arriving: read and drop it (bounded) so the client reads
  // this answer; only one past the bound gets `connection: close`.
  if (status === 413 && !discardRefusedBody(req)) res.setHeader("connection", "close");
  sendError(res, err, requestId, ctx.logger);
}

async function relayStream(
  ctx: ProxyContext,
  res: ServerResponse,
  up: UpstreamResponse,
  requestId: string,
  model: string,
  started: number,
  stripUsage: boolean,
  signal: RequestAbort,
  onFirst?: () => void,
): Promise<Usage | null> {
  res.writeHead(up.status, {
    "content-type": contentTypeOf(up) ?? "text/event-stream",
    "cache-control": "no-cache",
    "x-request-id": requestId,
  });
  // No flushHeaders(): the headers leave with the first chunk, in one write.
  const mm = ctx.metrics.forModel(model);
  const filter = up.status === 200 ? new SseUsageFilter(stripUsage) : null;
  let last = 0;
  // Writes are corked until the event loop's check phase: the last event and the stream's end
  // (which arrives a tick after the data) then leave in ONE write instead of two, a syscall
  // saved per stream, for a delay of one loop turn at most.
  try {
    await pump(up.body, res, (chunk) => {
      if (signal.aborted) return true;
      if (res.writableCorked === 0) {
        res.cork();
        setImmediate(uncorkResponse, res);
      }
      const now = performance.now();
      if (last === 0) {
        mm.ttft.observe((now - started) / 1000);
        onFirst?.();
      } else mm.itl.observe((now - last) / 1000);
      last = now;
      const out = filter ? filter.push(chunk) : chunk;
      if (filter?.invalid) {
        // Not an event stream: stop reading it (the catch below ends the client's stream).
        up.abort();
        return true;
      }
      return out.length === 0 || res.write(out);
    });
  } catch (err) {
    up.abort();
    if (signal.reason instanceof DrainCutError) return endCut(res, filter);
    if (signal.aborted) throw err;
    if (!filter) {
      ctx.logger.warn({ requestId, err: (err as Error).message }, "upstream stream failed");
      res.destroy();
      return null;
    }
    // The worker dropped the stream mid-way or sent something that is not an event stream
    // (headers are out, so no retry): end it cleanly with an OpenAI-shaped error event and
    // [DONE], dropping any half-received event, so clients see an error instead of a
    // truncated or garbled stream.
    const invalid = filter.invalid;
    filter.flush();
    ctx.logger.warn(
      { requestId, err: invalid ? "invalid event stream" : (err as Error).message },
      "upstream stream failed",
    );
    res.end(invalid ? STREAM_INVALID_EVENT : STREAM_ERROR_EVENT);
    return filter.usage;
  }
  if (signal.aborted) {
    up.abort();
    if (signal.reason instanceof DrainCutError) return endCut(res, filter);
    throw signal.reason;
  }
  const tail = filter?.flush();
  if (filter?.invalid) {
    ctx.logger.warn({ requestId, err: "invalid event stream" }, "upstream stream failed");
    res.end(STREAM_INVALID_EVENT);
    return filter.usage;
  }
  if (tail && tail.length > 0) res.write(tail);
  res.end();
  return filter?.usage ?? null;
}

/** A stream cut by the drain: what was whole is sent, then an error event and [DONE]. */
function endCut(res: ServerResponse, filter: SseUsageFilter | null): Usage | null {
  if (res.destroyed || res.writableEnded) return filter?.usage ?? null;
  filter?.flush();
  res.end(STREAM_DRAIN_CUT_EVENT);
  return filter?.usage ?? null;
}

function uncorkResponse(res: ServerResponse): void {
  res.uncork();
}

const errorEvent = (e: UpstreamError): string => `data: ${JSON.stringify(e.toJSON())}\n\ndata: [DONE]\n\n`;

const STREAM_ERROR_EVENT = errorEvent(
  new UpstreamError(
    "The worker serving this stream failed mid-way; the answer is incomplete.",
    502,
    "upstream_stream_error",
  ),
);

class DrainCutAnswer extends UpstreamError {
  constructor() {
    super(
      "This server shut down before the answer was complete (drain grace period over); retry.",
      503,
      "server_draining",
    );
  }
}

const STREAM_DRAIN_CUT_EVENT = errorEvent(new DrainCutAnswer());

const STREAM_INVALID_EVENT = errorEvent(
  new UpstreamError(
    "The worker serving this stream sent data that is not an OpenAI event stream; the answer is incomplete.",
    502,
    "upstream_invalid_response",
  ),
);
