/**
 * Server-side end of the NATS request plane: a RequestExecutor that sends a body to the worker's
 * agent on `infera.req.<model>.<worker>` and hands back the streamed answer. Failures map onto
 * the same errors the HTTP executor raises, so the router's retry path treats both alike:
 * no agent, an agent that cannot reach its engine, or a worker that stops answering before the
 * head → WorkerUnreachableError (connect|reset), which the MixedRouter retries elsewhere; the
 * caller's `timeoutMs` to the head → TimeoutError (504); a stream that breaks after the head →
 * the body iterator throws.
 *
 * A lost broker connection (broker restart) is not the worker's fault, so a request that has
 * no response head yet does not fail over it: it waits for the reconnect, bounded by
 * `reconnectWaitMs`, and is then sent (again, on a fresh inbox). nats.js drops what was
 * published while disconnected (every dial attempt resets its outbound buffer), so nothing is
 * published while the connection is down. Right after a reconnect the agents may not have
 * re-subscribed yet: "no responders" within the same bound is retried too.
 */
import { createInbox, type NatsConnection, headers as natsHeaders } from "@nats-io/transport-node";
import { InferaError, TimeoutError } from "../../protocol/errors.ts";
import type { AbortLike } from "../../util/abort.ts";
import { createLogger, type Logger } from "../../util/log.ts";
import {
  type EndpointKind,
  type RequestExecutor,
  rawBodyOf,
  type SendOptions,
  type SendTarget,
  type UpstreamResponse,
  WorkerUnreachableError,
} from "../types.ts";
import { DEFAULT_WINDOW, H_ENDPOINT, H_PING_MS, H_WINDOW } from "./frames.ts";
import { AbortError, NatsStream, parseAnswerJson } from "./stream.ts";
import { controlSubject, requestSubject } from "./subjects.ts";

export interface NatsExecutorOptions {
  nc: NatsConnection;
  /** Credit window per stream, in data frames (default 64). */
  window?: number;
  /** Client → agent ping period, and the agent's keepalive period (default 1000 ms). */
  pingMs?: number;
  /** No frame at all from the agent for this long → TimeoutError (default 4 × pingMs + 1000). */
  idleTimeoutMs?: number;
  /** The agent must acknowledge a request within this long (default 3000 ms). */
  acceptTimeoutMs?: number;
  /** Time-to-head limit when the caller gives no `timeoutMs` (default: none). */
  defaultTimeoutMs?: number;
  /**
   * How long a request without a response head may wait for a lost broker connection to come
   * back (and for the agents to re-subscribe) before it fails as unreachable (default 10000 ms;
   * 0 = fail at once, as before).
   */
  reconnectWaitMs?: number;
  logger?: Logger;
}

/** Default bound on a request's wait for the broker to come back. */
export const DEFAULT_RECONNECT_WAIT_MS = 10_000;
/** Pause between sends while the agents re-subscribe after a reconnect. */
const NO_RESPONDERS_RETRY_MS = 50;
/**
 * How long after a reconnect "no responders" still means "the agents are re-subscribing" (they
 * retry every 250 ms, src/transport/nats/connection.ts) rather than "no agent": past it, a dead
 * agent's worker fails over at once again.
 */
const NO_RESPONDERS_GRACE_MS = 3000;

export class NatsRequestExecutor implements RequestExecutor {
  private readonly opts: NatsExecutorOptions;
  private readonly nc: NatsConnection;
  private readonly window: number;
  private readonly pingMs: number;
  private readonly idleTimeoutMs: number;
  private readonly acceptTimeoutMs: number;
  private readonly reconnectWaitMs: number;
  private readonly active = new Set<NatsStream>();
  private readonly log: Logger;
  private readonly sweeper: NodeJS.Timeout;
  private readonly enc = new TextEncoder();
  /** Between a disconnect and the reconnect: publishes would be dropped by nats.js. */
  private down = false;
  /** When the connection last came back (-Infinity: never lost). */
  private lastReconnectAt = Number.NEGATIVE_INFINITY;
  /** Woken on reconnect (and on close). */
  private readonly upWaiters = new Set<() => void>();
  /** Streams cut by a disconnect: their agents are told to stop once the connection is back. */
  private orphans: NatsStream[] = [];
  private closed = false;

