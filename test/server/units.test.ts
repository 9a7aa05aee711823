import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { parseSize } from "../../src/cli/server.ts";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { createRoundRobin } from "../../src/router/policies/round-robin.ts";
import type { RoutingRequest } from "../../src/router/types.ts";
import { WorkerSet } from "../../src/router/worker-set.ts";
import { configFromEnv, mergeConfig, resolveServerConfig } from "../../src/server/config.ts";
import { parseEngineLoad } from "../../src/server/load-scraper.ts";
import { SseUsageFilter } from "../../src/server/sse.ts";
import { createLogger } from "../../src/util/log.ts";

const logger = createLogger("test");
const ev = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;

describe("SseUsageFilter", () => {
  const stream =
    ev({ choices: [{ delta: { content: "a" } }] }) +
    ev({ choices: [{ delta: { content: "b" } }] }) +
    ev({ choices: [], usage: { prompt_tokens: 7, completion_tokens: 2 } }) +
    "data: [DONE]\n\n";

  function run(strip: boolean, cuts: number[]): { out: string; usage: unknown } {
    const f = new SseUsageFilter(strip);
    const buf = Buffer.from(stream);
    let out = "";
    let prev = 0;
    for (const c of [...cuts, buf.length]) {
      out += f.push(buf.subarray(prev, c)).toString();
      prev = c;
    }
    out += f.flush().toString();
    return { out, usage: f.usage };
  }

  it("passes everything through and reads usage when the client asked", () => {
    for (const cuts of [[], [5], [30, 31, 90, 100, 150], Array.from({ length: 40 }, (_, i) => i * 5)]) {
      const r = run(false, cuts);
      assert.equal(r.out, stream);
      assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 2 });
    }
  });

  it("strips only the usage-only chunk when the server added include_usage", () => {
    for (const cuts of [[], [17], Array.from({ length: 60 }, (_, i) => i * 3)]) {
      const r = run(true, cuts);
      assert.equal(
        r.out,
        stream.replace(ev({ choices: [], usage: { prompt_tokens: 7, completion_tokens: 2 } }), ""),
      );
      assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 2 });
    }
  });
});

describe("parseEngineLoad", () => {
  it("reads vLLM (summing engines), SGLang and ATOM gauges", () => {
    const vllm = [
      "# HELP vllm:num_requests_running x",
      'vllm:num_requests_running{model_name="m",engine="0"} 3',
      'vllm:num_requests_running{model_name="m",engine="1"} 2',
      'vllm:num_requests_waiting{model_name="m",engine="0"} 4',
      'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.5',
      'vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.25',
      'vllm:num_requests_running_other{model_name="m"} 99',
    ].join("\n");
    const v = parseEngineLoad(vllm, 1)!;
    assert.deepEqual(v, { running: 5, waiting: 4, kvUsage: 0.375, scrapedAt: 1 });
    const s = parseEngineLoad(
      'sglang:num_running_reqs{tp_rank="0"} 1.0\nsglang:num_queue_reqs 2\nsglang:token_usage 0.1\n',
      2,
    )!;
    assert.deepEqual(s, { running: 1, waiting: 2, kvUsage: 0.1, scrapedAt: 2 });
    const a = parseEngineLoad(
      "atom:requests_running 6\natom:requests_waiting 0\natom:kv_cache_usage_ratio 0.9 1700000000\n",
      3,
    )!;
    assert.deepEqual(a, { running: 6, waiting: 0, kvUsage: 0.9, scrapedAt: 3 });
    assert.equal(parseEngineLoad("other_metric 1\n"), null);
  });
});

