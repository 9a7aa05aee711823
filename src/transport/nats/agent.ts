/**
 * Worker-side end of the NATS request plane. Subscribes to the worker's request subject, calls
 * the local engine over HTTP (the raw HTTP/1.1 client, `Http1Pool`, as the HTTP plane does;
 * issue #32), and streams the engine's response bytes back on the client's inbox
 * (frames.ts has the wire format). Credit from the client bounds what is in flight: when the
 * client falls behind, the agent stops reading the engine's body, and TCP backpressure holds
 * the engine, so nothing buffers without bound. A client abort, or a client that goes silent
 * (server crashed, broker lost), aborts the engine request, which the engine sees as a
 * disconnect and cancels.
 */
import {
  type Msg,
  type NatsConnection,
  headers as natsHeaders,
  type PublishOptions,
  type Subscription,
} from "@nats-io/transport-node";
import { createLogger, type Logger } from "../../util/log.ts";
import { splitBaseUrl } from "../base-url.ts";
import { Http1Pool } from "../http1/pool.ts";
import { connectionFailureKind, ENDPOINT_PATHS, type EndpointKind, endpointKindOf } from "../types.ts";
import { AgentStream, EngineCall, type StreamFrames } from "./agent-stream.ts";
import {
  CTL_ABORT,
  CTL_CREDIT,
  DEFAULT_WINDOW,
  decodeControl,
  type FrameKind,
  H_ENDPOINT,
  H_ERROR_CODE,
  H_ERROR_KIND,
  H_ERROR_STATUS,
  H_FRAME,
  H_PING_MS,
  H_SEQ,
  H_STATUS,
  H_WINDOW,
  isRelayedHeader,
} from "./frames.ts";
import { controlSubject, requestSubject } from "./subjects.ts";

export interface RequestAgentOptions {
  nc: NatsConnection;
  /** Engine base URL, e.g. `http://127.0.0.1:8001`. */
  engineUrl: string;
  model: string;
  workerId: string;
  /** Defaults to `requestSubject(model, workerId)`; put the same value in the record's `natsSubject`. */
  subject?: string;
  /** Max concurrent HTTP connections to the engine (default 1024: one per in-flight stream). */
  maxEngineConnections?: number;
  /** Sweep period for keepalives and silent-client checks (default 250 ms). */
  sweepMs?: number;
  logger?: Logger;
}

const TE = new TextEncoder();
/** nats.js sets `reply: ""` on it on first use; nothing else ever writes it. */
const NO_OPTIONS: PublishOptions = {};

export class NatsRequestAgent implements StreamFrames {
  readonly subject: string;
  readonly controlSubject: string;
  private readonly nc: NatsConnection;
  private readonly pool: Http1Pool;
  private readonly log: Logger;
  private readonly streams = new Map<string, AgentStream>();
  /** Aborts that overtook their request (kept one sweep, then dropped). */
  private readonly earlyAborts = new Map<string, number>();
  private reqSub?: Subscription;
  private ctlSub?: Subscription;
  private sweeper?: NodeJS.Timeout;
  private readonly sweepMs: number;
  private readonly pathPrefix: string;
  /** Requests handled since start (for tests and metrics). */
  handled = 0;

  constructor(opts: RequestAgentOptions) {
    this.nc = opts.nc;
    this.subject = opts.subject ?? requestSubject(opts.model, opts.workerId);
    this.controlSubject = controlSubject(this.subject);
    // Pool takes an origin only; an engine URL with a path keeps it as a prefix (base-url.ts).
    const base = splitBaseUrl(opts.engineUrl);
    this.pathPrefix = base.prefix;
    this.pool = new Http1Pool(base.origin, {
      connections: opts.maxEngineConnections ?? 1024,
      keepAliveTimeoutMs: 30_000,
      // The agent's own idle checks end silent streams; the client must not cut long prefills.
      headersTimeoutMs: 0,
      bodyTimeoutMs: 0,
    });
    this.log = opts.logger ?? createLogger("nats-agent", { worker: opts.workerId });
    this.sweepMs = opts.sweepMs ?? 250;
  }