  constructor(opts: NatsExecutorOptions) {
    this.opts = opts;
    this.nc = opts.nc;
    this.window = opts.window ?? DEFAULT_WINDOW;
    this.pingMs = opts.pingMs ?? 1000;
    this.idleTimeoutMs = opts.idleTimeoutMs ?? 4 * this.pingMs + 1000;
    this.acceptTimeoutMs = opts.acceptTimeoutMs ?? 3000;
    this.reconnectWaitMs = Math.max(0, opts.reconnectWaitMs ?? DEFAULT_RECONNECT_WAIT_MS);
    this.log = opts.logger ?? createLogger("nats-client");
    this.sweeper = setInterval(() => this.sweep(), Math.min(this.pingMs, 250));
    this.sweeper.unref();
    void this.watchConnection();
  }

  /** Streams in flight. */
  get inFlight(): number {
    return this.active.size;
  }

  /** True while the broker connection is lost and not yet back. */
  get isDown(): boolean {
    return this.down;
  }

  async send(
    worker: SendTarget,
    endpoint: EndpointKind,
    body: Record<string, unknown>,
    opts: SendOptions,
  ): Promise<UpstreamResponse> {
    if (opts.signal.aborted) throw new AbortError();
    const rec = worker.record;
    const subject = rec.natsSubject ?? requestSubject(rec.model, rec.id);
    // The body's registered bytes when it has them (the client's own, or those plus a PD
    // half's appended fields, ../types.ts), as the HTTP executor sends: re-serialising would
    // change what the engine reads (1.0 → 1, integers past 2^53, duplicate keys) and costs
    // milliseconds per long prompt. The agent hands these bytes to the engine as they are.
    // nats.js copies them into its write buffer at its next flush (a microtask after the
    // publish), so a pooled body buffer is not read once send() has settled.
    const payload = rawBodyOf(body) ?? this.enc.encode(JSON.stringify(body));
    const maxPayload = this.nc.info?.max_payload ?? Number.POSITIVE_INFINITY;
    if (payload.length + 1024 > maxPayload) {
      // Not the worker's fault, so not the retry path: every worker would refuse it alike.
      throw new InferaError(
        413,
        `Request body (${payload.length} bytes) exceeds the NATS broker's max_payload (${maxPayload} bytes).`,
        { type: "invalid_request_error", code: "request_too_large" },
      );
    }
    const headLimit = opts.timeoutMs ?? this.opts.defaultTimeoutMs;
    const headDeadline =
      headLimit !== undefined && headLimit > 0 ? Date.now() + headLimit : Number.POSITIVE_INFINITY;
    const headTimeout = () =>
      new TimeoutError(`worker ${rec.id} sent no response head within ${headLimit} ms over NATS`);
    // Set when this request first has to wait for the plane; bounds all its waits together.
    let waitUntil: number | undefined;
    for (;;) {
      if (this.down) {
        waitUntil ??= Date.now() + this.reconnectWaitMs;
        const up = await this.waitUp(Math.min(waitUntil, headDeadline), opts.signal);
        if (!up) {
          // The timer ended the wait, or the executor closed. Which bound the timer stood for
          // is decided by the deadlines, not by reading the clock again: Node's timers may fire
          // a millisecond before Date.now() reaches the deadline they were set for.
          if (!this.closed && headDeadline <= waitUntil) throw headTimeout();
          throw new WorkerUnreachableError(
            rec.url,
            "connect",
            `NATS connection is down (no reconnect within ${this.reconnectWaitMs} ms)`,
          );
        }
      }
      const stream = this.publish(subject, rec.id, rec.url, endpoint, payload, opts, headDeadline);
      try {
        const head = await stream.head;
        // A non-streamed answer reaches the client only whole, so until it is whole nothing has
        // been sent: a disconnect meanwhile re-sends it like a request without a head.
        return body.stream === true ? head : await bufferWhole(head, stream);
      } catch (err) {
        if (stream.replay === null || opts.signal.aborted || this.closed) throw err;
        waitUntil ??= Date.now() + this.reconnectWaitMs;
        if (Date.now() >= Math.min(waitUntil, headDeadline)) throw err;
        if (stream.replay === "no-responders") {
          await abortableSleep(Math.min(NO_RESPONDERS_RETRY_MS, waitUntil - Date.now()), opts.signal);
        }
        this.log.debug({ worker: rec.id, why: stream.replay }, "re-sending a request the NATS plane lost");
      }
    }
  }

