/**
 * The raw client's response parser, fed bytes directly: every answer split at every byte
 * boundary parses to the same head and body, and each framing violation of RFC 9112 it must
 * refuse throws (never waits for more bytes). The rules: RFC 9112 §2.2 (a bare LF, which a
 * recipient MAY accept, is refused here), §4 (status line), §5.1 (no white space before the colon), §5.2
 * (obs-fold), §6.3 (Content-Length beside Transfer-Encoding; conflicting lengths), §7.1
 * (chunk-size, CRLF after chunk data).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type ResponseHead, ResponseParser } from "../../../src/transport/http1/parser.ts";

interface Parsed {
  head: ResponseHead | null;
  body: string;
  done: boolean;
}

/** Feeds `parts` in order; returns what was parsed. */
function parse(parts: Buffer[], pauseEvery = 0): Parsed {
  const out: Parsed = { head: null, body: "", done: false };
  let n = 0;
  const p = new ResponseParser({
    onHead: (h) => {
      out.head = h;
      return true;
    },
    onBody: (c) => {
      out.body += c.toString("latin1");
      return pauseEvery === 0 || ++n % pauseEvery !== 0;
    },
  });
  p.reset(false);
  for (const part of parts) {
    let at = 0;
    // A paused parser resumes where it stopped (as the connection does with its stash).
    do at = p.execute(part, at);
    while (at < part.length && !p.done);
  }
  out.done = p.done;
  return out;
}

const splits = (s: string): Buffer[][] => {
  const b = Buffer.from(s, "latin1");
  const all: Buffer[][] = [[b]];
  for (let i = 1; i < b.length; i++) all.push([b.subarray(0, i), b.subarray(i)]);
  return all;
};

const CHUNKED =
  "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
  "9\r\ndata: 1\n\n\r\n" +
  "a;ext=1\r\ndata: 22\n\n\r\n" +
  "E\r\ndata: [DONE]\n\n\r\n" +
  "0\r\n\r\n";

