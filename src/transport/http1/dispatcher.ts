/**
 * An `Http1Pool` as an undici `Dispatcher`, for undici's `request()` (the load scraper's
 * `/metrics` GETs): they then share the request plane's kept-alive connections to the worker,
 * so an engine holds one connection set per server replica (issue #32; see
 * HttpExecutor.dispatcherFor). Only what `request()` uses is carried: a core-hook handler
 * (onConnect/onHeaders/onData/onComplete/onError), a path, a method, record or flat-array
 * headers, a string or Buffer body, and the two timeouts.
 */
import { Dispatcher } from "undici";
import { invalidArg } from "./errors.ts";
import type { Http1Pool } from "./pool.ts";
import type { Http1Handler } from "./request.ts";

export class Http1Dispatcher extends Dispatcher {
  private readonly pool: Http1Pool;

  constructor(pool: Http1Pool) {
    super();
    this.pool = pool;
  }

  override dispatch(opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    const h = handler as unknown as Http1Handler;
    if (typeof h.onHeaders !== "function" || typeof h.onData !== "function") {
      throw invalidArg("Http1Dispatcher takes handlers with undici's core hooks only");
    }
    const body = opts.body;
    if (body !== undefined && body !== null && typeof body !== "string" && !Buffer.isBuffer(body)) {
      h.onError(invalidArg("Http1Dispatcher takes a string or Buffer body only"));
      return false;
    }
    return this.pool.dispatch(
      {
        path: opts.path,
        method: opts.method,
        headers: recordOf(opts.headers),
        body,
        headersTimeout: opts.headersTimeout,
        bodyTimeout: opts.bodyTimeout,
      },
      h,
    );
  }

  override close(): Promise<void>;
  override close(callback: () => void): void;
  override close(callback?: () => void): Promise<void> | undefined {
    const p = this.pool.close();
    if (!callback) return p;
    void p.then(callback);
    return undefined;
  }

  override destroy(): Promise<void>;
  override destroy(err: Error | null): Promise<void>;
  override destroy(callback: () => void): void;
  override destroy(err: Error | null, callback: () => void): void;
  override destroy(a?: Error | null | (() => void), b?: () => void): Promise<void> | undefined {
    const cb = typeof a === "function" ? a : b;
    const p = this.pool.destroy();
    if (!cb) return p;
    void p.then(cb);
    return undefined;
  }
}

function recordOf(h: Dispatcher.DispatchOptions["headers"]): Record<string, string> | null {
  if (h === undefined || h === null) return null;
  const out: Record<string, string> = {};
  if (Array.isArray(h)) {
    for (let i = 0; i + 1 < h.length; i += 2) out[String(h[i])] = String(h[i + 1]);
    return out;
  }
  for (const [k, v] of Object.entries(h as Record<string, string | string[] | undefined>)) {
    if (v !== undefined) out[k] = Array.isArray(v) ? v.join(", ") : v;
  }
  return out;
}
