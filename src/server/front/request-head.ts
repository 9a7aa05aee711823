/**
 * The request heads the raw front (./front.ts) takes itself: only the plainest HTTP/1.1 POST
 * or GET, whole in the bytes at hand. Anything else (a head or body not all there, another
 * version or method, chunked framing, a POST without Content-Length, a GET with a body, `expect`, `upgrade`,
 * a `connection` other than keep-alive or close, a duplicate or malformed field, an
 * oversized head) is not refused here: `parseHotHead` says null and the connection goes to
 * node:http, whose parser answers it as before (400, 431, 100-continue, 408 …). So this parser
 * may be strict without ever answering an error of its own.
 *
 * Grammar (RFC 9112 §3, §5; RFC 9110 §5.5): `POST|GET SP origin-form SP HTTP/1.1 CRLF`, then
 * `token ":" OWS field-value OWS CRLF` lines, then CRLF. A field value is HTAB, SP, VCHAR or
 * obs-text; a bare CR or LF anywhere, white space before the colon, or obs-fold is not taken.
 */

import { FIELD_VCHAR, TCHAR } from "../../util/http-grammar.ts";

/** A request head the raw front serves; `headers` is keyed by lower-case name like node:http's. */
export interface HotHead {
  method: "POST" | "GET";
  path: string;
  headers: Record<string, string>;
  /** Bytes of the head, the blank line included: the body starts here. */
  headLength: number;
  contentLength: number;
  /** `Connection: close`: the answer says so and the connection ends after it. */
  close: boolean;
}

/** Node's default `maxHeaderSize` (16 KiB): a longer head is node:http's to refuse (431). */
export const MAX_HOT_HEAD_BYTES = 16 * 1024;
/* More than 64 fields go to node:http (whose `maxHeadersCount` is 2,000): the `{1,64}` below. */

/**
 * The whole head at once (one linear pass of the regexp engine, cheaper than a test per line):
 * the request line, then fields with a token name, no white space before the colon, and a value
 * of HTAB, SP, VCHAR or obs-text, each line ended by CRLF (checked on the head + CRLF).
 */
const HEAD = new RegExp(
  `^(POST|GET) (\\/[A-Za-z0-9/_.-]*) HTTP\\/1\\.1\\r\\n(?:[${TCHAR}]+:[${FIELD_VCHAR}]*\\r\\n){1,64}$`,
);
const DIGITS = /^[0-9]{1,15}$/;

const CRLF2 = Buffer.from("\r\n\r\n", "latin1");

/**
 * The head at the start of `buf` when the raw front may serve it, its body whole in `buf`
 * too; else null. `isHot(method, path)` says which routes the front serves.
 */
export function parseHotHead(buf: Buffer, isHot: (method: string, path: string) => boolean): HotHead | null {
  if (buf.length < 18 || (buf[0] !== 0x50 /* P */ && buf[0] !== 0x47) /* G */) return null;
  const end = buf.indexOf(CRLF2);
  if (end < 0 || end + 4 > MAX_HOT_HEAD_BYTES) return null;
  // The head and the first CRLF of the blank line: every line then ends with CRLF.
  const text = buf.toString("latin1", 0, end + 2);
  const m = HEAD.exec(text);
  if (m === null) return null;
  const method = m[1] as "POST" | "GET";
  const path = m[2]!;
  if (!isHot(method, path)) return null;
  const headers: Record<string, string> = Object.create(null);
  let contentLength = -1;
  let host = false;
  let close = false;
  let at = text.indexOf("\r\n") + 2;
  while (at < text.length) {
    const next = text.indexOf("\r\n", at);
    const colon = text.indexOf(":", at);
    const key = text.slice(at, colon).toLowerCase();
    if (key in headers) return null;
    const value = ows(text, colon + 1, next);
    switch (key) {
      case "content-length":
        if (!DIGITS.test(value)) return null;
        contentLength = Number(value);
        break;
      case "connection": {
        const v = value.toLowerCase();
        if (v === "close") close = true;
        else if (v !== "keep-alive") return null;
        break;
      }
      case "host":
        host = value.length > 0;
        break;
      case "transfer-encoding":
      case "expect":
      case "upgrade":
      case "te":
        return null;
    }
    headers[key] = value;
    at = next + 2;
  }
  if (!host) return null;
  if (method === "GET") {
    if (contentLength > 0) return null;
    contentLength = 0;
  } else if (contentLength < 0) return null;
  const headLength = end + 4;
  if (buf.length < headLength + contentLength) return null;
  return { method, path, headers, headLength, contentLength, close };
}

/** The field value between `from` and `to` without its optional white space (SP, HTAB) around it. */
function ows(text: string, from: number, to: number): string {
  while (from < to && (text.charCodeAt(from) === 0x20 || text.charCodeAt(from) === 0x09)) from++;
  while (to > from && (text.charCodeAt(to - 1) === 0x20 || text.charCodeAt(to - 1) === 0x09)) to--;
  return text.slice(from, to);
}
