import type { IncomingMessage, ServerResponse } from "node:http";
import { InferaError, UpstreamError } from "../../protocol/errors.ts";
import { parseChatRequest } from "../../protocol/openai.ts";
import type { TraceSpan } from "../../router/trace.ts";
import {
  ENDPOINT_PATHS,
  type EndpointKind,
  type RequestExecutor,
  type UpstreamResponse,
} from "../../transport/types.ts";
import type { RequestAbort } from "../../util/abort.ts";
import { admit, traceFailed } from "../admission.ts";
import type { FlowTicket } from "../flow-gate.ts";
import { sendJson } from "../http-util.ts";
import { pump } from "../pump.ts";
import { relayWhole } from "../relay-whole.ts";
import {
  countFailure,
  DrainCutError,
  droppedForClient,
  type ProxyContext,
  routingRequestOf,
  startRequest,
} from "../request-context.ts";
import { type ChatChunk, type ChatCompletion, type ChatUsage, chatChunks } from "./chat-sse.ts";
import { readObjectBody } from "./intake.ts";

/** Writes one API's stream from the engine's chat chunks. */
export interface Streamer {
  /**
   * The events before the first token (e.g. `response.created`, `message_start`);
   * `promptTokens` gives routing's count of the whole prompt (undefined past its caps).
   */
  start(promptTokens: () => number | undefined): string;
  chunk(c: ChatChunk): string;
  /** The closing events, with the stream's usage; `failed` names an engine failure mid-way. */
  end(usage: ChatUsage | null, failed?: string): string;
}

export interface Translation {
  /** The metrics' endpoint label. */
  readonly label: string;
  /** The engine route that serves this API natively (a worker's record lists it in `routes`). */
  readonly native: EndpointKind;
  /** The client's body → a chat-completions body; throws BadRequestError for what it cannot carry. */
  toChat(body: Record<string, unknown>): Record<string, unknown>;
  /** A whole chat answer → this API's answer. */
  whole(chat: ChatCompletion, body: Record<string, unknown>): unknown;
  streamer(body: Record<string, unknown>): Streamer;
  /** An error in this API's shape (status kept). */
  errorBody(e: InferaError): unknown;
}

/** Whether a worker's record says its engine serves `kind`'s route itself. */
export function servesRoute(record: { routes?: string[] }, kind: EndpointKind): boolean {
  return record.routes?.includes(ENDPOINT_PATHS[kind]) === true;
}

export async function handleTranslated(
  ctx: ProxyContext,
  t: Translation,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const { started, requestId, abort } = startRequest(ctx, req, res);
  let model = "";
  const tr = ctx.tracer?.start(req.headers, requestId, t.label);
  const intake = tr?.phase("intake");
  let relay: TraceSpan | undefined;
  let ticket: FlowTicket | null = null;
  let answered = 0;
  let usage: ChatUsage | null = null;
  try {
    ctx.auth.check(req.headers);
    const { raw, body: client } = await readObjectBody(ctx, req);
    const chat = t.toChat(client);
    const stream = chat.stream === true;
    // Usage is always asked for: the translated answers carry it.
    if (stream) chat.stream_options = { include_usage: true };
    const body = parseChatRequest(chat);
    model = body.model;
    const router = ctx.router.routerFor(model);
    const rreq = routingRequestOf(ctx, req.headers, requestId, "chat", body, tr, intake);
    let native = false;
    const exec = executorFor(ctx, t, model, client, (n) => {
      native = n;
    });
    if (ctx.preparePrompt) await rreq.prepare();
    if (res.destroyed) return;
    // Nothing may await between the admission and router.handle (see admit).
    if (ctx.flow) ticket = await admit(ctx.flow, rreq, raw.length, req.headers, abort, tr, ctx.preparePrompt);
    const up = await router.handle(rreq, exec, abort);
    answered = up.status;
    if (abort.aborted) {
      up.abort();
      throw abort.reason;
    }
    relay = tr?.phase("stream");
    const onFirst = ticket?.onFirst;
    if (native) await relayNative(ctx, res, up, requestId, stream, abort, onFirst);
    else if (up.status !== 200) throw await engineError(up);
    else if (stream) {
      const s = t.streamer(client);
      usage = await relayTranslatedStream(
        res,
        up,
        s,
        s.start(() => rreq.wholePromptTokenCount()),
        requestId,
        abort,
        onFirst,
      );
    } else {
      const answer = (await readAnswer(up, ctx.maxResponseBufferBytes)) as ChatCompletion;
      usage = answer.usage ?? null;
      sendJson(res, 200, t.whole(answer, client), { "x-request-id": requestId });
    }
    relay?.end();
    tr?.finish(up.status);
    if (usage) countUsage(ctx, model, usage);
    ctx.metrics.countRequest(model, t.label, up.status);
    ctx.metrics.observeE2e(model, t.label, (performance.now() - started) / 1000);
  } catch (err) {
    traceFailed(tr, intake, relay, err);
    answerFailure(ctx, t, err, req, res, requestId, model, abort);
  } finally {
    ctx.inFlight?.delete(abort);
    ticket?.end(answered, usage?.completion_tokens);
  }
}

