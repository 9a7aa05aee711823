/**
 * Server hardening (issues #16 item 9 and #17): what the router passes to the engine, body
 * depth, worker answers that are not valid, large answers, time limits, /metrics access and
 * echoed input. Real HTTP throughout: sims, a misbehaving raw worker, the `openai` client.
 */
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { connect } from "node:net";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { HUGE_BYTES, misbehavingWorker } from "../helpers/broken-worker.ts";
import { type Cluster, startCluster } from "./cluster.ts";

interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

const apiErr = (e: unknown) => e as InstanceType<typeof OpenAI.APIError>;

describe("#16: fields vLLM accepts reach the engine; its own answer comes back", () => {
  let c: Cluster;
  let direct: OpenAI;
  before(async () => {
    c = await startCluster(1);
    direct = new OpenAI({ baseURL: `${c.sims[0]!.url}/v1`, apiKey: "none", maxRetries: 0 });
  });
  after(async () => {
    await c?.close();
  });

  /** The same request, through the server and straight to the engine: same status and message. */
  async function sameAsEngine(send: (client: OpenAI) => Promise<unknown>): Promise<void> {
    const outcome = (p: Promise<unknown>) =>
      p.then(
        () => ({ status: 200, message: "" }),
        (e: unknown) => ({ status: apiErr(e).status, message: apiErr(e).message }),
      );
    const viaServer = await outcome(send(c.client));
    const viaEngine = await outcome(send(direct));
    assert.deepEqual(viaServer, viaEngine);
  }

  // vLLM: `temperature: float | None` with no upper bound
  // (vllm-project/vllm vllm/entrypoints/openai/chat_completion/protocol.py @ 002032ee2b18e1f7bd924ec47b62504ba3866063).
  it("temperature above 2 is served", async () => {
    const r = await c.client.chat.completions.create({
      model: "sim-model",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 2,
      temperature: 3,
    });
    assert.equal(r.choices.length, 1);
  });

  // vLLM: `top_logprobs: TopLogprobsParam`, bounded by the engine's --max-logprobs, not by 20
  // (same file and commit); the sim runs with the default 20, so 25 is the engine's own 400.
  it("top_logprobs above 20: the engine's --max-logprobs decides", async () => {
    const send = (client: OpenAI) =>
      client.chat.completions.create({
        model: "sim-model",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 1,
        logprobs: true,
        top_logprobs: 25,
      });
    await assert.rejects(send(c.client), (e: unknown) =>
      /max allowed logprobs of 20/.test(apiErr(e).message),
    );
    await sameAsEngine(send);
    // A stream request's error answer is JSON, relayed (and checked) like a non-streamed one.
    await sameAsEngine((client) =>
      client.chat.completions.create({
        model: "sim-model",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 1,
        logprobs: true,
        top_logprobs: 25,
        stream: true,
      }),
    );
  });

  // vLLM: `max_tokens: int | None` and `echo_without_generation = self.echo and self.max_tokens == 0`
  // (vllm-project/vllm vllm/entrypoints/openai/completion/protocol.py @ 002032ee2b18e1f7bd924ec47b62504ba3866063).
  it("max_tokens: 0 with echo is the engine's to judge", async () => {
    await sameAsEngine((client) =>
      client.completions.create({ model: "sim-model", prompt: "Once upon", max_tokens: 0, echo: true }),
    );
  });

  // vLLM: `prompt` is optional; validate_prompt_and_prompt_embeds wants one of the two (same file).
  it("prompt_embeds without prompt is the engine's to judge", async () => {
    await sameAsEngine((client) =>
      client.completions.create({
        model: "sim-model",
        prompt_embeds: "AAAA",
        max_tokens: 1,
      } as unknown as OpenAI.CompletionCreateParamsNonStreaming),
    );
  });

  it("neither prompt nor prompt_embeds → the router's 400 naming prompt", async () => {
    await assert.rejects(
      c.client.completions.create({
        model: "sim-model",
        max_tokens: 1,
      } as unknown as OpenAI.CompletionCreateParamsNonStreaming),
      (e: unknown) => apiErr(e).status === 400 && (apiErr(e).error as ErrorBody["error"]).param === "prompt",
    );
  });

  it("a body nested past the depth limit → 400, not a 500 from the re-serialiser", async () => {
    const depth = 20_000;
    // `stop` as a list takes the validated (re-serialised) path.
    const body = `{"model":"sim-model","messages":[{"role":"user","content":"x"}],"stop":["a"],"x":${"[".repeat(depth)}${"]".repeat(depth)}}`;
    const res = await fetch(`${c.server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
    assert.equal(res.status, 400);
    const j = (await res.json()) as ErrorBody;
    assert.equal(j.error.type, "invalid_request_error");
    assert.match(j.error.message, /nested deeper than/);
  });

  it("a 3 MB model name is not echoed whole", async () => {
    const model = "m".repeat(3 * 1024 * 1024 - 200);
    const res = await fetch(`${c.server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, messages: [{ role: "user", content: "x" }] }),
    });
    assert.equal(res.status, 404);
    const text = await res.text();
    assert.ok(text.length < 2000, `error body of ${text.length} bytes`);
    assert.equal((JSON.parse(text) as ErrorBody).error.code, "model_not_found");
  });
});