  /** One send of the request on a fresh inbox; its head settles the attempt. */
  private publish(
    subject: string,
    workerId: string,
    workerUrl: string,
    endpoint: EndpointKind,
    payload: Uint8Array,
    opts: SendOptions,
    headDeadline: number,
  ): NatsStream {
    const inbox = createInbox();
    let headTimer: NodeJS.Timeout | undefined;
    const onAbort = () => stream.abort();
    const stream = new NatsStream(this.nc, inbox, controlSubject(subject), workerId, workerUrl, this.window, {
      onFinish: (s) => {
        this.active.delete(s);
        opts.signal.removeEventListener("abort", onAbort);
        if (headTimer) clearTimeout(headTimer);
      },
    });
    if (Number.isFinite(headDeadline)) {
      headTimer = setTimeout(
        () => {
          if (!stream.hasHead) {
            const limit = opts.timeoutMs ?? this.opts.defaultTimeoutMs;
            stream.timeout(`worker ${workerId} sent no response head within ${limit} ms over NATS`);
          }
        },
        Math.max(0, headDeadline - Date.now()),
      );
      headTimer.unref();
      void stream.head.then(
        () => clearTimeout(headTimer),
        () => {},
      );
    }
    // "No responders" just after a reconnect: the agents may not have re-subscribed yet.
    stream.onNoResponders = () => {
      const grace = Math.min(this.reconnectWaitMs, NO_RESPONDERS_GRACE_MS);
      if (Date.now() - this.lastReconnectAt < grace) stream.replay = "no-responders";
    };
    opts.signal.addEventListener("abort", onAbort, { once: true });
    try {
      stream.sub = this.nc.subscribe(inbox, { callback: (err, msg) => stream.onMsg(err, msg) });
      const h = natsHeaders();
      h.set(H_ENDPOINT, endpoint);
      h.set(H_WINDOW, String(this.window));
      h.set(H_PING_MS, String(this.pingMs));
      if (opts.headers) {
        for (const [k, v] of Object.entries(opts.headers)) {
          try {
            h.set(k, v);
          } catch {
            // A header name NATS cannot carry (client-supplied junk): dropped, not fatal.
          }
        }
      }
      this.active.add(stream);
      this.nc.publish(subject, payload, { reply: inbox, headers: h });
    } catch (err) {
      stream.unreachable(
        "connect",
        `NATS publish failed: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
    return stream;
  }

  /** Resolves true once the connection is back, false at `until`; rejects when aborted. */
  private waitUp(until: number, signal: AbortLike): Promise<boolean> {
    if (!this.down) return Promise.resolve(true);
    if (this.closed) return Promise.resolve(false);
    return new Promise<boolean>((resolve, reject) => {
      const done = (v: boolean | Error) => {
        clearTimeout(timer);
        this.upWaiters.delete(wake);
        signal.removeEventListener("abort", onAbort);
        if (v instanceof Error) reject(v);
        else resolve(v);
      };
      const wake = () => done(!this.down);
      const onAbort = () => done(new AbortError());
      const timer = setTimeout(() => done(false), Math.max(0, until - Date.now()));
      this.upWaiters.add(wake);
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  private sweep(): void {
    const now = Date.now();
    for (const s of this.active) {
      // Never accepted: like an HTTP connect timeout. Silent after accepting: like a reset.
      if (!s.accepted && now - s.lastFrame > this.acceptTimeoutMs) {
        s.silent("connect", `no NATS accept within ${this.acceptTimeoutMs} ms`);
      } else if (now - s.lastFrame > this.idleTimeoutMs) {
        s.silent("reset", `stopped answering over NATS (silent ${now - s.lastFrame} ms)`);
      } else if (now - s.lastPing >= this.pingMs) {
        s.lastPing = now;
        s.ping();
      }
    }
  }

  /**
   * On a disconnect, frames published by either side may be gone. A stream without its head is
   * sent again after the reconnect (send() waits); one already streaming fails, and the server
   * ends it with an error event. On the reconnect, the agents of all of them are told to stop.
   */
  private async watchConnection(): Promise<void> {
    try {
      for await (const st of this.nc.status()) {
        if (st.type === "reconnect") {
          this.down = false;
          this.lastReconnectAt = Date.now();
          const orphans = this.orphans;
          this.orphans = [];
          for (const s of orphans) s.abortUpstream();
          for (const w of [...this.upWaiters]) w();
          continue;
        }
        if (st.type !== "disconnect") continue;
        this.down = true;
        if (this.active.size === 0) continue;
        const streaming = [...this.active].filter((s) => s.hasHead).length;
        this.log.warn(
          { inFlight: this.active.size, streaming },
          "nats disconnected; re-sending requests without a response head after the reconnect",
        );
        for (const s of [...this.active]) {
          if ((!s.hasHead || s.buffering) && this.reconnectWaitMs > 0) s.replay = "disconnect";
          this.orphans.push(s);
          s.unreachable("reset", "NATS connection lost mid-request");
        }
      }
    } catch {
      // connection closed
    }
    this.down = true;
    this.closed = true;
    for (const w of [...this.upWaiters]) w();
  }

  /** Stops the timers and fails what is in flight (the connection is the caller's to close). */
  close(): void {
    this.closed = true;
    clearInterval(this.sweeper);
    for (const s of [...this.active]) s.fail(new AbortError("NATS executor closed"));
    for (const w of [...this.upWaiters]) w();
  }
}

function abortableSleep(ms: number, signal: AbortLike): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(new AbortError());
      return;
    }
    const onAbort = () => {
      clearTimeout(t);
      reject(new AbortError());
    };
    const t = setTimeout(
      () => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      },
      Math.max(0, ms),
    );
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/** Non-streamed answers held in the replay window; past this they are relayed as they come. */
const WHOLE_ANSWER_LIMIT = 16 * 1024 * 1024;

/**
 * Reads a non-streamed answer to its end (up to WHOLE_ANSWER_LIMIT) so that a disconnect while
 * it arrives fails the attempt (and send() re-sends it) rather than the client's request.
 */
async function bufferWhole(head: UpstreamResponse, stream: NatsStream): Promise<UpstreamResponse> {
  const parts: Uint8Array[] = [];
  let len = 0;
  const it = stream[Symbol.asyncIterator]();
  let done = false;
  stream.buffering = true;
  try {
    while (len <= WHOLE_ANSWER_LIMIT) {
      const r = await it.next();
      if (r.done) {
        done = true;
        break;
      }
      parts.push(r.value);
      len += r.value.length;
    }
  } finally {
    stream.buffering = false;
  }
  async function* body(): AsyncGenerator<Uint8Array> {
    yield* parts;
    if (!done) yield* stream;
  }
  return {
    status: head.status,
    headers: head.headers,
    body: body(),
    json: async () => {
      const all: Uint8Array[] = [...parts];
      if (!done) for await (const c of stream) all.push(c);
      return parseAnswerJson(all, stream.workerId);
    },
    abort: () => head.abort(),
  };
}
