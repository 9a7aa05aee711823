/**
 * The raw front (issue #32): the plainest requests to the route table's hot routes served
 * straight off the socket, every other request by node:http as before.
 *
 * Why: node:http's server side (IncomingMessage and ServerResponse streams, their events, the
 * header maps) costs about as much CPU per request as infera's own routing and relay; in a
 * bare proxy a raw `net` front took 53–67 µs per request where node:http took 93–110
 * (bench/router-overhead RESULTS, 2026-12-05 09:30). What it may not cost is any of node:http's
 * checks. So this front takes a request only when it can prove it plain (./request-head.ts: a
 * whole HTTP/1.1 POST or GET, head and body, to a hot route, nothing unusual in its fields) and hands
 * the connection, with every byte it read, to node:http's own connection listener the moment
 * it cannot. Node's parser then answers the odd request exactly as it did before (its 400, 431,
 * 408, 100-continue, its limits and timeouts), and serves that connection from then on.
 *
 * It sits in front of node:http on the same `http.Server`: it replaces the server's
 * `connection` listeners and calls them on a hand-off, so listening, `address()`, `close()`
 * and the connection count stay node's. What node:http does for its own connections and this
 * front does for its own:
 * - keep-alive: an idle connection is closed after `keepAliveTimeoutMs` (checked every 1 s);
 * - pipelining: requests are answered in order; bytes that arrive during an answer wait
 *   (past 64 KiB the socket is paused, as node:http pauses it);
 * - a client that closes or half-closes while its answer runs: the response's `close` comes
 *   before its `finish`, which aborts the worker's request (request-context.ts);
 * - drain and close: `closeIdle()` (what `server.close()` does to node's idle connections)
 *   and `closeAll()` (`closeAllConnections()`).
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { type ExchangeOwner, RawRequest, RawResponse } from "./exchange.ts";
import { parseHotHead } from "./request-head.ts";

export interface RawFrontOptions {
  /** The routes served here (POST or GET); every other request goes to node:http. */
  isHot: (method: string, path: string) => boolean;
  /** The server's request listener (routes.ts's dispatcher), called with this front's request and response. */
  handle: (req: IncomingMessage, res: ServerResponse) => void;
  /** As node:http's `keepAliveTimeout`: an idle connection is closed after this. */
  keepAliveTimeoutMs: number;
}

/** Bytes held for requests pipelined behind a running one before the socket is paused. */
const PIPELINE_HOLD_BYTES = 64 * 1024;
/**
 * A larger request goes to node:http even when it came whole: bodies past the body parser's
 * off-loop threshold (256 KiB) are moved to a worker thread, which must own their buffer.
 */
const MAX_RAW_REQUEST_BYTES = 128 * 1024;
const SWEEP_MS = 1000;

type ConnectionListener = (this: Server, socket: Socket) => void;

export class RawFront {
  /** Requests this front served itself, and connections it handed to node:http. */
  served = 0;
  handedOff = 0;
  private readonly server: Server;
  private readonly opts: RawFrontOptions;
  private readonly nodeListeners: ConnectionListener[];
  private readonly conns = new Set<RawConnection>();
  private sweeper: NodeJS.Timeout | null = null;

  constructor(server: Server, opts: RawFrontOptions) {
    this.server = server;
    this.opts = opts;
    this.nodeListeners = server.listeners("connection") as ConnectionListener[];
    server.removeAllListeners("connection");
    server.on("connection", (socket: Socket) => this.accept(socket));
  }

  /** Closes this front's idle keep-alive connections (a drain: node's `server.close()` does it for its own). */
  closeIdle(): void {
    for (const c of this.conns) if (c.idle) c.socket.destroy();
  }

  /** Closes every connection this front holds (the server's close). */
  closeAll(): void {
    for (const c of this.conns) c.socket.destroy();
    this.conns.clear();
    if (this.sweeper) clearInterval(this.sweeper);
    this.sweeper = null;
  }

  private accept(socket: Socket): void {
    const c = new RawConnection(this, socket);
    this.conns.add(c);
    if (!this.sweeper) {
      this.sweeper = setInterval(() => this.sweep(), SWEEP_MS);
      this.sweeper.unref();
    }
  }

  /** @internal */
  dropped(c: RawConnection): void {
    this.conns.delete(c);
  }

