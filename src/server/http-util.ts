/** Small HTTP helpers for the node:http server: bounded body reading and OpenAI-shaped errors. */
import type { IncomingMessage, ServerResponse } from "node:http";
import { InferaError, PayloadTooLargeError, toInferaError } from "../protocol/errors.ts";
import type { Logger } from "../util/log.ts";
import { POOL_FROM, releaseBodyBuffer, takeBodyBuffer } from "./body-buffers.ts";
import { bufferedBody } from "./front/exchange.ts";

export class BodyAbortedError extends Error {}

/**
 * Reads a request body up to `limit` bytes. Rejects with PayloadTooLargeError as soon as the
 * declared or received size passes the limit, and with BodyAbortedError when the client
 * goes away mid-upload.
 *
 * A body of `POOL_FROM` bytes or more is read into a buffer lent by ./body-buffers.ts (the
 * returned Buffer is a view of its first bytes): give it back with `releaseBody` once nothing
 * reads the body any more, and it serves the next large body instead of a fresh allocation.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = req.headers["content-length"];
  if (declared !== undefined && Number(declared) > limit) {
    return Promise.reject(new PayloadTooLargeError(limit));
  }
  // The raw front (./front/front.ts) read the body whole before the request began.
  const whole = bufferedBody(req);
  if (whole !== undefined) return Promise.resolve(whole);
  return new Promise((resolve, reject) => {
    const body = new BodyBuffer(limit);
    let done = false;
    // The four listeners are closures over this call, never stored on an object they reach:
    // the BodyReader class this replaces kept them in its own fields (an object ↔ closure
    // cycle), and under Node 24's Maglev tier such objects survived young-generation
    // collections, so every request's objects were promoted to the old generation (≈ 6 KB
    // per request, see bench/router-overhead/RESULTS.md, 2026-12-05 lane L).
    const finish = (err: Error | null, out?: Buffer): void => {
      if (done) return;
      done = true;
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
      if (err) {
        body.discard();
        reject(err);
      } else resolve(out!);
    };
    const onData = (c: Buffer): void => {
      if (!body.push(c)) finish(new PayloadTooLargeError(limit));
    };
    const onEnd = (): void => finish(null, body.take());
    const onError = (): void => finish(new BodyAbortedError("request body aborted"));
    const onClose = (): void => {
      if (!req.complete) finish(new BodyAbortedError("request body aborted"));
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("close", onClose);
  });
}

/**
 * Gives a body read by `readBody` back to the buffer pool. Only when nothing reads it any
 * more, its forwarding included: the next large body overwrites it. A body that is not a
 * pooled buffer (a small one, or one moved to a worker thread) is left alone.
 */
export function releaseBody(raw: Buffer): void {
  releaseBodyBuffer(raw.buffer);
}

/**
 * The bytes of one body being read (no listeners: `readBody` holds those).
 *
 * Memory grows with the bytes that arrive, never with the declared length: a client that
 * declares the limit and sends one byte holds that byte, not a buffer of the declared size
 * (which each such connection used to pin until it went away). Small bodies are a chunk list;
 * from `POOL_FROM` bytes on they move into a pooled buffer, swapped for one twice the size
 * when full (the copies add up to less than the body).
 */
class BodyBuffer {
  private readonly limit: number;
  private chunks: Buffer[] = [];
  /** The pooled buffer once the body passed POOL_FROM bytes, and a Buffer view of it. */
  private buf: ArrayBuffer | null = null;
  private view: Buffer | null = null;
  private size = 0;

  constructor(limit: number) {
    this.limit = limit;
  }

  /** Adds a chunk; false once the body is past the limit (nothing more is kept). */
  push(c: Buffer): boolean {
    const at = this.size;
    this.size += c.length;
    if (this.size > this.limit) return false;
    if (this.view === null) {
      this.chunks.push(c);
      if (this.size >= POOL_FROM) {
        const chunks = this.chunks;
        this.chunks = [];
        this.grow(this.size, 0);
        let off = 0;
        for (const k of chunks) off += k.copy(this.view!, off);
      }
      return true;
    }
    if (this.size > this.view.length) this.grow(this.size, at);
    c.copy(this.view!, at);
    return true;
  }

