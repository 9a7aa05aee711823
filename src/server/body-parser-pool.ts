/**
 * Large request bodies parsed off the event loop (issue #17 item 1). Decoding and `JSON.parse`
 * of a 1 MB body took 15–25 ms of the server's one thread, each a single slice that every
 * other request in flight waited behind. A body past `OFF_LOOP_BODY_BYTES` is handed (its
 * buffer transferred, not copied) to a small pool of worker threads that decode, parse and
 * depth-check it, and gets the buffer back for forwarding the client's own bytes. Reading
 * a cloned 1 MB string back was itself a 3–10 ms slice, so long strings do not travel back:
 * the worker reports where each one's bytes lie in the body, and this thread decodes them
 * in `STRING_CHUNK_BYTES` pieces, one per event-loop turn, joined as a rope. Flattening that
 * rope would be the same big slice again, so routing reads the string's head, kept apart
 * (`longStringHead`), and the forwarded body is the client's bytes: on the common path the
 * long string is never flattened here.
 *
 * Bounded: at most `maxPending` bodies in the pool (parsing or queued); past that a body is
 * refused with a 503 (`BodyParserBusyError`) instead of queueing without limit. A worker that
 * dies fails only the body it was parsing (500, `BodyParserFailedError`); the next body gets a
 * fresh worker. Workers are started on first use, so a server that never sees a large body
 * never starts one, and are unref'd while idle, so they never keep a process alive.
 *
 * The worker is an eval'd plain-JS string with no imports: it runs the same under tsx (tests,
 * `INFERA_DIST=0`) and from the esbuild bundle, where a separate worker module would be missing.
 */
import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";
import { InferaError, InvalidJsonError } from "../protocol/errors.ts";
import { assertBodyDepth, bodyDepthError, MAX_BODY_DEPTH } from "../protocol/openai.ts";
import { PIECE_CHARS, ROUTING_TEXT_CAP } from "./prompt-tokens.ts";

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

/** A long string left out of the cloned value: where it goes, and its bytes in the body. */
type Span = [path: (string | number)[], start: number, end: number];

type Reply =
  | { id: number; ok: true; value: unknown; buf: ArrayBuffer; spans: Span[] }
  | { id: number; ok: false; kind: "json" | "depth"; message: string; buf: ArrayBuffer };

/** Bytes of a long string decoded per event-loop turn. */
const STRING_CHUNK_BYTES = 64 * 1024;
/** Long strings per body sent as spans (the rest are cloned): bounds the worker's search. */
const MAX_SPANS = 8;

/**
 * `workerData`: { maxDepth, crashMarker, longChars, maxSpans }. Messages: { id, buf, off, len }
 * → Reply.
 *
 * A string of at least `longChars` is sent as a span when its UTF-8 bytes, between quotes,
 * are found in the body: well-formed strings only, so those bytes decode to exactly it
 * (whichever occurrence is found). Candidates are found by a short prefix, then compared whole.
 */
