/**
 * The HTTP request plane's answer bodies (undici dispatch → PushBody) against a real node:http
 * upstream: relay, backpressure that reaches the worker's socket, aborts before and after the
 * headers, async iteration, json(), and an early `break` that stops the transfer.
 */
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import type { WorkerState } from "../../src/router/types.ts";
import { pump } from "../../src/server/proxy.ts";
import { HttpExecutor } from "../../src/transport/http.ts";
import { type BodySource, PushBody } from "../../src/transport/push-body.ts";
import { type AbortLike, RequestAbort } from "../../src/util/abort.ts";
import { mixedRecord } from "../helpers/records.ts";
import { waitUntil } from "../helpers/wait.ts";

type Route = (req: IncomingMessage, res: ServerResponse) => void;

let server: Server;
let route: Route = (_req, res) => res.end("{}");
let worker: WorkerState;
const exec = new HttpExecutor();

before(async () => {
  server = createServer((req, res) => {
    req.resume();
    req.once("end", () => route(req, res));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  worker = { record: mixedRecord({ id: "w", model: "m", url }) } as unknown as WorkerState;
});
after(async () => {
  await exec.close();
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

const send = (signal: AbortLike = new AbortController().signal) =>
  exec.send(worker, "chat", { model: "m" }, { signal });

describe("HttpExecutor answers (dispatch + PushBody)", () => {
  it("relays status, headers and every byte; json() parses a whole answer", async () => {
    route = (_req, res) => {
      res.setHeader("Content-Type", "application/json; charset=utf-8");
      res.setHeader("X-Extra", ["1", "2"]);
      res.writeHead(201);
      res.end(JSON.stringify({ ok: true, n: 42 }));
    };
    const up = await send();
    assert.equal(up.status, 201);
    // Read before `headers` is built (the relay's path), then from the built object.
    assert.equal(up.contentType, "application/json; charset=utf-8");
    assert.equal(up.headers["content-type"], "application/json; charset=utf-8");
    assert.equal(up.headers["x-extra"], "1, 2", "repeated headers joined, names lower-cased");
    assert.deepEqual(await up.json(), { ok: true, n: 42 });
  });

  it("async iteration yields the streamed chunks in order", async () => {
    route = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      let i = 0;
      const t = setInterval(() => {
        if (i === 5) {
          clearInterval(t);
          res.end("data: [DONE]\n\n");
        } else res.write(`data: ${i++}\n\n`);
      }, 2);
    };
    const up = await send();
    let text = "";
    for await (const c of up.body) text += Buffer.from(c).toString();
    assert.equal(text, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\ndata: [DONE]\n\n");
  });

  it("a full client pauses the transfer back to the worker's socket, and resumes it", async () => {
    const chunk = Buffer.alloc(256 * 1024, 0x61);
    const total = 64; // 16 MiB: far more than loopback socket buffers hold
    let blocked = 0;
    let written = 0;
    route = (_req, res) => {
      res.writeHead(200);
      const more = (): void => {
        while (written < total) {
          written++;
          if (!res.write(chunk)) {
            blocked++;
            res.once("drain", more);
            return;
          }
        }
        res.end();
      };
      more();
    };
    const up = await send();
    const fakeRes = new (await import("node:events")).EventEmitter() as never as ServerResponse;
    let received = 0;
    let full = true;
    const done = pump(up.body, fakeRes, (c) => {
      received += c.length;
      return !full;
    });
    // The relay said "full" after its first chunk: the worker must hit backpressure and stop
    // well short of the whole body.
    await waitUntil(async () => blocked > 0, 5000, "worker blocked");
    await new Promise((r) => setTimeout(r, 100));
    const writtenWhilePaused = written;
    assert.ok(
      writtenWhilePaused < total,
      `worker wrote ${writtenWhilePaused} of ${total} chunks while paused`,
    );
    assert.ok(received < total * chunk.length);
    full = false;
    (fakeRes as unknown as { emit(e: string): void }).emit("drain");
    await done;
    assert.equal(received, total * chunk.length);
  });

  const aborts: [string, () => { signal: AbortLike; abort(): void }][] = [
    [
      "AbortController",
      () => {
        const ac = new AbortController();
        return { signal: ac.signal, abort: () => ac.abort() };
      },
    ],
    // The server's per-request abort.
    [
      "RequestAbort",
      () => {
        const ra = new RequestAbort();
        return { signal: ra, abort: () => ra.abort() };
      },
    ],
  ];
  for (const [kind, make] of aborts) {
    it(`an abort before the headers rejects send() and closes the worker's request (${kind})`, async () => {
      let closed = false;
      route = (_req, res) => {
        res.once("close", () => {
          closed = true;
        });
        // never answers
      };
      const ac = make();
      const p = send(ac.signal);
      await new Promise((r) => setTimeout(r, 50));
      ac.abort();
      await assert.rejects(p, (e: Error) => e.name === "AbortError");
      await waitUntil(async () => closed, 5000, "worker saw the close");
    });

    it(`an abort after the headers fails the body and closes the worker's request (${kind})`, async () => {
      let closed = false;
      route = (_req, res) => {
        res.once("close", () => {
          closed = true;
        });
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write("data: 1\n\n");
      };
      const ac = make();
      const up = await send(ac.signal);
      const iter = up.body[Symbol.asyncIterator]();
      assert.equal(Buffer.from((await iter.next()).value as Uint8Array).toString(), "data: 1\n\n");
      ac.abort();
      await assert.rejects(iter.next());
      await waitUntil(async () => closed, 5000, "worker saw the close");
    });
  }

  it("breaking out of for-await stops the transfer", async () => {
    let closed = false;
    route = (_req, res) => {
      res.once("close", () => {
        closed = true;
      });
      res.writeHead(200);
      const t = setInterval(() => res.write("x".repeat(100)), 2);
      res.once("close", () => clearInterval(t));
    };
    const up = await send();
    for await (const _ of up.body) break;
    await waitUntil(async () => closed, 5000, "worker saw the close");
  });

  it("a refused connection is a WorkerUnreachableError of kind connect", async () => {
    const dead = {
      record: mixedRecord({ id: "d", model: "m", url: "http://127.0.0.1:1" }),
    } as unknown as WorkerState;
    await assert.rejects(
      exec.send(dead, "chat", { model: "m" }, { signal: new AbortController().signal }),
      (e: Error & { kind?: string }) => e.name === "WorkerUnreachableError" || e.kind === "connect",
    );
  });
});

describe("HttpExecutor pools of workers that leave (issue #17)", () => {
  /** A worker whose first request hangs until released, on a pool of one connection. */
  async function oneConnection() {
    const ex = new HttpExecutor({ connections: 1 });
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => {
      release = r;
    });
    let seen = 0;
    const srv = createServer((req, res) => {
      req.resume();
      seen++;
      const n = seen;
      req.once("end", () => {
        if (n === 1) void gate.then(() => res.end(JSON.stringify({ n })));
        else res.end(JSON.stringify({ n }));
      });
    });
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
    const w = { record: mixedRecord({ id: "q", model: "m", url }) } as unknown as WorkerState;
    const go = () => ex.send(w, "chat", { model: "m" }, { signal: new AbortController().signal });
    const stop = async () => {
      await ex.close();
      srv.closeAllConnections();
      await new Promise<void>((r) => srv.close(() => r()));
    };
    return { ex, url, go, release, seenCount: () => seen, stop };
  }

  it("forget() lets requests queued on the pool go out instead of failing them", async () => {
    const t = await oneConnection();
    try {
      const first = t.go();
      await waitUntil(async () => t.seenCount() === 1, 5000, "first request at the worker");
      // Queued behind the first: not on a connection yet. The old forget() destroyed the
      // pool here and this one failed with UND_ERR_DESTROYED (a 502 no router retried).
      const queued = t.go();
      t.ex.forget(t.url);
      t.release();
      assert.deepEqual(await (await first).json(), { n: 1 });
      assert.deepEqual(await (await queued).json(), { n: 2 });
    } finally {
      await t.stop();
    }
  });

  it("a request its destroyed pool never sent is a WorkerUnreachableError of kind connect", async () => {
    const t = await oneConnection();
    try {
      const first = t.go();
      first.catch(() => {});
      await waitUntil(async () => t.seenCount() === 1, 5000, "first request at the worker");
      const queued = t.go();
      const closing = t.ex.close(); // destroys every pool
      await assert.rejects(queued, (e: Error & { kind?: string; code?: string }) => {
        assert.equal(e.name, "WorkerUnreachableError", `got ${e.name}: ${e.message}`);
        assert.equal(e.kind, "connect");
        return true;
      });
      await closing;
    } finally {
      t.release();
      await t.stop();
    }
  });
});

describe("PushBody", () => {
  class RecordingSource implements BodySource {
    log: string[] = [];
    resume(): void {
      this.log.push("resume");
    }
    abort(reason: Error): void {
      this.log.push(`abort:${reason.name}`);
    }
  }

  it("queues chunks and the end until a sink attaches, then replays them in order", () => {
    const body = new PushBody(new RecordingSource());
    assert.equal(body.push(Buffer.from("a")), true);
    assert.equal(body.push(Buffer.from("b")), true);
    body.end();
    const seen: string[] = [];
    let ended = false;
    body.attach({
      onData: (c) => {
        seen.push(Buffer.from(c).toString());
        return true;
      },
      onEnd: () => (ended = true),
      onError: () => {},
    });
    assert.deepEqual(seen, ["a", "b"]);
    assert.equal(ended, true);
  });

  it("an unread body pauses the source after 16 chunks; attaching a reader resumes it", () => {
    const src = new RecordingSource();
    const body = new PushBody(src);
    let accepted = 0;
    for (let i = 0; i < 16; i++) if (body.push(Buffer.from([i]))) accepted++;
    assert.equal(accepted, 15);
    const seen: number[] = [];
    body.attach({
      onData: (c) => {
        seen.push(c[0]!);
        return true;
      },
      onEnd: () => {},
      onError: () => {},
    });
    assert.equal(seen.length, 16);
    assert.deepEqual(src.log, ["resume"]);
  });

  it("an end or a failure that came before any chunk and any reader still reaches the reader", async () => {
    const ended = new PushBody(new RecordingSource());
    ended.end();
    assert.deepEqual(await ended.bytes(), Buffer.alloc(0));
    const failed = new PushBody(new RecordingSource());
    failed.fail(new Error("reset before any byte"));
    await assert.rejects(failed.bytes(), /reset before any byte/);
  });

  it("a sink returning false pauses the source; resume() resumes it once", () => {
    const src = new RecordingSource();
    const body = new PushBody(src);
    body.attach({ onData: () => false, onEnd: () => {}, onError: () => {} });
    assert.equal(body.push(Buffer.from("a")), false);
    body.resume();
    body.resume();
    assert.deepEqual(src.log, ["resume"]);
  });

  it("destroy() aborts the source, fails the sink and runs close listeners once", () => {
    const src = new RecordingSource();
    const body = new PushBody(src);
    let err: Error | null = null;
    let closes = 0;
    body.onClose(() => closes++);
    body.attach({ onData: () => true, onEnd: () => {}, onError: (e) => (err = e) });
    body.destroy();
    body.destroy();
    body.end();
    assert.deepEqual(src.log, ["abort:AbortError"]);
    assert.equal((err as Error | null)?.name, "AbortError");
    assert.equal(closes, 1);
    let late = 0;
    body.onClose(() => late++);
    assert.equal(late, 1, "a listener added after close runs at once");
  });

  it("the iterator pauses the source past 16 buffered chunks and resumes when drained", async () => {
    const src = new RecordingSource();
    const body = new PushBody(src);
    const it = body[Symbol.asyncIterator]();
    let accepted = 0;
    for (let i = 0; i < 16; i++) if (body.push(Buffer.from([i]))) accepted++;
    assert.equal(accepted, 15, "the 16th buffered chunk asks the source to pause");
    for (let i = 0; i < 16; i++) assert.equal(((await it.next()).value as Uint8Array)[0], i);
    assert.deepEqual(src.log, ["resume"]);
    body.fail(new Error("boom"));
    await assert.rejects(it.next(), /boom/);
  });
});
