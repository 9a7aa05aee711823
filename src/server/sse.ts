/**
 * Server-sent-event pass-through with usage capture. Complete events (ended by a blank line)
 * are forwarded as they arrive, in the upstream's own bytes; only a chunk that mentions
 * `"usage"` is looked into, to read the token counts and, when the server itself asked for
 * usage (the client did not), to drop the final usage-only event.
 */

export interface Usage {
  prompt_tokens?: number;
  completion_tokens?: number;
}

const BOUNDARY = Buffer.from("\n\n");
const USAGE = Buffer.from('"usage"');
const EMPTY_CHOICES = Buffer.from('"choices":[]');
/**
 * What `findUsage` and `hasEmptyChoices` search for natively: the needles' tails from a byte
 * that is rare in JSON. Node's Buffer search finds a short needle by its first byte, and `"`
 * starts every key and string (searching `"usage"` itself took ≈ 1 µs per KiB of events).
 */
const USAGE_TAIL = Buffer.from('ge"');
const EMPTY_ARRAY = Buffer.from("[]");
/** A stream that never sends a blank line must not be held back forever. */
const MAX_PENDING = 64 * 1024;

export class SseUsageFilter {
  private readonly stripUsageChunk: boolean;
  usage: Usage | null = null;
  /**
   * Set once the worker sent something that is not an OpenAI event stream (see `validEvent`);
   * nothing more is forwarded after it and the relay ends the stream with an error event.
   */
  invalid = false;
  private pending: Buffer | null = null;

  constructor(stripUsageChunk: boolean) {
    this.stripUsageChunk = stripUsageChunk;
  }

  /** Returns the bytes to forward now (possibly empty). */
  push(chunk: Uint8Array): Buffer {
    let buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    if (this.pending) {
      buf = Buffer.concat([this.pending, buf]);
      this.pending = null;
    }
    const last = lastBoundary(buf);
    if (last < 0) {
      if (buf.length > MAX_PENDING) return buf;
      this.pending = buf;
      return EMPTY;
    }
    const end = last + 2;
    if (end < buf.length) this.pending = buf.subarray(end);
    const complete = end < buf.length ? buf.subarray(0, end) : buf;
    if (!validEvents(complete)) {
      this.invalid = true;
      this.pending = null;
      return EMPTY;
    }
    // One search over the whole chunk: most chunks carry no usage and leave here.
    const at = findUsage(complete, 0);
    return at < 0 ? complete : this.inspect(complete, at);
  }

  /** What is left at the end of the stream (`invalid` is set when it is not an event). */
  flush(): Buffer {
    const p = this.pending ?? EMPTY;
    this.pending = null;
    if (p.length > 0 && !isBlank(p) && !validEvents(p)) {
      this.invalid = true;
      return EMPTY;
    }
    return p;
  }

  /**
   * Reads the usage of every event that mentions `"usage"` (the first at `at`) and, when the
   * server asked for usage itself, drops the usage-only ones (`"choices":[]`). Only those
   * events are located (each Buffer search is a native call of ≈ 0.2 µs, and a stream's last
   * chunk often holds all of its events): the rest are passed on as they are.
   */
  private inspect(complete: Buffer, at: number): Buffer {
    let kept: Buffer[] | null = null;
    let from = 0;
    while (at >= 0) {
      const start = eventStart(complete, at);
      let stop = complete.indexOf(BOUNDARY, at);
      stop = stop < 0 ? complete.length : stop + 2;
      const ev = complete.subarray(start, stop);
      const usage = parseUsage(ev, at - start);
      if (usage) this.usage = usage;
      if (this.stripUsageChunk && hasEmptyChoices(ev)) {
        kept ??= [];
        if (start > from) kept.push(complete.subarray(from, start));
        from = stop;
      }
      at = stop < complete.length ? findUsage(complete, stop) : -1;
    }
    if (kept === null) return complete;
    if (from < complete.length) kept.push(complete.subarray(from));
    return kept.length === 1 ? kept[0]! : Buffer.concat(kept);
  }
}

/** The first `"usage"` in `b` at or after `from`, or -1 (`b.indexOf(USAGE, from)`, faster). */
function findUsage(b: Buffer, from: number): number {
  const lead = USAGE.length - USAGE_TAIL.length;
  let i = b.indexOf(USAGE_TAIL, from + lead);
  while (i >= 0) {
    if (startsWith(b, i - lead, USAGE)) return i - lead;
    i = b.indexOf(USAGE_TAIL, i + 1);
  }
  return -1;
}

