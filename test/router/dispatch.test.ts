/**
 * The one dispatch path (src/router/dispatch.ts): a WorkerClaim's accounting (claimed at pick
 * time, released exactly once on end, failure, abort or json(), prefill tokens at the first
 * byte), its reports to the breaker, and the routers built on it, against a real node:http
 * upstream through the real HttpExecutor.
 */
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { join, relative } from "node:path";
import { Readable } from "node:stream";
import { after, before, beforeEach, describe, it } from "node:test";
import { InferaError, TimeoutError } from "../../src/protocol/errors.ts";
import { makeDisaggRouterFactory } from "../../src/router/disagg/index.ts";
import { type HealthReporter, WorkerClaim } from "../../src/router/dispatch.ts";
import { MixedRouter } from "../../src/router/mixed.ts";
import type { WorkerState } from "../../src/router/types.ts";
import { LiveWorker, type WorkerSet } from "../../src/router/worker-set.ts";
import { pump } from "../../src/server/pump.ts";
import { HttpExecutor } from "../../src/transport/http.ts";
import {
  type BodySink,
  connectionKindOf,
  failureKind,
  isRelayBody,
  type RelayBody,
  type RequestExecutor,
  type UpstreamResponse,
  WorkerUnreachableError,
} from "../../src/transport/types.ts";
import { createLogger } from "../../src/util/log.ts";
import { freePort } from "../helpers/ports.ts";
import { mixedRecord } from "../helpers/records.ts";
import { waitUntil } from "../helpers/wait.ts";
import { firstPolicy, record, routingRequest } from "./disagg/fixtures.ts";

const logger = createLogger("test", {});
logger.level = "silent";

type Route = (req: IncomingMessage, res: ServerResponse, body: string) => void;
let server: Server;
let url = "";
let route: Route = (_req, res) => res.end("{}");
const exec = new HttpExecutor();

