/**
 * A strict, incremental HTTP/1.1 response parser for the request plane's raw client (RFC 9112):
 * the status line and header fields by hand, then the body as Content-Length bytes, chunked
 * transfer coding, or bytes up to the connection's close. Bytes are fed as they arrive, in any
 * split; body bytes are handed on as views of the packets (no copy).
 *
 * Strict where a lenient parser would open a hole between this server and the engine: a bare
 * LF, obs-fold, a field name with white space or a non-token byte, a control byte in a value,
 * Content-Length beside Transfer-Encoding (RFC 9112 §6.3, the classic smuggling vector),
 * conflicting Content-Lengths, a transfer coding other than chunked, a bad chunk size or a
 * chunk not followed by CRLF all fail the answer. The head (status line and fields) is capped,
 * like undici's and node:http's, at `http.maxHeaderSize` (16 KiB unless set).
 *
 * Error codes follow llhttp/undici's names (`HPE_*`, `UND_ERR_HEADERS_OVERFLOW`), so the
 * executor's and the relay's existing classification treats them as it did under undici.
 */
import { maxHeaderSize } from "node:http";
import { FIELD_VCHAR, TCHAR, TOKEN } from "../../util/http-grammar.ts";
import { ParseError } from "./errors.ts";

/**
 * What the parser reports, in order: the head, then body chunks. The end is `done` after
 * `execute` or `finish` returns. Returning false pauses parsing (see `ResponseParser.paused`).
 */
export interface ResponseSink {
  /** A final (≥ 200) head; informational 1xx heads are skipped. */
  onHead(head: ResponseHead): boolean;
  /** A body chunk (a view of the packet). */
  onBody(chunk: Buffer): boolean;
}

export interface ResponseHead {
  status: number;
  statusText: string;
  /** Names and values in order, as received (names keep their case): [name, value, name, value, …]. */
  raw: string[];
  /** Whether the connection may carry another request after this answer. */
  keepAlive: boolean;
  /** The `Keep-Alive: timeout=N` hint in seconds, if any. */
  keepAliveHint: number | undefined;
}

const MAX_HEAD = maxHeaderSize;
/** A chunk-size line with its extensions; llhttp allows no more in practice. */
const MAX_CHUNK_LINE = 1024;

const S_HEAD = 0;
const S_LENGTH = 1;
const S_CHUNK_SIZE = 2;
const S_CHUNK_DATA = 3;
const S_CHUNK_CRLF = 4;
const S_TRAILERS = 5;
const S_UNTIL_CLOSE = 6;
const S_DONE = 7;

const CR = 0x0d;
const LF = 0x0a;

const STATUS_LINE = new RegExp(`^HTTP\\/1\\.([01]) ([1-9]\\d\\d)(?: ([${FIELD_VCHAR}]*))?$`);
/** A trailer field line: a token name right before the colon, a value without control bytes but HTAB. */
const FIELD = new RegExp(`^[${TCHAR}]+:[${FIELD_VCHAR}]*$`);
/** A hex digit's value by byte, 0xff for any other byte. */
const HEX = new Uint8Array(256).fill(0xff);
for (let d = 0; d < 16; d++) {
  HEX["0123456789abcdef".charCodeAt(d)] = d;
  HEX["0123456789ABCDEF".charCodeAt(d)] = d;
}
/** tchar (RFC 9110 §5.6.2), by byte. */
const TCHAR_BYTE = new Uint8Array(256);
for (let c = 0; c < 256; c++) if (TOKEN.test(String.fromCharCode(c))) TCHAR_BYTE[c] = 1;
const CHUNK_SIZE = new RegExp(`^([0-9A-Fa-f]{1,12})[ \\t]*(?:;[${FIELD_VCHAR}]*)?$`);
const DIGITS = /^\d{1,15}$/;
const KEEP_ALIVE_TIMEOUT = /(?:^|[\s,])timeout\s*=\s*(\d+)/i;