/** Whether `ev` holds `"choices":[]` (`ev.indexOf(EMPTY_CHOICES) >= 0`, faster). */
function hasEmptyChoices(ev: Buffer): boolean {
  const lead = EMPTY_CHOICES.length - EMPTY_ARRAY.length;
  let i = ev.indexOf(EMPTY_ARRAY, lead);
  while (i >= 0) {
    if (startsWith(ev, i - lead, EMPTY_CHOICES)) return true;
    i = ev.indexOf(EMPTY_ARRAY, i + 1);
  }
  return false;
}

/**
 * Where the last event boundary (a blank line, `\n\n`) of `b` starts, or -1. A chunk usually
 * ends with one: checked first, without a native call.
 */
function lastBoundary(b: Buffer): number {
  const n = b.length;
  if (n >= 2 && b[n - 1] === LF && b[n - 2] === LF) return n - 2;
  return b.lastIndexOf(BOUNDARY);
}

/**
 * The start of the event holding position `at` of `b`, as splitting `b` at every `\n\n` from its
 * start places it: just after the boundary before `at`. In a run of k line feeds that split
 * takes them two by two, so the event starts after the run's last complete pair.
 */
function eventStart(b: Buffer, at: number): number {
  const p = b.lastIndexOf(BOUNDARY, at - 1);
  if (p < 0) return 0;
  let run = p;
  while (run > 0 && b[run - 1] === LF) run--;
  return run + 2 * ((p + 2 - run) >> 1);
}

const EMPTY = Buffer.alloc(0);

const LF = 0x0a;
const CR = 0x0d;
const SP = 0x20;
const COLON = 0x3a;
const LBRACE = 0x7b;
const RBRACE = 0x7d;
const DATA = Buffer.from("data:");
const DONE = Buffer.from("[DONE]");
const FIELDS = [Buffer.from("event:"), Buffer.from("id:"), Buffer.from("retry:")];

function isBlank(b: Buffer): boolean {
  for (let i = 0; i < b.length; i++) {
    const c = b[i]!;
    if (c !== LF && c !== CR && c !== SP && c !== 0x09) return false;
  }
  return true;
}

/** Whether `b` holds `prefix` at `at`: a byte loop (Buffer.compare is a native call per line). */
function startsWith(b: Buffer, at: number, prefix: Buffer): boolean {
  const n = prefix.length;
  if (b.length - at < n) return false;
  for (let i = 0; i < n; i++) if (b[at + i] !== prefix[i]) return false;
  return true;
}

/**
 * Whether every line of `b` (complete events) is what an OpenAI-compatible engine sends: a
 * `data:` line whose payload is a JSON object (first byte `{`, last `}`; not parsed, to keep
 * the relay cheap) or `[DONE]`, an SSE comment, another SSE field, or a blank line.
 */
function validEvents(b: Buffer): boolean {
  let at = 0;
  while (at < b.length) {
    // A blank line (every event ends with one) needs no search.
    if (b[at] === LF) {
      at++;
      continue;
    }
    let eol = b.indexOf(LF, at);
    if (eol < 0) eol = b.length;
    let end = eol;
    if (end > at && b[end - 1] === CR) end--;
    if (end > at && !validLine(b, at, end)) return false;
    at = eol + 1;
  }
  return true;
}

function validLine(b: Buffer, at: number, end: number): boolean {
  if (b[at] === COLON) return true;
  if (startsWith(b, at, DATA)) {
    let p = at + DATA.length;
    if (b[p] === SP) p++;
    let q = end;
    while (q > p && (b[q - 1] === SP || b[q - 1] === 0x09)) q--;
    if (q - p === DONE.length && startsWith(b, p, DONE)) return true;
    return q - p >= 2 && b[p] === LBRACE && b[q - 1] === RBRACE;
  }
  for (const f of FIELDS) if (startsWith(b, at, f)) return true;
  return false;
}

const PROMPT_RE = /"prompt_tokens"\s*:\s*(\d+)/;
const COMPLETION_RE = /"completion_tokens"\s*:\s*(\d+)/;

/**
 * Token counts of a usage-bearing event (`"usage"` at `at`, or searched for). A regex over the
 * `"usage"` tail instead of a full JSON.parse: the chunk is forwarded as bytes anyway, only two
 * numbers are wanted.
 */
function parseUsage(ev: Buffer, at = findUsage(ev, 0)): Usage | null {
  if (at < 0) return null;
  const tail = ev.toString("latin1", at);
  const p = PROMPT_RE.exec(tail);
  const c = COMPLETION_RE.exec(tail);
  if (!p && !c) return null;
  return {
    prompt_tokens: p ? Number(p[1]) : undefined,
    completion_tokens: c ? Number(c[1]) : undefined,
  };
}

/** Reads usage from a whole (non-streamed) JSON answer. */
export function usageFromJson(buf: Buffer): Usage | null {
  return parseUsage(buf);
}
