/**
 * The raw HTTP/1.1 client (`Http1Pool`, through `HttpExecutor` as the server uses it) against
 * hostile and odd upstreams, each a real `net` server writing bytes by hand: answers split
 * across packets, Content-Length and close-delimited answers, `connection: close`, the
 * keep-alive hint and the keep-alive race, a close mid-body, an oversized head, a bad status
 * line, bad chunk framing, Content-Length with Transfer-Encoding, aborts (the worker must see
 * its connection close, the only way an engine learns to stop generating) and timeouts.
 *
 * Error expectations are the ones the request plane gave under undici (same `code`s, so the
 * executor's `classify` and the relay's `bodyFailure` map them as before): a failure before
 * the head that the worker caused is a 502 UpstreamError (parse errors) or a
 * WorkerUnreachableError (connection lost), a slow head a TimeoutError.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { after, describe, it } from "node:test";
import { TimeoutError, UpstreamError } from "../../../src/protocol/errors.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { bodyFailure } from "../../../src/server/relay-whole.ts";
import { HttpExecutor } from "../../../src/transport/http.ts";
import { connectionFailureKind, WorkerUnreachableError } from "../../../src/transport/types.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { waitUntil } from "../../helpers/wait.ts";

/** What the upstream does with each request: `n` counts requests on this connection (1-based). */
type OnRequest = (sock: net.Socket, n: number, head: string) => void;

interface Upstream {
  url: string;
  worker: WorkerState;
  /** Connections accepted so far. */
  conns: number;
  /** Requests seen so far. */
  requests: number;
  /** Connections the client closed. */
  closed: number;
  close(): Promise<void>;
}

const servers: Upstream[] = [];
after(async () => {
  for (const s of servers) await s.close();
});

