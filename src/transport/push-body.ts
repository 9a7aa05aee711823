/**
 * A response body fed chunk by chunk by its transport (the HTTP executor's undici dispatch
 * handler), read either by one attached `BodySink` (the server's relay: plain calls, no
 * stream machinery) or as an AsyncIterable (everything else). It replaces undici's body
 * `Readable` on the hot path: no Readable state machine, no per-chunk 'data' emit, no
 * `AsyncResource`, which a bare undici `request` pays per answer.
 *
 * Backpressure: a sink that returns false from `onData` pauses the source until `resume()`.
 */

import type { BodySink, RelayBody } from "./types.ts";

export type { BodySink } from "./types.ts";

/**
 * What the body asks of its transport. There is no pause(): `push` returning false is the
 * pause signal (undici stops reading when its onData hook returns false).
 */
export interface BodySource {
  resume(): void;
  /** Stops the transfer (the consumer went away); the source then calls nothing more. */
  abort(reason: Error): void;
}

/** Chunks buffered before a reader attaches, past which the source is paused. */
const UNREAD_CHUNKS = 16;

const OPEN = 0;
const ENDED = 1;
const FAILED = 2;

export class PushBody implements RelayBody {
  private readonly source: BodySource;
  private sink: BodySink | null = null;
  /** Chunks that arrived before a sink was attached. */
  private queue: Uint8Array[] | null = null;
  private state = OPEN;
  private error: Error | null = null;
  private paused = false;
  private closeListeners: Array<() => void> | null = null;

  constructor(source: BodySource) {
    this.source = source;
  }

  /** True once the body ended, failed or was destroyed. */
  get closed(): boolean {
    return this.state !== OPEN;
  }

  // --- producer side ------------------------------------------------------------------

  /** Delivers a chunk; returns false when the source should pause (the sink is full). */
  push(chunk: Uint8Array): boolean {
    if (this.state !== OPEN) return false;
    if (this.sink === null) {
      if (this.queue === null) this.queue = [chunk];
      else this.queue.push(chunk);
      // Nobody reading yet: hold the worker back rather than buffer a whole stream.
      if (this.queue.length < UNREAD_CHUNKS) return true;
      this.paused = true;
      return false;
    }
    if (this.sink.onData(chunk)) return true;
    this.paused = true;
    return false;
  }

  end(): void {
    if (this.state !== OPEN) return;
    this.state = ENDED;
    if (this.sink && this.queue === null) this.sink.onEnd();
    this.closeOnce();
  }

  fail(err: Error): void {
    if (this.state !== OPEN) return;
    this.state = FAILED;
    this.error = err;
    if (this.sink && this.queue === null) this.sink.onError(err);
    this.closeOnce();
  }

  // --- consumer side ------------------------------------------------------------------

  /** Attaches the one consumer; chunks queued so far (and the end, if reached) are replayed now. */
  attach(sink: BodySink): void {
    if (this.sink) throw new Error("a body has one consumer");
    this.sink = sink;
    const queued = this.queue;
    this.queue = null;
    let wantsMore = true;
    if (queued !== null) for (const c of queued) wantsMore = sink.onData(c) && wantsMore;
    // An end or failure that came before the reader (with or without chunks) is delivered now.
    if (this.state === ENDED) sink.onEnd();
    else if (this.state === FAILED) sink.onError(this.error!);
    else if (queued !== null) {
      // Held back while unread: go on, unless the sink is already full (it resumes on drain).
      if (!wantsMore) this.paused = true;
      else this.resume();
    }
  }

  /** After a sink's `onData` returned false: let the source go on. */
  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    if (this.state === OPEN) this.source.resume();
  }

  /** The consumer gives up: the transfer is aborted and an attached sink sees the error. */
  destroy(reason: Error = abortError()): void {
    if (this.state !== OPEN) return;
    this.source.abort(reason);
    this.fail(reason);
  }

  /** Runs `fn` once the body ended, failed or was destroyed (at once if it already has). */
  onClose(fn: () => void): void {
    if (this.state !== OPEN) fn();
    else if (this.closeListeners === null) this.closeListeners = [fn];
    else this.closeListeners.push(fn);
  }

  [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    return new BodyIterator(this);
  }

  async bytes(): Promise<Buffer> {
    const chunks: Uint8Array[] = [];
    for await (const c of this) chunks.push(c);
    return Buffer.concat(chunks);
  }

  async json(): Promise<unknown> {
    return JSON.parse((await this.bytes()).toString("utf8"));
  }

  private closeOnce(): void {
    const ls = this.closeListeners;
    this.closeListeners = null;
    if (ls) for (const fn of ls) fn();
  }
}

function abortError(): Error {
  return Object.assign(new Error("The body was aborted by its reader."), { name: "AbortError" });
}

/** Async iteration over a PushBody: a small buffer, paused while it holds more than a few chunks. */
class BodyIterator implements AsyncIterator<Uint8Array>, BodySink {
  private readonly body: PushBody;
  private readonly buffered: Uint8Array[] = [];
  private done = false;
  private error: Error | null = null;
  private waiter: { resolve: (r: IteratorResult<Uint8Array>) => void; reject: (e: Error) => void } | null =
    null;

  constructor(body: PushBody) {
    this.body = body;
    body.attach(this);
  }

  onData(chunk: Uint8Array): boolean {
    const w = this.waiter;
    if (w) {
      this.waiter = null;
      w.resolve({ value: chunk, done: false });
      return true;
    }
    this.buffered.push(chunk);
    return this.buffered.length < 16;
  }

  onEnd(): void {
    this.done = true;
    this.settle();
  }

  onError(err: Error): void {
    this.error = err;
    this.settle();
  }

  next(): Promise<IteratorResult<Uint8Array>> {
    if (this.buffered.length > 0) {
      const value = this.buffered.shift()!;
      if (this.buffered.length === 0) this.body.resume();
      return Promise.resolve({ value, done: false });
    }
    if (this.error) return Promise.reject(this.error);
    if (this.done) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  /** `break` out of for-await: the rest of the body is not wanted. */
  return(): Promise<IteratorResult<Uint8Array>> {
    this.buffered.length = 0;
    this.body.destroy();
    return Promise.resolve({ value: undefined, done: true });
  }

  private settle(): void {
    const w = this.waiter;
    if (!w) return;
    this.waiter = null;
    if (this.error) w.reject(this.error);
    else w.resolve({ value: undefined, done: true });
  }
}