export class ResponseParser {
  private readonly sink: ResponseSink;
  private state = S_HEAD;
  /** Bytes of an incomplete head, chunk-size line or trailer section. */
  private pending: Buffer | null = null;
  private remaining = 0;
  /** Trailer bytes so far: together capped like a head (undici counts them against maxHeaderSize). */
  private trailerBytes = 0;
  private noBody = false;
  /** Set when `onBody` returned false; `execute` stops and returns where it got to. */
  paused = false;
  /** Whether the answer is delimited by the connection's close (then it is never kept alive). */
  get untilClose(): boolean {
    return this.state === S_UNTIL_CLOSE;
  }
  /** Whether the answer being parsed is complete. */
  get done(): boolean {
    return this.state === S_DONE;
  }
  /** Whether any byte of a head has been received (the current answer has started). */
  get started(): boolean {
    return this.state !== S_HEAD || this.pending !== null;
  }

  constructor(sink: ResponseSink) {
    this.sink = sink;
  }

  /** Readies the parser for the next answer; `noBody`: the request was HEAD. */
  reset(noBody: boolean): void {
    this.state = S_HEAD;
    this.pending = null;
    this.remaining = 0;
    this.noBody = noBody;
    this.paused = false;
  }

  /**
   * Parses `buf` from `at`; returns the offset where it stopped: `buf.length`, or earlier when
   * paused or done (bytes after a complete answer are the caller's to judge). Throws ParseError.
   */
  execute(buf: Buffer, at = 0): number {
    this.paused = false;
    while (at < buf.length && !this.paused) {
      switch (this.state) {
        case S_HEAD:
          at = this.head(buf, at);
          break;
        case S_LENGTH: {
          const n = Math.min(this.remaining, buf.length - at);
          this.remaining -= n;
          const chunk = n === buf.length ? buf : buf.subarray(at, at + n);
          at += n;
          if (this.remaining === 0) this.state = S_DONE;
          if (!this.sink.onBody(chunk)) this.paused = true;
          break;
        }
        case S_CHUNK_SIZE:
          at = this.chunkSize(buf, at);
          break;
        case S_CHUNK_DATA: {
          const n = Math.min(this.remaining, buf.length - at);
          this.remaining -= n;
          const chunk = buf.subarray(at, at + n);
          at += n;
          if (this.remaining === 0) {
            this.state = S_CHUNK_CRLF;
            this.remaining = 2;
          }
          if (!this.sink.onBody(chunk)) this.paused = true;
          break;
        }
        case S_CHUNK_CRLF:
          // Exactly CRLF after a chunk's data: anything else is broken framing.
          if (buf[at] !== (this.remaining === 2 ? CR : LF))
            throw new ParseError("HPE_STRICT", "Missing expected CR after chunk data");
          at++;
          if (--this.remaining === 0) this.state = S_CHUNK_SIZE;
          break;
        case S_TRAILERS:
          at = this.trailers(buf, at);
          break;
        case S_UNTIL_CLOSE: {
          const chunk = at === 0 ? buf : buf.subarray(at);
          at = buf.length;
          if (!this.sink.onBody(chunk)) this.paused = true;
          break;
        }
        default:
          return at;
      }
    }
    return at;
  }

  /** The connection closed: completes a close-delimited answer; false if the answer was cut short. */
  finish(): boolean {
    if (this.state === S_UNTIL_CLOSE) {
      this.state = S_DONE;
      return true;
    }
    return this.state === S_DONE;
  }

  /** Takes the bytes of `buf` from `at` up to a terminator, joining earlier ones; null when incomplete. */
  private collect(
    buf: Buffer,
    at: number,
    term: Buffer,
    limit: number,
    code: string,
  ): [Buffer, number] | null {
    let data = at === 0 ? buf : buf.subarray(at);
    let from = 0;
    if (this.pending !== null) {
      from = Math.max(0, this.pending.length - term.length + 1);
      data = Buffer.concat([this.pending, data]);
      this.pending = null;
    }
    const end = data.indexOf(term, from);
    if (end < 0) {
      if (data.length > limit) throw overflow(code);
      this.pending = data;
      return null;
    }
    if (end > limit) throw overflow(code);
    // Where parsing resumes in `buf`: past the terminator, less what came from `pending`.
    const consumed = end + term.length - (data.length - (buf.length - at));
    return [data.subarray(0, end), at + consumed];
  }

