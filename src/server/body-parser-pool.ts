/**
 * Large request bodies parsed off the event loop (issue #17 item 1). Decoding and `JSON.parse`
 * of a 1 MB body took 15–25 ms of the server's one thread, each a single slice that every
 * other request in flight waited behind. A body past `OFF_LOOP_BODY_BYTES` is handed (its
 * buffer transferred, not copied) to a small pool of worker threads that decode, parse and
 * depth-check it; the event loop only pays the structured-clone read of the result (a long
 * string is one memcpy) and gets the buffer back for forwarding the client's own bytes.
 *
 * Bounded: at most `maxPending` bodies in the pool (parsing or queued); past that a body is
 * refused with a 503 (`BodyParserBusyError`) instead of queueing without limit. A worker that
 * dies fails only the body it was parsing (500, `BodyParserFailedError`); the next body gets a
 * fresh worker. Workers are started on first use and unref'd, so a server that never sees a
 * large body never starts one, and they never keep a process alive.
 *
 * The worker is an eval'd plain-JS string with no imports: it runs the same under tsx (tests,
 * `INFERA_DIST=0`) and from the esbuild bundle, where a separate worker module would be missing.
 */
import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";
import { InferaError, InvalidJsonError } from "../protocol/errors.ts";
import { assertBodyDepth, bodyDepthError, MAX_BODY_DEPTH } from "../protocol/openai.ts";

/** Bodies larger than this are parsed in the pool; smaller ones stay on the fast synchronous path. */
export const OFF_LOOP_BODY_BYTES = 256 * 1024;

/** Too many large bodies are being parsed at once (503, retry shortly). */
export class BodyParserBusyError extends InferaError {
  constructor() {
    super(503, "Too many large request bodies are being parsed; retry shortly.", {
      type: "service_unavailable",
      code: "server_busy",
      headers: { "retry-after": "1" },
    });
  }
}

/** The worker parsing this body died (500 for this request only). */
export class BodyParserFailedError extends InferaError {
  constructor() {
    super(500, "The request body could not be parsed (internal parser failure).", {
      type: "server_error",
      code: "body_parser_failed",
    });
  }
}

/**
 * The synchronous path for small bodies (valid UTF-8, checked by the caller): the same
 * decode, parse and depth check as the worker, with the same errors.
 */
export function parseBodySync(raw: Buffer): unknown {
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw.toString("utf8"));
  } catch (err) {
    throw new InvalidJsonError((err as Error).message);
  }
  assertBodyDepth(parsed);
  return parsed;
}

export interface ParsedBody {
  /** `JSON.parse` of the body, structurally identical to parsing it on this thread. */
  value: unknown;
  /** The body's bytes, handed back by the worker (the caller's buffer was transferred). */
  raw: Buffer;
}

type Reply =
  | { id: number; ok: true; value: unknown; buf: ArrayBuffer }
  | { id: number; ok: false; kind: "json" | "depth"; message: string; buf: ArrayBuffer };

/** `workerData`: { maxDepth, crashMarker }. Messages: { id, buf, off, len } → Reply. */
const WORKER_SRC = `
"use strict";
const { parentPort, workerData } = require("node:worker_threads");
const { maxDepth, crashMarker } = workerData;
function tooDeep(v, left) {
  if (left === 0) return true;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const x = v[i];
      if (x !== null && typeof x === "object" && tooDeep(x, left - 1)) return true;
    }
    return false;
  }
  for (const k in v) {
    const x = v[k];
    if (x !== null && typeof x === "object" && tooDeep(x, left - 1)) return true;
  }
  return false;
}
parentPort.on("message", (m) => {
  const text = Buffer.from(m.buf, m.off, m.len).toString("utf8");
  if (crashMarker && text.includes(crashMarker)) process.exit(70);
  let value;
  try {
    value = JSON.parse(text);
  } catch (err) {
    parentPort.postMessage({ id: m.id, ok: false, kind: "json", message: err.message, buf: m.buf }, [m.buf]);
    return;
  }
  if (value !== null && typeof value === "object" && tooDeep(value, maxDepth)) {
    parentPort.postMessage({ id: m.id, ok: false, kind: "depth", message: "", buf: m.buf }, [m.buf]);
    return;
  }
  parentPort.postMessage({ id: m.id, ok: true, value, buf: m.buf }, [m.buf]);
});
`;

interface Job {
  id: number;
  buf: ArrayBuffer;
  off: number;
  len: number;
  resolve: (p: ParsedBody) => void;
  reject: (e: Error) => void;
}

/** One worker thread and the job it is running (one at a time: the queue is the pool's). */
class Slot {
  job: Job | null = null;
  constructor(readonly worker: Worker) {}
}

export interface BodyParserPoolOptions {
  /** Worker threads (default: 1 on ≤ 2 cores, else 2). */
  workers?: number;
  /** Bodies in the pool at once, parsing or queued, before a body is refused with 503. */
  maxPending?: number;
  /** Test hook: a worker exits at once on a body containing this string. */
  crashMarker?: string;
}