before(async () => {
  server = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (c: string) => {
      body += c;
    });
    req.once("end", () => route(req, res, body));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(async () => {
  await exec.close();
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

/** A LiveWorker (the server's own kind, with `routed`) at `at`. */
const live = (id = "w", at = url) => new LiveWorker(mixedRecord({ id, model: "m", url: at }));
const signal = () => new AbortController().signal;

function reporter(): HealthReporter & { log: string[] } {
  const log: string[] = [];
  return {
    log,
    reportFailure: (w, kind) => log.push(`${w.record.id}:${kind}`),
    reportSuccess: (w) => log.push(`${w.record.id}:ok`),
  };
}

/** An SSE stream: one event now, the second when `go` resolves, then the end. */
function twoEvents(go: Promise<void>): Route {
  return (_req, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write("data: 1\n\n");
    void go.then(() => res.end("data: 2\n\n"));
  };
}

describe("WorkerClaim accounting", () => {
  it("claims inFlight, routed and prefill tokens at once; releases exactly once", () => {
    const w = live();
    const c = new WorkerClaim(w, {}, 7);
    assert.deepEqual([w.inFlight, w.routed, w.pendingPrefillTokens], [1, 1, 7]);
    c.firstByte();
    c.firstByte();
    assert.deepEqual([w.inFlight, w.pendingPrefillTokens], [1, 0], "prefill done, request still running");
    c.release();
    c.release();
    assert.deepEqual([w.inFlight, w.routed, w.pendingPrefillTokens], [0, 1, 0]);
    const c2 = new WorkerClaim(w, {}, 3);
    c2.release();
    assert.deepEqual(
      [w.inFlight, w.routed, w.pendingPrefillTokens],
      [0, 2, 0],
      "release ends pending prefill too",
    );
  });

  it("a WorkerState that keeps no `routed` count is left without one", () => {
    const w: WorkerState = { record: live().record, inFlight: 0, pendingPrefillTokens: 0, available: true };
    new WorkerClaim(w, {}).release();
    assert.equal(w.routed, undefined);
  });
});

describe("a claimed answer over HTTP", () => {
  beforeEach(() => {
    route = (_req, res) => res.end("{}");
  });

  it("keeps the relay body (no promise per chunk) and drops prefill at the first byte, inFlight at the end", async () => {
    let go!: () => void;
    route = twoEvents(new Promise<void>((r) => (go = r)));
    const w = live();
    const claim = new WorkerClaim(w, {}, 5);
    const up = claim.wrap(await claim.send(exec, "chat", { model: "m" }, { signal: signal() }));
    assert.ok(isRelayBody(up.body), "a relay body even while prefill is pending");
    const seen: Array<[number, number]> = [];
    await pump(up.body, null, (c) => {
      seen.push([w.pendingPrefillTokens, w.inFlight]);
      if (seen.length === 1) go();
      return c.length > 0;
    });
    assert.deepEqual(seen[0], [0, 1], "first chunk: prefill released, request still in flight");
    assert.deepEqual([w.inFlight, w.pendingPrefillTokens], [0, 0]);
  });

  it("async iteration over the claimed relay body sees the first byte; break releases", async () => {
    let go!: () => void;
    route = twoEvents(new Promise<void>((r) => (go = r)));
    const w = live();
    const claim = new WorkerClaim(w, {}, 5);
    const up = claim.wrap(await claim.send(exec, "chat", { model: "m" }, { signal: signal() }));
    for await (const _ of up.body) {
      assert.deepEqual([w.pendingPrefillTokens, w.inFlight], [0, 1]);
      break;
    }
    go();
    await waitUntil(() => w.inFlight === 0, 2000, "the claim released");
    assert.ok(claim.isReleased);
  });

  it("a body that breaks off releases once", async () => {
    route = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write("data: 1\n\n");
      setTimeout(() => res.socket?.destroy(), 20);
    };
    const w = live();
    const claim = new WorkerClaim(w, {}, 5);
    const up = claim.wrap(await claim.send(exec, "chat", { model: "m" }, { signal: signal() }));
    await assert.rejects(pump(up.body, null, () => true));
    assert.deepEqual([w.inFlight, w.pendingPrefillTokens], [0, 0]);
    up.abort();
    assert.equal(w.inFlight, 0, "a later abort does not release again");
  });

  it("abort() stops the upstream, runs onAbort and releases once", async () => {
    let upstreamClosed = false;
    route = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write("data: 1\n\n");
      res.once("close", () => {
        upstreamClosed = true;
      });
    };
    const w = live();
    let aborts = 0;
    const claim = new WorkerClaim(w, {}, 5);
    const up = claim.wrap(
      await claim.send(exec, "chat", { model: "m" }, { signal: signal() }),
      () => aborts++,
    );
    assert.equal(w.inFlight, 1);
    up.abort();
    assert.deepEqual([w.inFlight, w.pendingPrefillTokens, aborts], [0, 0, 1]);
    await waitUntil(() => upstreamClosed, 2000, "the upstream request closed");
  });

  it("json() releases", async () => {
    route = (_req, res) => {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify({ ok: 1 }));
    };
    const w = live();
    const claim = new WorkerClaim(w, {}, 5);
    const up = claim.wrap(await claim.send(exec, "chat", { model: "m" }, { signal: signal() }));
    assert.equal(up.contentType, "application/json");
    assert.deepEqual(await up.json(), { ok: 1 });
    assert.deepEqual([w.inFlight, w.pendingPrefillTokens], [0, 0]);
  });
});

