/**
 * One kept-alive connection to a worker: a `net` (or `tls`) socket carrying one request at a
 * time (no pipelining), the request's head and body written at once, the answer parsed by
 * `ResponseParser` and handed to the request's handler as it arrives, with backpressure (a
 * handler that returns false pauses the socket). Deadlines (connect, answer head, body gap,
 * idle) are checked by the shared sweeper; aborting a request destroys the socket, so the
 * engine sees the disconnect and stops generating.
 */
import net, { type Socket } from "node:net";
import tls from "node:tls";
import { bodyTimeout, connectTimeout, headersTimeout, socketClosed } from "./errors.ts";
import { type ResponseHead, ResponseParser, type ResponseSink } from "./parser.ts";
import { ACTIVE, type Carrier, DONE, type PendingRequest, QUEUED } from "./request.ts";
import { PRECISE_BELOW_MS, type Swept, unwatch, watch } from "./sweeper.ts";

/** Where and how to connect, and how long an idle connection may be kept. */
export interface Endpoint {
  host: string;
  port: number;
  tls: boolean;
  connectTimeoutMs: number;
  /** Idle time without a server hint. */
  keepAliveMs: number;
  /** A `Keep-Alive: timeout=N` hint is trusted up to this. */
  keepAliveMaxMs: number;
  /** Kept idle this much less than the server's hint, so the server never closes it first. */
  keepAliveThresholdMs: number;
}

/** The pool a connection reports to. */
export interface ConnectionOwner {
  /** The answer ended and the connection may carry another request. */
  release(conn: Http1Connection): void;
  /** The socket closed. */
  removed(conn: Http1Connection): void;
  /** Sends `req` again on a fresh connection (the keep-alive race, see `fail`). */
  retry(req: PendingRequest): void;
}

const P_CONNECTING = 0;
const P_IDLE = 1;
const P_HEAD = 2;
const P_BODY = 3;
const P_CLOSED = 4;

/**
 * Where every plain-TCP connection reads into (`onread`): the bytes are copied out at once, so
 * one buffer serves them all, and a read skips the socket's Readable machinery ('data' events),
 * ≈ 1 µs per answer (bench/router-overhead/upstream-client.ts). TLS sockets use 'data'.
 */
const READ_BUF = Buffer.allocUnsafe(64 * 1024);

/** What a reused connection's failure looks like when the server had closed it while idle. */
const RACE_CODES = new Set(["UND_ERR_SOCKET", "ECONNRESET", "EPIPE"]);

export class Http1Connection implements ResponseSink, Carrier, Swept {
  private readonly socket: Socket;
  private readonly ep: Endpoint;
  private readonly owner: ConnectionOwner;
  private readonly parser: ResponseParser;
  private req: PendingRequest | null = null;
  private phase = P_CONNECTING;
  /** Connect or head deadline, or when an idle connection is evicted (ms since epoch). */
  private deadline: number;
  /** Answers completed on it: a request failing on a used connection may be the keep-alive race. */
  private served = 0;
  private reusable = false;
  private idleMs = 0;
  /** Bytes received but not parsed while the handler had paused. */
  private stash: Buffer | null = null;
  private socketPaused = false;
  private error: Error | null = null;
  /** Body-gap accounting for the sweeper: bytes read at the last tick, and ms without progress. */
  private seenBytes = 0;
  private stallMs = 0;
  /** A per-request timer, only for timeouts too short for the sweeper's tick. */
  private precise: NodeJS.Timeout | null = null;
  /** Whether the carried request's bytes went out (a request cancelled before leaves the socket clean). */
  private sent = false;
  /** An idle connection's eviction time, kept while a request is being announced. */
  private idleDeadline = 0;

  constructor(ep: Endpoint, owner: ConnectionOwner) {
    this.ep = ep;
    this.owner = owner;
    this.parser = new ResponseParser(this);
    const s = ep.tls
      ? tls.connect({ host: ep.host, port: ep.port, servername: net.isIP(ep.host) ? undefined : ep.host })
      : net.connect({
          host: ep.host,
          port: ep.port,
          onread: { buffer: READ_BUF, callback: (n: number, b: Uint8Array) => this.onRead(n, b) },
        });
    this.socket = s;
    s.setNoDelay(true);
    s.setKeepAlive(true, 60_000);
    this.deadline = Date.now() + ep.connectTimeoutMs;
    s.once(ep.tls ? "secureConnect" : "connect", () => this.connected());
    if (ep.tls) s.on("data", (b: Buffer) => this.onData(b));
    s.on("end", () => this.onEnd());
    s.on("error", (e: Error) => {
      this.error ??= e;
    });
    s.on("close", () => this.onClose());
    watch(this);
  }