  /** Subscribes; resolves once the broker has the subscriptions (so requests sent after it land). */
  async start(): Promise<void> {
    // A queue group, so that a restarted agent overlapping its predecessor never doubles a request.
    this.reqSub = this.nc.subscribe(this.subject, {
      queue: "infera-agent",
      callback: (err, msg) => {
        if (err) return;
        this.onRequest(msg);
      },
    });
    this.ctlSub = this.nc.subscribe(this.controlSubject, {
      callback: (err, msg) => {
        if (err) return;
        this.onControl(msg);
      },
    });
    this.sweeper = setInterval(() => this.sweep(), this.sweepMs);
    this.sweeper.unref();
    await this.nc.flush();
  }

  /** Streams in flight right now. */
  get active(): number {
    return this.streams.size;
  }

  /** Per-stream flow-control state (data frames sent vs credit), for tests and debugging. */
  streamStats(): { sent: number; allowed: number }[] {
    return [...this.streams.values()].map((s) => ({ sent: s.sent, allowed: s.allowed }));
  }

  async close(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    this.reqSub?.unsubscribe();
    this.ctlSub?.unsubscribe();
    for (const st of this.streams.values()) st.abort("agent closing");
    this.streams.clear();
    await this.pool.close().catch(() => {});
  }

  private onControl(msg: Msg): void {
    const ctl = decodeControl(msg.data);
    if (!ctl) return;
    const inbox = msg.reply;
    if (!inbox) return;
    const st = this.streams.get(inbox);
    if (!st) {
      if (ctl[0] === CTL_ABORT) this.earlyAborts.set(inbox, Date.now());
      return;
    }
    st.lastHeard = Date.now();
    if (ctl[0] === CTL_CREDIT) {
      if (ctl[1] > st.allowed) {
        st.allowed = ctl[1];
        st.wake();
      }
    } else if (ctl[0] === CTL_ABORT) {
      st.abort("client aborted");
    }
    // CTL_PING: lastHeard is all it does.
  }

  private onRequest(msg: Msg): void {
    const inbox = msg.reply;
    if (!inbox) return; // nowhere to answer: not ours to handle
    const h = msg.headers;
    const endpoint = endpointKindOf(h?.get(H_ENDPOINT)) ?? "chat";
    const window = positiveInt(h?.get(H_WINDOW), DEFAULT_WINDOW);
    const pingMs = positiveInt(h?.get(H_PING_MS), 1000);
    const fwd: Record<string, string> = { "content-type": "application/json" };
    if (h) {
      for (const k of h.keys()) {
        if (!k.toLowerCase().startsWith("infera-")) fwd[k.toLowerCase()] = h.get(k);
      }
    }
    const now = Date.now();
    const st = new AgentStream(inbox, window, pingMs, now);
    this.streams.set(inbox, st);
    this.handled++;
    this.frame(st, "accept");
    if (this.earlyAborts.delete(inbox)) st.abort("client aborted");
    // The payload goes to the engine as the bytes it came as, never parsed here: they are the
    // client's own (plus any fields the server appended), which a re-serialisation would change.
    void this.run(st, endpoint, fwd, msg.data).finally(() => {
      st.done = true;
      this.streams.delete(inbox);
    });
  }

  /** The engine request of `st`; resolves once it is over for the agent (ended, failed, aborted). */
  private run(
    st: AgentStream,
    endpoint: EndpointKind,
    headers: Record<string, string>,
    body: Uint8Array,
  ): Promise<void> {
    if (st.done) return Promise.resolve();
    const maxChunk = Math.max(1024, (this.nc.info?.max_payload ?? 1 << 20) - 4096);
    return new Promise<void>((resolve) => {
      this.pool.dispatch(
        {
          path: this.pathPrefix + ENDPOINT_PATHS[endpoint],
          method: "POST",
          headers,
          // A view of the message's bytes, not a copy.
          body: Buffer.from(body.buffer, body.byteOffset, body.byteLength),
        },
        new EngineCall(st, this, maxChunk, resolve),
      );
    });
  }