describe("a claim's watchers (the pending bridge): prefilled or dropped, once", () => {
  beforeEach(() => {
    route = (_req, res) => res.end("{}");
  });

  const watcher = () => {
    const log: string[] = [];
    return { log, prefilled: () => log.push("prefilled"), dropped: (r: string) => log.push(`dropped:${r}`) };
  };

  it("the first byte of a 200 answer: prefilled (with or without pending tokens counted)", async () => {
    for (const tokens of [5, 0]) {
      let go!: () => void;
      route = twoEvents(new Promise<void>((r) => (go = r)));
      const claim = new WorkerClaim(live(), {}, tokens);
      const w = watcher();
      claim.watch(w);
      const up = claim.wrap(await claim.send(exec, "chat", { model: "m" }, { signal: signal() }));
      assert.deepEqual(w.log, [], "headers are not a prefill");
      await pump(up.body, null, (c) => {
        go();
        return c.length > 0;
      });
      assert.deepEqual(w.log, ["prefilled"], `tokens ${tokens}`);
    }
  });

  it("a short answer that arrived whole before the relay attached: prefilled, not dropped", async () => {
    // Head, event and end in one write: undici delivers them in one socket read, so the body
    // has ended (its chunk queued) before the relay attaches. The claim used to end at that
    // close, telling the watcher `dropped:failed` for a successful answer.
    route = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end('data: {"x":1}\n\ndata: [DONE]\n\n');
    };
    const w = live();
    const claim = new WorkerClaim(w, {}, 5);
    const obs = watcher();
    claim.watch(obs);
    const up = claim.wrap(await claim.send(exec, "chat", { model: "m" }, { signal: signal() }));
    // Let the whole answer land before anything reads it.
    await new Promise((r) => setTimeout(r, 50));
    let bytes = 0;
    await pump(up.body, null, (c) => {
      bytes += c.length;
      return true;
    });
    assert.ok(bytes > 0);
    assert.deepEqual(obs.log, ["prefilled"]);
    await waitUntil(() => claim.isReleased, 1000, "the claim ends");
    assert.equal(w.inFlight, 0);
    assert.equal(w.pendingPrefillTokens, 0);
  });

  it("a 5xx answer (its error body included) and a broken-off body before any byte: dropped as failed", async () => {
    route = (_req, res) => {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "boom" } }));
    };
    const c1 = new WorkerClaim(live(), {}, 5);
    const w1 = watcher();
    c1.watch(w1);
    const up1 = c1.wrap(await c1.send(exec, "chat", { model: "m" }, { signal: signal() }));
    await pump(up1.body, null, () => true);
    assert.deepEqual(w1.log, ["dropped:failed"]);

    route = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.flushHeaders();
      setTimeout(() => res.socket?.destroy(), 20);
    };
    const c2 = new WorkerClaim(live(), {}, 5);
    const w2 = watcher();
    c2.watch(w2);
    const up2 = c2.wrap(await c2.send(exec, "chat", { model: "m" }, { signal: signal() }));
    await assert.rejects(pump(up2.body, null, () => true));
    assert.deepEqual(w2.log, ["dropped:failed"]);
  });

  it("the client going away: dropped as cancelled (abort of the answer, or of the send)", async () => {
    route = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.flushHeaders();
    };
    const c1 = new WorkerClaim(live(), {}, 5);
    const w1 = watcher();
    c1.watch(w1);
    const up = c1.wrap(await c1.send(exec, "chat", { model: "m" }, { signal: signal() }));
    up.abort();
    up.abort();
    assert.deepEqual(w1.log, ["dropped:cancelled"]);

    route = () => {}; // never answers
    const ctl = new AbortController();
    const c2 = new WorkerClaim(live(), {}, 5);
    const w2 = watcher();
    c2.watch(w2);
    const sent = c2.send(exec, "chat", { model: "m" }, { signal: ctl.signal });
    ctl.abort();
    await assert.rejects(sent);
    assert.deepEqual(w2.log, ["dropped:cancelled"]);
  });

  it("json() of a 200 answer: prefilled; a watcher added after the end hears the outcome at once", async () => {
    // The body comes after the headers (as a whole answer after its generation): json() reads it.
    route = (_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.flushHeaders();
      setTimeout(() => res.end(JSON.stringify({ ok: 1 })), 30);
    };
    const claim = new WorkerClaim(live(), {}, 0);
    const w = watcher();
    claim.watch(w);
    const up = claim.wrap(await claim.send(exec, "chat", { model: "m" }, { signal: signal() }));
    await up.json();
    const late = watcher();
    claim.watch(late);
    assert.deepEqual([w.log, late.log], [["prefilled"], ["prefilled"]]);
    const gone = new WorkerClaim(live(), {}, 0);
    gone.release();
    const w3 = watcher();
    gone.watch(w3);
    assert.deepEqual(w3.log, ["dropped:failed"]);
  });
});