describe("config layers", () => {
  it("file < env < flags, field by field; workers imply static discovery", () => {
    const dir = mkdtempSync(join(tmpdir(), "infera-cfg-"));
    try {
      const file = join(dir, "c.yaml");
      writeFileSync(
        file,
        "port: 9001\npolicy: kv-aware\nmaxRetries: 5\ndiscovery:\n  workers: [http://127.0.0.1:1]\n",
      );
      const saved = { ...process.env };
      process.env.INFERA_PORT = "9002";
      process.env.INFERA_API_KEYS = "a, b";
      try {
        const c = resolveServerConfig({ port: 9003, policy: undefined }, file);
        assert.equal(c.port, 9003);
        assert.equal(c.policy, "kv-aware");
        assert.equal(c.maxRetries, 5);
        assert.deepEqual(c.apiKeys, ["a", "b"]);
        assert.equal(c.discovery.kind, "static");
        assert.equal(resolveServerConfig({}, file).port, 9002);
      } finally {
        process.env = saved;
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    assert.equal(mergeConfig({}).discovery.kind, "memory");
    assert.equal(
      mergeConfig({ discovery: { kind: "etcd" } }, { discovery: { workers: ["http://x:1"] } }).discovery.kind,
      "etcd",
    );
    assert.deepEqual(
      configFromEnv({ INFERA_ETCD: "http://e1:2379,http://e2:2379" }).discovery?.etcdEndpoints,
      ["http://e1:2379", "http://e2:2379"],
    );
    assert.throws(() => mergeConfig({ port: 70000 }));
    assert.equal(parseSize("4MiB"), 4 * 1024 * 1024);
    assert.equal(parseSize("512k"), 512 * 1024);
    assert.equal(parseSize("1000"), 1000);
  });
});

describe("WorkerSet circuit breaker and round-robin", () => {
  const rec = (id: string) =>
    completeRecord({ id, url: `http://127.0.0.1:1/${id}`, model: "m", servedModelNames: ["m"] });

  it("connect errors open at once, 5xx after the threshold; the half-open probe closes it", async () => {
    const memory = new MemoryDiscovery([rec("a"), rec("b")]);
    let healthy = false;
    let probes = 0;
    const ws = new WorkerSet(memory, {
      logger,
      breaker: { cooldownMs: 20, failureThreshold: 3 },
      probe: async () => {
        probes++;
        return healthy;
      },
    });
    ws.attach();
    const a = ws.get("a")!;
    const b = ws.get("b")!;
    ws.reportFailure(a, "connect");
    assert.equal(a.available, false);
    assert.deepEqual(ws.group("m")!.available, [b]);
    ws.reportFailure(b, "5xx");
    ws.reportFailure(b, "5xx");
    ws.reportSuccess(b);
    ws.reportFailure(b, "5xx");
    ws.reportFailure(b, "5xx");
    assert.equal(b.available, true, "successes reset the 5xx streak");
    ws.reportFailure(b, "5xx");
    assert.equal(b.available, false);
    await new Promise((r) => setTimeout(r, 80));
    assert.ok(probes >= 2, "half-open probes ran");
    assert.equal(a.available, false);
    healthy = true;
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(a.available, true);
    assert.equal(b.available, true);
    assert.equal(a.breaker, "closed");
    await ws.close();
  });

  it("round-robin is an exact spread over the candidates", () => {
    const memory = new MemoryDiscovery([rec("a"), rec("b"), rec("c")]);
    const ws = new WorkerSet(memory, { logger });
    ws.attach();
    const p = createRoundRobin({ logger, options: {} });
    const counts: Record<string, number> = {};
    const cands = ws.group("m")!.available;
    for (let i = 0; i < 300; i++) {
      const id = p.select({} as RoutingRequest, cands).worker.record.id;
      counts[id] = (counts[id] ?? 0) + 1;
    }
    assert.deepEqual(counts, { a: 100, b: 100, c: 100 });
  });
});

describe("request validation fast path", () => {
  it("accepts exactly what the zod schema accepts (randomised bodies)", async () => {
    const { parseChatRequest, parseCompletionRequest, chatCompletionRequestSchema, completionRequestSchema } =
      await import("../../src/protocol/openai.ts");
    const values: unknown[] = [
      undefined,
      null,
      true,
      false,
      0,
      1,
      2,
      -1,
      0.5,
      3,
      2.5,
      "",
      "x",
      [],
      ["a"],
      [1, 2],
      [[1]],
      {},
      { include_usage: true },
      { include_usage: "y" },
      [1.5],
      21,
    ];
    const messages: unknown[] = [
      [{ role: "user", content: "hi" }],
      [{ role: "user", content: null, name: "n" }],
      [{ role: "user", content: [{ type: "text", text: "a" }] }],
      [{ role: "user", content: 5 }],
      [{ role: 1, content: "x" }],
      [{ role: "user", name: null }],
      [],
      "x",
      [null],
    ];
    const fields = [
      "stream",
      "stream_options",
      "max_tokens",
      "n",
      "temperature",
      "top_p",
      "presence_penalty",
      "seed",
      "stop",
      "user",
      "cache_salt",
      "kv_transfer_params",
      "max_completion_tokens",
      "echo",
      "logprobs",
      "top_logprobs",
    ];
    let seed = 12345;
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed % n;
    };
    const accepts = (f: (b: unknown) => unknown, b: unknown) => {
      try {
        f(b);
        return true;
      } catch {
        return false;
      }
    };
    let accepted = 0;
    for (let i = 0; i < 3000; i++) {
      const b: Record<string, unknown> = { model: rnd(10) === 0 ? values[rnd(values.length)] : "m" };
      for (let k = rnd(3); k < 3; k++) {
        const f = fields[rnd(fields.length)]!;
        const v = values[rnd(values.length)];
        if (v !== undefined) b[f] = v;
      }
      const chat = { ...b, messages: messages[rnd(messages.length)] };
      const comp = { ...b, prompt: [values[rnd(values.length)], "p", [1, 2, 3], ["a", "b"]][rnd(4)] };
      const zc = chatCompletionRequestSchema.safeParse(chat).success;
      assert.equal(accepts(parseChatRequest, chat), zc, JSON.stringify(chat));
      assert.equal(
        accepts(parseCompletionRequest, comp),
        completionRequestSchema.safeParse(comp).success,
        JSON.stringify(comp),
      );
      if (zc) accepted++;
    }
    assert.ok(accepted > 50, `enough valid bodies were generated (${accepted})`);
  });
});

describe("streaming pump backpressure", () => {
  it("pauses the upstream body while the client socket is full, resumes on drain", async () => {
    const { PassThrough } = await import("node:stream");
    const { pump } = await import("../../src/server/proxy.ts");
    const body = new PassThrough();
    const res = new EventEmitter() as EventEmitter & { full: boolean };
    res.full = true;
    const seen: string[] = [];
    const done = pump(body, res as never, (c) => {
      seen.push(c.toString());
      return !res.full;
    });
    body.write("a");
    body.write("b");
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(seen, ["a"], "nothing more is read while the client is not draining");
    assert.equal(body.isPaused(), true);
    res.full = false;
    res.emit("drain");
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(seen, ["a", "b"]);
    body.end("c");
    await done;
    assert.deepEqual(seen, ["a", "b", "c"]);
  });

  it("rejects when the upstream body is destroyed mid-way", async () => {
    const { PassThrough } = await import("node:stream");
    const { pump } = await import("../../src/server/proxy.ts");
    const body = new PassThrough();
    const done = pump(body, null, () => true);
    body.write("x");
    body.destroy(new Error("reset"));
    await assert.rejects(done, /reset/);
  });
});

describe("AutoRouter and RoutingRequest", () => {
  const rec = (id: string, role: "mixed" | "prefill" | "decode") =>
    completeRecord({ id, url: `http://127.0.0.1:1/${id}`, model: "m", servedModelNames: ["m"], role });

  it("picks mixed until prefill and decode workers exist (with a factory), re-deciding on changes", async () => {
    const { AutoRouter } = await import("../../src/router/auto.ts");
    const memory = new MemoryDiscovery([rec("a", "mixed")]);
    const ws = new WorkerSet(memory, { logger });
    ws.attach();
    let built = 0;
    const factory = () => {
      built++;
      return { kind: "disagg" as const, handle: async () => Promise.reject(new Error("unused")) };
    };
    const auto = new AutoRouter({ workers: ws, policy: "round-robin", logger, disaggFactory: factory });
    assert.equal(auto.routerFor("m").kind, "mixed");
    memory.put(rec("p", "prefill"));
    assert.equal(auto.routerFor("m").kind, "mixed", "prefill alone is not enough");
    memory.put(rec("d", "decode"));
    assert.equal(auto.routerFor("m").kind, "disagg");
    assert.equal(auto.routerFor("m").kind, "disagg");
    assert.equal(built, 1, "the router is cached until membership changes");
    memory.remove("d");
    assert.equal(auto.routerFor("m").kind, "mixed");
    const noFactory = new AutoRouter({ workers: ws, policy: "round-robin", logger });
    memory.put(rec("d", "decode"));
    assert.equal(noFactory.routerFor("m").kind, "mixed");
    const forced = new AutoRouter({
      workers: ws,
      policy: "round-robin",
      logger,
      mode: "mixed",
      disaggFactory: factory,
    });
    assert.equal(forced.routerFor("m").kind, "mixed");
    assert.throws(() => auto.routerFor("nope"), /does not exist/);
    assert.throws(
      () => new AutoRouter({ workers: ws, policy: "no-such-policy", logger }),
      /unknown routing policy/,
    );
    assert.throws(
      () => new AutoRouter({ workers: ws, policy: "round-robin", logger, mode: "disagg" }),
      /disagg/,
    );
    auto.close();
  });

  it("prompt tokens: templated chat, completion strings and token arrays, computed once", async () => {
    const { ServerRoutingRequest } = await import("../../src/server/routing-request.ts");
    const { getDefaultTokenizer } = await import("../../src/kv/tokenizer.ts");
    const tok = getDefaultTokenizer();
    const messages = [
      { role: "system", content: "You are terse." },
      {
        role: "user",
        content: [
          { type: "text", text: "Hi " },
          { type: "text", text: "there" },
        ],
      },
    ];
    const chat = new ServerRoutingRequest("r", "m", "chat", { messages }, false, undefined, tok);
    assert.deepEqual(chat.promptTokens(), tok.encode(tok.applyChatTemplate(messages)));
    assert.equal(chat.promptTokens(), chat.promptTokens(), "memoised");
    assert.match(chat.promptText(), /Hi there/);
    const str = new ServerRoutingRequest("r", "m", "completion", { prompt: "Once upon" }, false, "salt", tok);
    assert.deepEqual(str.promptTokens(), tok.encode("Once upon"));
    assert.equal(str.cacheSalt, "salt");
    const ids = new ServerRoutingRequest(
      "r",
      "m",
      "completion",
      { prompt: [5, 6, 7] },
      false,
      undefined,
      tok,
    );
    assert.deepEqual(ids.promptTokens(), [5, 6, 7]);
    const batch = new ServerRoutingRequest(
      "r",
      "m",
      "completion",
      { prompt: [[1, 2], [3]] },
      false,
      undefined,
      tok,
    );
    assert.deepEqual(batch.promptTokens(), [1, 2]);
  });
});
