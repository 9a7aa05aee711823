/** DisaggRouter against a scripted executor: flows, pairing, xPyD choice, faults, aborts. */
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, test } from "node:test";
import type { ConnectorKind } from "../../../src/discovery/types.ts";
import { InferaError } from "../../../src/protocol/errors.ts";
import { makeDisaggRouterFactory } from "../../../src/router/disagg/index.ts";
import type { DisaggOptions } from "../../../src/router/disagg/router.ts";
import type { ModelRouter, WorkerState } from "../../../src/router/types.ts";
import { WorkerUnreachableError } from "../../../src/transport/types.ts";
import { createLogger } from "../../../src/util/log.ts";
import { type Call, delay, FakeExecutor, jsonAnswer } from "./fake-exec.ts";
import { firstPolicy, record, routingRequest, state } from "./fixtures.ts";

const logger = createLogger("test", {});
logger.level = "silent";

function worker(
  id: string,
  role: "prefill" | "decode",
  kind: ConnectorKind,
  over: Partial<WorkerState> = {},
) {
  return state(record(id, role, { kind, bootstrapHost: "127.0.0.1", bootstrapPort: 9 }), over);
}

function router(ps: WorkerState[], ds: WorkerState[], opts: DisaggOptions = {}) {
  const failures: string[] = [];
  const policy = firstPolicy();
  const r: ModelRouter = makeDisaggRouterFactory(opts)({
    model: "m",
    prefillWorkers: () => ps.filter((w) => w.available),
    decodeWorkers: () => ds.filter((w) => w.available),
    policy,
    logger,
    options: {},
    reportFailure: (w, kind) => failures.push(`${w.record.id}:${kind}`),
  });
  return { r, failures, policy };
}

const body = { model: "m", messages: [{ role: "user", content: "hi" }], stream: true, max_tokens: 20 };
const nixlParams = { do_remote_prefill: true, remote_block_ids: [1], remote_host: "h", remote_port: 1 };
const kvp = (c: Call) => c.body.kv_transfer_params as Record<string, unknown>;
const signal = () => new AbortController().signal;
const text = async (it: AsyncIterable<Uint8Array>) => {
  let s = "";
  for await (const c of it) s += new TextDecoder().decode(c);
  return s;
};

