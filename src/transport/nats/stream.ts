/**
 * Client-side state of one NATS request stream: it takes the agent's frames off the inbox
 * subscription, resolves the head, and is the response body's async iterator. The queue of data
 * frames is bounded by the credit window: credit is granted only as the consumer takes frames,
 * so a consumer that falls behind stops the agent (and through it the engine).
 */
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { TimeoutError, UpstreamError } from "../../protocol/errors.ts";
import { type ConnectionFailureKind, type UpstreamResponse, WorkerUnreachableError } from "../types.ts";
import {
  CTL_ABORT,
  CTL_CREDIT,
  CTL_PING,
  encodeControl,
  H_ERROR_CODE,
  H_ERROR_KIND,
  H_ERROR_STATUS,
  H_FRAME,
  H_SEQ,
  H_STATUS,
} from "./frames.ts";

const TD = new TextDecoder();

export class AbortError extends Error {
  constructor(message = "The request was aborted.") {
    super(message);
    this.name = "AbortError";
  }
}

type Resolver = {
  resolve: (r: IteratorResult<Uint8Array>) => void;
  reject: (e: Error) => void;
};

export interface StreamHooks {
  /** Called once when the stream is finished (ended, failed or aborted). */
  onFinish(s: NatsStream): void;
}

export class NatsStream implements AsyncIterator<Uint8Array>, AsyncIterable<Uint8Array> {
  private readonly nc: NatsConnection;
  readonly inbox: string;
  private readonly ctlSubject: string;
  readonly workerId: string;
  /** The worker's URL, named in WorkerUnreachableError like the HTTP executor does. */
  readonly workerUrl: string;
  private readonly window: number;
  private readonly hooks: StreamHooks;
  sub?: Subscription;
  /** Time of the last frame from the agent (any kind). */
  lastFrame: number;
  accepted = false;
  /** Time of the last ping sent (the executor's sweeper paces them). */
  lastPing = Date.now();
  /**
   * Set by the executor when this send failed for the plane's sake, not the worker's, before
   * any head (or while a non-streamed answer is read whole): the request is sent again (lost
   * with the connection, or no agent subscribed yet just after a reconnect).
   */
  replay: "disconnect" | "no-responders" | null = null;
  /**
   * Set while the executor reads a non-streamed answer whole: nothing has reached the client
   * yet, so a disconnect re-sends it like a request without a head.
   */
  buffering = false;
  /** Called before a "no responders" answer fails the stream (the executor may set `replay`). */
  onNoResponders?: () => void;
  private queue: (Uint8Array | undefined)[] = [];
  private qHead = 0;
  private received = 0;
  private consumed = 0;
  private granted: number;
  private waiter: Resolver | null = null;
  private ended = false;
  private failure: Error | null = null;
  private finished = false;
  private headSettled = false;
  private headResolve!: (r: UpstreamResponse) => void;
  private headReject!: (e: Error) => void;
  readonly head: Promise<UpstreamResponse>;

  constructor(
    nc: NatsConnection,
    inbox: string,
    ctlSubject: string,
    workerId: string,
    workerUrl: string,
    window: number,
    hooks: StreamHooks,
  ) {
    this.nc = nc;
    this.inbox = inbox;
    this.ctlSubject = ctlSubject;
    this.workerId = workerId;
    this.workerUrl = workerUrl;
    this.window = window;
    this.hooks = hooks;
    this.granted = window;
    this.lastFrame = Date.now();
    this.head = new Promise<UpstreamResponse>((res, rej) => {
      this.headResolve = res;
      this.headReject = rej;
    });
    // The head promise may be abandoned by a caller that already gave up; never an unhandled rejection.
    this.head.catch(() => {});
  }

  get isFinished(): boolean {
    return this.finished;
  }

  /** Subscription callback: every frame from the agent. */
  onMsg(err: Error | null, msg: Msg): void {
    if (this.finished) return;
    if (err) {
      this.unreachable("reset", `NATS subscription failed: ${err.message}`);
      return;
    }
    this.lastFrame = Date.now();
    const h = msg.headers;
    if (h === undefined) {
      // Data frame: the hot path. No copies, no parsing.
      if (this.ended) return;
      this.received++;
      if (this.waiter) {
        const w = this.waiter;
        this.waiter = null;
        this.consumed++;
        this.grant();
        w.resolve({ value: msg.data, done: false });
      } else {
        this.queue.push(msg.data);
      }
      return;
    }
    // No responders: the request (or a control frame) reached no agent subscription.
    if (h.code === 503 && msg.data.length === 0) {
      this.onNoResponders?.();
      this.unreachable("connect", "no NATS agent subscribed");
      return;
    }
    const seq = Number(h.get(H_SEQ));
    if (seq !== this.received) {
      this.fail(
        new UpstreamError(
          `NATS stream from worker ${this.workerId} lost frames (${this.received} of ${seq})`,
          502,
          "upstream_stream_error",
        ),
      );
      return;
    }
    switch (h.get(H_FRAME)) {
      case "accept":
        this.accepted = true;
        break;
      case "head":
        this.accepted = true;
        this.settleHead(Number(h.get(H_STATUS)) || 502, h);
        break;
      case "end":
        this.ended = true;
        this.wakeDone();
        this.finish();
        break;
      case "error": {
        const status = Number(h.get(H_ERROR_STATUS)) || 502;
        const code = h.get(H_ERROR_CODE) || "upstream_error";
        const kind = h.get(H_ERROR_KIND);
        if (code === "worker_unreachable" && (kind === "connect" || kind === "reset")) {
          this.unreachable(kind, TD.decode(msg.data));
        } else this.fail(new UpstreamError(TD.decode(msg.data), status, code));
        break;
      }
      default:
        break; // keepalive, or a frame kind from a newer agent
    }
  }

