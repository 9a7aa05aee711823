/**
 * Server-side end of the NATS request plane: a RequestExecutor that sends a body to the worker's
 * agent on `infera.req.<model>.<worker>` and hands back the streamed answer. Failures map onto
 * the same errors the HTTP executor raises, so the router's retry path treats both alike:
 * no agent, an agent that cannot reach its engine, a lost connection or a worker that stops
 * answering before the head → WorkerUnreachableError (connect|reset), which the MixedRouter
 * retries elsewhere; the caller's `timeoutMs` to the head → TimeoutError (504); a stream that
 * breaks after the head → the body iterator throws.
 */
import { createInbox, type NatsConnection, headers as natsHeaders } from "@nats-io/transport-node";
import { InferaError } from "../../protocol/errors.ts";
import type {
  EndpointKind,
  RequestExecutor,
  SendOptions,
  UpstreamResponse,
  WorkerState,
} from "../../router/types.ts";
import { createLogger, type Logger } from "../../util/log.ts";
import { DEFAULT_WINDOW, H_ENDPOINT, H_PING_MS, H_WINDOW } from "./frames.ts";
import { AbortError, NatsStream } from "./stream.ts";
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
  logger?: Logger;
}

export class NatsRequestExecutor implements RequestExecutor {
  private readonly nc: NatsConnection;
  private readonly window: number;
  private readonly pingMs: number;
  private readonly idleTimeoutMs: number;
  private readonly acceptTimeoutMs: number;
  private readonly active = new Set<NatsStream>();
  private readonly log: Logger;
  private readonly sweeper: NodeJS.Timeout;
  private readonly enc = new TextEncoder();
  /** Between a disconnect and the reconnect: publishes would only be buffered (and maybe lost). */
  private down = false;

  constructor(private readonly opts: NatsExecutorOptions) {
    this.nc = opts.nc;
    this.window = opts.window ?? DEFAULT_WINDOW;
    this.pingMs = opts.pingMs ?? 1000;
    this.idleTimeoutMs = opts.idleTimeoutMs ?? 4 * this.pingMs + 1000;
    this.acceptTimeoutMs = opts.acceptTimeoutMs ?? 3000;
    this.log = opts.logger ?? createLogger("nats-client");
    this.sweeper = setInterval(() => this.sweep(), Math.min(this.pingMs, 250));
    this.sweeper.unref();
    void this.watchConnection();
  }

  /** Streams in flight. */
  get inFlight(): number {
    return this.active.size;
  }

  async send(
    worker: WorkerState,
    endpoint: EndpointKind,
    body: Record<string, unknown>,
    opts: SendOptions,
  ): Promise<UpstreamResponse> {
    if (opts.signal.aborted) throw new AbortError();
    const rec = worker.record;
    const subject = rec.natsSubject ?? requestSubject(rec.model, rec.id);
    const inbox = createInbox();
    const stream = new NatsStream(this.nc, inbox, controlSubject(subject), rec.id, rec.url, this.window, {
      onFinish: (s) => {
        this.active.delete(s);
        opts.signal.removeEventListener("abort", onAbort);
        if (headTimer) clearTimeout(headTimer);
      },
    });
    const onAbort = () => stream.abort();
    let headTimer: NodeJS.Timeout | undefined;
    const headLimit = opts.timeoutMs ?? this.opts.defaultTimeoutMs;
    if (headLimit !== undefined && headLimit > 0) {
      headTimer = setTimeout(() => {
        if (!stream.isFinished) {
          stream.timeout(`worker ${rec.id} sent no response head within ${headLimit} ms over NATS`);
        }
      }, headLimit);
      headTimer.unref();
    }
    const payload = this.enc.encode(JSON.stringify(body));
    const maxPayload = this.nc.info?.max_payload ?? Number.POSITIVE_INFINITY;
    if (payload.length + 1024 > maxPayload) {
      // Not the worker's fault, so not the retry path: every worker would refuse it alike.
      stream.fail(
        new InferaError(
          413,
          `Request body (${payload.length} bytes) exceeds the NATS broker's max_payload (${maxPayload} bytes).`,
          { type: "invalid_request_error", code: "request_too_large" },
        ),
      );
      return stream.head;
    }
    if (this.down) {
      // Fail now (the router retries or answers at once) instead of buffering the request
      // until the reconnect, where it may be lost and only time out `acceptTimeoutMs` later,
      // charging a healthy worker's breaker after the plane is back.
      stream.unreachable("connect", "NATS connection is down (reconnecting)");
      return stream.head;
    }
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
    const res = await stream.head;
    if (headTimer) clearTimeout(headTimer);
    return res;
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

  /** Frames published while the broker was away may be gone: fail what was in flight, retry decides. */
  private async watchConnection(): Promise<void> {
    try {
      for await (const st of this.nc.status()) {
        if (st.type === "reconnect") this.down = false;
        if (st.type !== "disconnect") continue;
        this.down = true;
        if (this.active.size === 0) continue;
        this.log.warn({ inFlight: this.active.size }, "nats disconnected; failing in-flight streams");
        for (const s of [...this.active]) {
          s.unreachable("reset", "NATS connection lost mid-request");
        }
      }
    } catch {
      // connection closed
    }
  }

  /** Stops the timers and fails what is in flight (the connection is the caller's to close). */
  close(): void {
    clearInterval(this.sweeper);
    for (const s of [...this.active]) s.fail(new AbortError("NATS executor closed"));
  }
}