  /** Whether an idle connection can take a request now. */
  usable(now: number): boolean {
    return this.phase === P_IDLE && now < this.deadline && !this.socket.destroyed;
  }

  /** Carries `req` (sent at once, or when the socket connects). */
  start(req: PendingRequest): void {
    this.req = req;
    req.carrier = this;
    req.state = ACTIVE;
    if (this.phase !== P_CONNECTING) this.send(req);
  }

  private connected(): void {
    if (this.phase !== P_CONNECTING) return;
    this.phase = P_IDLE;
    if (this.req !== null) this.send(this.req);
  }

  private send(r: PendingRequest): void {
    this.parser.reset(r.method === "HEAD");
    this.idleDeadline = this.deadline;
    this.sent = false;
    this.phase = P_HEAD;
    const t = r.headersTimeout;
    this.deadline = t > 0 ? Date.now() + t : Number.POSITIVE_INFINITY;
    if (t > 0 && t < PRECISE_BELOW_MS) this.arm(t, headersTimeout);
    if (this.socketPaused) {
      this.socketPaused = false;
      this.socket.resume();
    }
    this.socket.ref();
    if (!r.announced) {
      r.announced = true;
      r.handler.onConnect(r.abort);
      if (this.req !== r) return; // aborted from onConnect
    }
    this.sent = true;
    const b = r.bytes;
    if (Array.isArray(b)) {
      this.socket.cork();
      this.socket.write(b[0], "latin1");
      this.socket.write(b[1]);
      this.socket.uncork();
    } else if (typeof b === "string") this.socket.write(b, "latin1");
    else this.socket.write(b);
  }

  /** A read into READ_BUF: copied out (the parser and the handler keep views of it). */
  private onRead(n: number, shared: Uint8Array): boolean {
    const b = Buffer.allocUnsafe(n);
    b.set(shared.subarray(0, n));
    this.onData(b);
    return true;
  }

  private onData(buf: Buffer): void {
    const r = this.req;
    if (r === null) {
      // Bytes on an idle connection answer nothing we asked: never reuse it.
      this.destroy();
      return;
    }
    r.received = true;
    this.feed(r, buf);
  }

  private feed(r: PendingRequest, buf: Buffer): void {
    let at: number;
    try {
      at = this.parser.execute(buf);
    } catch (err) {
      this.fail(err as Error);
      return;
    }
    if (this.req !== r) return; // cancelled from a handler hook
    // Bytes after a complete answer were not asked for: the connection is not reused.
    if (this.parser.done) this.complete(r, at < buf.length);
    else if (this.parser.paused) {
      if (at < buf.length) this.stash = buf.subarray(at);
      if (!this.socketPaused) {
        this.socketPaused = true;
        this.socket.pause();
      }
    }
  }

  // --- ResponseSink ------------------------------------------------------------------------

  onHead(head: ResponseHead): boolean {
    const r = this.req;
    if (r === null || r.state !== ACTIVE) return false;
    this.phase = P_BODY;
    this.disarm();
    this.reusable = head.keepAlive;
    const hint = head.keepAliveHint;
    if (hint === undefined) this.idleMs = this.ep.keepAliveMs;
    else {
      this.idleMs = Math.min(hint * 1000 - this.ep.keepAliveThresholdMs, this.ep.keepAliveMaxMs);
      if (this.idleMs <= 0) this.reusable = false;
    }
    this.seenBytes = this.socket.bytesRead;
    this.stallMs = 0;
    const t = r.bodyTimeout;
    if (t > 0 && t < PRECISE_BELOW_MS) this.arm(t, bodyTimeout);
    return r.handler.onHeaders(head.status, head.raw, r.resume, head.statusText) !== false;
  }

  onBody(chunk: Buffer): boolean {
    const r = this.req;
    if (r === null || r.state !== ACTIVE) return false;
    this.precise?.refresh();
    return r.handler.onData(chunk) !== false;
  }

  // --- Carrier -----------------------------------------------------------------------------

