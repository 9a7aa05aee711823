/** Small HTTP helpers for the node:http server: bounded body reading and OpenAI-shaped errors. */
import type { IncomingMessage, ServerResponse } from "node:http";
import { InferaError, PayloadTooLargeError, toInferaError } from "../protocol/errors.ts";

export class BodyAbortedError extends Error {}

/**
 * Reads a request body up to `limit` bytes. Rejects with PayloadTooLargeError as soon as the
 * declared or received size passes the limit, and with BodyAbortedError when the client
 * goes away mid-upload.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = req.headers["content-length"];
  if (declared !== undefined && Number(declared) > limit) {
    return Promise.reject(new PayloadTooLargeError(limit));
  }
  const expected = declared === undefined ? -1 : Number(declared);
  return new Promise((resolve, reject) => new BodyReader(req, limit, expected, resolve, reject).start());
}

/**
 * Bodies at least this large, with a declared length, are copied into one buffer as they
 * arrive: concatenating a 1 MB body at its end was one more millisecond-long slice of the
 * event loop (page faults included), paid while every other request waited.
 */
const PREALLOCATE_BYTES = 64 * 1024;

/**
 * One body being read. A class with prototype methods rather than per-request closures: the
 * tsx-transpiled closures each cost a `__name` defineProperty call on the hot path.
 */
class BodyReader {
  private readonly req: IncomingMessage;
  private readonly limit: number;
  private readonly expected: number;
  private readonly resolve: (b: Buffer) => void;
  private readonly reject: (e: Error) => void;
  private readonly chunks: Buffer[] = [];
  /**
   * The whole body's buffer when its length was declared and large (see PREALLOCATE_BYTES),
   * allocated when the first bytes arrive rather than on a bare promise of them.
   */
  private whole: Buffer | null = null;
  private size = 0;
  private done = false;
  // Assigned in the constructor (not as class fields) so that tsx's keepNames leaves them unwrapped.
  private readonly onData: (c: Buffer) => void;
  private readonly onEnd: () => void;
  private readonly onError: () => void;
  private readonly onClose: () => void;

  constructor(
    req: IncomingMessage,
    limit: number,
    expected: number,
    resolve: (b: Buffer) => void,
    reject: (e: Error) => void,
  ) {
    this.req = req;
    this.limit = limit;
    this.expected = expected;
    this.resolve = resolve;
    this.reject = reject;
    this.onData = (c) => this.data(c);
    this.onEnd = () => this.end();
    this.onError = () => this.finish(new BodyAbortedError("request body aborted"));
    this.onClose = () => {
      if (!this.req.complete) this.finish(new BodyAbortedError("request body aborted"));
    };
  }

  start(): void {
    const req = this.req;
    req.on("data", this.onData);
    req.on("end", this.onEnd);
    req.on("error", this.onError);
    req.on("close", this.onClose);
  }

  private data(c: Buffer): void {
    const at = this.size;
    this.size += c.length;
    if (this.size > this.limit) {
      this.finish(new PayloadTooLargeError(this.limit));
      return;
    }
    if (at === 0 && this.expected >= PREALLOCATE_BYTES && this.expected <= this.limit) {
      // Its own allocation (not Node's shared pool), so it can be transferred to a worker whole.
      this.whole = Buffer.allocUnsafeSlow(this.expected);
    }
    const whole = this.whole;
    // The HTTP parser enforces the declared length; the chunk list stays as a fallback anyway.
    if (whole && this.size <= whole.length && this.chunks.length === 0) c.copy(whole, at);
    else {
      if (whole && this.chunks.length === 0 && at > 0) this.chunks.push(whole.subarray(0, at));
      this.chunks.push(c);
    }
  }

  private end(): void {
    const chunks = this.chunks;
    if (this.whole && chunks.length === 0) {
      this.finish(null, this.size === this.whole.length ? this.whole : this.whole.subarray(0, this.size));
      return;
    }
    this.finish(null, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, this.size));
  }

  private finish(err: Error | null, buf?: Buffer): void {
    if (this.done) return;
    this.done = true;
    const req = this.req;
    req.off("data", this.onData);
    req.off("end", this.onEnd);
    req.off("error", this.onError);
    req.off("close", this.onClose);
    if (err) this.reject(err);
    else this.resolve(buf!);
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
export function sendError(res: ServerResponse, err: unknown, requestId?: string): void {
  const e = err instanceof InferaError ? err : toInferaError(err);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const headers: Record<string, string> = { ...e.headers };
  if (requestId) headers["x-request-id"] = requestId;
  if (e.status === 413) headers.connection = "close";
  sendJson(res, e.status, e.toJSON(), headers);
}