  /** @internal Gives `c`'s socket (and the bytes read of it) to node:http for good. */
  handOff(c: RawConnection, bytes: Buffer | null): void {
    const socket = c.socket;
    this.conns.delete(c);
    this.handedOff++;
    for (const l of this.nodeListeners) l.call(this.server, socket);
    if (socket.isPaused()) socket.resume();
    // Straight into node's parser (its `data` listener), before anything newer can arrive.
    if (bytes) socket.emit("data", bytes);
  }

  /** @internal */
  get options(): RawFrontOptions {
    return this.opts;
  }

  private sweep(): void {
    const cutoff = Date.now() - this.opts.keepAliveTimeoutMs;
    for (const c of this.conns) if (c.idle && c.lastActive < cutoff) c.socket.destroy();
    if (this.conns.size === 0 && this.sweeper) {
      clearInterval(this.sweeper);
      this.sweeper = null;
    }
  }
}

/** One client connection while this front serves it. */
class RawConnection implements ExchangeOwner {
  readonly socket: Socket;
  readonly keepAliveTimeoutS: number;
  lastActive = Date.now();
  private readonly front: RawFront;
  /** Bytes read and not yet taken by a request. */
  private buf: Buffer | null = null;
  private req: RawRequest | null = null;
  private res: RawResponse | null = null;
  private readonly onData = (d: Buffer): void => {
    this.buf = this.buf === null ? d : Buffer.concat([this.buf, d]);
    if (this.res === null) this.next();
    else if (this.buf.length > PIPELINE_HOLD_BYTES) this.socket.pause();
  };
  private readonly onEnd = (): void => {
    // As node:http without allowHalfOpen: a half-close ends the connection, and an answer
    // still running is the client's abort.
    if (this.res) this.socket.destroy();
    else this.socket.end();
  };
  private readonly onClose = (): void => {
    this.front.dropped(this);
    const req = this.req;
    const res = this.res;
    this.req = null;
    this.res = null;
    if (res) {
      res.gone();
      req?.emit("close");
    }
  };
  private readonly onDrain = (): void => {
    this.res?.emit("drain");
  };
  private readonly onError = (err: Error): void => {
    // As node's response: an error with nobody listening must not throw ('close' follows anyway).
    if (this.res && this.res.listenerCount("error") > 0) this.res.emit("error", err);
  };

  constructor(front: RawFront, socket: Socket) {
    this.front = front;
    this.socket = socket;
    this.keepAliveTimeoutS = Math.floor(front.options.keepAliveTimeoutMs / 1000);
    socket.setNoDelay(true);
    socket.on("data", this.onData);
    socket.on("end", this.onEnd);
    socket.on("close", this.onClose);
    socket.on("drain", this.onDrain);
    socket.on("error", this.onError);
  }

  get idle(): boolean {
    return this.res === null;
  }

  answered(res: RawResponse, close: boolean): void {
    if (res !== this.res) return;
    this.res = null;
    this.req = null;
    this.lastActive = Date.now();
    if (close) {
      this.socket.end();
      return;
    }
    if (this.socket.isPaused()) this.socket.resume();
    if (this.buf !== null) this.next();
  }

  /** Serves the request at the head of `buf`, or hands the connection to node:http. */
  private next(): void {
    const buf = this.buf!;
    const opts = this.front.options;
    const head = parseHotHead(buf, opts.isHot);
    const total = head ? head.headLength + head.contentLength : 0;
    if (head === null || total > MAX_RAW_REQUEST_BYTES) {
      this.release();
      this.front.handOff(this, buf);
      return;
    }
    this.buf = buf.length > total ? buf.subarray(total) : null;
    const req = new RawRequest(
      this.socket,
      head.method,
      head.path,
      head.headers,
      buf.subarray(head.headLength, total),
    );
    const res = new RawResponse(this.socket, this, head.close);
    this.req = req;
    this.res = res;
    this.front.served++;
    // The handlers are typed for node:http's objects; these two carry the part of them the
    // hot path uses (./exchange.ts lists it), with node's meaning.
    opts.handle(req as unknown as IncomingMessage, res as unknown as ServerResponse);
  }

  /** Lets go of the socket: node:http's listeners take it from here. */
  private release(): void {
    const s = this.socket;
    s.off("data", this.onData);
    s.off("end", this.onEnd);
    s.off("close", this.onClose);
    s.off("drain", this.onDrain);
    s.off("error", this.onError);
    this.buf = null;
  }
}
