/**
 * Connection handling: frames in, frames out, strictly in order per connection. HELLO (the
 * handshake that passes the arena fd) and STATS are answered here; the rest go to handlers.
 * A framing violation closes only the offending connection; nothing a client sends can
 * throw out of this module.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import type net from "node:net";
import { z } from "zod";
import { BadRequestError, InferaError, toInferaError } from "../protocol/errors.ts";
import type { Logger } from "../util/log.ts";
import type { ConnGuard } from "./conn-guard.ts";
import { type ConnState, commitSunkPut, handle, putSink, type Reply, releaseConn } from "./handlers.ts";
import { sendWithFds } from "./native/fdpass.ts";
import {
  encodeFrame,
  FLAG_ERROR,
  FLAG_RESPONSE,
  type Frame,
  FrameDecoder,
  FrameTooLargeError,
  Op,
  PROTOCOL_VERSION,
  ProtocolError,
} from "./protocol.ts";
import { readFrames, type SocketReadStats, widenSendBuffer } from "./socket-reader.ts";
import type { TieredStore } from "./store.ts";

export interface ServeContext {
  store: TieredStore;
  log: Logger;
  maxFrameBytes: number;
  stats: () => Record<string, unknown>;
  onClientCount: (delta: number) => void;
  /** Read sunk PUT data straight into the arena reservation (socket-reader.ts). */
  directRead: boolean;
  reads: SocketReadStats;
  /**
   * Shared secret TCP clients must send in HELLO (`token`) before anything else is answered.
   * Unset: TCP is open to whoever reaches it (the daemon only allows that on loopback).
   */
  tcpToken?: string;
  /**
   * Backpressure bound per connection: requests read but not yet answered (their data
   * included) plus replies the socket has not sent. Past it the daemon stops reading that
   * connection until it is under half; a client that sends and never reads costs this much,
   * not everything it sends.
   */
  maxQueuedBytes: number;
  /**
   * TCP pre-auth limits and refusal accounting (conn-guard.ts): until its HELLO is accepted a
   * TCP connection may send one frame of at most `preAuthFrameBytes` and must do so within
   * `authTimeoutMs`. Unix-socket connections are exempt (their file mode guards them).
   */
  guard: ConnGuard;
}

/** Requests read but unanswered on one connection before it is paused (whatever their size). */
const MAX_QUEUED_FRAMES = 1024;

const helloSchema = z.object({
  namespace: z.string().min(1).max(256).optional(),
  arena: z.boolean().optional(),
  client: z.string().max(256).optional(),
  token: z.string().max(4096).optional(),
});

const unauthenticated = (message: string) =>
  new InferaError(401, message, { type: "authentication_error", param: "token", code: "invalid_token" });

const digest = (s: string) => createHash("sha256").update(s, "utf8").digest();

/** Constant-time comparison (over digests, so lengths leak nothing either). */
function tokenMatches(given: string | undefined, expected: string): boolean {
  return given !== undefined && timingSafeEqual(digest(given), digest(expected));
}

export function serveConnection(sock: net.Socket, ctx: ServeContext, transport: "unix" | "tcp"): void {
  new Connection(sock, ctx, transport).start();
}

/**
 * One client connection: its state (namespace, leases, reservations), the auth state of a TCP
 * connection, the ordered chain of requests being answered, and the backpressure that pauses
 * reading while too much waits.
 */
class Connection {
  private readonly sock: net.Socket;
  private readonly ctx: ServeContext;
  private readonly transport: "unix" | "tcp";
  private readonly st: ConnState = {
    namespace: null,
    arena: false,
    leases: new Map(),
    reservations: new Map(),
    nextHandle: 1,
  };
  /** A TCP connection with a token configured answers nothing but HELLO until it sent the token. */
  private authed: boolean;
  /** A TCP connection whose HELLO has not been accepted yet (see ServeContext.guard). */
  private preAuth: boolean;
  private readonly decoder: FrameDecoder;
  private readonly authTimer: NodeJS.Timeout | undefined;
  private chain: Promise<void> = Promise.resolve();
  private closed = false;
  /** Frames taken by `chain` and not yet answered (and drained), and their data bytes. */
  private queued = 0;
  private queuedBytes = 0;
  private paused = false;