/**
 * The executor for `model`: on a mixed fleet, a worker whose engine serves this API itself gets
 * the client's own body on that route (`onNative(true)`), the others the translated chat body.
 */
function executorFor(
  ctx: ProxyContext,
  t: Translation,
  model: string,
  client: Record<string, unknown>,
  onNative: (native: boolean) => void,
): RequestExecutor {
  if (ctx.router.kindFor(model) !== "mixed") return ctx.executor;
  return {
    send: (w, endpoint, b, opts) => {
      const native = servesRoute(w.record, t.native);
      onNative(native);
      return native ? ctx.executor.send(w, t.native, client, opts) : ctx.executor.send(w, endpoint, b, opts);
    },
  };
}

/** Answers (in the API's error shape) or drops, for a client that left, a failed request. */
function answerFailure(
  ctx: ProxyContext,
  t: Translation,
  err: unknown,
  req: IncomingMessage,
  res: ServerResponse,
  requestId: string,
  model: string,
  abort: RequestAbort,
): void {
  // A drain whose grace ran out: an answer not started gets a 503 in the API's shape.
  if (abort.reason instanceof DrainCutError && !res.headersSent && !res.destroyed) {
    const e = new InferaError(503, DRAIN_CUT_MESSAGE, { code: "server_draining" });
    sendJson(res, 503, t.errorBody(e), { "x-request-id": requestId });
    return;
  }
  if (droppedForClient(ctx, err, res, model, abort)) return;
  const e = err instanceof InferaError ? err : new UpstreamError("Internal error.", 500, "internal_error");
  if (e.status >= 500) ctx.logger.warn({ requestId, err: (err as Error).message }, `${t.label} failed`);
  countFailure(ctx, req, res, model, t.label, e.status);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  sendJson(res, e.status, t.errorBody(e), { ...e.headers, "x-request-id": requestId });
}

function countUsage(ctx: ProxyContext, model: string, usage: ChatUsage): void {
  const mm = ctx.metrics.forModel(model);
  if (usage.prompt_tokens) mm.promptTokens.inc(usage.prompt_tokens);
  if (usage.completion_tokens) mm.completionTokens.inc(usage.completion_tokens);
}

/** An engine's error answer (OpenAI's shape, or vLLM's older flat `ErrorResponse`) as an InferaError. */
async function engineError(up: UpstreamResponse): Promise<InferaError> {
  let body: unknown = null;
  try {
    body = await up.json();
  } catch {
    up.abort();
  }
  const o = (body ?? {}) as { error?: { message?: unknown; code?: unknown }; message?: unknown };
  const msg = o.error?.message ?? o.message;
  const message = typeof msg === "string" ? msg : `The worker answered with status ${up.status}.`;
  const status = up.status >= 400 && up.status <= 599 ? up.status : 502;
  return new InferaError(status, message, {
    code: typeof o.error?.code === "string" ? o.error.code : null,
  });
}

