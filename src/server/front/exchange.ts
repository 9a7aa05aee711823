/**
 * One request and its answer on the raw front (./front.ts), as the completion handlers see
 * them: the parts of node:http's `IncomingMessage` and `ServerResponse` that the hot routes'
 * handlers (routes.ts's dispatcher, proxy.ts, api/, status-routes.ts, relay-whole.ts, pump.ts,
 * http-util.ts, request-context.ts, lifecycle.ts's tracker and drain) use, with node's meaning:
 *
 * - request: `headers`, `method`, `url`, `httpVersion`, `complete` (always true: the body came
 *   whole), `socket`, `resume()`, the events `close` (the client left) and `error`; the body is
 *   read with `bufferedBody` (http-util's `readBody` asks it first).
 * - response: `statusCode`, `setHeader`/`getHeader`/`removeHeader`, `writeHead`, `write` (false
 *   when the socket is full; `drain` follows), `end`, `cork`/`uncork`/`writableCorked`,
 *   `destroy`, `headersSent`, `writableEnded`, `writableFinished`, `destroyed`, `socket`, and
 *   the events `drain`, `finish`, `close`, `error`.
 *
 * The answer's head is written as node:http writes it: the status line with its reason, the
 * fields set, `date`, `connection: keep-alive` and `keep-alive: timeout=<s>` (or `connection:
 * close`), `content-length` when known else chunked framing; names and values are checked as
 * node checks them (a CR or LF in a value throws `ERR_INVALID_CHAR`). The head leaves with the
 * first body bytes in one write.
 */
import { EventEmitter } from "node:events";
import { STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import { FIELD_VALUE, TOKEN } from "../../util/http-grammar.ts";

/** What the connection (./front.ts) learns from its answer. */
export interface ExchangeOwner {
  readonly keepAliveTimeoutS: number;
  /** The answer is written whole (`close`: the connection must end after it). */
  answered(res: RawResponse, close: boolean): void;
}

/** node:http's error for a bad header, with its code. */
class HeaderError extends TypeError {
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.code = code;
  }
}

let dateSecond = 0;
let dateText = "";
/** The `date` field, formatted once per second (node:http caches it the same way). */
function httpDate(): string {
  const now = Date.now();
  const s = Math.floor(now / 1000);
  if (s !== dateSecond) {
    dateSecond = s;
    dateText = new Date(now).toUTCString();
  }
  return dateText;
}

export class RawRequest extends EventEmitter {
  readonly method: "POST" | "GET";
  readonly httpVersion = "1.1";
  readonly complete = true;
  readonly url: string;
  readonly headers: Record<string, string>;
  readonly socket: Socket;
  /** The body, whole; `null` once handed to the reader. */
  private body: Buffer | null;

  constructor(
    socket: Socket,
    method: "POST" | "GET",
    url: string,
    headers: Record<string, string>,
    body: Buffer,
  ) {
    super();
    this.method = method;
    this.socket = socket;
    this.url = url;
    this.headers = headers;
    this.body = body;
  }

  /** The body is already read: nothing to resume. */
  resume(): this {
    return this;
  }

  /** The body, once (http-util's `readBody`). */
  takeBody(): Buffer {
    const b = this.body ?? Buffer.alloc(0);
    this.body = null;
    return b;
  }
}

/** The whole body of a raw front request, or undefined for a node:http one. */
export function bufferedBody(req: object): Buffer | undefined {
  return req instanceof RawRequest ? req.takeBody() : undefined;
}

const LAST_CHUNK = "0\r\n\r\n";