  constructor(sock: net.Socket, ctx: ServeContext, transport: "unix" | "tcp") {
    this.sock = sock;
    this.ctx = ctx;
    this.transport = transport;
    this.authed = transport === "unix" || ctx.tcpToken === undefined;
    this.decoder = new FrameDecoder(ctx.maxFrameBytes, false, (op, meta, len) =>
      this.closed || !this.authed ? null : putSink(ctx.store, this.st, op, meta, len),
    );
    this.preAuth = transport === "tcp";
    if (this.preAuth) this.decoder.frameLimit = ctx.guard.limits.preAuthFrameBytes;
    this.authTimer = this.preAuth
      ? setTimeout(() => {
          if (this.closed || !this.preAuth) return;
          ctx.guard.refuse("auth_timeout", sock.remoteAddress);
          this.close();
        }, ctx.guard.limits.authTimeoutMs)
      : undefined;
    this.authTimer?.unref();
  }

  start(): void {
    const { sock, ctx } = this;
    ctx.onClientCount(1);
    // Copy-path GET answers leave in fewer partial writes (see SEND_BUFFER_BYTES).
    if (this.transport === "unix") widenSendBuffer(sock);
    readFrames(sock, {
      decoder: this.decoder,
      stats: ctx.reads,
      direct: ctx.directRead,
      closed: () => this.closed,
      onViolation: (why, err) =>
        err instanceof FrameTooLargeError ? this.refuseOversize(err) : this.close(why),
      onFrames: (frames) => {
        for (const f of frames) {
          if (this.closed) return;
          if (this.queued === 0 && f.sinkToken !== undefined && f.op === Op.PUT) this.putNow(f);
          else this.enqueue(f);
        }
        this.throttle();
      },
    });
    sock.on("drain", this.unthrottle);
    sock.on("error", () => this.close());
    sock.on("close", () => this.close());
  }

  private endPreAuth(): void {
    this.preAuth = false;
    this.decoder.frameLimit = undefined;
    clearTimeout(this.authTimer);
  }