/** A raw upstream: reads request heads (and Content-Length bodies) and hands each to `on`. */
async function upstream(on: OnRequest): Promise<Upstream> {
  const socks = new Set<net.Socket>();
  const u = { conns: 0, requests: 0, closed: 0 } as Upstream;
  const server = net.createServer((sock) => {
    u.conns++;
    socks.add(sock);
    // Each write its own packet, as an engine's event stream is (Nagle would batch them).
    sock.setNoDelay(true);
    sock.on("close", () => {
      u.closed++;
      socks.delete(sock);
    });
    sock.on("error", () => {});
    let buf = Buffer.alloc(0);
    let n = 0;
    sock.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      for (;;) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buf.toString("latin1", 0, end);
        const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + len) return;
        buf = buf.subarray(end + 4 + len);
        u.requests++;
        on(sock, ++n, head);
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  u.url = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  u.worker = { record: mixedRecord({ id: "w", model: "m", url: u.url }) } as unknown as WorkerState;
  u.close = async () => {
    for (const s of socks) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  };
  servers.push(u);
  return u;
}

const exec = new HttpExecutor();
after(() => exec.close());

const send = (
  u: Upstream,
  ex = exec,
  timeoutMs?: number,
  signal: AbortSignal = new AbortController().signal,
) => ex.send(u.worker, "chat", { model: "m" }, { signal, timeoutMs });

const text = async (body: AsyncIterable<Uint8Array>): Promise<string> => {
  let s = "";
  for await (const c of body) s += Buffer.from(c).toString("latin1");
  return s;
};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const SSE =
  "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" +
  "9\r\ndata: 1\n\n\r\nE\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";

describe("Http1Pool against raw upstreams", () => {
  it("a chunked answer split across two packets at every byte boundary", async () => {
    let split = 1;
    const u = await upstream((sock) => {
      const at = split;
      sock.write(SSE.slice(0, at), "latin1");
      // Apart in time, so the client reads them as separate packets (Nagle off on both ends).
      setTimeout(() => sock.write(SSE.slice(at), "latin1"), 3);
    });
    for (; split < SSE.length; split++) {
      const up = await send(u);
      assert.equal(up.status, 200);
      assert.equal(up.contentType, "text/event-stream");
      assert.equal(await text(up.body), "data: 1\n\ndata: [DONE]\n\n", `split at ${split}`);
    }
    assert.equal(u.conns, 1, "every answer left the connection reusable");
  });

  it("Content-Length answers are reused; `connection: close` and close-delimited ones are not", async () => {
    let mode = "cl";
    const u = await upstream((sock) => {
      if (mode === "cl") sock.write('HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n{"a":1}');
      else if (mode === "close")
        sock.write('HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 7\r\n\r\n{"a":2}');
      else sock.end('HTTP/1.1 200 OK\r\n\r\n{"a":3}');
    });
    assert.deepEqual(await (await send(u)).json(), { a: 1 });
    assert.deepEqual(await (await send(u)).json(), { a: 1 });
    assert.equal(u.conns, 1);
    mode = "close";
    assert.deepEqual(await (await send(u)).json(), { a: 2 });
    assert.deepEqual(await (await send(u)).json(), { a: 2 });
    assert.equal(u.conns, 2, "the `connection: close` answer's socket was not reused");
    mode = "eof";
    assert.deepEqual(await (await send(u)).json(), { a: 3 }, "a body delimited by the close ends with it");
    assert.deepEqual(await (await send(u)).json(), { a: 3 });
    assert.equal(u.conns, 4);
  });

  it("a `Keep-Alive: timeout` hint within undici's 2 s threshold is not reused; none, or a long one, is", async () => {
    let hint = "";
    const u = await upstream((sock) => sock.write(`HTTP/1.1 200 OK\r\n${hint}content-length: 2\r\n\r\n{}`));
    hint = "keep-alive: timeout=2\r\n";
    await (await send(u)).json();
    await (await send(u)).json();
    assert.equal(u.conns, 2, "a server closing after 2 s idle would race the next request");
    hint = "keep-alive: timeout=65\r\n";
    await (await send(u)).json();
    await (await send(u)).json();
    assert.equal(u.conns, 3);
  });

  it("the keep-alive race: a reused connection closed before any answer byte is retried once, fresh", async () => {
    const u = await upstream((sock, n) => {
      // The second request on each connection meets a server that has just closed it.
      if (n === 2) sock.destroy();
      else sock.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
    });
    const ex = new HttpExecutor();
    try {
      await (await send(u, ex)).json();
      assert.deepEqual(await (await send(u, ex)).json(), {});
      assert.equal(u.conns, 2, "retried on a new connection");
      assert.equal(u.requests, 3, "sent twice: on the reused connection, then on the fresh one");
    } finally {
      await ex.close();
    }
  });

  it("no retry on a fresh connection, nor once the answer has begun", async () => {
    const fresh = await upstream((sock) => sock.destroy());
    await assert.rejects(send(fresh), (e: Error) => {
      assert.ok(e instanceof WorkerUnreachableError, `${e.name}: ${e.message}`);
      assert.equal(e.kind, "reset");
      return true;
    });
    assert.equal(fresh.requests, 1, "a fresh connection's failure is the worker's: not resent here");
    const begun = await upstream((sock, n) => {
      if (n === 1) sock.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
      else {
        sock.write("HTTP/1.1 200 O");
        setTimeout(() => sock.destroy(), 5);
      }
    });
    await (await send(begun)).json();
    await assert.rejects(send(begun), WorkerUnreachableError);
    assert.equal(begun.requests, 2, "an answer that had begun is not resent");
  });

  it("a server closing mid-body fails the body as a dropped connection", async () => {
    const u = await upstream((sock) => {
      sock.write('HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"partial":');
      setTimeout(() => sock.destroy(), 10);
    });
    const up = await send(u);
    const err = await text(up.body).then(
      () => null,
      (e: Error) => e,
    );
    assert.ok(err, "the body must fail, not end");
    assert.equal(connectionFailureKind(err), "reset");
    assert.match(String((bodyFailure(err) as Error).message), /dropped the connection/);
    const chunked = await upstream((sock) => {
      sock.write("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n");
      setTimeout(() => sock.end(), 10);
    });
    await assert.rejects(
      text((await send(chunked)).body),
      (e: Error) => connectionFailureKind(e) === "reset",
    );
  });

  const badHeads: [string, string][] = [
    ["an oversized head", `HTTP/1.1 200 OK\r\nx-big: ${"a".repeat(20_000)}\r\ncontent-length: 2\r\n\r\n{}`],
    ["a bad status line", "HTTP/1.1 20 OK\r\ncontent-length: 2\r\n\r\n{}"],
    [
      "Content-Length with Transfer-Encoding",
      "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    ],
    ["obs-fold", "HTTP/1.1 200 OK\r\nx-a: 1\r\n folded\r\ncontent-length: 2\r\n\r\n{}"],
  ];
  for (const [what, answer] of badHeads) {
    it(`${what} is a 502 UpstreamError, and its connection is not reused`, async () => {
      const u = await upstream((sock) => sock.write(answer));
      for (let i = 0; i < 2; i++)
        await assert.rejects(send(u), (e: Error) => {
          assert.ok(
            e instanceof UpstreamError && !(e instanceof WorkerUnreachableError),
            `${e.name}: ${e.message}`,
          );
          assert.equal(e.status, 502);
          return true;
        });
      await waitUntil(async () => u.closed === 2, 5000, "both connections closed by the client");
      assert.equal(u.conns, 2);
    });
  }

  it("bad chunk framing after the head fails the body, it does not hang", async () => {
    for (const tail of ["zz\r\nhi\r\n0\r\n\r\n", "2\r\nhello\r\n0\r\n\r\n"]) {
      const u = await upstream((sock) =>
        sock.write(`HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n${tail}`),
      );
      const up = await send(u);
      await assert.rejects(text(up.body), (e: Error & { code?: string }) => /^HPE_/.test(e.code ?? ""));
      await waitUntil(async () => u.closed === 1, 5000, "the connection closed");
    }
  });

  it("an abort mid-stream closes the worker's connection", async () => {
    let first!: () => void;
    const wrote = new Promise<void>((r) => {
      first = r;
    });
    const u = await upstream((sock) => {
      sock.write("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n");
      first();
    });
    const ac = new AbortController();
    const up = await send(u, exec, undefined, ac.signal);
    const it = up.body[Symbol.asyncIterator]();
    assert.equal(Buffer.from((await it.next()).value as Uint8Array).toString(), "data: 1\n\n");
    await wrote;
    ac.abort();
    await assert.rejects(it.next());
    await waitUntil(async () => u.closed === 1, 5000, "the worker saw its connection close");
  });

  it("a request aborted while queued is never written, and leaves its connection reusable", async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const u = await upstream((sock, n) => {
      const answer = () => sock.write(`HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n{"n":${n}}`);
      if (n === 2) void gate.then(answer);
      else answer();
    });
    const ex = new HttpExecutor({ connections: 1 });
    try {
      await (await send(u, ex)).json();
      const first = send(u, ex);
      await waitUntil(async () => u.requests === 2, 5000, "the second request at the worker");
      const ac = new AbortController();
      const queued = send(u, ex, undefined, ac.signal);
      ac.abort();
      release();
      assert.deepEqual(await (await first).json(), { n: 2 });
      await assert.rejects(queued, (e: Error) => e.name === "AbortError");
      assert.deepEqual(await (await send(u, ex)).json(), { n: 3 }, "the queued one never reached the worker");
      assert.equal(u.conns, 1, "the connection it was handed to was kept");
    } finally {
      await ex.close();
    }
  });

  it("an answer that comes before a large body was written leaves the connection unused after", async () => {
    // The worker answers a 400 as soon as it has the head and reads no more of this
    // connection: 8 MiB cannot all leave the client's socket. Reusing it would queue the next
    // request behind the unsent rest of the body, where the worker never reads it.
    let conns = 0;
    const server = net.createServer((sock) => {
      conns++;
      sock.setNoDelay(true);
      sock.on("error", () => {});
      let head = "";
      const onData = (d: Buffer) => {
        head += d.toString("latin1");
        if (!head.includes("\r\n\r\n")) return;
        sock.off("data", onData);
        sock.pause();
        sock.write('HTTP/1.1 400 Bad Request\r\ncontent-length: 13\r\n\r\n{"error":"x"}');
        if (conns > 1) sock.resume();
      };
      sock.on("data", onData);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
    const w = { record: mixedRecord({ id: "big", model: "m", url }) } as unknown as WorkerState;
    const ex = new HttpExecutor();
    try {
      const big = await ex.send(
        w,
        "chat",
        { model: "m", pad: "x".repeat(8 << 20) },
        { signal: new AbortController().signal },
      );
      assert.equal(big.status, 400);
      await big.json();
      const next = await ex.send(
        w,
        "chat",
        { model: "m" },
        { signal: new AbortController().signal, timeoutMs: 3000 },
      );
      assert.equal(next.status, 400);
      assert.equal(conns, 2, "the next request went on a fresh connection");
    } finally {
      await ex.close();
      server.close();
    }
  });

  it("a head that does not come in time is a TimeoutError, even when trickled a byte at a time", async () => {
    const silent = await upstream(() => {});
    await assert.rejects(send(silent, exec, 200), TimeoutError);
    await waitUntil(async () => silent.closed === 1, 5000, "the timed-out connection closed");
    const trickle = await upstream((sock) => {
      const head = "HTTP/1.1 200 OK\r\nx-slow: ";
      let i = 0;
      const t = setInterval(() => {
        if (sock.destroyed) clearInterval(t);
        else sock.write(head[i++ % head.length]!);
      }, 20);
    });
    await assert.rejects(send(trickle, exec, 300), TimeoutError);
  });

  it("a body that stalls past the body timeout fails as a TimeoutError", async () => {
    const ex = new HttpExecutor({ bodyTimeoutMs: 300 });
    try {
      const u = await upstream((sock) => sock.write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{"));
      const up = await send(u, ex);
      const err = await text(up.body).then(
        () => null,
        (e: Error) => e,
      );
      assert.ok(bodyFailure(err) instanceof TimeoutError, String(err));
      // Chunks that keep coming, each within the timeout, do not trip it.
      const slow = await upstream((sock) => {
        sock.write("HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\n");
        let i = 0;
        const t = setInterval(() => {
          sock.write("x");
          if (++i === 6) clearInterval(t);
        }, 100);
      });
      assert.equal(await text((await send(slow, ex)).body), "xxxxxx");
    } finally {
      await ex.close();
    }
  });

  it("bytes on an idle connection (answering nothing) keep it from reuse", async () => {
    const u = await upstream((sock) => {
      sock.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
      setTimeout(() => sock.write('HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{"x":666}'), 20);
    });
    await (await send(u)).json();
    await sleep(60);
    assert.deepEqual(await (await send(u)).json(), {});
    assert.equal(u.conns, 2, "the connection with unasked-for bytes was dropped");
  });
});
