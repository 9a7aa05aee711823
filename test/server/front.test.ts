/**
 * The raw HTTP front (src/server/front/): which requests it takes, what it answers on the wire,
 * and that every other request reaches node:http intact, on the same connection.
 *
 * Expectations come from HTTP/1.1 (RFC 9112 framing, RFC 9110 fields) and from node:http's own
 * behaviour, measured here against a `--http-front node` server side by side, never from the
 * front's code.
 */
import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer, get, type IncomingMessage, type ServerResponse } from "node:http";
import { type AddressInfo, connect, createServer as createNetServer, type Socket } from "node:net";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { RawResponse } from "../../src/server/front/exchange.ts";
import { RawFront } from "../../src/server/front/front.ts";
import { parseHotHead } from "../../src/server/front/request-head.ts";
import { type Cluster, startCluster } from "./cluster.ts";

const hot = (m: string, p: string) =>
  (m === "POST" && p === "/v1/chat/completions") || (m === "GET" && p === "/health");
const head = (s: string) => parseHotHead(Buffer.from(s, "latin1"), hot);

describe("parseHotHead: only the plainest requests", () => {
  const body = '{"a":1}';
  const ok = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\nX-Thing:  two words \t\r\n\r\n${body}`;

  it("takes a whole HTTP/1.1 POST: lower-case names, values without their white space", () => {
    const h = head(ok);
    assert.ok(h);
    assert.equal(h.path, "/v1/chat/completions");
    assert.equal(h.contentLength, body.length);
    assert.equal(h.headers["x-thing"], "two words");
    assert.equal(h.headers.host, "x");
    assert.equal(h.headLength, ok.length - body.length);
  });

  const refused: [string, string][] = [
    ["the body not all there", ok.slice(0, -1)],
    ["the head not all there", ok.slice(0, 30)],
    ["another path", ok.replace("/v1/chat/completions", "/v1/embeddings")],
    ["a query", ok.replace("/v1/chat/completions", "/v1/chat/completions?x=1")],
    ["another method", ok.replace("POST", "PUT")],
    ["HTTP/1.0", ok.replace("HTTP/1.1", "HTTP/1.0")],
    ["no Host (RFC 9112 §3.2: a 400)", ok.replace("Host: x\r\n", "")],
    ["no Content-Length", ok.replace(/Content-Length: \d+\r\n/, "")],
    ["Transfer-Encoding", ok.replace("Host: x", "Host: x\r\nTransfer-Encoding: chunked")],
    [
      "Content-Length beside Transfer-Encoding",
      ok.replace("Host: x", "Host: x\r\nTransfer-Encoding: identity"),
    ],
    ["two Content-Length fields", ok.replace("Host: x", `Host: x\r\nContent-Length: ${body.length}`)],
    ["a duplicate field (node:http joins or drops them)", ok.replace("Host: x", "Host: x\r\nx-thing: a")],
    ["a Content-Length that is not digits", ok.replace(/Content-Length: \d+/, "Content-Length: +7")],
    ["white space before the colon (RFC 9112 §5.1: a 400)", ok.replace("Host: x", "Host : x")],
    ["obs-fold (RFC 9112 §5.2)", ok.replace("Host: x", "Host: x\r\n y")],
    ["a bare LF", ok.replace("Host: x\r\n", "Host: x\n")],
    ["a bare CR in a value", ok.replace("Host: x", "Host: x\ry")],
    ["a NUL in a value", ok.replace("Host: x", "Host: x\0")],
    ["Expect: 100-continue", ok.replace("Host: x", "Host: x\r\nExpect: 100-continue")],
    ["Upgrade", ok.replace("Host: x", "Host: x\r\nUpgrade: websocket")],
    ["Connection: upgrade", ok.replace("Host: x", "Host: x\r\nConnection: upgrade")],
    ["a head past 16 KiB", ok.replace("Host: x", `Host: x\r\nX-Big: ${"a".repeat(17_000)}`)],
    [
      "more than 64 fields",
      ok.replace("Host: x", `Host: x${Array.from({ length: 64 }, (_, i) => `\r\nX-${i}: v`).join("")}`),
    ],
  ];
  for (const [what, text] of refused)
    it(`leaves to node:http: ${what}`, () => assert.equal(head(text), null));

  it("takes a GET without a body; a GET with one goes to node:http", () => {
    const g = head("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert.equal(g?.method, "GET");
    assert.equal(g?.contentLength, 0);
    assert.ok(head("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"));
    assert.equal(head("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"), null);
    assert.equal(head("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"), null, "not a hot route here");
    assert.equal(head("HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"), null);
  });

  it("takes Connection: keep-alive in any case", () => {
    assert.ok(head(ok.replace("Host: x", "Host: x\r\nConnection: Keep-Alive")));
  });
});

describe("RawResponse checks fields as node:http does", () => {
  it("a CR/LF in a value throws ERR_INVALID_CHAR, a bad name ERR_INVALID_HTTP_TOKEN", () => {
    const owner = { keepAliveTimeoutS: 5, answered() {} };
    const sock = { write: () => true } as unknown as Socket;
    const res = new RawResponse(sock, owner);
    assert.throws(() => res.setHeader("bad name", "x"), { code: "ERR_INVALID_HTTP_TOKEN" });
    assert.throws(() => res.writeHead(200, { "x-a": "one\r\nset-cookie: evil" }), {
      code: "ERR_INVALID_CHAR",
    });
    const res2 = new RawResponse(sock, owner);
    res2.writeHead(200, { "content-length": 2 });
    assert.throws(() => res2.setHeader("x-late", "1"), { code: "ERR_HTTP_HEADERS_SENT" });
  });
});

describe("RawResponse on a real socket: framing of small and large bodies", () => {
  it("content-length and chunked answers, a 100 KiB chunk among small ones, latin1 head bytes", async () => {
    const server = createNetServer();
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const accepted = once(server, "connection");
    const client = connect((server.address() as AddressInfo).port, "127.0.0.1");
    const [sock] = (await accepted) as [Socket];
    const raw: Buffer[] = [];
    client.on("data", (d: Buffer) => raw.push(d));
    const answers = new AnswerReader(client);
    const owner = { keepAliveTimeoutS: 7, answered() {} };
    const big = Buffer.alloc(100 * 1024, "x");
    // Content-Length, one large body: written beside its head, not copied.
    const a = new RawResponse(sock, owner);
    a.writeHead(200, { "content-length": big.length, "x-name": "caf\u00e9" });
    a.end(big);
    const first = await answers.next();
    assert.equal(first.body.length, big.length);
    assert.equal(first.fields.get("keep-alive"), "timeout=7");
    // The obs-text byte went out as one byte (latin1), as node:http writes it.
    const wire = Buffer.concat(raw);
    assert.ok(wire.includes(Buffer.from("x-name: caf\xe9\r\n", "latin1")));
    // Chunked: small, large, small, then the last chunk.
    const b = new RawResponse(sock, owner);
    b.writeHead(200, { "content-type": "text/event-stream" });
    b.write("data: 1\n\n");
    b.write(big);
    b.write(Buffer.from("data: 2\n\n"));
    b.end();
    const second = await answers.next();
    assert.equal(second.fields.get("transfer-encoding"), "chunked");
    assert.equal(second.body, `data: 1\n\n${big.toString()}data: 2\n\n`);
    // end(data) before any head: a known length, as node:http does.
    const c = new RawResponse(sock, owner);
    c.statusCode = 404;
    c.end("gone");
    const third = await answers.next();
    assert.equal(third.status, 404);
    assert.equal(third.fields.get("content-length"), "4");
    assert.equal(third.body, "gone");
    client.destroy();
    sock.destroy();
    await new Promise((r) => server.close(r));
  });
});

/** One HTTP/1.1 answer read off a raw socket: head fields and the body (de-chunked). */
interface Answer {
  status: number;
  fields: Map<string, string>;
  body: string;
}

/** Reads answers off `sock` as they come (content-length or chunked framing). */
class AnswerReader {
  private buf = Buffer.alloc(0);
  private waiters: (() => void)[] = [];
  constructor(sock: Socket) {
    sock.on("data", (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d]);
      for (const w of this.waiters.splice(0)) w();
    });
  }

  async next(timeoutMs = 5000): Promise<Answer> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const a = this.take();
      if (a) return a;
      if (Date.now() > deadline)
        throw new Error(`no whole answer in ${timeoutMs} ms: ${this.buf.toString("latin1")}`);
      await Promise.race([new Promise<void>((r) => this.waiters.push(r)), sleep(50)]);
    }
  }

  private take(): Answer | null {
    const text = this.buf.toString("latin1");
    const end = text.indexOf("\r\n\r\n");
    if (end < 0) return null;
    const lines = text.slice(0, end).split("\r\n");
    const status = Number(lines[0]!.split(" ")[1]);
    const fields = new Map<string, string>();
    for (const l of lines.slice(1)) {
      const c = l.indexOf(":");
      assert.ok(!fields.has(l.slice(0, c).toLowerCase()), `duplicate field in ${lines.join(" | ")}`);
      fields.set(l.slice(0, c).toLowerCase(), l.slice(c + 1).trim());
    }
    let at = end + 4;
    let body = "";
    if (fields.has("content-length")) {
      const n = Number(fields.get("content-length"));
      if (this.buf.length < at + n) return null;
      body = this.buf.subarray(at, at + n).toString("utf8");
      at += n;
    } else {
      assert.equal(fields.get("transfer-encoding"), "chunked");
      for (;;) {
        const le = text.indexOf("\r\n", at);
        if (le < 0) return null;
        const size = Number.parseInt(text.slice(at, le), 16);
        if (text.length < le + 2 + size + 2) return null;
        assert.equal(text.slice(le + 2 + size, le + 4 + size), "\r\n", "a chunk ends with CRLF");
        body += this.buf.subarray(le + 2, le + 2 + size).toString("utf8");
        at = le + 4 + size;
        if (size === 0) break;
      }
    }
    this.buf = this.buf.subarray(at);
    return { status, fields, body };
  }
}

const chatBody = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({
    model: "sim-model",
    messages: [{ role: "user", content: "Say hello" }],
    max_tokens: 3,
    ...extra,
  });
const post = (body: string, path = "/v1/chat/completions", more = "") =>
  `POST ${path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n${more}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

async function open(url: string): Promise<{ sock: Socket; answers: AnswerReader }> {
  const u = new URL(url);
  const sock = connect(Number(u.port), u.hostname);
  await once(sock, "connect");
  return { sock, answers: new AnswerReader(sock) };
}

/** A counter from /metrics, read on a connection of its own (a GET would move a shared one to node:http). */
async function counter(url: string, name: string): Promise<number> {
  const text = await new Promise<string>((resolve, reject) => {
    get(`${url}/metrics`, { agent: false }, (res) => {
      let t = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (t += c));
      res.on("end", () => resolve(t));
    }).on("error", reject);
  });
  const m = new RegExp(`^${name} (\\d+)`, "m").exec(text);
  return m ? Number(m[1]) : 0;
}

describe("the raw front in the server, beside node:http's", () => {
  let raw: Cluster;
  let nodeFront: Cluster;
  before(async () => {
    raw = await startCluster(1);
    nodeFront = await startCluster(1, { config: { httpFront: "node" } });
  });
  after(async () => {
    await raw?.close();
    await nodeFront?.close();
  });

  it("serves the official client's completions itself, with the answers node:http gives", async () => {
    const before = await counter(raw.server.url, "infera_http_front_requests_total");
    const r = await raw.client.chat.completions.create({
      model: "sim-model",
      messages: [{ role: "user", content: "Say hello" }],
      max_tokens: 4,
    });
    assert.equal(r.usage?.completion_tokens, 4);
    const s = await raw.client.completions.create({
      model: "sim-model",
      prompt: "Once",
      max_tokens: 3,
      stream: true,
    });
    let n = 0;
    for await (const ch of s) n += ch.choices.length;
    assert.ok(n >= 1);
    // The two completions and the second read of /metrics (each read counts itself).
    assert.equal((await counter(raw.server.url, "infera_http_front_requests_total")) - before, 3);
    assert.equal(await counter(nodeFront.server.url, "infera_http_front_requests_total"), 0);
  });

  it("writes the same head fields as node:http (non-streamed and streamed), nothing twice", async () => {
    for (const stream of [false, true]) {
      const got: Answer[] = [];
      for (const c of [raw, nodeFront]) {
        const { sock, answers } = await open(c.server.url);
        sock.write(post(chatBody({ stream }), "/v1/chat/completions", "X-Request-Id: front-test-1\r\n"));
        got.push(await answers.next());
        sock.destroy();
      }
      const [r, n] = got as [Answer, Answer];
      assert.equal(r.status, 200);
      assert.deepEqual([...r.fields.keys()].sort(), [...n.fields.keys()].sort(), `stream=${stream}`);
      for (const k of ["content-type", "x-request-id", "x-content-type-options", "connection", "keep-alive"])
        assert.equal(
          r.fields.get(k)?.toLowerCase(),
          n.fields.get(k)?.toLowerCase(),
          `${k} (stream=${stream})`,
        );
      assert.ok(!Number.isNaN(Date.parse(r.fields.get("date")!)));
      if (stream) assert.match(r.body, /data: \[DONE\]\n\n$/);
      else assert.equal(JSON.parse(r.body).object, "chat.completion");
    }
  });

  it("the translated and pass-through routes: the same answers from both fronts", async () => {
    const msg = (stream: boolean) =>
      JSON.stringify({
        model: "sim-model",
        max_tokens: 3,
        stream,
        messages: [{ role: "user", content: "Hi" }],
      });
    const cases: [string, string][] = [
      ["/v1/messages", msg(false)],
      ["/v1/messages", msg(true)],
      ["/v1/responses", JSON.stringify({ model: "sim-model", input: "Hi", max_output_tokens: 3 })],
      ["/tokenize", JSON.stringify({ model: "sim-model", prompt: "Hi" })],
    ];
    const served = await counter(raw.server.url, "infera_http_front_requests_total");
    for (const [path, body] of cases) {
      const got: Answer[] = [];
      for (const c of [raw, nodeFront]) {
        const { sock, answers } = await open(c.server.url);
        sock.write(post(body, path, "Anthropic-Version: 2023-06-01\r\n"));
        got.push(await answers.next());
        sock.destroy();
      }
      const [r, n] = got as [Answer, Answer];
      assert.equal(r.status, n.status, path);
      if (path !== "/tokenize") assert.equal(r.status, 200, `${path}: ${r.body}`);
      assert.deepEqual([...r.fields.keys()].sort(), [...n.fields.keys()].sort(), `${path}: ${body}`);
      assert.equal(r.fields.get("content-type"), n.fields.get("content-type"), path);
    }
    // The four, and this read of /metrics.
    assert.equal((await counter(raw.server.url, "infera_http_front_requests_total")) - served, 5);
  });

  it("Connection: close is answered raw as node:http answers it, and the connection ends", async () => {
    const got: Answer[] = [];
    const handoffs = await counter(raw.server.url, "infera_http_front_handoffs_total");
    for (const c of [raw, nodeFront]) {
      const { sock, answers } = await open(c.server.url);
      const closed = once(sock, "close");
      sock.write(post(chatBody(), "/v1/chat/completions", "Connection: close\r\n"));
      got.push(await answers.next());
      await closed;
    }
    assert.equal(got[0]!.fields.get("connection"), "close");
    assert.deepEqual([...got[0]!.fields.keys()].sort(), [...got[1]!.fields.keys()].sort());
    assert.equal(await counter(raw.server.url, "infera_http_front_handoffs_total"), handoffs);
  });

  it("answers pipelined requests in order, then hands the connection to node:http for a route it does not take", async () => {
    const handoffs = await counter(raw.server.url, "infera_http_front_handoffs_total");
    const { sock, answers } = await open(raw.server.url);
    sock.write(
      post(chatBody({ max_tokens: 2 }), "/v1/chat/completions", "X-Request-Id: first\r\n") +
        post(chatBody({ max_tokens: 3 }), "/v1/chat/completions", "X-Request-Id: second\r\n") +
        "GET /v1/models/sim-model HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    const a = await answers.next();
    const b = await answers.next();
    const c = await answers.next();
    assert.deepEqual([a.fields.get("x-request-id"), b.fields.get("x-request-id")], ["first", "second"]);
    assert.equal(JSON.parse(a.body).usage.completion_tokens, 2);
    assert.equal(JSON.parse(b.body).usage.completion_tokens, 3);
    assert.equal(c.status, 200);
    assert.equal(JSON.parse(c.body).id, "sim-model");
    // node:http has it now: it still serves completions on it.
    sock.write(post(chatBody()));
    assert.equal((await answers.next()).status, 200);
    sock.destroy();
    assert.equal((await counter(raw.server.url, "infera_http_front_handoffs_total")) - handoffs, 1);
  });

  it("a body that arrives in two writes, a chunked upload and a bad head reach node:http intact", async () => {
    // Split body: node:http reads the rest.
    let { sock, answers } = await open(raw.server.url);
    const text = post(chatBody());
    sock.write(text.slice(0, text.length - 10));
    await sleep(50);
    sock.write(text.slice(-10));
    assert.equal(JSON.parse((await answers.next()).body).object, "chat.completion");
    sock.destroy();
    // Chunked upload after a raw request on the same connection.
    ({ sock, answers } = await open(raw.server.url));
    sock.write(post(chatBody()));
    assert.equal((await answers.next()).status, 200);
    const b = chatBody();
    sock.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n${b.length.toString(16)}\r\n${b}\r\n0\r\n\r\n`,
    );
    assert.equal(JSON.parse((await answers.next()).body).object, "chat.completion");
    sock.destroy();
    // White space before a colon: node's 400, in OpenAI's error shape, from both fronts alike.
    const bad: Answer[] = [];
    for (const c of [raw, nodeFront]) {
      const o = await open(c.server.url);
      o.sock.write(post(chatBody()).replace("Host: t", "Host : t"));
      bad.push(await o.answers.next());
      o.sock.destroy();
    }
    assert.equal(bad[0]!.status, 400);
    assert.deepEqual(bad[0]!.body, bad[1]!.body);
  });

  it("a refused request keeps the connection: 401 without a key is answered raw, the next request works", async () => {
    const keyed = await startCluster(1, { config: { apiKeys: ["k-front-1"] } });
    try {
      const { sock, answers } = await open(keyed.server.url);
      sock.write(post(chatBody()));
      const a = await answers.next();
      assert.equal(a.status, 401);
      assert.equal(JSON.parse(a.body).error.code, "invalid_api_key");
      sock.write(post(chatBody(), "/v1/chat/completions", "Authorization: Bearer k-front-1\r\n"));
      assert.equal((await answers.next()).status, 200);
      sock.destroy();
      assert.equal(await counter(keyed.server.url, "infera_http_front_handoffs_total"), 0);
    } finally {
      await keyed.close();
    }
  });
});

describe("RawFront on a plain node:http server", () => {
  let server: ReturnType<typeof createServer>;
  let front: RawFront;
  let url = "";
  const seen: string[] = [];
  before(async () => {
    const handle = (req: IncomingMessage, res: ServerResponse) => {
      seen.push(`${req.method} ${req.url}`);
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => res.end(`${req.method} ${Buffer.concat(chunks).length}`));
      if (req.complete) res.end(`${req.method} raw`);
    };
    server = createServer({ keepAliveTimeout: 60_000 }, handle);
    front = new RawFront(server, { isHot: hot, handle, keepAliveTimeoutMs: 1200 });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    front.closeAll();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  it("closes a connection idle past its keep-alive timeout, and says the timeout in the answer", async () => {
    const { sock, answers } = await open(url);
    sock.write(post("{}"));
    const a = await answers.next();
    assert.equal(a.fields.get("keep-alive"), "timeout=1");
    const t0 = Date.now();
    await once(sock, "close");
    const idle = Date.now() - t0;
    assert.ok(idle >= 1000 && idle < 4000, `closed after ${idle} ms`);
  });

  it("a client that leaves while its answer runs gets no answer; the response sees close before finish", async () => {
    const events: string[] = [];
    const server2 = createServer();
    const front2 = new RawFront(server2, {
      isHot: hot,
      keepAliveTimeoutMs: 5000,
      handle: (_req, res) => {
        res.on("finish", () => events.push("finish"));
        res.on("close", () => events.push(`close finished=${res.writableFinished}`));
        setTimeout(() => res.end("late"), 200);
      },
    });
    await new Promise<void>((r) => server2.listen(0, "127.0.0.1", r));
    const { sock } = await open(`http://127.0.0.1:${(server2.address() as AddressInfo).port}`);
    sock.write(post("{}"));
    await sleep(50);
    sock.destroy();
    await sleep(300);
    assert.deepEqual(events, ["close finished=false"]);
    front2.closeAll();
    await new Promise((r) => server2.close(r));
  });

  it("closeIdle closes an idle connection (a drain)", async () => {
    const { sock } = await open(url);
    sock.write(post("{}"));
    await sleep(100);
    front.closeIdle();
    await once(sock, "close");
    assert.ok(seen.length > 0);
  });
});
