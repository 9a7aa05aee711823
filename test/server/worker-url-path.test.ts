/**
 * Issue #30 item 5: a worker URL with a path (vLLM behind a path-rewriting gateway, e.g.
 * `http://gw/team-a/llama` → the engine's `/`) made every request of its model a 500 with
 * nothing logged: undici's `new Pool(url)` throws UND_ERR_INVALID_ARG for a URL with a path,
 * and proxy.ts logged a 5xx only when its error had no `code`. Now the path is a prefix of
 * every request path, and every 5xx the server answers is logged with its cause.
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import pino from "pino";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { freePort } from "../helpers/ports.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

const PREFIX = "/team-a/llama";

/** A gateway that serves the engine under PREFIX only (strips it, as a rewriting proxy does). */
function startGateway(target: URL): Promise<{ server: http.Server; url: string; seen: string[] }> {
  const seen: string[] = [];
  const server = http.createServer((req, res) => {
    seen.push(req.url ?? "");
    if (!req.url?.startsWith(`${PREFIX}/`)) {
      res.writeHead(404).end("no such route on the gateway");
      return;
    }
    const up = http.request(
      {
        host: target.hostname,
        port: target.port,
        path: req.url.slice(PREFIX.length),
        method: req.method,
        headers: req.headers,
      },
      (ur) => {
        res.writeHead(ur.statusCode ?? 502, ur.headers);
        ur.pipe(res);
      },
    );
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({ server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen }),
    ),
  );
}

function captureLogger(): { logger: pino.Logger; lines: () => Record<string, unknown>[] } {
  const out: string[] = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      out.push(...String(chunk).split("\n").filter(Boolean));
      cb();
    },
  });
  return { logger: pino({ level: "info" }, stream), lines: () => out.map((l) => JSON.parse(l)) };
}

describe("a worker URL with a path (issue #30 item 5)", () => {
  let sim: SimProcess;
  let gw: Awaited<ReturnType<typeof startGateway>>;
  let server: InferaServer;
  const log = captureLogger();
  let deadPort: number;

  before(async () => {
    sim = await startSim({ model: "prefixed", args: ["--speed", "100", "--seed", "1"], timeoutMs: 60_000 });
    gw = await startGateway(new URL(sim.url));
    deadPort = await freePort();
    const memory = new MemoryDiscovery([
      completeRecord({ id: "behind-gw", url: `${gw.url}${PREFIX}/`, model: "prefixed", engine: "vllm" }),
      completeRecord({ id: "dead", url: `http://127.0.0.1:${deadPort}/x`, model: "dead", engine: "vllm" }),
    ]);
    server = await startServer({ port: 0, scrapeIntervalMs: 0 }, { discovery: memory, logger: log.logger });
    // Health checks go to the URL's path too (`${url}/health`): wait until the worker is live.
    const deadline = Date.now() + 15_000;
    for (;;) {
      const m = (await (await fetch(`${server.url}/v1/models`)).json()) as { data: { id: string }[] };
      if (m.data.some((d) => d.id === "prefixed")) break;
      if (Date.now() > deadline) throw new Error(`never live: ${JSON.stringify(m)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  });
  after(async () => {
    await server?.close();
    gw?.server.close();
    await sim?.stop();
  });

  it("requests go to the URL's path + /v1/..., streamed and not (openai client)", async () => {
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
    const r = await client.chat.completions.create({
      model: "prefixed",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
    });
    assert.equal(r.usage?.completion_tokens, 4);
    const s = await client.completions.create({
      model: "prefixed",
      prompt: "hi",
      max_tokens: 3,
      stream: true,
    });
    let n = 0;
    for await (const ch of s) n += ch.choices[0]?.text ? 1 : 0;
    assert.ok(n >= 1);
    assert.ok(gw.seen.includes(`${PREFIX}/v1/chat/completions`), gw.seen.join(","));
    assert.ok(gw.seen.includes(`${PREFIX}/v1/completions`), gw.seen.join(","));
  });

  it("a 5xx with an error code is logged with its cause", async () => {
    const res = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "dead", messages: [{ role: "user", content: "x" }], max_tokens: 2 }),
    });
    const body = (await res.json()) as { error: { code: string } };
    assert.ok(res.status >= 500, String(res.status));
    assert.ok(body.error.code, "the answer has a code");
    const requestId = res.headers.get("x-request-id");
    const line = log.lines().find((l) => String(l.msg).startsWith(`answered ${res.status}`));
    assert.ok(line, `no log line for the ${res.status}: ${JSON.stringify(log.lines().slice(-5))}`);
    assert.equal(line.status, res.status);
    assert.equal(line.code, body.error.code);
    assert.equal(line.requestId, requestId);
    assert.ok((line.err as { message?: string })?.message, "the cause is logged");
  });
});
