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
 * The worker is a module of its own (./body-parser-worker.ts; dist/body-parser-worker.js in
 * the build). Where that file is missing (the single-executable `infera`, which carries one
 * bundle and no files beside it), bodies are parsed on the loop as small ones are: the same
 * results, without the offloading.
 *
 * A large body arrives in a buffer lent by ./body-buffers.ts: it is moved to the worker whole
 * (nothing else holds it) and lent again when it comes back, so the caller gives it back to
 * the pool as it would have without the worker.
 */
import { existsSync } from "node:fs";
import { availableParallelism } from "node:os";
import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
import { MAX_BODY_DEPTH } from "../protocol/body-depth.ts";
import { InferaError, InvalidJsonError } from "../protocol/errors.ts";
import { assertBodyDepth, bodyDepthError } from "../protocol/openai.ts";
import { handOver, releaseBodyBuffer, takeBack } from "./body-buffers.ts";
import type { Span, WorkerConfig, WorkerJob, WorkerReply } from "./body-parser-worker.ts";
import { PIECE_CHARS, ROUTING_TEXT_CAP } from "./prompt-tokens.ts";

/** Bodies larger than this are parsed in the pool; smaller ones stay on the fast synchronous path. */
export const OFF_LOOP_BODY_BYTES = 256 * 1024;

/**
 * The compiled worker's path relative to this module's source file, set by scripts/build.mjs
 * (esbuild `define`); absent when the sources run as they are. (In dist/, `import.meta.url` is
 * rewritten to the source file's URL: see the build script.)
 */
declare const __BODY_PARSER_WORKER_FILE__: string | undefined;

/** Where the worker's module should be (the pool checks that it is there). */
function defaultWorkerFile(): URL {
  const rel =
    typeof __BODY_PARSER_WORKER_FILE__ === "string" ? __BODY_PARSER_WORKER_FILE__ : "./body-parser-worker.ts";
  return new URL(rel, import.meta.url);
}

const isFile = (url: URL): boolean => url.protocol === "file:" && existsSync(fileURLToPath(url));

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

/** Bytes of a long string decoded per event-loop turn. */
const STRING_CHUNK_BYTES = 64 * 1024;
/** Long strings per body sent as spans (the rest are cloned): bounds the worker's search. */
const MAX_SPANS = 8;

interface Job extends WorkerJob {
  /** The buffer was lent by ./body-buffers.ts: lend it again when it comes back. */
  pooled: boolean;
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
  /**
   * The worker's module (default: ./body-parser-worker.ts, or the build's compiled one). Null,
   * or a file that is not there: bodies are parsed on this thread instead.
   */
  workerFile?: URL | null;
}

export class BodyParserPool {
  private readonly slots: (Slot | null)[];
  private readonly queue: Job[] = [];
  private readonly maxPending: number;
  private readonly crashMarker: string;
  private readonly longChars: number;
  private readonly workerFile: URL | null;
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
    const file = opts.workerFile === undefined ? defaultWorkerFile() : opts.workerFile;
    this.workerFile = file && isFile(file) ? file : null;
  }

  /** Whether bodies are parsed on worker threads (false: the worker file is missing). */
  get offLoop(): boolean {
    return this.workerFile !== null;
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
    if (!this.workerFile) {
      try {
        return Promise.resolve({ value: parseBodySync(raw), raw });
      } catch (err) {
        return Promise.reject(err as Error);
      }
    }
    // Move the buffer when it is this body's alone: lent by the body pool (the body is its
    // first `length` bytes), or exactly the body's own allocation. Otherwise (a slice of a
    // shared allocation) copy the body first, once.
    const pooled = handOver(raw.buffer);
    const whole =
      pooled || (raw.byteOffset === 0 && raw.buffer.byteLength === raw.length && !isShared(raw.buffer));
    const buf = whole ? (raw.buffer as ArrayBuffer) : new Uint8Array(raw).buffer;
    const off = whole ? raw.byteOffset : 0;
    this.pending++;
    return new Promise<ParsedBody>((resolve, reject) => {
      this.queue.push({ id: this.nextId++, buf, off, len: raw.length, pooled, resolve, reject });
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
      const msg: WorkerJob = { id: job.id, buf: job.buf, off: job.off, len: job.len };
      s.worker.postMessage(msg, [job.buf]);
    }
  }

  private spawn(i: number): Slot {
    const workerData: WorkerConfig = {
      maxDepth: MAX_BODY_DEPTH,
      crashMarker: this.crashMarker,
      longChars: this.longChars,
      maxSpans: MAX_SPANS,
    };
    // Not the parent's flags: a profiler's or an --import's are not meant for the worker.
    const worker = new Worker(this.workerFile!, { workerData, execArgv: [] });
    const slot = new Slot(worker);
    worker.on("message", (r: WorkerReply) => this.reply(slot, r));
    const died = (): void => this.died(i, slot);
    worker.on("error", died);
    worker.on("exit", died);
    // Idle workers never keep the process alive (refs while a body is parsing, see pump). After
    // the listeners: attaching a "message" listener refs the worker's port again.
    worker.unref();
    return slot;
  }

  private reply(slot: Slot, r: WorkerReply): void {
    const job = slot.job;
    if (!job || job.id !== r.id) return;
    slot.job = null;
    slot.worker.unref();
    if (job.pooled) takeBack(r.buf);
    if (r.ok) {
      const raw = Buffer.from(r.buf, job.off, job.len);
      if (r.spans.length === 0) this.settle(job, null, { value: r.value, raw });
      else {
        // The worker is free for the next body while this one's long strings are decoded.
        this.slicedStrings += r.spans.length;
        fillSpans(r.value, raw, r.spans).then(
          (value) => this.settle(job, null, { value, raw }),
          (err: Error) => {
            releaseBodyBuffer(r.buf);
            this.settle(job, err);
          },
        );
      }
    } else {
      // A refused body is read no further: its buffer serves the next one.
      releaseBodyBuffer(r.buf);
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