  /** Switches to a pooled buffer of at least `need` bytes, keeping the `have` bytes read so far. */
  private grow(need: number, have: number): void {
    const next = takeBodyBuffer(need);
    const view = Buffer.from(next);
    if (this.view && have > 0) this.view.copy(view, 0, 0, have);
    if (this.buf) releaseBodyBuffer(this.buf);
    this.buf = next;
    this.view = view;
  }

  /** The whole body (a view of the pooled buffer, or the chunks joined). */
  take(): Buffer {
    if (this.view) return this.view.subarray(0, this.size);
    const chunks = this.chunks;
    this.chunks = [];
    return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, this.size);
  }

  /** Nobody will read this body: its buffer serves the next one. */
  discard(): void {
    this.chunks = [];
    if (this.buf) releaseBodyBuffer(this.buf);
    this.buf = null;
    this.view = null;
  }
}

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers?: Record<string, string>,
): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

/** Answers with an OpenAI-shaped error, or just closes the stream if headers are already out. */
export function sendError(res: ServerResponse, err: unknown, requestId?: string, log?: Logger): void {
  const e = err instanceof InferaError ? err : toInferaError(err);
  if (log && e.status >= 500) logServerError(log, e, err, requestId, res.headersSent);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const headers: Record<string, string> = { ...e.headers };
  if (requestId) headers["x-request-id"] = requestId;
  sendJson(res, e.status, e.toJSON(), headers);
}

/** What is read and thrown away of a refused (413) upload, at most, and for how long. */
export const DISCARD_REFUSED_BYTES = 64 * 1024 * 1024;
export const DISCARD_REFUSED_MS = 10_000;

/**
 * After a 413, reads and discards the rest of the upload, so a client still sending (Node's
 * fetch, the OpenAI SDK) reads the answer instead of failing with EPIPE when the socket closes
 * under it, and then retrying the whole body (issue #30 item 11). Bounded: past
 * DISCARD_REFUSED_BYTES or DISCARD_REFUSED_MS the connection is destroyed. Returns false when
 * the declared length is already past the bound: the answer should say `connection: close`.
 */
export function discardRefusedBody(req: IncomingMessage): boolean {
  if (req.complete) return true;
  const declared = Number(req.headers["content-length"]);
  if (declared > DISCARD_REFUSED_BYTES) {
    req.resume();
    return false;
  }
  let n = 0;
  const cut = () => {
    clearTimeout(timer);
    req.socket.destroy();
  };
  const timer = setTimeout(cut, DISCARD_REFUSED_MS);
  timer.unref();
  req.on("data", (c: Buffer) => {
    n += c.length;
    if (n > DISCARD_REFUSED_BYTES) cut();
  });
  req.once("end", () => clearTimeout(timer));
  req.once("close", () => clearTimeout(timer));
  req.resume();
  return true;
}

/**
 * Every 5xx the server answers is logged with its cause (issue #30 item 5: a worker URL that
 * undici refused made every request a 500 and, having a `code`, was never logged). A 500 is
 * our fault: `error`; a 502/503/504 says a worker or the fleet failed: `warn`.
 */
function logServerError(
  log: Logger,
  e: InferaError,
  cause: unknown,
  requestId: string | undefined,
  headersSent: boolean,
): void {
  const c = cause as { code?: unknown; message?: unknown; cause?: unknown } | null;
  const fields = {
    status: e.status,
    code: e.code,
    requestId,
    // The error itself and what it wraps: with its stack when unexpected (pino's err
    // serializer); an expected InferaError (no worker, upstream failure) without it, as a
    // burst of them must not cost a stack serialisation each.
    err: cause instanceof InferaError ? { type: cause.constructor.name, message: cause.message } : cause,
    causeCode: typeof c?.code === "string" ? c.code : undefined,
    innerCause: c?.cause,
    afterHeaders: headersSent || undefined,
  };
  const msg = `answered ${e.status}: ${e.message}`;
  if (e.status === 500) log.error(fields, msg);
  else log.warn(fields, msg);
}