  // --- StreamFrames (the engine call's frames) -----------------------------------------------

  head(st: AgentStream, status: number, raw: string[]): void {
    const head = natsHeaders();
    head.set(H_FRAME, "head");
    head.set(H_SEQ, "0");
    head.set(H_STATUS, String(status));
    // Repeated fields joined as one (as undici's header object gave them before).
    const fields: Record<string, string> = {};
    for (let i = 0; i + 1 < raw.length; i += 2) {
      const k = raw[i]!.toLowerCase();
      if (!isRelayedHeader(k)) continue;
      const v = raw[i + 1]!;
      fields[k] = fields[k] === undefined ? v : `${fields[k]}, ${v}`;
    }
    for (const k in fields) {
      try {
        head.set(k, fields[k]!);
      } catch {
        // A header NATS cannot carry: dropped.
      }
    }
    this.publish(st, undefined, head);
  }

  data(st: AgentStream, bytes: Uint8Array): void {
    this.publish(st, bytes);
  }

  failed(st: AgentStream, err: Error, answered: boolean): void {
    if (answered) {
      this.error(st, 502, "upstream_stream_error", `engine stream failed: ${errMsg(err)}`);
      return;
    }
    // Nothing reached the engine (refused, reset): the router may retry elsewhere, as over HTTP.
    const kind = connectionFailureKind(err);
    if (kind) this.error(st, 502, "worker_unreachable", `engine ${errMsg(err)}`, kind);
    else this.error(st, 502, "upstream_error", `engine request failed: ${errMsg(err)}`);
  }

  private publish(
    st: AgentStream,
    data: Uint8Array | undefined,
    headers?: ReturnType<typeof natsHeaders>,
  ): void {
    st.lastSent = Date.now();
    try {
      // Data frames share one options object: nats.js would allocate one per call otherwise.
      this.nc.publish(st.inbox, data, headers ? { headers } : NO_OPTIONS);
    } catch (err) {
      // Closed or draining connection: the client will time out and retry elsewhere.
      this.log.warn({ err: errMsg(err) }, "nats publish failed");
      st.abort("publish failed");
    }
  }

  frame(st: AgentStream, kind: FrameKind): void {
    const h = natsHeaders();
    h.set(H_FRAME, kind);
    h.set(H_SEQ, String(st.sent));
    this.publish(st, undefined, h);
  }

  private error(st: AgentStream, status: number, code: string, message: string, kind?: string): void {
    const h = natsHeaders();
    if (kind) h.set(H_ERROR_KIND, kind);
    h.set(H_FRAME, "error");
    h.set(H_SEQ, String(st.sent));
    h.set(H_ERROR_STATUS, String(status));
    h.set(H_ERROR_CODE, code);
    this.publish(st, TE.encode(message), h);
    this.log.warn({ code, message }, "request failed at agent");
  }

  private sweep(): void {
    const now = Date.now();
    for (const st of this.streams.values()) {
      if (st.done) continue;
      if (now - st.lastHeard > 4 * st.pingMs + 500) {
        this.log.warn({ inbox: st.inbox }, "client went silent; aborting engine request");
        st.abort("client silent");
        continue;
      }
      if (now - st.lastSent >= st.pingMs) this.frame(st, "keepalive");
    }
    for (const [inbox, at] of this.earlyAborts) {
      if (now - at > 10_000) this.earlyAborts.delete(inbox);
    }
  }
}

function positiveInt(v: string | undefined, dflt: number): number {
  const n = v ? Number.parseInt(v, 10) : Number.NaN;
  return Number.isFinite(n) && n > 0 ? n : dflt;
}

function errMsg(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Starts an agent; the returned object's `close()` stops it. */
export async function startRequestAgent(opts: RequestAgentOptions): Promise<NatsRequestAgent> {
  const agent = new NatsRequestAgent(opts);
  await agent.start();
  return agent;
}
