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
    const last = buf.lastIndexOf(BOUNDARY);
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
    if (complete.indexOf(USAGE) < 0) return complete;
    return this.inspect(complete);
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

  private inspect(complete: Buffer): Buffer {
    const kept: Buffer[] = [];
    let dropped = false;
    let start = 0;
    while (start < complete.length) {
      let stop = complete.indexOf(BOUNDARY, start);
      stop = stop < 0 ? complete.length : stop + 2;
      const ev = complete.subarray(start, stop);
      start = stop;
      if (ev.indexOf(USAGE) >= 0) {
        const usage = parseUsage(ev);
        if (usage) this.usage = usage;
        if (this.stripUsageChunk && ev.indexOf(EMPTY_CHOICES) >= 0) {
          dropped = true;
          continue;
        }
      }
      kept.push(ev);
    }
    return dropped ? Buffer.concat(kept) : complete;
  }
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

const startsWith = (b: Buffer, at: number, prefix: Buffer): boolean =>
  b.length - at >= prefix.length && b.compare(prefix, 0, prefix.length, at, at + prefix.length) === 0;

/**
 * Whether every line of `b` (complete events) is what an OpenAI-compatible engine sends: a
 * `data:` line whose payload is a JSON object (first byte `{`, last `}`; not parsed, to keep
 * the relay cheap) or `[DONE]`, an SSE comment, another SSE field, or a blank line.
 */
function validEvents(b: Buffer): boolean {
  let at = 0;
  while (at < b.length) {
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
 * Token counts of a usage-bearing event. A regex over the `"usage"` tail instead of a full
 * JSON.parse: the chunk is forwarded as bytes anyway, only two numbers are wanted.
 */
function parseUsage(ev: Buffer): Usage | null {
  const at = ev.indexOf(USAGE);
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