/**
 * A whole chat answer to translate: read up to the server's response buffer limit
 * (`maxResponseBufferBytes`, the limit a relayed chat answer is checked within). A chat answer
 * past it is relayed unchecked; one to translate must be held whole, so past it the worker's
 * answer is dropped with a 502 rather than buffered without bound.
 */
async function readAnswer(up: UpstreamResponse, limit: number): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const c of up.body) {
      size += c.byteLength;
      if (size > limit) {
        up.abort();
        throw new UpstreamError(
          `The worker's answer is larger than this server translates (${limit} bytes, maxResponseBufferBytes).`,
          502,
          "upstream_response_too_large",
        );
      }
      chunks.push(Buffer.isBuffer(c) ? c : Buffer.from(c.buffer, c.byteOffset, c.byteLength));
    }
  } catch (err) {
    up.abort();
    if (err instanceof InferaError) throw err;
    throw new UpstreamError("The worker's answer was cut off.", 502, "upstream_invalid_response");
  }
  try {
    const v: unknown = JSON.parse(Buffer.concat(chunks, size).toString("utf8"));
    if (v !== null && typeof v === "object" && !Array.isArray(v)) return v;
  } catch {
    // Falls through to the 502 below.
  }
  throw new UpstreamError("The worker's answer is not valid JSON.", 502, "upstream_invalid_response");
}

/** A native answer (the engine served the API itself): relayed as it came. */
async function relayNative(
  ctx: ProxyContext,
  res: ServerResponse,
  up: UpstreamResponse,
  requestId: string,
  stream: boolean,
  abort: RequestAbort,
  onFirst?: () => void,
): Promise<void> {
  if (!stream || up.status !== 200) {
    await relayWhole(ctx, res, up, requestId, abort);
    return;
  }
  res.writeHead(200, {
    "content-type": up.contentType ?? up.headers["content-type"] ?? "text/event-stream",
    "cache-control": "no-cache",
    "x-request-id": requestId,
  });
  try {
    await pump(up.body, res, (chunk) => {
      onFirst?.();
      return abort.aborted || res.write(chunk);
    });
  } catch (err) {
    up.abort();
    if (abort.aborted) throw err;
    res.destroy();
    return;
  }
  res.end();
}

/** The engine's chat stream, translated event by event, with backpressure. */
async function relayTranslatedStream(
  res: ServerResponse,
  up: UpstreamResponse,
  s: Streamer,
  head: string,
  requestId: string,
  abort: RequestAbort,
  onFirst?: () => void,
): Promise<ChatUsage | null> {
  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-request-id": requestId,
  });
  res.write(head);
  let usage: ChatUsage | null = null;
  try {
    for await (const c of chatChunks(up.body)) {
      if (abort.aborted) break;
      if (c.error) throw new UpstreamError(c.error.message ?? "The worker failed mid-stream.");
      if (c.usage) usage = c.usage;
      onFirst?.();
      const out = s.chunk(c);
      if (out !== "" && !res.write(out)) await drained(res);
    }
  } catch (err) {
    up.abort();
    if (abort.reason instanceof DrainCutError) return endCut(res, s, usage);
    if (abort.aborted) throw abort.reason;
    res.end(s.end(usage, (err as Error).message || "the worker failed mid-stream"));
    return usage;
  }
  if (abort.aborted) {
    up.abort();
    if (abort.reason instanceof DrainCutError) return endCut(res, s, usage);
    throw abort.reason;
  }
  res.end(s.end(usage));
  return usage;
}

const DRAIN_CUT_MESSAGE =
  "This server shut down before the answer was complete (drain grace period over); retry.";

/** A stream cut by the drain: closed with the API's failure events rather than a reset. */
function endCut(res: ServerResponse, s: Streamer, usage: ChatUsage | null): ChatUsage | null {
  if (!res.destroyed && !res.writableEnded) res.end(s.end(usage, DRAIN_CUT_MESSAGE));
  return usage;
}

/** Resolves when the response drains, or closes (the client left: the abort ends the loop). */
function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.once("drain", done);
    res.once("close", done);
  });
}