/** An executor answering with a given body (bodies other transports or test doubles give). */
function bodyExecutor(body: () => AsyncIterable<Uint8Array>): RequestExecutor {
  return {
    send: async () =>
      ({
        status: 200,
        headers: { "content-type": "text/plain" },
        body: body(),
        json: async () => ({}),
        abort: () => {},
      }) satisfies UpstreamResponse,
  };
}

describe("a claimed answer with another kind of body", () => {
  it("an async generator body is iterated through: first byte, then release at its end", async () => {
    const w = live();
    const claim = new WorkerClaim(w, {}, 4);
    const enc = new TextEncoder();
    const gen = bodyExecutor(async function* () {
      yield enc.encode("a");
      yield enc.encode("b");
    });
    const up = claim.wrap(await claim.send(gen, "chat", {}, { signal: signal() }));
    const seen: number[][] = [];
    for await (const _ of up.body) seen.push([w.pendingPrefillTokens, w.inFlight]);
    assert.deepEqual(seen, [
      [0, 1],
      [0, 1],
    ]);
    assert.equal(w.inFlight, 0);
  });

  it("a Node stream without pending prefill is handed through; its close releases", async () => {
    const w = live();
    const src = Readable.from([Buffer.from("x")]);
    const claim = new WorkerClaim(w, {});
    const up = claim.wrap(
      await claim.send(
        bodyExecutor(() => src),
        "chat",
        {},
        { signal: signal() },
      ),
    );
    assert.equal(up.body, src);
    await pump(up.body, null, () => true);
    await waitUntil(() => w.inFlight === 0, 2000, "the claim released");
  });

  it("the server relays any RelayBody with plain calls, never iterating it", async () => {
    const chunks: string[] = [];
    const body: RelayBody = {
      attach(sink: BodySink) {
        sink.onData(Buffer.from("a"));
        sink.onData(Buffer.from("b"));
        sink.onEnd();
      },
      resume() {},
      onClose(fn) {
        fn();
      },
      destroy() {},
      [Symbol.asyncIterator]() {
        throw new Error("iterated");
      },
    };
    await pump(body, null, (c) => chunks.push(Buffer.from(c).toString()) > 0);
    assert.deepEqual(chunks, ["a", "b"]);
  });
});

