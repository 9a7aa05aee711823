/**
 * A worker origin's pool of raw HTTP/1.1 connections: kept-alive sockets reused most recent
 * first, at most `connections` open, requests beyond that queued in order. The request plane's
 * hot path (issue #32): undici's Pool with node:http cost ≈ 35 µs per proxied request more
 * than raw sockets, ≈ 20–30 µs of it on the upstream side (bench/router-overhead/RESULTS.md).
 *
 * Semantics kept from undici's Pool, which it replaces for proxied requests: one request per
 * connection at a time; `dispatch(opts, handler)` with undici's core handler hooks; `close()`
 * lets queued and running requests finish, `destroy()` fails them; a server's
 * `Keep-Alive: timeout=N` is honoured less a threshold (2 s, undici's default); no request is
 * retried except the keep-alive race (see Http1Connection.fail).
 */
import { type ConnectionOwner, type Endpoint, Http1Connection } from "./connection.ts";
import { poolClosed, poolDestroyed } from "./errors.ts";
import { type Http1Handler, type Http1RequestOptions, PendingRequest } from "./request.ts";

export interface Http1PoolOptions {
  /** Max open connections. */
  connections?: number;
  /** Wait for an answer's head, from when the request is written (ms; 0: no limit). */
  headersTimeoutMs?: number;
  /** Longest gap between an answer's body chunks (ms; 0: no limit). */
  bodyTimeoutMs?: number;
  /** How long an idle connection is kept when the server gives no `Keep-Alive` hint. */
  keepAliveTimeoutMs?: number;
  /** The longest a server's hint keeps a connection (undici: 600 s). */
  keepAliveMaxTimeoutMs?: number;
  /** Kept this much less than the server's hint (undici: 2 s). */
  keepAliveTimeoutThresholdMs?: number;
  connectTimeoutMs?: number;
}

export class Http1Pool implements ConnectionOwner {
  private readonly ep: Endpoint;
  /** `host[:port]` as the Host header carries it. */
  private readonly host: string;
  private readonly max: number;
  private readonly headersTimeout: number;
  private readonly bodyTimeout: number;
  private readonly conns = new Set<Http1Connection>();
  /** Idle connections, most recently used last. */
  private readonly idle: Http1Connection[] = [];
  private readonly queue: PendingRequest[] = [];
  private closed = false;
  private destroyed = false;
  private onDrained: (() => void) | null = null;
  private readonly dequeue = (r: PendingRequest): void => {
    const i = this.queue.indexOf(r);
    if (i >= 0) this.queue.splice(i, 1);
  };

  constructor(origin: string, opts: Http1PoolOptions = {}) {
    const u = new URL(origin);
    if (u.protocol !== "http:" && u.protocol !== "https:")
      throw new Error(`unsupported protocol ${u.protocol}`);
    const secure = u.protocol === "https:";
    this.host = u.host;
    this.ep = {
      host: u.hostname.startsWith("[") ? u.hostname.slice(1, -1) : u.hostname,
      port: u.port ? Number(u.port) : secure ? 443 : 80,
      tls: secure,
      connectTimeoutMs: opts.connectTimeoutMs ?? 10_000,
      keepAliveMs: opts.keepAliveTimeoutMs ?? 4000,
      keepAliveMaxMs: opts.keepAliveMaxTimeoutMs ?? 600_000,
      keepAliveThresholdMs: opts.keepAliveTimeoutThresholdMs ?? 2000,
    };
    this.max = opts.connections ?? 256;
    this.headersTimeout = opts.headersTimeoutMs ?? 600_000;
    this.bodyTimeout = opts.bodyTimeoutMs ?? 300_000;
  }

  /** Open connections (busy or idle). */
  get size(): number {
    return this.conns.size;
  }

  /**
   * Sends a request; the handler hears of it through undici's core hooks. A failure before it
   * is handed to a connection (bad arguments, a closed pool) reaches `onError` without `onConnect`.
   */
  dispatch(opts: Http1RequestOptions, handler: Http1Handler): boolean {
    if (this.closed) {
      handler.onError(this.destroyed ? poolDestroyed() : poolClosed());
      return false;
    }
    let r: PendingRequest;
    try {
      r = new PendingRequest(opts, this.host, handler, this.headersTimeout, this.bodyTimeout);
    } catch (err) {
      handler.onError(err as Error);
      return false;
    }
    const now = Date.now();
    for (let c = this.idle.pop(); c !== undefined; c = this.idle.pop()) {
      if (c.usable(now)) {
        c.start(r);
        return true;
      }
      c.destroy();
    }
    if (this.conns.size < this.max) this.open().start(r);
    else {
      r.onDequeue = this.dequeue;
      this.queue.push(r);
    }
    return true;
  }

  private open(): Http1Connection {
    const c = new Http1Connection(this.ep, this);
    this.conns.add(c);
    return c;
  }

  private next(): PendingRequest | undefined {
    const r = this.queue.shift();
    if (r !== undefined) r.onDequeue = null;
    return r;
  }

  // --- ConnectionOwner ---------------------------------------------------------------------

  release(conn: Http1Connection): void {
    const r = this.next();
    if (r !== undefined) conn.start(r);
    else if (this.closed) conn.destroy();
    else this.idle.push(conn);
  }

  removed(conn: Http1Connection): void {
    this.conns.delete(conn);
    const i = this.idle.indexOf(conn);
    if (i >= 0) this.idle.splice(i, 1);
    // A slot freed while requests wait (a connection failed or was not reusable): fill it.
    if (this.queue.length > 0 && this.conns.size < this.max && !this.destroyed)
      this.open().start(this.next()!);
    if (this.closed && this.conns.size === 0 && this.queue.length === 0) this.onDrained?.();
  }

  retry(req: PendingRequest): void {
    if (this.destroyed) req.cancel(poolDestroyed());
    else this.open().start(req);
  }

  // --- lifecycle ---------------------------------------------------------------------------

  /** Takes no more requests; those queued or running finish. Resolves once every socket closed. */
  close(): Promise<void> {
    this.closed = true;
    for (const c of this.idle.splice(0)) c.destroy();
    return this.drained();
  }

  /** Fails every queued and running request and closes every socket. */
  destroy(): Promise<void> {
    this.closed = true;
    this.destroyed = true;
    for (const r of this.queue.splice(0)) {
      r.onDequeue = null;
      r.cancel(poolDestroyed());
    }
    for (const c of [...this.conns]) c.fail(poolDestroyed());
    return this.drained();
  }

  private drained(): Promise<void> {
    if (this.conns.size === 0 && this.queue.length === 0) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const prev = this.onDrained;
      this.onDrained = () => {
        prev?.();
        resolve();
      };
    });
  }
}