  private settleHead(status: number, h: NonNullable<Msg["headers"]>): void {
    if (this.headSettled) return;
    this.headSettled = true;
    const headers: Record<string, string> = {};
    for (const k of h.keys()) {
      if (!k.startsWith("Infera-")) headers[k.toLowerCase()] = h.get(k);
    }
    this.headResolve({
      status,
      headers,
      body: this,
      json: () => this.readJson(),
      abort: () => this.abort(),
    });
  }

  [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    return this;
  }

  next(): Promise<IteratorResult<Uint8Array>> {
    if (this.qHead < this.queue.length) {
      const v = this.queue[this.qHead]!;
      this.queue[this.qHead] = undefined;
      this.qHead++;
      if (this.qHead === this.queue.length) {
        this.queue.length = 0;
        this.qHead = 0;
      }
      this.consumed++;
      this.grant();
      return Promise.resolve({ value: v, done: false });
    }
    if (this.failure) return Promise.reject(this.failure);
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  /** A consumer that stops early (break out of for-await) aborts the upstream request. */
  return(): Promise<IteratorResult<Uint8Array>> {
    if (!this.ended) this.abort();
    return Promise.resolve({ value: undefined, done: true });
  }

  private grant(): void {
    if (this.ended || this.granted - this.consumed > this.window >> 1) return;
    this.granted = this.consumed + this.window;
    this.control(CTL_CREDIT, this.granted);
  }

  /** Tells the agent to stop this request, whatever state the stream is in (after a reconnect). */
  abortUpstream(): void {
    this.control(CTL_ABORT, 0);
  }

  ping(): void {
    this.control(CTL_PING, 0);
  }

  private control(kind: number, value: number): void {
    try {
      this.nc.publish(this.ctlSubject, encodeControl(kind, value), { reply: this.inbox });
    } catch {
      // Connection closed: the disconnect handler fails the stream.
    }
  }

  private async readJson(): Promise<unknown> {
    const parts: Uint8Array[] = [];
    for await (const c of this) parts.push(c);
    return parseAnswerJson(parts, this.workerId);
  }

  /** Cancels the request at the agent (and so at the engine); idempotent. */
  abort(reason?: Error): void {
    if (this.finished) return;
    this.control(CTL_ABORT, 0);
    // What is queued is no longer wanted: the next read throws, as an aborted HTTP body does.
    this.queue.length = 0;
    this.qHead = 0;
    this.fail(reason ?? new AbortError());
  }

  /**
   * Before the head this is the router's retry path (WorkerUnreachableError, as an HTTP connect
   * failure or reset); once the body is streaming, a failed stream like an HTTP body that breaks.
   */
  unreachable(kind: ConnectionFailureKind, detail: string): void {
    if (this.finished) return;
    if (!this.headSettled) this.fail(new WorkerUnreachableError(this.workerUrl, kind, detail));
    else this.fail(new UpstreamError(`worker ${this.workerId}: ${detail}`, 502, "upstream_stream_error"));
  }

  /** Like unreachable(), and tells the agent to stop (it may still be alive). */
  silent(kind: ConnectionFailureKind, detail: string): void {
    if (this.finished) return;
    this.control(CTL_ABORT, 0);
    if (this.headSettled) this.fail(new TimeoutError(`worker ${this.workerId}: ${detail}`));
    else this.unreachable(kind, detail);
  }

  get hasHead(): boolean {
    return this.headSettled;
  }

  timeout(message: string): void {
    if (this.finished) return;
    this.control(CTL_ABORT, 0);
    this.fail(new TimeoutError(message));
  }

  fail(err: Error): void {
    if (this.finished) return;
    this.failure = err;
    if (!this.headSettled) {
      this.headSettled = true;
      this.headReject(err);
    }
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w.reject(err);
    }
    this.finish();
  }

  private wakeDone(): void {
    if (this.waiter && this.qHead >= this.queue.length) {
      const w = this.waiter;
      this.waiter = null;
      w.resolve({ value: undefined, done: true });
    }
  }

  private finish(): void {
    if (this.finished) return;
    this.finished = true;
    if (!this.headSettled) {
      // An end before any head: the agent broke protocol.
      this.headSettled = true;
      this.headReject(new UpstreamError(`worker ${this.workerId} ended the stream without a response`));
    }
    try {
      this.sub?.unsubscribe();
    } catch {
      // already closed
    }
    this.hooks.onFinish(this);
  }
}

/** A non-streamed answer's chunks as JSON; invalid JSON is the worker's fault (502). */
export function parseAnswerJson(parts: readonly Uint8Array[], workerId: string): unknown {
  try {
    return JSON.parse(Buffer.concat(parts).toString("utf8"));
  } catch {
    throw new UpstreamError(`worker ${workerId} answered with invalid JSON`, 502, "upstream_bad_response");
  }
}
