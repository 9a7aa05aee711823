/**
 * The HTTP request plane: sends an OpenAI body straight to a worker's engine URL over a raw
 * HTTP/1.1 connection pool per worker (`./http1/`: keep-alive `net` sockets, no pipelining so
 * that one slow stream never blocks another; it replaced undici's `Pool` here for CPU per
 * request, issue #32). Connection failures before any response byte become `WorkerUnreachableError`,
 * which the MixedRouter retries on another worker; so does a request the pool failed before
 * handing it to a connection (pool closed or destroyed under it): nothing of it reached the
 * worker, so it is always safe to send elsewhere.
 */
import type { Dispatcher } from "undici";
import { TimeoutError, UpstreamError } from "../protocol/errors.ts";
import type { AbortLike } from "../util/abort.ts";
import { splitBaseUrl } from "./base-url.ts";
import { Http1Dispatcher } from "./http1/dispatcher.ts";
import { Http1Pool } from "./http1/pool.ts";
import { type BodySource, PushBody } from "./push-body.ts";

import {
  connectionFailureKind,
  ENDPOINT_PATHS,
  type EndpointKind,
  type RequestExecutor,
  rawBodyOf,
  type SendOptions,
  type SendTarget,
  type UpstreamResponse,
  WorkerUnreachableError,
} from "./types.ts";

export interface HttpExecutorOptions {
  /** Max open connections per worker. */
  connections?: number;
  /** Wait for response headers (a non-streamed answer's headers come at its end). */
  headersTimeoutMs?: number;
  /** Max gap between body chunks. */
  bodyTimeoutMs?: number;
  keepAliveTimeoutMs?: number;
}

// The client's bytes of a body forwarded as it came (or with PD fields appended) skip a
// JSON.stringify (./types.ts, rawBodyOf).

export class HttpExecutor implements RequestExecutor {
  private readonly opts: HttpExecutorOptions;
  /** Per worker URL: its origin's pool and the path prefix its requests go under. */
  private readonly pools = new Map<string, WorkerPool>();
  private closed = false;

  constructor(opts: HttpExecutorOptions = {}) {
    this.opts = opts;
  }

  private pool(url: string): WorkerPool {
    let p = this.pools.get(url);
    if (!p) {
      const base = splitBaseUrl(url);
      const pool = new Http1Pool(base.origin, {
        connections: this.opts.connections ?? 256,
        keepAliveTimeoutMs: this.opts.keepAliveTimeoutMs ?? 4000,
        headersTimeoutMs: this.opts.headersTimeoutMs ?? 600_000,
        bodyTimeoutMs: this.opts.bodyTimeoutMs ?? 300_000,
      });
      p = { pool, prefix: base.prefix, dispatcher: null };
      this.pools.set(url, p);
    }
    return p;
  }

  send(
    worker: SendTarget,
    endpoint: EndpointKind,
    body: Record<string, unknown>,
    opts: SendOptions,
  ): Promise<UpstreamResponse> {
    const url = worker.record.url;
    const headers: Record<string, string> =
      opts.headers === undefined ? JSON_HEADERS : { "content-type": "application/json", ...opts.headers };
    return new Promise<UpstreamResponse>((resolve, reject) => {
      const handler = new UpstreamHandler(url, opts.signal, resolve, reject);
      if (handler.settled) return;
      const { pool, prefix } = this.pool(url);
      pool.dispatch(
        {
          path: prefix + ENDPOINT_PATHS[endpoint],
          method: "POST",
          headers,
          body: rawBodyOf(body) ?? JSON.stringify(body),
          headersTimeout: opts.timeoutMs,
        },
        handler,
      );
    });
  }