describe("send failures and the breaker", () => {
  it("a refused connection: WorkerUnreachableError(connect), released, counted once", async () => {
    const w = live("dead", `http://127.0.0.1:${await freePort()}`);
    const health = reporter();
    const claim = new WorkerClaim(w, health, 9);
    const err = await claim.send(exec, "chat", {}, { signal: signal() }).catch((e: unknown) => e);
    assert.ok(err instanceof WorkerUnreachableError && err.kind === "connect");
    assert.deepEqual([w.inFlight, w.pendingPrefillTokens], [0, 0]);
    claim.fail(err);
    assert.deepEqual(health.log, ["dead:connect"], "one failure per claim");
  });

  it("an aborted send is not the worker's fault", async () => {
    const w = live();
    const health = reporter();
    const claim = new WorkerClaim(w, health);
    const ac = new AbortController();
    ac.abort();
    await assert.rejects(claim.send(exec, "chat", {}, { signal: ac.signal }));
    assert.deepEqual([w.inFlight, health.log.length], [0, 0]);
  });

  it("a 5xx answer counts as 5xx at once; the claim holds until the answer is released", async () => {
    route = (_req, res) => {
      res.writeHead(503, { "content-type": "application/json" });
      res.end('{"error":{"message":"busy"}}');
    };
    const w = live();
    const health = reporter();
    const claim = new WorkerClaim(w, health);
    const up = await claim.send(exec, "chat", {}, { signal: signal() });
    assert.equal(up.status, 503);
    assert.deepEqual(health.log, ["w:5xx"]);
    assert.equal(w.inFlight, 1);
    await claim.wrap(up).json();
    assert.equal(w.inFlight, 0);
  });

  it("a timeout is not a connection failure: send leaves it to the router (fail → 5xx)", async () => {
    route = () => {}; // never answers
    const w = live();
    const health = reporter();
    const claim = new WorkerClaim(w, health);
    const err = await claim
      .send(exec, "chat", {}, { signal: signal(), timeoutMs: 100 })
      .catch((e: unknown) => e);
    assert.ok(err instanceof TimeoutError, String(err));
    assert.deepEqual(health.log, [], "the MixedRouter neither retries nor counts timeouts");
    claim.fail(err);
    assert.deepEqual(health.log, ["w:5xx"]);
    claim.fail(new InferaError(400, "bad"));
    assert.equal(w.inFlight, 0);
    server.closeAllConnections();
  });

  it("classifies failures: connection kinds for retries, failure kinds for the breaker", () => {
    const cases: Array<[unknown, string | null, string | null]> = [
      [Object.assign(new Error("x"), { code: "ECONNREFUSED" }), "connect", "connect"],
      [new Error("x", { cause: Object.assign(new Error("y"), { code: "ECONNRESET" }) }), "reset", "reset"],
      [Object.assign(new Error("x"), { code: "UND_ERR_CLOSED" }), "reset", "reset"],
      [new WorkerUnreachableError("u", "connect", "not sent"), "connect", "connect"],
      [new TimeoutError("slow"), null, "5xx"],
      [new InferaError(502, "broken"), null, "5xx"],
      [new InferaError(400, "bad request"), null, null],
      [new Error("plain"), null, null],
    ];
    for (const [err, conn, fail] of cases) {
      assert.equal(connectionKindOf(err), conn, String(err));
      assert.equal(failureKind(err), fail, String(err));
    }
  });
});