  resume(r: PendingRequest): void {
    if (this.req !== r || (this.phase !== P_BODY && this.phase !== P_HEAD)) return;
    const s = this.stash;
    this.stash = null;
    if (s !== null) {
      this.feed(r, s);
      if (this.req !== r || this.parser.paused) return;
    }
    if (this.socketPaused) {
      this.socketPaused = false;
      this.socket.resume();
    }
  }

  cancel(r: PendingRequest, err: Error): void {
    if (this.req !== r) return;
    this.detach(r);
    if (!this.sent && this.phase === P_HEAD && this.served > 0) {
      // Cancelled as it was announced (a request aborted while it waited in the queue): none
      // of it was written, so the connection is as clean as before and goes back to the pool.
      this.phase = P_IDLE;
      this.deadline = this.idleDeadline;
      this.socket.unref();
      this.owner.release(this);
    } else {
      // The engine learns of the abort only from the closed connection (HTTP/1.1 has no other way).
      this.destroy();
    }
    r.handler.onError(err);
  }

  // --- endings -----------------------------------------------------------------------------

  private complete(r: PendingRequest, extra: boolean): void {
    this.detach(r);
    this.served++;
    // An answer that came while the request was still being written (an early error to a large
    // body): the rest of the body would go out ahead of the next request; not reused.
    if (this.reusable && !extra && this.phase !== P_CLOSED && this.socket.writableLength === 0) {
      this.phase = P_IDLE;
      this.deadline = Date.now() + this.idleMs;
      if (this.socketPaused) {
        this.socketPaused = false;
        this.socket.resume();
      }
      this.socket.unref();
      this.owner.release(this);
    } else this.destroy();
    r.handler.onComplete([]);
  }

  /**
   * Fails the request carried (if any) and closes the connection. A request that failed on a
   * reused connection before any byte of its answer came is sent once more on a fresh one:
   * that is the keep-alive race (the server closed the idle connection as the request went
   * out), not a worker failure. It is the same resend the router would do on another worker
   * for this failure, without counting it against a healthy worker.
   */
  fail(err: Error): void {
    const r = this.req;
    this.destroy();
    if (r === null || r.state !== ACTIVE) return;
    this.detach(r);
    if (
      !r.received &&
      this.served > 0 &&
      !r.retried &&
      RACE_CODES.has((err as { code?: string }).code ?? "")
    ) {
      r.retried = true;
      r.state = QUEUED;
      this.owner.retry(r);
      return;
    }
    r.handler.onError(err);
  }

  private onEnd(): void {
    const r = this.req;
    if (r === null) this.destroy();
    else if (this.parser.finish()) this.complete(r, true);
    else this.fail(socketClosed());
  }

  private onClose(): void {
    this.phase = P_CLOSED;
    this.disarm();
    unwatch(this);
    if (this.req !== null) this.fail(this.error ?? socketClosed());
    this.owner.removed(this);
  }

  destroy(): void {
    if (!this.socket.destroyed) this.socket.destroy();
  }

  private detach(r: PendingRequest): void {
    this.disarm();
    this.req = null;
    this.stash = null;
    r.carrier = null;
    r.state = DONE;
  }

  // --- deadlines ---------------------------------------------------------------------------

  private arm(ms: number, make: () => Error): void {
    this.disarm();
    this.precise = setTimeout(() => this.fail(make()), ms);
    this.precise.unref();
  }

  private disarm(): void {
    if (this.precise !== null) {
      clearTimeout(this.precise);
      this.precise = null;
    }
  }

  sweep(now: number, tickMs: number): void {
    switch (this.phase) {
      case P_CONNECTING:
        if (now > this.deadline) this.fail(connectTimeout());
        break;
      case P_HEAD:
        if (now > this.deadline) this.fail(headersTimeout());
        break;
      case P_BODY: {
        const t = this.req?.bodyTimeout ?? 0;
        // A paused body waits on the client, not the worker.
        if (t <= 0 || this.precise !== null || this.socketPaused) break;
        const b = this.socket.bytesRead;
        if (b !== this.seenBytes) {
          this.seenBytes = b;
          this.stallMs = 0;
        } else {
          this.stallMs += tickMs;
          if (this.stallMs >= t) this.fail(bodyTimeout());
        }
        break;
      }
      case P_IDLE:
        if (this.req === null && now > this.deadline) this.destroy();
        break;
    }
  }
}