describe("serial (nixl)", () => {
  test("P first with the prefill body, then D with P's params; one request id; D's answer returned", async () => {
    const p = worker("p1", "prefill", "nixl");
    const d = worker("d1", "decode", "nixl");
    const exec = new FakeExecutor({
      p1: () => jsonAnswer(200, { id: "x", kv_transfer_params: nixlParams }),
      d1: () => jsonAnswer(200, { from: "d", usage: { prompt_tokens: 5, completion_tokens: 20 } }),
    });
    const { r } = router([p], [d]);
    const up = await r.handle(routingRequest(body), exec, signal());
    assert.equal(r.kind, "disagg");
    assert.deepEqual(
      exec.calls.map((c) => c.worker),
      ["p1", "d1"],
    );
    const [pc, dc] = exec.calls;
    assert.equal(pc.body.stream, false);
    assert.equal(pc.body.max_tokens, 1);
    assert.equal(kvp(pc).do_remote_decode, true);
    assert.deepEqual(kvp(dc), nixlParams);
    assert.equal(dc.body.stream, true);
    assert.equal(dc.body.max_tokens, 20);
    assert.equal(pc.opts.headers?.["x-request-id"], dc.opts.headers?.["x-request-id"]);
    assert.equal(pc.opts.headers?.["x-request-id"], "req-0123456789abcdef0123456789abcdef");
    assert.equal(d.inFlight, 1, "D counted while its answer is open");
    assert.equal(p.inFlight, 0);
    assert.match(await text(up.body), /"from":"d"/);
    assert.equal(d.inFlight, 0);
  });

  test("a P that fails is replaced by another P; the failure counts against it", async () => {
    const p1 = worker("p1", "prefill", "nixl");
    const p2 = worker("p2", "prefill", "nixl");
    const d = worker("d1", "decode", "nixl");
    const exec = new FakeExecutor({
      p1: () => {
        throw new WorkerUnreachableError("http://p1", "connect", "ECONNREFUSED");
      },
      p2: () => jsonAnswer(200, { kv_transfer_params: nixlParams }),
      d1: () => jsonAnswer(200, { ok: true }),
    });
    const { r, failures } = router([p1, p2], [d]);
    await r.handle(routingRequest(body), exec, signal());
    assert.deepEqual(
      exec.calls.map((c) => c.worker),
      ["p1", "p2", "d1"],
    );
    assert.deepEqual(failures, ["p1:connect"]);
    assert.equal(p1.inFlight + p2.inFlight, 0);
  });

  test("all P fail: 502 prefill_failed, or with pdFallbackMixed the whole request on D", async () => {
    const p = worker("p1", "prefill", "nixl");
    const d = worker("d1", "decode", "nixl");
    const handlers = {
      p1: () => jsonAnswer(500, { error: { message: "boom" } }),
      d1: () => jsonAnswer(200, { ok: true }),
    };
    const e1 = new FakeExecutor(handlers);
    await assert.rejects(router([p], [d]).r.handle(routingRequest(body), e1, signal()), (e) => {
      assert.ok(e instanceof InferaError);
      assert.equal(e.status, 502);
      assert.equal(e.code, "prefill_failed");
      assert.match(e.message, /boom/);
      return true;
    });
    assert.deepEqual(
      e1.calls.map((c) => c.worker),
      ["p1"],
    );
    const e2 = new FakeExecutor(handlers);
    await router([p], [d], { pdFallbackMixed: true }).r.handle(routingRequest(body), e2, signal());
    assert.deepEqual(
      e2.calls.map((c) => c.worker),
      ["p1", "d1"],
    );
    assert.deepEqual(e2.calls[1].body, body, "D gets the client's body untouched");
  });

  test("P answering without kv_transfer_params counts as a P failure", async () => {
    const exec = new FakeExecutor({ p1: () => jsonAnswer(200, { id: "no-params" }) });
    await assert.rejects(
      router([worker("p1", "prefill", "nixl")], [worker("d1", "decode", "nixl")]).r.handle(
        routingRequest(body),
        exec,
        signal(),
      ),
      (e) => e instanceof InferaError && e.status === 502 && /kv_transfer_params/.test(e.message),
    );
  });

  test("a 4xx from P goes to the client as a 4xx, no retry", async () => {
    const exec = new FakeExecutor({
      p1: () => jsonAnswer(400, { error: { message: "context too long" } }),
      p2: () => jsonAnswer(200, { kv_transfer_params: nixlParams }),
    });
    const ps = [worker("p1", "prefill", "nixl"), worker("p2", "prefill", "nixl")];
    await assert.rejects(
      router(ps, [worker("d1", "decode", "nixl")]).r.handle(routingRequest(body), exec, signal()),
      (e) => {
        assert.ok(e instanceof InferaError);
        assert.equal(e.status, 400);
        assert.equal(e.type, "invalid_request_error");
        return true;
      },
    );
    assert.equal(exec.calls.length, 1);
  });

  test("D failing after P: clean 502 decode_failed; D timing out: 504", async () => {
    const p = worker("p1", "prefill", "nixl");
    const d = worker("d1", "decode", "nixl");
    const okP = () => jsonAnswer(200, { kv_transfer_params: nixlParams });
    const e1 = new FakeExecutor({
      p1: okP,
      d1: () => jsonAnswer(502, { error: { message: "KV pull failed" } }),
    });
    const { r, failures } = router([p], [d]);
    await assert.rejects(r.handle(routingRequest(body), e1, signal()), (e) => {
      assert.ok(e instanceof InferaError);
      assert.equal(e.status, 502);
      assert.equal(e.code, "decode_failed");
      assert.match(e.message, /KV pull failed/);
      return true;
    });
    assert.deepEqual(failures, ["d1:5xx"]);
    const e2 = new FakeExecutor({
      p1: okP,
      d1: () => jsonAnswer(504, { error: { message: "pull timed out" } }),
    });
    await assert.rejects(
      r.handle(routingRequest(body), e2, signal()),
      (e) => e instanceof InferaError && e.status === 504,
    );
    assert.equal(d.inFlight, 0);
  });

  test("per-phase timeouts reach the executor", async () => {
    const exec = new FakeExecutor({
      p1: () => jsonAnswer(200, { kv_transfer_params: nixlParams }),
      d1: () => jsonAnswer(200, {}),
    });
    const { r } = router([worker("p1", "prefill", "nixl")], [worker("d1", "decode", "nixl")], {
      prefillTimeoutMs: 1234,
      decodeTimeoutMs: 5678,
    });
    await r.handle(routingRequest(body), exec, signal());
    assert.deepEqual(
      exec.calls.map((c) => c.opts.timeoutMs),
      [1234, 5678],
    );
  });
});