const WORKER_SRC = `
"use strict";
const { parentPort, workerData } = require("node:worker_threads");
const { maxDepth, crashMarker, longChars, maxSpans } = workerData;
const QUOTE = Buffer.from('"');
function findSpans(holder, raw) {
  const spans = [];
  const walk = (parent, key, path) => {
    if (spans.length >= maxSpans) return;
    const v = parent[key];
    if (typeof v === "string") {
      if (v.length < longChars || !v.isWellFormed()) return;
      const enc = Buffer.from(v, "utf8");
      const head = Buffer.concat([QUOTE, enc.subarray(0, 64)]);
      for (let at = raw.indexOf(head); at >= 0; at = raw.indexOf(head, at + 1)) {
        const start = at + 1;
        const end = start + enc.length;
        if (raw[end] === 0x22 && raw.subarray(start, end).equals(enc)) {
          spans.push([path.slice(1), start, end]);
          parent[key] = "";
          return;
        }
      }
      return;
    }
    if (v === null || typeof v !== "object") return;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) { path.push(i); walk(v, i, path); path.pop(); }
    } else {
      for (const k in v) { path.push(k); walk(v, k, path); path.pop(); }
    }
  };
  walk(holder, "v", ["v"]);
  return spans;
}
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
  const raw = Buffer.from(m.buf, m.off, m.len);
  const text = raw.toString("utf8");
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
  const holder = { v: value };
  const spans = longChars > 0 && text.length >= longChars ? findSpans(holder, raw) : [];
  parentPort.postMessage({ id: m.id, ok: true, value: holder.v, buf: m.buf, spans }, [m.buf]);
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
  readonly worker: Worker;
  job: Job | null = null;
  constructor(worker: Worker) {
    this.worker = worker;
  }
}

export interface BodyParserPoolOptions {
  /** Worker threads (default: 1 on ≤ 2 cores, else 2). */
  workers?: number;
  /** Bodies in the pool at once, parsing or queued, before a body is refused with 503. */
  maxPending?: number;
  /** Test hook: a worker exits at once on a body containing this string. */
  crashMarker?: string;
  /**
   * Strings at least this long are decoded here in slices rather than cloned whole (default
   * 32 Ki characters; 0 = never).
   */
  longStringChars?: number;
}

export class BodyParserPool {
  private readonly slots: (Slot | null)[];
  private readonly queue: Job[] = [];
  private readonly maxPending: number;
  private readonly crashMarker: string;
  private readonly longChars: number;
  private pending = 0;
  private nextId = 1;
  private closed = false;
  /** Workers that died mid-job (for tests and logs). */
  crashes = 0;
  /** Long strings decoded on this thread in slices instead of cloned (for tests). */
  slicedStrings = 0;

  constructor(opts: BodyParserPoolOptions = {}) {
    const n = opts.workers ?? (availableParallelism() <= 2 ? 1 : 2);
    this.slots = new Array<Slot | null>(Math.max(1, n)).fill(null);
    this.maxPending = Math.max(1, opts.maxPending ?? 32);
    this.crashMarker = opts.crashMarker ?? "";
    this.longChars = Math.max(0, opts.longStringChars ?? 32 * 1024);
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
      s.worker.ref();
      s.worker.postMessage({ id: job.id, buf: job.buf, off: job.off, len: job.len }, [job.buf]);
    }
  }

  private spawn(i: number): Slot {
    const worker = new Worker(WORKER_SRC, {
      eval: true,
      workerData: {
        maxDepth: MAX_BODY_DEPTH,
        crashMarker: this.crashMarker,
        longChars: this.longChars,
        maxSpans: MAX_SPANS,
      },
      // The parent's --import (tsx) is of no use to a plain-JS worker and costs startup time.
      execArgv: [],
    });
    const slot = new Slot(worker);
    worker.on("message", (r: Reply) => this.reply(slot, r));
    const died = (): void => this.died(i, slot);
    worker.on("error", died);
    worker.on("exit", died);
    // Idle workers never keep the process alive (refs while a body is parsing, see pump). After
    // the listeners: attaching a "message" listener refs the worker's port again.
    worker.unref();
    return slot;
  }

  private reply(slot: Slot, r: Reply): void {
    const job = slot.job;
    if (!job || job.id !== r.id) return;
    slot.job = null;
    slot.worker.unref();
    if (r.ok) {
      const raw = Buffer.from(r.buf);
      if (r.spans.length === 0) this.settle(job, null, { value: r.value, raw });
      else {
        // The worker is free for the next body while this one's long strings are decoded.
        this.slicedStrings += r.spans.length;
        fillSpans(r.value, raw, r.spans).then(
          (value) => this.settle(job, null, { value, raw }),
          (err: Error) => this.settle(job, err),
        );
      }
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

const yieldToLoop = (): Promise<void> => new Promise((r) => setImmediate(r));

/** Characters of a long string's head kept apart for routing (which looks no further). */
const HEAD_CHARS = ROUTING_TEXT_CAP + PIECE_CHARS;

/** The heads of long strings decoded here, by the object holding the string and its key. */
const heads = new WeakMap<object, Map<string | number, string>>();

/**
 * The first characters (at least ROUTING_TEXT_CAP) of the long string at `holder[key]`
 * when it was decoded here in slices: slicing that rope's head is cheap, slicing the rope
 * itself flattens all of it (a megabyte-long copy in one slice). Undefined otherwise.
 */
export function longStringHead(holder: object, key: string | number): string | undefined {
  return heads.get(holder)?.get(key);
}

/**
 * Puts the long strings back into `value` (where the worker left ""), each decoded from its
 * bytes in `STRING_CHUNK_BYTES` pieces, one per event-loop turn, cut between UTF-8 sequences.
 * Resolves with the value (a top-level string is returned rather than assigned).
 */
async function fillSpans(value: unknown, raw: Buffer, spans: readonly Span[]): Promise<unknown> {
  let top = value;
  for (const [path, start, end] of spans) {
    let s = "";
    let head = "";
    for (let at = start; at < end; ) {
      let stop = Math.min(end, at + STRING_CHUNK_BYTES);
      while (stop < end && (raw[stop]! & 0xc0) === 0x80) stop--;
      const piece = raw.toString("utf8", at, stop);
      s += piece;
      // Only HEAD_CHARS: a longer head (a whole 64 KiB piece past it) is flattened whole when cut.
      if (head.length < HEAD_CHARS)
        head += piece.length > HEAD_CHARS - head.length ? piece.slice(0, HEAD_CHARS - head.length) : piece;
      at = stop;
      if (at < end) await yieldToLoop();
    }
    if (path.length === 0) {
      top = s;
      continue;
    }
    let holder = top as Record<string | number, unknown>;
    for (let i = 0; i < path.length - 1; i++) holder = holder[path[i]!] as Record<string | number, unknown>;
    const key = path[path.length - 1]!;
    holder[key] = s;
    if (head.length < s.length) {
      const m = heads.get(holder) ?? new Map<string | number, string>();
      heads.set(holder, m);
      m.set(key, head);
    }
  }
  return top;
}

const isShared = (b: ArrayBufferLike): boolean =>
  typeof SharedArrayBuffer !== "undefined" && b instanceof SharedArrayBuffer;

let shared: BodyParserPool | null = null;

/** The process's pool, created on first use (its workers start on the first large body). */
export function bodyParserPool(): BodyParserPool {
  shared ??= new BodyParserPool();
  return shared;
}