export class BodyParserPool {
  private readonly slots: (Slot | null)[];
  private readonly queue: Job[] = [];
  private readonly maxPending: number;
  private readonly crashMarker: string;
  private pending = 0;
  private nextId = 1;
  private closed = false;
  /** Workers that died mid-job (for tests and logs). */
  crashes = 0;

  constructor(opts: BodyParserPoolOptions = {}) {
    const n = opts.workers ?? (availableParallelism() <= 2 ? 1 : 2);
    this.slots = new Array<Slot | null>(Math.max(1, n)).fill(null);
    this.maxPending = Math.max(1, opts.maxPending ?? 32);
    this.crashMarker = opts.crashMarker ?? "";
  }

  /** Bodies parsing or queued now. */
  get size(): number {
    return this.pending;
  }

  /**
   * Parses `raw` (valid UTF-8, checked by the caller) on a worker. `raw` is detached (its
   * memory moves to the worker and back); use the returned `raw` afterwards. Rejects with
   * InvalidJsonError / the depth error exactly as parsing on this thread would, with
   * BodyParserBusyError when the pool is full, BodyParserFailedError when the worker died.
   */
  parse(raw: Buffer): Promise<ParsedBody> {
    if (this.closed || this.pending >= this.maxPending) return Promise.reject(new BodyParserBusyError());
    // Transfer the buffer when it is exactly this body's memory; otherwise (a slice of a
    // shared allocation) copy it first, once.
    const whole = raw.byteOffset === 0 && raw.buffer.byteLength === raw.length && !isShared(raw.buffer);
    const buf = whole ? (raw.buffer as ArrayBuffer) : new Uint8Array(raw).buffer;
    this.pending++;
    return new Promise<ParsedBody>((resolve, reject) => {
      this.queue.push({ id: this.nextId++, buf, off: 0, len: raw.length, resolve, reject });
      this.pump();
    });
  }

  /** Stops the workers; bodies in flight or queued fail with BodyParserBusyError. */
  async close(): Promise<void> {
    this.closed = true;
    for (const j of this.queue.splice(0)) this.settle(j, new BodyParserBusyError());
    const workers: Worker[] = [];
    for (let i = 0; i < this.slots.length; i++) {
      const s = this.slots[i];
      if (!s) continue;
      this.slots[i] = null;
      if (s.job) this.settle(s.job, new BodyParserBusyError());
      s.job = null;
      workers.push(s.worker);
    }
    await Promise.all(workers.map((w) => w.terminate()));
  }

  private pump(): void {
    for (let i = 0; i < this.slots.length && this.queue.length > 0; i++) {
      let s = this.slots[i];
      if (s?.job) continue;
      if (!s) {
        s = this.spawn(i);
        this.slots[i] = s;
      }
      const job = this.queue.shift()!;
      s.job = job;
      s.worker.postMessage({ id: job.id, buf: job.buf, off: job.off, len: job.len }, [job.buf]);
    }
  }

  private spawn(i: number): Slot {
    const worker = new Worker(WORKER_SRC, {
      eval: true,
      workerData: { maxDepth: MAX_BODY_DEPTH, crashMarker: this.crashMarker },
      // The parent's --import (tsx) is of no use to a plain-JS worker and costs startup time.
      execArgv: [],
    });
    worker.unref();
    const slot = new Slot(worker);
    worker.on("message", (r: Reply) => this.reply(slot, r));
    const died = (): void => this.died(i, slot);
    worker.on("error", died);
    worker.on("exit", died);
    return slot;
  }

  private reply(slot: Slot, r: Reply): void {
    const job = slot.job;
    if (!job || job.id !== r.id) return;
    slot.job = null;
    if (r.ok) {
      this.settle(job, null, { value: r.value, raw: Buffer.from(r.buf) });
    } else {
      this.settle(job, r.kind === "json" ? new InvalidJsonError(r.message) : bodyDepthError());
    }
    this.pump();
  }

  private died(i: number, slot: Slot): void {
    if (this.slots[i] !== slot) return; // already replaced (error then exit)
    this.slots[i] = null;
    if (slot.job) {
      this.crashes++;
      this.settle(slot.job, new BodyParserFailedError());
      slot.job = null;
    }
    if (!this.closed) this.pump();
  }

  private settle(job: Job, err: Error | null, ok?: ParsedBody): void {
    this.pending--;
    if (err) job.reject(err);
    else job.resolve(ok!);
  }
}

const isShared = (b: ArrayBufferLike): boolean =>
  typeof SharedArrayBuffer !== "undefined" && b instanceof SharedArrayBuffer;

let shared: BodyParserPool | null = null;

/** The process's pool, created on first use (its workers start on the first large body). */
export function bodyParserPool(): BodyParserPool {
  shared ??= new BodyParserPool();
  return shared;
}