  private head(buf: Buffer, at: number): number {
    const got = this.collect(buf, at, CRLFCRLF, MAX_HEAD, "UND_ERR_HEADERS_OVERFLOW");
    if (got === null) return buf.length;
    const [bytes, next] = got;
    const text = bytes.toString("latin1");
    let eol = text.indexOf("\r\n");
    if (eol < 0) eol = text.length;
    const m = STATUS_LINE.exec(eol === text.length ? text : text.slice(0, eol));
    if (m === null) throw new ParseError("HPE_INVALID_CONSTANT", "Invalid HTTP status line");
    const status = Number(m[2]);
    const raw: string[] = [];
    let length = -1;
    let chunked = false;
    let te = false;
    let close = m[1] === "0";
    let hint: number | undefined;
    for (let pos = eol + 2; pos < text.length; pos = eol + 2) {
      eol = text.indexOf("\r\n", pos);
      if (eol < 0) eol = text.length;
      field(text, pos, eol, raw);
      const name = raw[raw.length - 2]!;
      const value = raw[raw.length - 1]!;
      switch (name.length) {
        case 10:
          if (name.toLowerCase() === "connection") {
            const v = value.toLowerCase();
            if (/(?:^|,)\s*close\s*(?:,|$)/.test(v)) close = true;
            else if (m[1] === "0" && /(?:^|,)\s*keep-alive\s*(?:,|$)/.test(v)) close = false;
          } else if (name.toLowerCase() === "keep-alive") {
            const k = KEEP_ALIVE_TIMEOUT.exec(value);
            if (k) hint = Number(k[1]);
          }
          break;
        case 14:
          if (name.toLowerCase() === "content-length") length = contentLength(value, length);
          break;
        case 17:
          if (name.toLowerCase() === "transfer-encoding") {
            // Only `chunked`, once: engines send nothing else, and a coding this client cannot
            // decode (or a second chunked) would be relayed as something it is not.
            if (te || value.toLowerCase() !== "chunked")
              throw new ParseError("HPE_INVALID_TRANSFER_ENCODING", "Unsupported transfer encoding");
            te = true;
            chunked = true;
          }
          break;
      }
    }
    if (te && length >= 0)
      throw new ParseError(
        "HPE_UNEXPECTED_CONTENT_LENGTH",
        "Content-Length can't be present with Transfer-Encoding",
      );
    if (status < 200) {
      // 101 was never asked for; other 1xx are interim, the final answer follows.
      if (status === 101) throw new ParseError("HPE_INVALID_CONSTANT", "Unexpected protocol upgrade");
      return next;
    }
    const reason = m[3] ?? "";
    const noBody = this.noBody || status === 204 || status === 304;
    if (noBody) this.state = S_DONE;
    else if (chunked) this.state = S_CHUNK_SIZE;
    else if (length >= 0) {
      this.remaining = length;
      this.state = length === 0 ? S_DONE : S_LENGTH;
    } else {
      this.state = S_UNTIL_CLOSE;
      close = true;
    }
    if (!this.sink.onHead({ status, statusText: reason, raw, keepAlive: !close, keepAliveHint: hint }))
      this.paused = true;
    return next;
  }

