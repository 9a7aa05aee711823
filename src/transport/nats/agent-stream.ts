/**
 * One request in the NATS agent (agent.ts): its flow-control state (`AgentStream`) and its call
 * to the engine (`EngineCall`), a handler on the raw HTTP/1.1 client's `dispatch` API
 * (`Http1Pool`, undici's core hooks; issue #32: the Kubernetes path's every request crosses
 * the agent, and the pool's push hooks spare a body stream and an async iterator per answer).
 *
 * Credit bounds what is in flight: a data frame goes out only while `sent < allowed`; short
 * of credit, the rest of the chunk waits here and the handler pauses the engine's socket
 * (TCP backpressure then holds the engine) until the client grants more.
 */
import type { Http1Handler } from "../http1/request.ts";
import type { FrameKind } from "./frames.ts";

/** One in-flight request. */
export class AgentStream {
  readonly inbox: string;
  readonly pingMs: number;
  sent = 0;
  allowed: number;
  lastHeard: number;
  lastSent: number;
  creditWaiter: (() => void) | null = null;
  /** Set by the engine call: cancels the engine request (closing its connection). */
  onAbort: ((err: Error) => void) | null = null;
  done = false;

  constructor(inbox: string, window: number, pingMs: number, now: number) {
    this.inbox = inbox;
    this.pingMs = pingMs;
    this.allowed = window;
    this.lastHeard = now;
    this.lastSent = now;
  }

  wake(): void {
    const w = this.creditWaiter;
    this.creditWaiter = null;
    if (w) w();
  }

  abort(reason: string): void {
    if (this.done) return;
    this.done = true;
    this.onAbort?.(new Error(reason));
    this.wake();
  }
}

/** What the engine call needs of the agent: its frames on the client's inbox. */
export interface StreamFrames {
  /** The engine's status and relayed headers (`raw`: name, value, name, value, …). */
  head(st: AgentStream, status: number, raw: string[]): void;
  /** Bytes of the answer, ≤ `maxChunk` per frame. */
  data(st: AgentStream, bytes: Uint8Array): void;
  frame(st: AgentStream, kind: FrameKind): void;
  /** The engine request failed; `answered`: after its head (the stream broke). */
  failed(st: AgentStream, err: Error, answered: boolean): void;
}

/**
 * The engine request of one stream. Settles (`done()`) once the request is over for the agent:
 * the answer relayed to its end, a failure reported, or the stream aborted (the engine's
 * connection is then closed: HTTP/1.1's only way to tell it to stop).
 */
export class EngineCall implements Http1Handler {
  private readonly st: AgentStream;
  private readonly out: StreamFrames;
  private readonly maxChunk: number;
  private readonly settle: () => void;
  private abortFn: ((err?: Error) => void) | null = null;
  private resumeFn: (() => void) | null = null;
  private answered = false;
  /** A chunk not yet all sent for want of credit, and how far it went. */
  private chunk: Buffer | null = null;
  private off = 0;
  /** The answer ended while a chunk waited for credit: the end frame follows it. */
  private complete = false;
  private settled = false;

  constructor(st: AgentStream, out: StreamFrames, maxChunk: number, done: () => void) {
    this.st = st;
    this.out = out;
    this.maxChunk = maxChunk;
    this.settle = done;
    st.onAbort = (err) => {
      // Not handed to a connection yet: onConnect aborts it before a byte is written.
      this.abortFn?.(err);
      this.finish();
    };
  }

  onConnect(abort: (err?: Error) => void): void {
    this.abortFn = abort;
    if (this.st.done) abort(new Error("stream ended"));
  }

  onHeaders(status: number, raw: string[], resume: () => void): boolean {
    if (status < 200) return true; // 1xx: the real answer follows
    if (this.st.done) return false;
    this.answered = true;
    this.resumeFn = resume;
    this.out.head(this.st, status, raw);
    return true;
  }

  onData(chunk: Buffer): boolean {
    if (this.st.done) return false;
    this.chunk = chunk;
    this.off = 0;
    return this.drain();
  }

  onComplete(): void {
    if (this.chunk !== null) this.complete = true;
    else this.end();
  }

  onError(err: Error): void {
    if (!this.st.done) this.out.failed(this.st, err, this.answered);
    this.finish();
  }

  /** Sends what credit allows of the pending chunk; false while some of it still waits. */
  private drain(): boolean {
    const st = this.st;
    const c = this.chunk!;
    while (this.off < c.length) {
      if (st.done) return false;
      if (st.sent >= st.allowed) {
        st.creditWaiter = this.onCredit;
        return false;
      }
      const end = Math.min(c.length, this.off + this.maxChunk);
      this.out.data(st, this.off === 0 && end === c.length ? c : c.subarray(this.off, end));
      st.sent++;
      this.off = end;
    }
    this.chunk = null;
    return true;
  }

  private readonly onCredit = (): void => {
    if (this.st.done) {
      this.finish();
      return;
    }
    if (!this.drain()) return;
    if (this.complete) this.end();
    else this.resumeFn?.();
  };

  private end(): void {
    if (!this.st.done) this.out.frame(this.st, "end");
    this.finish();
  }

  private finish(): void {
    if (this.settled) return;
    this.settled = true;
    this.chunk = null;
    this.settle();
  }
}