  private close(why?: string): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.authTimer);
    if (why)
      this.ctx.log.warn(
        { transport: this.transport, why },
        "kvd closed a connection after a malformed frame",
      );
    this.sock.destroy();
    releaseConn(this.ctx.store, this.st);
    this.ctx.onClientCount(-1);
  }

  /**
   * Sends a last frame and closes: ends the socket so the frame is delivered, and destroys it
   * a little later whatever happens (a peer that does not read must not hold it open).
   */
  private closeAfter(parts: Buffer[]): void {
    if (this.closed) return;
    this.send(parts);
    this.closed = true;
    clearTimeout(this.authTimer);
    const sock = this.sock;
    sock.end();
    setTimeout(() => sock.destroy(), 2000).unref();
    releaseConn(this.ctx.store, this.st);
    this.ctx.onClientCount(-1);
  }

  /** Writes a frame's parts; false when the socket's buffer is full (wait for drainage). */
  private send(parts: Buffer[], after?: () => void): boolean {
    if (this.closed) {
      after?.();
      return true;
    }
    const sock = this.sock;
    const cb = after ? () => after() : undefined;
    // One part (header and meta, no data) is one plain write; more are corked into a writev.
    if (parts.length === 1) return sock.write(parts[0]!, cb);
    let ok = true;
    sock.cork();
    for (let i = 0; i < parts.length; i++)
      ok = sock.write(parts[i]!, i === parts.length - 1 ? cb : undefined);
    sock.uncork();
    return ok;
  }

  private readonly drained = (): Promise<void> =>
    new Promise((resolve) => {
      if (this.closed) return resolve();
      const sock = this.sock;
      const done = () => {
        sock.off("drain", done);
        sock.off("close", done);
        resolve();
      };
      sock.on("drain", done);
      sock.on("close", done);
    });

  // Backpressure: the next request is not processed until the socket drained.
  private async write(parts: Buffer[], after?: () => void): Promise<void> {
    if (!this.send(parts, after)) await this.drained();
  }

  private errorFrame(f: Frame, err: unknown): Buffer[] {
    const e = toInferaError(err);
    if (!(err instanceof InferaError))
      this.ctx.log.error({ err: String(err), op: f.op }, "kvd handler failed");
    return encodeFrame(f.op, FLAG_RESPONSE | FLAG_ERROR, f.id, { error: e.toJSON().error, status: e.status });
  }

  private async hello(f: Frame): Promise<void> {
    const { ctx, st, sock } = this;
    const m = helloSchema.safeParse(f.meta);
    if (!m.success) throw new ProtocolError("invalid HELLO");
    if (!this.authed) {
      if (!tokenMatches(m.data.token, ctx.tcpToken!)) {
        ctx.guard.refuse("bad_token", sock.remoteAddress);
        return this.closeAfter(this.errorFrame(f, unauthenticated("kvd: missing or wrong token in HELLO")));
      }
      this.authed = true;
    }
    if (m.data.namespace?.includes("\0"))
      throw new BadRequestError("namespace must not contain NUL", "namespace", "invalid_namespace");
    if (m.data.namespace) st.namespace = m.data.namespace;
    this.endPreAuth();
    const wantFd = m.data.arena !== false && this.transport === "unix";
    const meta = {
      version: PROTOCOL_VERSION,
      arena: wantFd,
      arena_bytes: ctx.store.l2.arena.bytes,
      namespace: st.namespace,
      max_frame_bytes: ctx.maxFrameBytes,
      ephemeral: ctx.store.ephemeral,
    };
    const frame = Buffer.concat(encodeFrame(Op.HELLO, FLAG_RESPONSE, f.id, meta));
    if (wantFd) {
      // The fd-carrying reply bypasses `net`'s write queue: let earlier replies leave first.
      if (sock.writableLength > 0) await new Promise((r) => sock.once("drain", r));
      await sendWithFds(sock, frame, [ctx.store.l2.arena.fd]);
      st.arena = true;
    } else await this.write([frame]);
  }

  private async process1(f: Frame): Promise<void> {
    let reply: Reply;
    try {
      if (f.op === Op.HELLO) return await this.hello(f);
      if (!this.authed)
        return this.closeAfter(this.errorFrame(f, unauthenticated("kvd: send HELLO with the token first")));
      // Without a token there is nothing to authenticate: the first frame ends the pre-auth state.
      if (this.preAuth) this.endPreAuth();
      reply =
        f.op === Op.STATS
          ? { meta: this.ctx.stats() }
          : await handle(this.ctx.store, this.st, f.op, f.meta, f.data, f.sinkToken);
    } catch (err) {
      if (err instanceof ProtocolError) throw err;
      await this.write(this.errorFrame(f, err));
      return;
    }
    await this.write(encodeFrame(f.op, FLAG_RESPONSE, f.id, reply.meta, reply.data), reply.afterWrite);
  }

  /** Stops reading while too much waits on this connection (see ServeContext.maxQueuedBytes). */
  private throttle(): void {
    if (this.paused || this.closed) return;
    if (
      this.queued > MAX_QUEUED_FRAMES ||
      this.queuedBytes + this.sock.writableLength > this.ctx.maxQueuedBytes
    ) {
      this.paused = true;
      this.sock.pause();
    }
  }

  private readonly unthrottle = (): void => {
    if (!this.paused || this.closed) return;
    if (
      this.queued <= MAX_QUEUED_FRAMES / 2 &&
      this.queuedBytes + this.sock.writableLength <= this.ctx.maxQueuedBytes / 2
    ) {
      this.paused = false;
      this.sock.resume();
    }
  };

  private enqueue(f: Frame): void {
    this.queued++;
    const n = f.data.length;
    this.queuedBytes += n;
    this.chain = this.chain
      .then(() =>
        this.closed
          ? undefined
          : this.process1(f).catch((e) =>
              this.close(e instanceof ProtocolError ? e.message : `request failed: ${String(e)}`),
            ),
      )
      .then(() => {
        this.queued--;
        this.queuedBytes -= n;
        this.unthrottle();
      });
  }

  /**
   * A PUT received into its reservation needs nothing asynchronous: committed and answered
   * right here, in the read callback that completed it, with no promise per frame. Only when
   * nothing is queued before it, so answers stay in request order; if the answer fills the
   * socket's buffer, whatever comes next waits on the chain until it drained.
   */
  private putNow(f: Frame): void {
    let parts: Buffer[];
    try {
      parts = encodeFrame(
        f.op,
        FLAG_RESPONSE,
        f.id,
        commitSunkPut(this.ctx.store, this.st, f.sinkToken!).meta,
      );
    } catch (err) {
      parts = this.errorFrame(f, err);
    }
    if (this.send(parts)) return;
    this.queued++;
    this.chain = this.chain.then(this.drained).then(() => {
      this.queued--;
      this.unthrottle();
    });
  }

  /** An oversized frame: say so (413, with the request's op and id), then close. */
  private refuseOversize(e: FrameTooLargeError): void {
    if (this.closed) return;
    this.sock.pause();
    const err = new InferaError(413, e.message, { code: "frame_too_large", param: "data_length" });
    const parts = encodeFrame(e.op, FLAG_RESPONSE | FLAG_ERROR, e.id, {
      error: err.toJSON().error,
      status: 413,
      max_frame_bytes: e.limit,
    });
    // After the answers to what came before it, so responses stay in request order.
    const beforeAuth = this.preAuth;
    this.chain = this.chain.then(() => {
      if (beforeAuth) this.ctx.guard.refuse("preauth_frame", this.sock.remoteAddress);
      else
        this.ctx.log.warn(
          { transport: this.transport, why: e.message },
          "kvd closed a connection after an oversized frame",
        );
      this.closeAfter(parts);
    });
  }
}