describe("pairing and topologies", () => {
  test("a P and a D speaking different connectors are never paired", async () => {
    const exec = new FakeExecutor({
      p2: () => jsonAnswer(200, { kv_transfer_params: nixlParams }),
      d2: () => jsonAnswer(200, {}),
    });
    const ps = [worker("p1", "prefill", "atom"), worker("p2", "prefill", "nixl")];
    const ds = [worker("d1", "decode", "moriio"), worker("d2", "decode", "nixl")];
    const { r, policy } = router(ps, ds);
    await r.handle(routingRequest(body), exec, signal());
    assert.deepEqual(policy.offered, [["p2"]]);
    assert.deepEqual(
      exec.calls.map((c) => c.worker),
      ["p2", "d2"],
    );
    // No D speaks atom: with only an atom P, there is no pair.
    await assert.rejects(
      router([worker("p1", "prefill", "atom")], ds).r.handle(routingRequest(body), exec, signal()),
      (e) => e instanceof InferaError && e.status === 503,
    );
  });

  test("1P2D: D is the least loaded (in-flight, then engine load)", async () => {
    const exec = new FakeExecutor({
      p1: () => jsonAnswer(200, { kv_transfer_params: nixlParams }),
      d1: () => jsonAnswer(200, {}),
      d2: () => jsonAnswer(200, {}),
    });
    const d1 = worker("d1", "decode", "nixl", { inFlight: 2 });
    const d2 = worker("d2", "decode", "nixl", { inFlight: 1 });
    const { r } = router([worker("p1", "prefill", "nixl")], [d1, d2]);
    await r.handle(routingRequest(body), exec, signal());
    assert.equal(exec.calls[1].worker, "d2");
    d2.inFlight = 2;
    d1.engineLoad = { running: 1, waiting: 0, kvUsage: 0.1, scrapedAt: 0 };
    d2.engineLoad = { running: 5, waiting: 2, kvUsage: 0.1, scrapedAt: 0 };
    await r.handle(routingRequest(body), exec, signal());
    assert.equal(exec.calls[3].worker, "d1");
  });

  test("a burst spreads over the Ds: a pick counts at once, before any await", async () => {
    const slowD = async (c: Call) => {
      await delay(30, c.opts.signal);
      return jsonAnswer(200, {});
    };
    const exec = new FakeExecutor({ p1: () => jsonAnswer(200, {}), d1: slowD, d2: slowD });
    const ds = [worker("d1", "decode", "sglang"), worker("d2", "decode", "sglang")];
    const { r } = router([worker("p1", "prefill", "sglang")], ds);
    const ups = await Promise.all(
      Array.from({ length: 6 }, () => r.handle(routingRequest(body), exec, signal())),
    );
    assert.equal(exec.to("d1").length, 3);
    assert.equal(exec.to("d2").length, 3);
    await Promise.all(ups.map((u) => text(u.body)));
    assert.deepEqual(
      ds.map((d) => d.inFlight),
      [0, 0],
    );
  });

  test("no prefill worker at all: 503, or mixed on D with pdFallbackMixed", async () => {
    const exec = new FakeExecutor({ d1: () => jsonAnswer(200, { ok: 1 }) });
    const d = [worker("d1", "decode", "nixl")];
    await assert.rejects(
      router([], d).r.handle(routingRequest(body), exec, signal()),
      (e) => e instanceof InferaError && e.status === 503,
    );
    await router([], d, { pdFallbackMixed: true }).r.handle(routingRequest(body), exec, signal());
    assert.deepEqual(
      exec.calls.map((c) => c.worker),
      ["d1"],
    );
  });
});