  /**
   * The connection pool of a worker's origin, for the server's other requests to that worker
   * (the load scraper's `/metrics` GETs), so that they reuse the proxy's kept-alive connections
   * instead of a second set in undici's global dispatcher: an engine then holds one set of
   * sockets per server, and a worker's first proxied request finds a connection its scrapes
   * opened (at 256 workers, 2 sets meant ≈ 1 more connect per worker and 256 more sockets on
   * the fleet; issue #32). Undefined once closed, so a late scrape does not leave a new pool
   * (its sockets) behind.
   */
  dispatcherFor(url: string): Dispatcher | undefined {
    if (this.closed) return undefined;
    const p = this.pool(url);
    p.dispatcher ??= new Http1Dispatcher(p.pool);
    return p.dispatcher;
  }

  /**
   * Drops the pool of a worker that left the fleet. Closed, not destroyed: the requests
   * already queued on it still go out (a removed but live worker answers them; a dead one
   * refuses them, which the router retries elsewhere) and streams in flight run to their end.
   * Destroying it failed every queued request with UND_ERR_DESTROYED, a 502 nobody retried
   * (issue #17). Later sends to the URL get a fresh pool.
   */
  forget(url: string): void {
    const p = this.pools.get(url);
    if (!p) return;
    this.pools.delete(url);
    p.pool.close().catch(() => {});
  }

  async close(): Promise<void> {
    this.closed = true;
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.pool.destroy().catch(() => {})));
  }
}

/** A worker URL's pool, the path its requests go under, and the pool as undici's scrapes take it. */
interface WorkerPool {
  pool: Http1Pool;
  prefix: string;
  dispatcher: Http1Dispatcher | null;
}

// Frozen: the pool serialises a frozen header object once and reuses the lines.
const JSON_HEADERS: Record<string, string> = Object.freeze({ "content-type": "application/json" }) as Record<
  string,
  string
>;

/**
 * One request on the pool's `dispatch` API (undici's core handler hooks, which `Http1Pool`
 * keeps): the answer's body is a `PushBody` fed straight from the parser's callbacks, no
 * stream machinery per answer.
 *
 * The caller's signal aborts the request at any point until the body ends: before the headers
 * `send` rejects with the abort reason, after them the body fails with it.
 */
/**
 * The handler's abort listener, made here and not in the constructor: a closure over `this`
 * written into `this` by the method that made it kept every handler, and with it the request,
 * alive through young-generation collections under Node 24's Maglev tier (promoted to the old
 * generation; see bench/router-overhead/RESULTS.md, 2026-12-05 lane L).
 */
const abortListener = (h: UpstreamHandler) => (): void => h.abortFromSignal();

class UpstreamHandler implements BodySource {
  private readonly url: string;
  private readonly signal: AbortLike;
  private readonly resolve: (up: UpstreamResponse) => void;
  private readonly reject: (err: Error) => void;
  settled = false;
  private abortFn: ((err?: Error) => void) | null = null;
  private resumeFn: (() => void) | null = null;
  private body: PushBody | null = null;
  private done = false;
  /** An abort that came before the pool handed over its abort function. */
  private pendingAbort: Error | null = null;
  private readonly onAbort: () => void;

  constructor(
    url: string,
    signal: AbortLike,
    resolve: (up: UpstreamResponse) => void,
    reject: (err: Error) => void,
  ) {
    this.url = url;
    this.signal = signal;
    this.resolve = resolve;
    this.reject = reject;
    this.onAbort = abortListener(this);
    if (signal.aborted) {
      this.settled = true;
      this.done = true;
      reject(signalReason(signal));
      return;
    }
    signal.addEventListener("abort", this.onAbort, { once: true });
  }

  // --- the pool's handler hooks (undici's core hooks) ----------------------------------------------------------

  onConnect(abort: (err?: Error) => void): void {
    this.abortFn = abort;
    if (this.pendingAbort) abort(this.pendingAbort);
  }

  onHeaders(statusCode: number, rawHeaders: string[] | null, resume: () => void): boolean {
    if (statusCode < 200) return true; // 1xx: the real answer follows
    this.resumeFn = resume;
    const body = new PushBody(this);
    this.body = body;
    this.settled = true;
    this.resolve(new DispatchedUpstream(statusCode, rawHeaders ?? [], body));
    return true;
  }