export class RawResponse extends EventEmitter {
  statusCode = 200;
  headersSent = false;
  writableEnded = false;
  writableFinished = false;
  destroyed = false;
  writableCorked = 0;
  readonly socket: Socket;
  private readonly owner: ExchangeOwner;
  /** The answer's fields: lower-case names and their values, side by side (a few, so a list). */
  private readonly names: string[] = [];
  private readonly values: (string | number)[] = [];
  /** The head not yet written (it leaves with the first body bytes). */
  private head: string | null = null;
  private chunked = false;
  private close = false;
  private closed = false;
  private readonly finished = (err?: Error | null): void => {
    if (err || this.destroyed) return;
    this.writableFinished = true;
    this.emit("finish");
    this.emitClose();
    this.owner.answered(this, this.close);
  };

  /** `close`: the request said `Connection: close`; the answer says so and ends the connection. */
  constructor(socket: Socket, owner: ExchangeOwner, close = false) {
    super();
    this.socket = socket;
    this.owner = owner;
    this.close = close;
  }

  setHeader(name: string, value: string | number): this {
    this.unsent("set");
    this.put(checkName(name), value);
    return this;
  }

  getHeader(name: string): string | number | undefined {
    const i = this.names.indexOf(name.toLowerCase());
    return i < 0 ? undefined : this.values[i];
  }

  removeHeader(name: string): void {
    this.unsent("remove");
    const i = this.names.indexOf(name.toLowerCase());
    if (i >= 0) {
      this.names.splice(i, 1);
      this.values.splice(i, 1);
    }
  }

  /** node:http's refusal of a head change once the head is out. */
  private unsent(verb: "set" | "remove" | "write"): void {
    if (this.headersSent)
      throw new HeaderError(
        "ERR_HTTP_HEADERS_SENT",
        `Cannot ${verb} headers after they are sent to the client`,
      );
  }

  private put(key: string, value: string | number): void {
    const i = this.names.indexOf(key);
    if (i >= 0) this.values[i] = value;
    else {
      this.names.push(key);
      this.values.push(value);
    }
  }

  writeHead(status: number, headers?: Record<string, string | number | undefined>): this {
    this.unsent("write");
    if (!Number.isInteger(status) || status < 100 || status > 999)
      throw new RangeError(`Invalid status code: ${status}`);
    this.statusCode = status;
    if (headers)
      for (const k in headers) {
        const v = headers[k];
        if (v !== undefined) this.put(checkName(k), v);
      }
    this.head = this.buildHead(-1);
    this.headersSent = true;
    return this;
  }

  /** A body chunk; false when the socket's buffer is full (`drain` follows). */
  write(chunk: string | Uint8Array): boolean {
    if (this.writableEnded || this.destroyed) return false;
    if (!this.headersSent) this.writeHead(this.statusCode);
    const data = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk;
    if (data.length === 0) return true;
    return this.send(data, false);
  }

  end(chunk?: string | Uint8Array): this {
    if (this.writableEnded || this.destroyed) return this;
    this.writableEnded = true;
    const data = chunk === undefined ? null : typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk;
    if (!this.headersSent) {
      // As node:http: an answer ended before its head was written has a known length.
      this.head = this.buildHead(data ? data.length : 0);
      this.headersSent = true;
    }
    this.send(data, true, this.finished);
    return this;
  }

  cork(): void {
    this.writableCorked++;
    this.socket.cork();
  }

  uncork(): void {
    if (this.writableCorked === 0) return;
    this.writableCorked--;
    this.socket.uncork();
  }

  /** Ends the exchange at once: the socket is destroyed (the client sees the connection drop). */
  destroy(err?: Error): this {
    if (this.destroyed) return this;
    this.destroyed = true;
    this.socket.destroy(err);
    return this;
  }

  /** The socket closed (or the answer was written): `close`, once. */
  gone(): void {
    if (this.writableFinished) return;
    this.destroyed = true;
    this.emitClose();
  }

  private emitClose(): void {
    if (this.closed) return;
    this.closed = true;
    this.emit("close");
  }

