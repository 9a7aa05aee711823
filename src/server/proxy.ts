/**
 * The OpenAI completion endpoints: parse and validate the body, route it, and relay the
 * worker's answer. Streams are relayed event by event with backpressure; a client that goes
 * away aborts the upstream request at once, streamed or not.
 */
import { isUtf8 } from "node:buffer";
import type { IncomingMessage, ServerResponse } from "node:http";
import { InvalidJsonError, UpstreamError } from "../protocol/errors.ts";
import { parseChatRequest, parseCompletionRequest } from "../protocol/openai.ts";
import type { TraceSpan } from "../router/trace.ts";
import { contentTypeOf, type RoutedEndpoint, type UpstreamResponse } from "../transport/types.ts";
import type { RequestAbort } from "../util/abort.ts";
import { admit, traceFailed } from "./admission.ts";
import { bodyParserPool, OFF_LOOP_BODY_BYTES, parseBodySync } from "./body-parser-pool.ts";
import type { FlowTicket } from "./flow-gate.ts";
import { setForwardBody } from "./forward-body.ts";
import { readBody, releaseBody, sendError } from "./http-util.ts";
import { pump } from "./pump.ts";
import { relayWhole } from "./relay-whole.ts";
import {
  countFailure,
  DrainCutError,
  droppedForClient,
  type ProxyContext,
  requestAbort,
  requestIdOf,
  routingRequestOf,
} from "./request-context.ts";
import type { ServerRoutingRequest } from "./routing-request.ts";
import { SseUsageFilter, type Usage } from "./sse.ts";
import type { ServerRequestTrace } from "./tracing.ts";

export { pump } from "./pump.ts";

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
    const clientWantsUsage = setForwardBody(body, parsed, raw);
    const rreq = routingRequestOf(ctx, req.headers, requestId, endpoint, body, tr, intake);
    const abort = requestAbort(ctx, res);
    ac = abort;
    if (ctx.preparePrompt) {
      const pending = rreq.prepare();
      if (pending) await pending;
    }
    if (res.destroyed) return;
    // Nothing may await between the admission and router.handle (see admit). Without flow
    // control there is nothing to wait for: no promise, no microtask turn.
    if (ctx.flow) ticket = await admit(ctx.flow, rreq, raw.length, req.headers, abort, tr, ctx.preparePrompt);
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
    traceFailed(tr, intake, relay, err);
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
  if (droppedForClient(ctx, err, res, model, ac)) return;
  countFailure(ctx, req, res, model, endpointLabel, (err as { status?: number }).status ?? 500);
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