  onData(chunk: Buffer): boolean {
    return this.body === null || this.body.push(chunk);
  }

  onComplete(): void {
    this.finish();
    this.body?.end();
  }

  onError(err: Error): void {
    this.finish();
    if (!this.settled) {
      this.settled = true;
      // The pool calls onConnect just before it writes the request to a socket: without it,
      // the request never left this process (still queued when its pool was closed or
      // destroyed), so it is a connect-class failure the router may retry anywhere.
      this.reject(this.abortFn === null ? notSent(err, this.url) : classify(err, this.url));
    } else this.body?.fail(err);
  }

  // --- BodySource -----------------------------------------------------------------------

  resume(): void {
    this.resumeFn?.();
  }

  abort(reason: Error): void {
    if (this.done) return;
    // Not handed to a connection yet: the pool calls onConnect first, where it takes effect.
    if (this.abortFn) this.abortFn(reason);
    else this.pendingAbort = reason;
  }

  /** The caller's signal fired. */
  abortFromSignal(): void {
    this.abort(signalReason(this.signal));
  }

  private finish(): void {
    if (this.done) return;
    this.done = true;
    this.signal.removeEventListener("abort", this.onAbort);
  }
}

function signalReason(signal: AbortLike): Error {
  const r: unknown = signal.reason;
  return r instanceof Error
    ? r
    : Object.assign(new Error("This operation was aborted"), { name: "AbortError" });
}

/**
 * A worker's answer (a class: prototype methods cost nothing per request). Headers stay raw
 * until asked for: the relay needs only the content type, and building the whole object
 * (a string per name and value) cost ≈ 4 µs per request in profiles.
 */
class DispatchedUpstream implements UpstreamResponse {
  readonly status: number;
  private readonly raw: string[];
  readonly body: PushBody;
  private parsed: Record<string, string> | null = null;
  private ct: string | null | undefined = undefined;

  constructor(status: number, raw: string[], body: PushBody) {
    this.status = status;
    this.raw = raw;
    this.body = body;
  }

  get headers(): Record<string, string> {
    if (this.parsed === null) {
      const headers: Record<string, string> = {};
      const raw = this.raw;
      for (let i = 0; i + 1 < raw.length; i += 2) {
        const k = raw[i]!.toLowerCase();
        const v = raw[i + 1]!;
        headers[k] = headers[k] === undefined ? v : `${headers[k]}, ${v}`;
      }
      this.parsed = headers;
    }
    return this.parsed;
  }

  get contentType(): string | undefined {
    if (this.ct === undefined) {
      this.ct = null;
      const raw = this.raw;
      for (let i = 0; i + 1 < raw.length; i += 2) {
        const k = raw[i]!;
        if (k.length === 12 && k.toLowerCase() === "content-type") {
          this.ct = raw[i + 1]!;
          break;
        }
      }
    }
    return this.ct ?? undefined;
  }

  json(): Promise<unknown> {
    return this.body.json();
  }

  abort(): void {
    this.body.destroy();
  }
}

/** A failure before the request was handed to a connection; the caller's abort stays an abort. */
function notSent(err: unknown, url: string): Error {
  const e = err as { name?: string; code?: string; message?: string };
  if (e?.name === "AbortError") return err as Error;
  if (e?.code === "UND_ERR_HEADERS_TIMEOUT") return classify(err, url);
  return new WorkerUnreachableError(url, "connect", `not sent: ${e?.code ?? e?.message ?? "request failed"}`);
}

function classify(err: unknown, url: string): Error {
  const e = err as { name?: string; code?: string; message?: string };
  if (e?.name === "AbortError") return err as Error;
  const kind = connectionFailureKind(err);
  if (kind) return new WorkerUnreachableError(url, kind, e.code ?? e.message ?? "connection error");
  if (e?.code === "UND_ERR_HEADERS_TIMEOUT") return new TimeoutError(`Worker ${url} did not answer in time.`);
  return new UpstreamError(`Request to worker failed: ${e?.message ?? String(err)}`);
}