  /**
   * Writes `data` in the answer's framing, after the head if it is still unwritten: one write
   * (a copy) for a small chunk, a corked head / data / trailer (one `writev`, no copy) for a
   * large one. The framing is written as latin1, as node:http writes heads (obs-text in a
   * value stays one byte).
   */
  private send(data: Uint8Array | null, last: boolean, cb?: (err?: Error | null) => void): boolean {
    const head = this.head;
    this.head = null;
    const n = data ? data.length : 0;
    let pre = head ?? "";
    let post = "";
    if (this.chunked) {
      if (n > 0) pre += `${n.toString(16)}\r\n`;
      post = n > 0 ? (last ? `\r\n${LAST_CHUNK}` : "\r\n") : last ? LAST_CHUNK : "";
    }
    const s = this.socket;
    if (n === 0)
      return pre.length + post.length === 0 ? s.write(EMPTY, cb) : s.write(pre + post, "latin1", cb);
    if (n <= COPY_MAX_BYTES) return s.write(concat(pre, data!, post), cb);
    s.cork();
    if (pre.length > 0) s.write(pre, "latin1");
    let ok: boolean;
    if (post.length > 0) {
      s.write(data!);
      ok = s.write(post, "latin1", cb);
    } else ok = s.write(data!, cb);
    s.uncork();
    return ok;
  }

  /** The head; `length` ≥ 0 when the whole body is known (from `end` before any write). */
  private buildHead(length: number): string {
    const { names, values } = this;
    if (length >= 0 && !names.includes("content-length") && !names.includes("transfer-encoding"))
      this.put("content-length", length);
    let head = `HTTP/1.1 ${this.statusCode} ${STATUS_CODES[this.statusCode] ?? "unknown"}\r\n`;
    let date = false;
    let conn: string | null = null;
    let framing = false;
    for (let i = 0; i < names.length; i++) {
      const k = names[i]!;
      const v = values[i]!;
      const t = typeof v === "number" ? String(v) : v;
      if (typeof v !== "number" && !FIELD_VALUE.test(t))
        throw new HeaderError("ERR_INVALID_CHAR", `Invalid character in header content ["${k}"]`);
      head += `${k}: ${t}\r\n`;
      if (k === "date") date = true;
      else if (k === "connection") conn = t.toLowerCase();
      else if (k === "content-length") framing = true;
      else if (k === "transfer-encoding") {
        framing = true;
        this.chunked = t.toLowerCase() === "chunked";
      }
    }
    if (!date) head += `date: ${httpDate()}\r\n`;
    if (conn === null)
      head += this.close
        ? "connection: close\r\n"
        : `connection: keep-alive\r\nkeep-alive: timeout=${this.owner.keepAliveTimeoutS}\r\n`;
    else this.close ||= conn === "close";
    if (!framing) {
      this.chunked = true;
      head += "transfer-encoding: chunked\r\n";
    }
    return `${head}\r\n`;
  }
}

const EMPTY = Buffer.alloc(0);
/** Past this, a body chunk is not copied behind its framing but written beside it. */
const COPY_MAX_BYTES = 16 * 1024;

/** Names already checked and lowered (the handlers set a handful, the same every request). */
const LOWERED = new Map<string, string>();

function checkName(name: string): string {
  const known = LOWERED.get(name);
  if (known !== undefined) return known;
  if (!TOKEN.test(name))
    throw new HeaderError("ERR_INVALID_HTTP_TOKEN", `Header name must be a valid HTTP token ["${name}"]`);
  const lower = name.toLowerCase();
  if (LOWERED.size < 256) LOWERED.set(name, lower);
  return lower;
}

/** `pre` + `data` + `post` in one buffer (latin1 for the framing, which is ASCII). */
function concat(pre: string, data: Uint8Array, post: string): Buffer {
  const out = Buffer.allocUnsafe(pre.length + data.length + post.length);
  let at = out.write(pre, 0, "latin1");
  out.set(data, at);
  at += data.length;
  if (post.length > 0) out.write(post, at, "latin1");
  return out;
}
