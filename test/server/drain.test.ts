/**
 * Graceful drain of `infera server` (a rolling update sends SIGTERM): it stops accepting, the
 * streams in flight finish within the grace period, and then it exits 0. Past the grace
 * period what is still running is cut and the server exits all the same. Real processes:
 * a slow sim, the server, the openai client.
 *
 * Issue #30 item 8: when the grace period runs out each cut stream ends with an error event
 * and `data: [DONE]` (it was a bare reset), and a keep-alive connection with a request in
 * flight at SIGTERM gets its answer, marked `connection: close`.
 */
import assert from "node:assert/strict";
import http from "node:http";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { serverArgs, spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";
import { waitFor200, waitUntil } from "../helpers/wait.ts";

async function refused(url: string): Promise<boolean> {
  try {
    await fetch(url, { signal: AbortSignal.timeout(2000) });
    return false;
  } catch {
    return true;
  }
}

describe("infera server: SIGTERM drains", () => {
  let sim: SimProcess;
  before(async () => {
    // Slow: a 60-token stream lasts seconds.
    sim = await startSim({ args: ["--speed", "0.1"] });
  });
  after(async () => {
    await sim?.stop();
  });

  async function server(drainS: string) {
    const port = await freePort();
    const { proc, output } = spawnInfera(serverArgs(port, "--worker", sim.url, "--drain-timeout", drainS), {
      logLevel: "info",
      keepChars: 8000,
      stdout: true,
    });
    const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
    const url = `http://127.0.0.1:${port}`;
    await waitFor200(`${url}/ready`, { timeoutMs: 30_000, what: "server ready", output });
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
    return { proc, output, exited, url, client };
  }

  it("a stream in flight at SIGTERM ends with every token; new connections are refused; exit 0", async (t) => {
    const s = await server("30");
    t.after(() => s.proc.kill("SIGKILL"));
    const stream = await s.client.completions.create({
      model: sim.model,
      prompt: "drain",
      max_tokens: 60,
      stream: true,
      stream_options: { include_usage: true },
      // vLLM's extra: run to max_tokens.
      ...({ ignore_eos: true } as object),
    });
    const it = stream[Symbol.asyncIterator]();
    const first = await it.next();
    assert.equal(first.done, false);
    const t0 = Date.now();
    s.proc.kill("SIGTERM");
    // The listener closes at once: a new connection is refused while the stream goes on. Polled
    // (the signal's handling is not instant on a loaded box), not checked once after 300 ms.
    await waitUntil(() => refused(`${s.url}/health`), 10_000, "new connections refused while draining");
    let completion = -1;
    for (;;) {
      const chunk = await it.next();
      if (chunk.done) break;
      if (chunk.value.usage) completion = chunk.value.usage.completion_tokens;
    }
    assert.equal(completion, 60, "the stream ran to its end");
    assert.ok(Date.now() - t0 > 500, "the stream outlived the SIGTERM");
    assert.equal(await s.exited, 0, s.output());
    assert.match(s.output(), /drain: all requests finished/);
  });

  it("past the grace period the stream is cut and the server exits 0 anyway", async (t) => {
    const s = await server("1");
    t.after(() => s.proc.kill("SIGKILL"));
    const stream = await s.client.completions.create({
      model: sim.model,
      prompt: "cut",
      max_tokens: 400,
      stream: true,
      ...({ ignore_eos: true } as object),
    });
    const it = stream[Symbol.asyncIterator]();
    assert.equal((await it.next()).done, false);
    const t0 = Date.now();
    s.proc.kill("SIGTERM");
    await assert.rejects(async () => {
      for (;;) if ((await it.next()).done) break;
    }, "the stream is cut after the grace period");
    assert.equal(await s.exited, 0, s.output());
    const took = Date.now() - t0;
    assert.ok(took >= 900 && took < 10_000, `exited after the 1 s grace period (${took} ms)`);
    assert.match(s.output(), /grace period over/);
  });

  it("past the grace period each cut stream gets an error event and [DONE]", async (t) => {
    const s = await server("1");
    t.after(() => s.proc.kill("SIGKILL"));
    const streams = await Promise.all(
      [0, 1, 2].map(() =>
        fetch(`${s.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            model: sim.model,
            prompt: "cut",
            max_tokens: 400,
            stream: true,
            ignore_eos: true,
          }),
        }),
      ),
    );
    const readers = streams.map(async (res) => {
      assert.equal(res.status, 200);
      let text = "";
      try {
        for await (const c of res.body!) text += Buffer.from(c).toString();
      } catch (err) {
        return { text, err: String(err) };
      }
      return { text, err: null };
    });
    await new Promise((r) => setTimeout(r, 300));
    s.proc.kill("SIGTERM");
    for (const r of await Promise.all(readers)) {
      assert.equal(r.err, null, "the stream ended cleanly, not reset");
      const events = r.text.split("\n\n").filter(Boolean);
      assert.equal(events.at(-1), "data: [DONE]", r.text.slice(-300));
      const last = JSON.parse(events.at(-2)!.replace(/^data: /, "")) as { error?: { code?: string } };
      assert.equal(last.error?.code, "server_draining");
    }
    assert.equal(await s.exited, 0, s.output());
  });

  it("past the grace period a translated stream ends with its API's failure event, not a reset", async (t) => {
    const s = await server("1");
    t.after(() => s.proc.kill("SIGKILL"));
    const open = (path: string, body: object) =>
      fetch(`${s.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: sim.model, stream: true, ...body }),
      });
    const [messages, responses] = await Promise.all([
      open("/v1/messages", { max_tokens: 400, messages: [{ role: "user", content: "cut" }] }),
      open("/v1/responses", { max_output_tokens: 400, input: "cut" }),
    ]);
    const read = async (res: Response) => {
      assert.equal(res.status, 200);
      let text = "";
      for await (const c of res.body!) text += Buffer.from(c).toString();
      return text.split("\n\n").filter(Boolean);
    };
    const reading = [read(messages), read(responses)];
    await new Promise((r) => setTimeout(r, 300));
    s.proc.kill("SIGTERM");
    const [m, r] = await Promise.all(reading);
    // Anthropic's stream parser throws on `event: error` (anthropic-sdk-typescript src/core/streaming.ts).
    assert.match(m!.at(-1)!, /^event: error\ndata: .*"api_error".*drain grace period over/s);
    assert.match(r!.at(-1)!, /^event: response\.failed\n/);
    assert.equal(await s.exited, 0, s.output());
  });

  it("a keep-alive connection with a request in flight at SIGTERM gets its answer with connection: close", async (t) => {
    const s = await server("30");
    t.after(() => s.proc.kill("SIGKILL"));
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    t.after(() => agent.destroy());
    const post = (max: number) =>
      new Promise<{ status: number; connection: string | undefined; body: string }>((resolve, reject) => {
        const req = http.request(
          `${s.url}/v1/completions`,
          { method: "POST", agent, headers: { "content-type": "application/json" } },
          (res) => {
            let body = "";
            res.on("data", (d) => {
              body += d;
            });
            res.on("end", () =>
              resolve({ status: res.statusCode!, connection: res.headers.connection, body }),
            );
          },
        );
        req.on("error", reject);
        req.end(JSON.stringify({ model: sim.model, prompt: "ka", max_tokens: max, ignore_eos: true }));
      });
    // A first answer opens the keep-alive connection, then a slow one is in flight at SIGTERM.
    assert.equal((await post(1)).connection, "keep-alive");
    const slow = post(20);
    await new Promise((r) => setTimeout(r, 300));
    s.proc.kill("SIGTERM");
    const r = await slow;
    assert.equal(r.status, 200, r.body);
    assert.equal(
      (JSON.parse(r.body) as { usage: { completion_tokens: number } }).usage.completion_tokens,
      20,
    );
    assert.equal(r.connection, "close");
    assert.equal(await s.exited, 0, s.output());
  });
});
