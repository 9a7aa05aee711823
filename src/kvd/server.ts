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
  const { store, log } = ctx;
  const st: ConnState = {
    namespace: null,
    arena: false,
    leases: new Map(),
    reservations: new Map(),
    nextHandle: 1,
  };
  /** A TCP connection with a token configured answers nothing but HELLO until it sent the token. */
  let authed = transport === "unix" || ctx.tcpToken === undefined;
  const decoder = new FrameDecoder(ctx.maxFrameBytes, false, (op, meta, len) =>
    closed || !authed ? null : putSink(store, st, op, meta, len),
  );
  let chain: Promise<void> = Promise.resolve();
  let closed = false;
  /** A TCP connection whose HELLO has not been accepted yet (see ServeContext.guard). */
  let preAuth = transport === "tcp";
  if (preAuth) decoder.frameLimit = ctx.guard.limits.preAuthFrameBytes;
  const authTimer = preAuth
    ? setTimeout(() => {
        if (closed || !preAuth) return;
        ctx.guard.refuse("auth_timeout", sock.remoteAddress);
        close();
      }, ctx.guard.limits.authTimeoutMs)
    : undefined;
  authTimer?.unref();
  const endPreAuth = () => {
    preAuth = false;
    decoder.frameLimit = undefined;
    clearTimeout(authTimer);
  };
  ctx.onClientCount(1);
  // Copy-path GET answers leave in fewer partial writes (see SEND_BUFFER_BYTES).
  if (transport === "unix") widenSendBuffer(sock);

  const close = (why?: string) => {
    if (closed) return;
    closed = true;
    clearTimeout(authTimer);
    if (why) log.warn({ transport, why }, "kvd closed a connection after a malformed frame");
    sock.destroy();
    releaseConn(store, st);
    ctx.onClientCount(-1);
  };

  /**
   * Sends a last frame and closes: ends the socket so the frame is delivered, and destroys it
   * a little later whatever happens (a peer that does not read must not hold it open).
   */
  const closeAfter = (parts: Buffer[]) => {
    if (closed) return;
    send(parts);
    closed = true;
    clearTimeout(authTimer);
    sock.end();
    setTimeout(() => sock.destroy(), 2000).unref();
    releaseConn(store, st);
    ctx.onClientCount(-1);
  };

  /** Writes a frame's parts; false when the socket's buffer is full (wait for drainage). */
  const send = (parts: Buffer[], after?: () => void): boolean => {
    if (closed) {
      after?.();
      return true;
    }
    const cb = after ? () => after() : undefined;
    // One part (header and meta, no data) is one plain write; more are corked into a writev.
    if (parts.length === 1) return sock.write(parts[0]!, cb);
    let ok = true;
    sock.cork();
    for (let i = 0; i < parts.length; i++)
      ok = sock.write(parts[i]!, i === parts.length - 1 ? cb : undefined);
    sock.uncork();
    return ok;
  };

  const drained = (): Promise<void> =>
    new Promise((resolve) => {
      if (closed) return resolve();
      const done = () => {
        sock.off("drain", done);
        sock.off("close", done);
        resolve();
      };
      sock.on("drain", done);
      sock.on("close", done);
    });

  // Backpressure: the next request is not processed until the socket drained.
  const write = async (parts: Buffer[], after?: () => void): Promise<void> => {
    if (!send(parts, after)) await drained();
  };

  const errorFrame = (f: Frame, err: unknown): Buffer[] => {
    const e = toInferaError(err);
    if (!(err instanceof InferaError)) log.error({ err: String(err), op: f.op }, "kvd handler failed");
    return encodeFrame(f.op, FLAG_RESPONSE | FLAG_ERROR, f.id, { error: e.toJSON().error, status: e.status });
  };

  const hello = async (f: Frame): Promise<void> => {
    const m = helloSchema.safeParse(f.meta);
    if (!m.success) throw new ProtocolError("invalid HELLO");
    if (!authed) {
      if (!tokenMatches(m.data.token, ctx.tcpToken!)) {
        ctx.guard.refuse("bad_token", sock.remoteAddress);
        return closeAfter(errorFrame(f, unauthenticated("kvd: missing or wrong token in HELLO")));
      }
      authed = true;
    }
    if (m.data.namespace?.includes("\0"))
      throw new BadRequestError("namespace must not contain NUL", "namespace", "invalid_namespace");
    if (m.data.namespace) st.namespace = m.data.namespace;
    endPreAuth();
    const wantFd = m.data.arena !== false && transport === "unix";
    const meta = {
      version: PROTOCOL_VERSION,
      arena: wantFd,
      arena_bytes: store.l2.arena.bytes,
      namespace: st.namespace,
      max_frame_bytes: ctx.maxFrameBytes,
      ephemeral: store.ephemeral,
    };
    const frame = Buffer.concat(encodeFrame(Op.HELLO, FLAG_RESPONSE, f.id, meta));
    if (wantFd) {
      // The fd-carrying reply bypasses `net`'s write queue: let earlier replies leave first.
      if (sock.writableLength > 0) await new Promise((r) => sock.once("drain", r));
      await sendWithFds(sock, frame, [store.l2.arena.fd]);
      st.arena = true;
    } else await write([frame]);
  };

  const process1 = async (f: Frame): Promise<void> => {
    let reply: Reply;
    try {
      if (f.op === Op.HELLO) return await hello(f);
      if (!authed) return closeAfter(errorFrame(f, unauthenticated("kvd: send HELLO with the token first")));
      // Without a token there is nothing to authenticate: the first frame ends the pre-auth state.
      if (preAuth) endPreAuth();
      reply =
        f.op === Op.STATS
          ? { meta: ctx.stats() }
          : await handle(store, st, f.op, f.meta, f.data, f.sinkToken);
    } catch (err) {
      if (err instanceof ProtocolError) throw err;
      await write(errorFrame(f, err));
      return;
    }
    await write(encodeFrame(f.op, FLAG_RESPONSE, f.id, reply.meta, reply.data), reply.afterWrite);
  };

  /** Frames taken by `chain` and not yet answered (and drained), and their data bytes. */
  let queued = 0;
  let queuedBytes = 0;
  let paused = false;
  /** Stops reading while too much waits on this connection (see ServeContext.maxQueuedBytes). */
  const throttle = () => {
    if (paused || closed) return;
    if (queued > MAX_QUEUED_FRAMES || queuedBytes + sock.writableLength > ctx.maxQueuedBytes) {
      paused = true;
      sock.pause();
    }
  };
  const unthrottle = () => {
    if (!paused || closed) return;
    if (queued <= MAX_QUEUED_FRAMES / 2 && queuedBytes + sock.writableLength <= ctx.maxQueuedBytes / 2) {
      paused = false;
      sock.resume();
    }
  };
  const enqueue = (f: Frame) => {
    queued++;
    const n = f.data.length;
    queuedBytes += n;
    chain = chain
      .then(() =>
        closed
          ? undefined
          : process1(f).catch((e) =>
              close(e instanceof ProtocolError ? e.message : `request failed: ${String(e)}`),
            ),
      )
      .then(() => {
        queued--;
        queuedBytes -= n;
        unthrottle();
      });
  };

  /**
   * A PUT received into its reservation needs nothing asynchronous: committed and answered
   * right here, in the read callback that completed it, with no promise per frame. Only when
   * nothing is queued before it, so answers stay in request order; if the answer fills the
   * socket's buffer, whatever comes next waits on the chain until it drained.
   */
  const putNow = (f: Frame) => {
    let parts: Buffer[];
    try {
      parts = encodeFrame(f.op, FLAG_RESPONSE, f.id, commitSunkPut(store, st, f.sinkToken!).meta);
    } catch (err) {
      parts = errorFrame(f, err);
    }
    if (send(parts)) return;
    queued++;
    chain = chain.then(drained).then(() => {
      queued--;
      unthrottle();
    });
  };

  /** An oversized frame: say so (413, with the request's op and id), then close. */
  const refuseOversize = (e: FrameTooLargeError) => {
    if (closed) return;
    sock.pause();
    const err = new InferaError(413, e.message, { code: "frame_too_large", param: "data_length" });
    const parts = encodeFrame(e.op, FLAG_RESPONSE | FLAG_ERROR, e.id, {
      error: err.toJSON().error,
      status: 413,
      max_frame_bytes: e.limit,
    });
    // After the answers to what came before it, so responses stay in request order.
    const beforeAuth = preAuth;
    chain = chain.then(() => {
      if (beforeAuth) ctx.guard.refuse("preauth_frame", sock.remoteAddress);
      else log.warn({ transport, why: e.message }, "kvd closed a connection after an oversized frame");
      closeAfter(parts);
    });
  };

  readFrames(sock, {
    decoder,
    stats: ctx.reads,
    direct: ctx.directRead,
    closed: () => closed,
    onViolation: (why, err) => (err instanceof FrameTooLargeError ? refuseOversize(err) : close(why)),
    onFrames: (frames) => {
      for (const f of frames) {
        if (closed) return;
        if (queued === 0 && f.sinkToken !== undefined && f.op === Op.PUT) putNow(f);
        else enqueue(f);
      }
      throttle();
    },
  });
  sock.on("drain", unthrottle);
  sock.on("error", () => close());
  sock.on("close", () => close());
}