describe("routers on the one path", () => {
  const stubSet = (health: HealthReporter) => health as unknown as WorkerSet;

  it("MixedRouter with prefill tracking: relay body kept, prefill out at the first byte", async () => {
    let go!: () => void;
    route = twoEvents(new Promise<void>((r) => (go = r)));
    const w = live();
    const health = reporter();
    const r = new MixedRouter({
      model: "m",
      candidates: () => [w],
      policy: firstPolicy(),
      workers: stubSet(health),
      maxRetries: 1,
      trackPrefill: true,
      logger,
    });
    const up = await r.handle(routingRequest({ model: "m", stream: true }), exec, signal());
    assert.deepEqual([w.inFlight, w.routed, w.pendingPrefillTokens], [1, 1, 5]);
    assert.ok(isRelayBody(up.body));
    const seen: number[] = [];
    await pump(up.body, null, () => {
      seen.push(w.pendingPrefillTokens);
      go();
      return true;
    });
    assert.equal(seen[0], 0);
    assert.deepEqual([w.inFlight, w.pendingPrefillTokens], [0, 0]);
    assert.deepEqual(health.log, ["w:ok"]);
  });

  it("MixedRouter retries a refused worker on another, counting both attempts", async () => {
    route = (_req, res) => res.end("{}");
    const dead = live("dead", `http://127.0.0.1:${await freePort()}`);
    const ok = live("ok");
    const health = reporter();
    const r = new MixedRouter({
      model: "m",
      candidates: () => [dead, ok],
      policy: firstPolicy(),
      workers: stubSet(health),
      maxRetries: 1,
      trackPrefill: true,
      logger,
    });
    const up = await r.handle(routingRequest({ model: "m" }), exec, signal());
    await up.json();
    assert.deepEqual(health.log, ["dead:connect", "ok:ok"]);
    assert.deepEqual([dead.routed, dead.inFlight, dead.pendingPrefillTokens], [1, 0, 0]);
    assert.deepEqual([ok.routed, ok.inFlight, ok.pendingPrefillTokens], [1, 0, 0]);
  });

  it("DisaggRouter (nixl): P's claim ends with its half, D's with its relayed answer", async () => {
    let go!: () => void;
    const dStream = twoEvents(new Promise<void>((r) => (go = r)));
    route = (req, res, body) => {
      const b = JSON.parse(body) as { kv_transfer_params?: { do_remote_decode?: boolean } };
      if (b.kv_transfer_params?.do_remote_decode) {
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ id: "p", kv_transfer_params: { remote_block_ids: [1] } }));
      } else dStream(req, res, body);
    };
    const nixl = { kind: "nixl" as const, bootstrapHost: "127.0.0.1", bootstrapPort: 9 };
    const p = new LiveWorker(record("p1", "prefill", nixl, { url }));
    const d = new LiveWorker(record("d1", "decode", nixl, { url }));
    const health = reporter();
    const r = makeDisaggRouterFactory()({
      model: "m",
      prefillWorkers: () => [p],
      decodeWorkers: () => [d],
      policy: firstPolicy(),
      logger,
      options: {},
      ...health,
    });
    const up = await r.handle(
      routingRequest({ model: "m", messages: [{ role: "user", content: "hi" }], stream: true }),
      exec,
      signal(),
    );
    assert.deepEqual([p.inFlight, p.pendingPrefillTokens, p.routed], [0, 0, 1], "P released after its half");
    assert.deepEqual([d.inFlight, d.routed], [1, 1]);
    assert.ok(isRelayBody(up.body), "D's answer relayed without a promise per chunk");
    await pump(up.body, null, () => {
      go();
      return true;
    });
    assert.equal(d.inFlight, 0);
    assert.deepEqual(health.log, ["p1:ok", "d1:ok"]);
  });

  it("DisaggRouter's mixed fallback on D reports D's failure to the breaker", async () => {
    const d = live("d1", `http://127.0.0.1:${await freePort()}`);
    const health = reporter();
    const r = makeDisaggRouterFactory({ pdFallbackMixed: true })({
      model: "m",
      prefillWorkers: () => [],
      decodeWorkers: () => [d],
      policy: firstPolicy(),
      logger,
      options: {},
      ...health,
    });
    await assert.rejects(r.handle(routingRequest({ model: "m" }), exec, signal()), WorkerUnreachableError);
    assert.deepEqual(health.log, ["d1:connect"]);
    assert.deepEqual([d.inFlight, d.pendingPrefillTokens, d.routed], [0, 0, 1]);
  });
});

describe("module boundaries", () => {
  const SRC = new URL("../../src/", import.meta.url).pathname;
  const sources = (dir: string): string[] =>
    readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
      e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : [],
    );
  const importsOf = (file: string): string[] =>
    [...readFileSync(file, "utf8").matchAll(/\bfrom "([^"]+)"/g)].map((m) => m[1]!);

  it("router/ imports the transport's contract only, never an implementation", () => {
    const bad = sources(join(SRC, "router")).flatMap((f) =>
      importsOf(f)
        .filter((i) => i.includes("/transport/") && !i.endsWith("/transport/types.ts"))
        .map((i) => `${relative(SRC, f)} → ${i}`),
    );
    assert.deepEqual(bad, []);
  });

  it("nothing outside the transport tests for PushBody", () => {
    const bad = sources(SRC)
      .filter((f) => !relative(SRC, f).startsWith("transport/"))
      .filter((f) => /instanceof PushBody|push-body\.ts"/.test(readFileSync(f, "utf8")))
      .map((f) => relative(SRC, f));
    assert.deepEqual(bad, []);
  });
});