describe("concurrent (sglang, mooncake)", () => {
  let bootstrap: http.Server;
  let bootstrapPort = 0;
  before(async () => {
    bootstrap = http.createServer((req, res) => {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(req.url === "/query" ? { engine_id: "mc-engine" } : {}));
    });
    await new Promise<void>((r) => bootstrap.listen(0, "127.0.0.1", () => r()));
    bootstrapPort = (bootstrap.address() as { port: number }).port;
  });
  after(() => bootstrap.close());

  test("sglang: P and D get the same body at once; D's answer returned", async () => {
    const exec = new FakeExecutor({
      p1: async (c) => {
        await delay(30, c.opts.signal);
        return jsonAnswer(200, { from: "p" });
      },
      d1: async (c) => {
        await delay(60, c.opts.signal);
        return jsonAnswer(200, { from: "d" });
      },
    });
    const { r } = router([worker("p1", "prefill", "sglang")], [worker("d1", "decode", "sglang")]);
    const up = await r.handle(routingRequest(body), exec, signal());
    assert.match(await text(up.body), /"from":"d"/);
    const [pc, dc] = exec.calls;
    assert.ok(Math.abs(pc.at - dc.at) < 20, "both halves sent together");
    assert.deepEqual(pc.body, dc.body);
    assert.equal(pc.body.bootstrap_port, 9);
    assert.equal(pc.opts.headers?.["x-request-id"], dc.opts.headers?.["x-request-id"]);
  });

  test("mooncake: P fails → D aborted, retried on another P with a new transfer_id", async () => {
    const aborted: string[] = [];
    const mk = (id: string) =>
      state(record(id, "prefill", { kind: "mooncake", bootstrapHost: "127.0.0.1", bootstrapPort }));
    const exec = new FakeExecutor({
      p1: async () => {
        await delay(20, signal());
        return jsonAnswer(503, { error: { message: "overloaded" } });
      },
      p2: () => jsonAnswer(200, {}),
      d1: async (c) => {
        try {
          await delay(100, c.opts.signal);
        } catch (e) {
          aborted.push(String(kvp(c).transfer_id));
          throw e;
        }
        return jsonAnswer(200, { from: "d" });
      },
    });
    const d = state(record("d1", "decode", { kind: "mooncake" }));
    const { r } = router([mk("p1"), mk("p2")], [d]);
    const up = await r.handle(routingRequest(body), exec, signal());
    assert.match(await text(up.body), /"from":"d"/);
    assert.deepEqual(
      exec.calls.map((c) => c.worker),
      ["p1", "d1", "p2", "d1"],
    );
    const [p1c, d1c, p2c, d2c] = exec.calls;
    assert.equal(kvp(p1c).transfer_id, kvp(d1c).transfer_id);
    assert.equal(kvp(p2c).transfer_id, kvp(d2c).transfer_id);
    assert.notEqual(kvp(p1c).transfer_id, kvp(p2c).transfer_id);
    assert.deepEqual(aborted, [kvp(d1c).transfer_id], "the first D half was cancelled");
    assert.equal(kvp(d2c).remote_engine_id, "mc-engine");
    assert.equal(kvp(d2c).remote_bootstrap_addr, `http://127.0.0.1:${bootstrapPort}`);
    assert.equal(d.inFlight, 0);
  });

  test("client abort cancels both halves", async () => {
    const seen: string[] = [];
    const slow = (id: string) => async (c: Call) => {
      try {
        await delay(5000, c.opts.signal);
      } catch (e) {
        seen.push(id);
        throw e;
      }
      return jsonAnswer(200, {});
    };
    const exec = new FakeExecutor({ p1: slow("p1"), d1: slow("d1") });
    const { r } = router([worker("p1", "prefill", "sglang")], [worker("d1", "decode", "sglang")]);
    const ctl = new AbortController();
    const pending = r.handle(routingRequest(body), exec, ctl.signal);
    setTimeout(() => ctl.abort(new Error("client went away")), 30);
    await assert.rejects(pending, /client went away/);
    await delay(10, signal());
    assert.deepEqual(seen.sort(), ["d1", "p1"]);
  });
});