describe("#17: worker answers that are not valid, large answers, limits, /metrics", () => {
  let worker: ReturnType<typeof misbehavingWorker>;
  let server: InferaServer;
  let client: OpenAI;
  const MODELS = ["bad-json", "plain-500", "bad-status", "garbage-sse", "garbage-tail", "huge", "ok"];

  before(async () => {
    worker = misbehavingWorker();
    await new Promise<void>((r) => worker.server.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(worker.server.address() as AddressInfo).port}`;
    const memory = new MemoryDiscovery(
      MODELS.map((m) => completeRecord({ id: m, url, model: m, servedModelNames: [m], role: "mixed" })),
    );
    server = await startServer(
      {
        port: 0,
        scrapeIntervalMs: 0,
        apiKeys: ["sk-1"],
        metricsPublic: true,
        maxResponseBufferBytes: 1024 * 1024,
        // Not the 1 s of the trickle test below (its own server): every request of these tests
        // would then have to arrive within a second, and on a loaded CI box some did not (408).
        requestTimeoutMs: 60_000,
      },
      { discovery: memory },
    );
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "sk-1", maxRetries: 0 });
  });
  after(async () => {
    worker?.release();
    await server?.close();
    for (const s of worker?.sockets ?? []) s.destroy();
    await new Promise((r) => worker?.server.close(r));
  });

  const ask = (model: string) =>
    client.chat.completions.create({ model, messages: [{ role: "user", content: "x" }] });

  for (const model of ["bad-json", "plain-500", "bad-status"]) {
    it(`${model}: 502 in OpenAI's shape`, async () => {
      await assert.rejects(ask(model), (e: unknown) => {
        const err = apiErr(e);
        const body = err.error as ErrorBody["error"];
        return (
          err.status === 502 && body.type === "server_error" && body.code === "upstream_invalid_response"
        );
      });
    });
  }

  for (const model of ["garbage-sse", "garbage-tail"]) {
    it(`${model}: the stream's client gets an error event, then [DONE]`, async () => {
      const stream = await client.chat.completions.create({
        model,
        messages: [{ role: "user", content: "x" }],
        stream: true,
      });
      let chunks = 0;
      await assert.rejects(
        (async () => {
          for await (const _ of stream) chunks++;
        })(),
        (e: unknown) => e instanceof OpenAI.APIError && /not an OpenAI event stream/.test(e.message),
      );
      assert.equal(chunks, 1, "the valid event before the garbage was relayed");
      const res = await fetch(`${server.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: "Bearer sk-1", "content-type": "application/json" },
        body: JSON.stringify({ model, messages: [{ role: "user", content: "x" }], stream: true }),
      });
      const text = await res.text();
      assert.ok(!text.includes("html") && !text.includes("not an event"), text);
      assert.ok(text.endsWith("data: [DONE]\n\n"), text);
    });
  }

  it("an answer past maxResponseBufferBytes is relayed as it arrives, not held whole", async () => {
    const res = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: "Bearer sk-1", "content-type": "application/json" },
      body: JSON.stringify({ model: "huge", messages: [{ role: "user", content: "x" }] }),
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-length"), null);
    const reader = res.body!.getReader();
    let got = 0;
    const first = await Promise.race([
      reader.read(),
      new Promise<null>((r) => setTimeout(() => r(null), 5000).unref()),
    ]);
    assert.ok(first && !first.done, "bytes arrived before the worker finished its answer");
    got += first.value!.length;
    worker.release();
    const parts: Uint8Array[] = [first.value!];
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      got += value.length;
      parts.push(value);
    }
    const json = JSON.parse(Buffer.concat(parts).toString()) as { usage: { completion_tokens: number } };
    assert.equal(json.usage.completion_tokens, 7);
    assert.ok(got > HUGE_BYTES);
  });

  it("requestTimeoutMs: a body trickled slower than the limit gets 408", async (t) => {
    const strict = await startServer(
      { port: 0, scrapeIntervalMs: 0, apiKeys: ["sk-1"], requestTimeoutMs: 1000 },
      // No worker: the request never gets that far.
      { discovery: new MemoryDiscovery([]) },
    );
    t.after(() => strict.close());
    // Bytes of the 100-byte body sent so far: the 408 must come while it is still incomplete
    // (one byte per 200 ms: 20 s in all), whatever the box's speed.
    let sent = 0;
    const reply = await new Promise<string>((resolve) => {
      const s = connect(strict.port, "127.0.0.1", () => {
        s.write(
          "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
        );
        sent = 1;
        const t = setInterval(() => {
          s.write(" ");
          sent++;
        }, 200);
        s.on("close", () => clearInterval(t));
      });
      let out = "";
      s.on("data", (d) => {
        out += d.toString();
      });
      s.on("close", () => resolve(out));
      s.on("error", () => {});
    });
    assert.match(reply, /^HTTP\/1\.1 408/);
    assert.ok(sent < 100, `408 before the body was complete (${sent} of 100 bytes sent)`);
  });

  it("/metrics: public with metricsPublic even though keys are set; /v1/models still needs one", async () => {
    assert.equal((await fetch(`${server.url}/metrics`)).status, 200);
    assert.equal((await fetch(`${server.url}/v1/models`)).status, 401);
  });
});
