/**
 * The raw HTTP/1.1 client (`Http1Pool`, through `HttpExecutor` as the server uses it) against
 * hostile and odd upstreams, each a real `net` server writing bytes by hand: answers split
 * across packets, Content-Length and close-delimited answers, `connection: close`, the
 * keep-alive hint and the keep-alive race, a close mid-body, an oversized head, a bad status
 * line, bad chunk framing, Content-Length with Transfer-Encoding, unasked-for bytes.
 * (Aborts, timeouts and early answers: connection.test.ts.)
 *
 * Error expectations are the ones the request plane gave under undici (same `code`s, so the
 * executor's `classify` and the relay's `bodyFailure` map them as before): a failure before
 * the head that the worker caused is a 502 UpstreamError (parse errors) or a
 * WorkerUnreachableError (connection lost).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { UpstreamError } from "../../../src/protocol/errors.ts";
import { bodyFailure } from "../../../src/server/relay-whole.ts";
import { HttpExecutor } from "../../../src/transport/http.ts";
import { connectionFailureKind, WorkerUnreachableError } from "../../../src/transport/types.ts";
import { waitUntil } from "../../helpers/wait.ts";
import { SSE, send, sleep, text, upstream } from "./raw-upstream.ts";

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
