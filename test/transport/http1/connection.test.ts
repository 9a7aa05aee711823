/**
 * One raw HTTP/1.1 connection's life under the executor, against real `net` upstreams: an
 * abort mid-stream closes the worker's connection (the only way an engine learns to stop
 * generating), a request aborted while queued is never written and leaves its connection
 * pooled, an answer that comes before a large body was written ends the connection's reuse,
 * and the head and body timeouts (a precise timer under 2 s, the shared sweeper above) fire
 * as TimeoutErrors however slowly the worker trickles bytes.
 */
import assert from "node:assert/strict";
import net from "node:net";
import { describe, it } from "node:test";
import { TimeoutError } from "../../../src/protocol/errors.ts";
import type { WorkerState } from "../../../src/router/types.ts";
import { bodyFailure } from "../../../src/server/relay-whole.ts";
import { HttpExecutor } from "../../../src/transport/http.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { waitUntil } from "../../helpers/wait.ts";
import { exec, send, text, upstream } from "./raw-upstream.ts";

describe("Http1Connection: aborts, early answers, timeouts", () => {
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

  it("timeouts of 2 s and more (the shared sweeper's, not a timer per request) fire too", async () => {
    const ex = new HttpExecutor({ bodyTimeoutMs: 2500 });
    try {
      const silent = await upstream(() => {});
      const stalled = await upstream((sock) => sock.write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{"));
      const t0 = Date.now();
      const head = assert.rejects(send(silent, ex, 2500), TimeoutError);
      const body = (async () => {
        const up = await send(stalled, ex);
        const err = await text(up.body).then(
          () => null,
          (e: Error) => e,
        );
        assert.ok(bodyFailure(err) instanceof TimeoutError, String(err));
      })();
      await Promise.all([head, body]);
      assert.ok(Date.now() - t0 >= 2400, "not before the timeout");
    } finally {
      await ex.close();
    }
  });
});
