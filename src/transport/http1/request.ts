/**
 * One request on the raw HTTP/1.1 client: its bytes (head and body, ready for one write), the
 * caller's handler, and its state from queued to done. The handler hooks are undici's core
 * (legacy) dispatch hooks, so the executor's handler and undici's own `request()` (the load
 * scraper's) both drive it unchanged.
 */

import { TOKEN } from "../../util/http-grammar.ts";
import { invalidArg } from "./errors.ts";

/** undici's core dispatch handler hooks, as this client calls them. */
export interface Http1Handler {
  /** The request is about to be written to a connection; `abort` cancels it from now on. */
  onConnect(abort: (err?: Error) => void): void;
  /** The answer's head (final, ≥ 200). False pauses the body until `resume`. */
  onHeaders(status: number, rawHeaders: string[], resume: () => void, statusText: string): boolean;
  /** A body chunk; false pauses until `resume`. */
  onData(chunk: Buffer): boolean;
  onComplete(trailers: string[]): void;
  onError(err: Error): void;
}

export interface Http1RequestOptions {
  path: string;
  method: string;
  headers?: Readonly<Record<string, string>> | null;
  body?: Buffer | string | null;
  /** Wait for the answer's head, from when the request is written (ms; pool default if absent). */
  headersTimeout?: number | null;
  /** Longest gap between body chunks (ms; pool default if absent). */
  bodyTimeout?: number | null;
}

export const QUEUED = 0;
export const ACTIVE = 1;
export const DONE = 2;

/** What a request needs of the connection carrying it (kept abstract: no import cycle). */
export interface Carrier {
  cancel(req: PendingRequest, err: Error): void;
  resume(req: PendingRequest): void;
}

export class PendingRequest {
  readonly handler: Http1Handler;
  readonly method: string;
  /** Head and body as one buffer, a bodiless head, or [head, body] for a large body (two writes, corked). */
  readonly bytes: string | Buffer | [string, Buffer];
  readonly headersTimeout: number;
  readonly bodyTimeout: number;
  state = QUEUED;
  /** The connection carrying it (null while queued). */
  carrier: Carrier | null = null;
  /** Set once `onConnect` was called (a retried request is not announced twice). */
  announced = false;
  /** Whether any byte of the answer arrived (a request is retried only before). */
  received = false;
  /** Whether it was already retried once on a fresh connection. */
  retried = false;
  /** Where the pool dequeues it from, when it is given up while queued. */
  onDequeue: ((req: PendingRequest) => void) | null = null;
  /** undici's hook shape: abort(err?) from the handler's side, at any point. */
  readonly abort = (err?: Error): void => this.cancel(err ?? abortedError());
  readonly resume = (): void => {
    if (this.state === ACTIVE) this.carrier?.resume(this);
  };

  constructor(
    opts: Http1RequestOptions,
    host: string,
    handler: Http1Handler,
    headersTimeout: number,
    bodyTimeout: number,
  ) {
    this.handler = handler;
    this.method = opts.method;
    this.bytes = requestBytes(opts, host);
    this.headersTimeout = opts.headersTimeout ?? headersTimeout;
    this.bodyTimeout = opts.bodyTimeout ?? bodyTimeout;
  }

  /** Ends the request with `err` wherever it is; idempotent. */
  cancel(err: Error): void {
    if (this.state === DONE) return;
    const carrier = this.carrier;
    if (carrier !== null) {
      carrier.cancel(this, err);
      return;
    }
    this.state = DONE;
    this.onDequeue?.(this);
    this.handler.onError(err);
  }
}

function abortedError(): Error {
  return Object.assign(new Error("Request aborted"), { name: "AbortError", code: "UND_ERR_ABORTED" });
}

/** Above this a Buffer body is written after its head (corked) rather than copied behind it. */
const COPY_BODY_MAX = 64 * 1024;

/** Serialised header lines of shared header objects (the executor's JSON_HEADERS). */
const headerLines = new WeakMap<object, string>();

// Undici refuses these from a caller (it sets them itself or they change the framing).
const RESERVED = new Set([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
  "upgrade",
  "expect",
]);
/** A field value: no CR, LF or NUL (what could split the head, as undici checks), nothing past latin1. */
const BAD_VALUE = /[\r\n\0\u0100-\uffff]/;
/** A request target: printable, no space (undici's check). */
const BAD_PATH = /[^\u0021-\u00ff]/;

function linesOf(headers: Readonly<Record<string, string>>): string {
  let cached = headerLines.get(headers);
  if (cached !== undefined) return cached;
  cached = "";
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    if (!TOKEN.test(name) || RESERVED.has(name.toLowerCase()))
      throw invalidArg(`invalid header name ${name}`);
    if (BAD_VALUE.test(value)) throw invalidArg(`invalid ${name} header`);
    cached += `${name}: ${value}\r\n`;
  }
  if (Object.isFrozen(headers)) headerLines.set(headers, cached);
  return cached;
}

/** The request's bytes: head (and body) ready to write. Throws UND_ERR_INVALID_ARG on bad input. */
function requestBytes(opts: Http1RequestOptions, host: string): string | Buffer | [string, Buffer] {
  if (BAD_PATH.test(opts.path) || opts.path[0] !== "/") throw invalidArg("invalid request path");
  if (!TOKEN.test(opts.method)) throw invalidArg("invalid request method");
  const lines = opts.headers ? linesOf(opts.headers) : "";
  const body = typeof opts.body === "string" ? Buffer.from(opts.body) : opts.body;
  let head = `${opts.method} ${opts.path} HTTP/1.1\r\nhost: ${host}\r\n${lines}`;
  if (body === undefined || body === null) {
    // A POST without a body still says so (as undici does); a GET says nothing.
    return opts.method === "GET" || opts.method === "HEAD"
      ? `${head}\r\n`
      : `${head}content-length: 0\r\n\r\n`;
  }
  head += `content-length: ${body.length}\r\n\r\n`;
  if (body.length > COPY_BODY_MAX) return [head, body];
  const out = Buffer.allocUnsafe(head.length + body.length);
  out.write(head, 0, "latin1");
  body.copy(out, head.length);
  return out;
}