describe("ResponseParser", () => {
  it("a chunked answer split at every byte boundary gives the same head and body", () => {
    for (const parts of splits(CHUNKED)) {
      const r = parse(parts);
      assert.equal(r.done, true, `split at ${parts[0]!.length}`);
      assert.equal(r.head?.status, 200);
      assert.deepEqual(r.head?.raw, ["Content-Type", "text/event-stream", "Transfer-Encoding", "chunked"]);
      assert.equal(r.body, "data: 1\n\ndata: 22\n\ndata: [DONE]\n\n", `split at ${parts[0]!.length}`);
    }
  });

  it("three-way splits and one byte at a time parse the same", () => {
    const b = Buffer.from(CHUNKED, "latin1");
    for (let i = 1; i < b.length - 1; i += 3)
      for (let j = i + 1; j < b.length; j += 5) {
        const r = parse([b.subarray(0, i), b.subarray(i, j), b.subarray(j)]);
        assert.equal(r.body, "data: 1\n\ndata: 22\n\ndata: [DONE]\n\n");
        assert.equal(r.done, true);
      }
    const bytes = [...b].map((x) => Buffer.from([x]));
    assert.equal(parse(bytes).body, "data: 1\n\ndata: 22\n\ndata: [DONE]\n\n");
  });

  it("a Content-Length answer at every boundary, and with the body paused after each chunk", () => {
    const s = 'HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{"ok":true}';
    for (const parts of splits(s)) {
      const r = parse(parts, 1);
      assert.equal(r.done, true);
      assert.equal(r.head?.status, 201);
      assert.equal(r.head?.statusText, "Created");
      assert.equal(r.body, '{"ok":true}');
    }
  });

  it("trailers after the last chunk are read and the answer ends after them", () => {
    const s = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nx-t: 1\r\n\r\n";
    for (const parts of splits(s)) assert.deepEqual(parse(parts).body, "hi");
    assert.equal(parse([Buffer.from(s)]).done, true);
  });

  it("keep-alive: HTTP/1.1 by default, closed by `connection: close` or HTTP/1.0; the hint is read", () => {
    const h = (s: string) => parse([Buffer.from(s)]).head!;
    assert.equal(h("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").keepAlive, true);
    assert.equal(h("HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 0\r\n\r\n").keepAlive, false);
    assert.equal(h("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n").keepAlive, false);
    assert.equal(
      h("HTTP/1.1 200 OK\r\nKeep-Alive: timeout=65\r\ncontent-length: 0\r\n\r\n").keepAliveHint,
      65,
    );
  });

  it("no Content-Length and no chunking: the body runs to the close, never kept alive", () => {
    const out: string[] = [];
    const p = new ResponseParser({ onHead: () => true, onBody: (c) => out.push(c.toString()) > 0 });
    p.reset(false);
    p.execute(Buffer.from("HTTP/1.1 200 OK\r\n\r\nabc"));
    assert.equal(p.done, false);
    assert.equal(p.finish(), true);
    assert.equal(out.join(""), "abc");
    const q = new ResponseParser({ onHead: () => true, onBody: () => true });
    q.reset(false);
    q.execute(Buffer.from("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc"));
    assert.equal(q.finish(), false, "a Content-Length answer cut short is not complete");
  });

  it("1xx interim answers are skipped; 204 and 304 have no body", () => {
    const r = parse([
      Buffer.from(
        "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
      ),
    ]);
    assert.equal(r.head?.status, 200);
    assert.equal(r.body, "ok");
    assert.equal(parse([Buffer.from("HTTP/1.1 204 No Content\r\n\r\n")]).done, true);
  });

  const refused: [string, string, string][] = [
    ["a bad status line", "HTTP/1.1 2000 OK\r\ncontent-length: 0\r\n\r\n", "HPE_INVALID_CONSTANT"],
    ["not HTTP", "HTTX/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", "HPE_INVALID_CONSTANT"],
    ["HTTP/2 in a status line", "HTTP/2 200 OK\r\ncontent-length: 0\r\n\r\n", "HPE_INVALID_CONSTANT"],
    [
      "obs-fold",
      "HTTP/1.1 200 OK\r\nx-a: 1\r\n  folded\r\ncontent-length: 0\r\n\r\n",
      "HPE_INVALID_HEADER_TOKEN",
    ],
    ["space before the colon", "HTTP/1.1 200 OK\r\ncontent-length : 0\r\n\r\n", "HPE_INVALID_HEADER_TOKEN"],
    [
      "a bare LF in a field",
      "HTTP/1.1 200 OK\r\nx-a: 1\nx-b: 2\r\ncontent-length: 0\r\n\r\n",
      "HPE_INVALID_HEADER_TOKEN",
    ],
    [
      "a NUL in a value",
      "HTTP/1.1 200 OK\r\nx-a: a\0b\r\ncontent-length: 0\r\n\r\n",
      "HPE_INVALID_HEADER_TOKEN",
    ],
    [
      "Content-Length with Transfer-Encoding",
      "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
      "HPE_UNEXPECTED_CONTENT_LENGTH",
    ],
    [
      "conflicting Content-Lengths",
      "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
      "HPE_UNEXPECTED_CONTENT_LENGTH",
    ],
    [
      "a non-numeric Content-Length",
      "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
      "HPE_INVALID_CONTENT_LENGTH",
    ],
    [
      "a coding other than chunked",
      "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
      "HPE_INVALID_TRANSFER_ENCODING",
    ],
    [
      "a bad chunk size",
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhi\r\n0\r\n\r\n",
      "HPE_INVALID_CHUNK_SIZE",
    ],
    [
      "a negative chunk size",
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n-2\r\nhi\r\n0\r\n\r\n",
      "HPE_INVALID_CHUNK_SIZE",
    ],
    [
      "a chunk longer than its size (no CRLF after the data)",
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n",
      "HPE_STRICT",
    ],
    [
      "an unasked-for upgrade",
      "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
      "HPE_INVALID_CONSTANT",
    ],
  ];
  for (const [what, s, code] of refused) {
    it(`refuses ${what} (${code}) at every split`, () => {
      for (const parts of splits(s))
        assert.throws(() => parse(parts), { code }, `split at ${parts[0]!.length}`);
    });
  }

  it("a head past http.maxHeaderSize fails as undici's header overflow, complete or not", () => {
    const big = `HTTP/1.1 200 OK\r\nx-big: ${"a".repeat(20_000)}\r\ncontent-length: 0\r\n\r\n`;
    assert.throws(() => parse([Buffer.from(big)]), { code: "UND_ERR_HEADERS_OVERFLOW" });
    // Still arriving: refused once past the limit, not buffered without end.
    assert.throws(() => parse([Buffer.from(big.slice(0, 18_000))]), { code: "UND_ERR_HEADERS_OVERFLOW" });
  });

  it("endless trailer lines are refused once past the head's size, not read forever", () => {
    const line = `x-t: ${"a".repeat(100)}\r\n`;
    const s = `HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n${line.repeat(200)}`;
    assert.throws(() => parse([Buffer.from(s)]), { code: "UND_ERR_HEADERS_OVERFLOW" });
    const ok = `HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n${line.repeat(10)}\r\n`;
    assert.equal(parse([Buffer.from(ok)]).done, true);
  });

  it("an endless chunk-size line is refused, not buffered", () => {
    const s = `HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;${"x".repeat(5000)}`;
    assert.throws(() => parse([Buffer.from(s)]), { code: "HPE_INVALID_CHUNK_SIZE" });
  });
});