  private chunkSize(buf: Buffer, at: number): number {
    // The common line, whole in this packet: hex digits then CRLF, read in place.
    if (this.pending === null) {
      let i = at;
      let size = 0;
      for (; i < buf.length && i - at < 13; i++) {
        const v = HEX[buf[i]!]!;
        if (v === 0xff) break;
        size = size * 16 + v;
      }
      if (i > at && i - at <= 12 && i + 1 < buf.length && buf[i] === CR && buf[i + 1] === LF) {
        this.chunk(size);
        return i + 2;
      }
    }
    const got = this.collect(buf, at, CRLF, MAX_CHUNK_LINE, "HPE_INVALID_CHUNK_SIZE");
    if (got === null) return buf.length;
    const [line, next] = got;
    const m = CHUNK_SIZE.exec(line.toString("latin1"));
    if (m === null) throw new ParseError("HPE_INVALID_CHUNK_SIZE", "Invalid character in chunk size");
    this.chunk(Number.parseInt(m[1]!, 16));
    return next;
  }

  private chunk(size: number): void {
    if (size === 0) {
      this.state = S_TRAILERS;
      this.trailerBytes = 0;
    } else {
      this.remaining = size;
      this.state = S_CHUNK_DATA;
    }
  }

  /** Trailer fields after the last chunk (validated, then dropped), up to the empty line. */
  private trailers(buf: Buffer, at: number): number {
    // Most answers have none: the last chunk's CRLF follows at once.
    if (this.pending === null && buf.length - at >= 2 && buf[at] === CR && buf[at + 1] === LF) {
      this.state = S_DONE;
      return at + 2;
    }
    const got = this.collect(buf, at, CRLF, MAX_HEAD - this.trailerBytes, "UND_ERR_HEADERS_OVERFLOW");
    if (got === null) return buf.length;
    const [line, next] = got;
    this.trailerBytes += line.length + 2;
    if (this.trailerBytes > MAX_HEAD) throw overflow("UND_ERR_HEADERS_OVERFLOW");
    if (line.length === 0) this.state = S_DONE;
    else if (!FIELD.test(line.toString("latin1")))
      throw new ParseError("HPE_INVALID_HEADER_TOKEN", "Invalid trailer field");
    return next;
  }
}

/**
 * Appends the name and value of the field line `s[from, to)` to `raw`, or throws: a name of
 * tchars right before the colon (so obs-fold's leading white space and a space before the
 * colon fail), a value without control bytes but HTAB (so a bare CR or LF fails), OWS trimmed.
 */
function field(s: string, from: number, to: number, raw: string[]): void {
  let i = from;
  while (i < to && TCHAR_BYTE[s.charCodeAt(i)] === 1) i++;
  if (i === from || i === to || s.charCodeAt(i) !== 0x3a) throw badField();
  const name = s.slice(from, i);
  i++;
  while (i < to && isOws(s.charCodeAt(i))) i++;
  let j = to;
  while (j > i && isOws(s.charCodeAt(j - 1))) j--;
  for (let k = i; k < j; k++) {
    const c = s.charCodeAt(k);
    if (c < 0x20 ? c !== 0x09 : c === 0x7f) throw badField();
  }
  raw.push(name, s.slice(i, j));
}

const isOws = (c: number): boolean => c === 0x20 || c === 0x09;
const badField = (): ParseError => new ParseError("HPE_INVALID_HEADER_TOKEN", "Invalid header field");

const CRLF = Buffer.from("\r\n");
const CRLFCRLF = Buffer.from("\r\n\r\n");

function overflow(code: string): ParseError {
  return code === "UND_ERR_HEADERS_OVERFLOW"
    ? new ParseError(code, "Headers Overflow Error")
    : new ParseError(code, "Chunk size line too long");
}

/** A Content-Length value (RFC 9110 §8.6: a list of one repeated value is that value); `prev` -1 if none yet. */
function contentLength(value: string, prev: number): number {
  let n = prev;
  for (const part of value.split(",")) {
    const v = part.trim();
    if (!DIGITS.test(v)) throw new ParseError("HPE_INVALID_CONTENT_LENGTH", "Invalid Content-Length");
    const len = Number(v);
    if (n >= 0 && len !== n)
      throw new ParseError("HPE_UNEXPECTED_CONTENT_LENGTH", "Conflicting Content-Length");
    n = len;
  }
  return n;
}
