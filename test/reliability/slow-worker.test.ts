/**
 * Slow workers: a tiny raw HTTP worker (own process) that never answers ("stall-head") and one that sends
 * its headers (and one SSE event) then stalls ("stall-body"), behind `infera server` run as
 * its own process with 1 s upstream timeouts. The per-request (headers) timeout answers 504;
 * the idle (body) timeout ends a stream with an error event and [DONE] and a non-streamed
 * answer with 504. Three waves of 200 concurrent stalled requests: the server's RSS stays
 * bounded and nothing stays in flight.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { waitFor200 } from "../helpers/wait.ts";
import { streamChat } from "./load.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
const TIMEOUT_MS = 1000;
/**
 * How late after the configured timeout an answer may come: Node/undici check timeouts on a
 * coarse timer and the machine is shared. The goal column states this same window.
 */
const SLACK_MS = 1000;
const inWindow = (ms: number): boolean => ms >= TIMEOUT_MS - 50 && ms <= TIMEOUT_MS + SLACK_MS;

const fakes: ChildProcess[] = [];
let server: ChildProcess | undefined;
const dir = mkdtempSync(join(tmpdir(), "infera-slow-"));
after(async () => {
  server?.kill("SIGKILL");
  for (const f of fakes) f.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
  fileDone(import.meta.url);
});

/**
 * A worker that answers /health and /v1/models, and stalls every completion. It runs in its own
 * process: in this one, 200 concurrent clients could starve it past the 1 s headers timeout, and
 * a stall-body stream would then get a 504 instead of its headers (seen under load).
 */
async function fakeWorker(mode: "stall-head" | "stall-body"): Promise<string> {
  const port = await freePort();
  const event = `data: ${JSON.stringify({ object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: "x" } }] })}\n\n`;
  const src = `
    const { createServer } = require("node:http");
    createServer((req, res) => {
      if (req.method === "GET") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ object: "list", data: [{ id: ${JSON.stringify(mode)}, object: "model" }] }));
        return;
      }
      req.resume();
      if (${JSON.stringify(mode)} === "stall-body") {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(${JSON.stringify(event)});
      }
      // …and then nothing, ever.
    }).listen(${port}, "127.0.0.1");`;
  const child = spawn(process.execPath, ["-e", src], { stdio: "ignore" });
  fakes.push(child);
  const url = `http://127.0.0.1:${port}`;
  await waitFor200(`${url}/v1/models`, { timeoutMs: 10_000, what: mode, stepMs: 50 });
  return url;
}

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : 0;
}

async function post(base: string, body: unknown): Promise<{ status: number; json: unknown; ms: number }> {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: res.status, json, ms: performance.now() - t0 };
}

const isOpenAiError = (j: unknown): boolean => {
  const e = (j as { error?: Record<string, unknown> } | null)?.error;
  return !!e && typeof e.message === "string" && typeof e.type === "string" && "param" in e && "code" in e;
};

test("slow workers: timeouts fire, memory stays bounded", { timeout: 60_000 }, async () => {
  const headUrl = await fakeWorker("stall-head");
  const bodyUrl = await fakeWorker("stall-body");
  const rec = (id: string, url: string) => ({
    id,
    url,
    model: id,
    servedModelNames: [id],
    engine: "vllm",
    role: "mixed",
  });
  const port = await freePort();
  const cfg = join(dir, "server.json");
  writeFileSync(
    cfg,
    JSON.stringify({
      host: "127.0.0.1",
      port,
      scrapeIntervalMs: 0,
      discovery: { kind: "static", records: [rec("stall-head", headUrl), rec("stall-body", bodyUrl)] },
      upstream: { headersTimeoutMs: TIMEOUT_MS, bodyTimeoutMs: TIMEOUT_MS },
    }),
  );
  const spawned = spawnInfera(["server", "--config", cfg], { logLevel: "silent", keepChars: 4000 });
  server = spawned.proc;
  const base = `http://127.0.0.1:${port}`;
  await waitFor200(`${base}/ready`, {
    timeoutMs: 20_000,
    what: "server ready",
    stepMs: 50,
    output: spawned.output,
  });
  const pid = server.pid!;
  const msg = [{ role: "user", content: "hello" }];

  // Per-request (headers) timeout, streamed or not: 504 in OpenAI's shape.
  const head = await post(base, { model: "stall-head", messages: msg });
  const headStream = await post(base, { model: "stall-head", messages: msg, stream: true });
  // Idle (body) timeout: a non-streamed answer whose body never ends → 504 too.
  const body = await post(base, { model: "stall-body", messages: msg });
  // …and a stream that stalls after its first event ends with an error event and [DONE].
  const t0 = performance.now();
  const stream = await streamChat(base, { model: "stall-body", messages: msg });
  const streamMs = performance.now() - t0;

  // Memory: 3 waves of 200 concurrent stalled requests (half per worker, half streamed).
  const baseline = rssKiB(pid);
  let peak = baseline;
  const sampler = setInterval(() => {
    peak = Math.max(peak, rssKiB(pid));
  }, 50);
  const wavePeaks: number[] = [];
  let waveBad = 0;
  for (let w = 0; w < 3; w++) {
    const outs = await Promise.all(
      Array.from({ length: 200 }, (_, i) => {
        const model = i % 2 === 0 ? "stall-head" : "stall-body";
        if (i % 4 < 2) return post(base, { model, messages: msg }).then((r) => r.status === 504);
        return streamChat(base, { model, messages: msg }).then((r) =>
          model === "stall-head" ? r.status === 504 : r.status === 200 && r.error !== null && r.sawDone,
        );
      }),
    );
    waveBad += outs.filter((ok) => !ok).length;
    wavePeaks.push(peak);
  }
  clearInterval(sampler);
  const workers = (await (await fetch(`${base}/v1/workers`)).json()) as {
    data: Array<{ id: string; state: { inFlight: number } }>;
  };
  const inFlight = workers.data.reduce((n, w) => n + w.state.inFlight, 0);
  const growthMiB = (peak - baseline) / 1024;

  const timeoutsOk =
    inWindow(head.ms) &&
    inWindow(body.ms) &&
    inWindow(streamMs) &&
    head.status === 504 &&
    isOpenAiError(head.json) &&
    headStream.status === 504 &&
    body.status === 504 &&
    isOpenAiError(body.json) &&
    stream.status === 200 &&
    stream.error !== null &&
    stream.sawDone;
  const figure =
    `headers timeout → ${head.status} in ${head.ms.toFixed(0)} ms (stream: ${headStream.status}); ` +
    `idle timeout → non-streamed ${body.status} in ${body.ms.toFixed(0)} ms, stream error event + [DONE]=${stream.sawDone} ` +
    `in ${streamMs.toFixed(0)} ms; 600 stalled requests: ${waveBad} wrong answers, RSS ${(baseline / 1024).toFixed(0)} → peak ` +
    `${(peak / 1024).toFixed(0)} MiB (+${growthMiB.toFixed(0)}; per wave ${wavePeaks.map((p) => (p / 1024).toFixed(0)).join("/")}), in flight after ${inFlight}`;
  const pass = timeoutsOk && waveBad === 0 && growthMiB <= 64 && inFlight === 0;
  record(
    import.meta.url,
    "slow worker (stalls)",
    figure,
    `headers and idle timeouts → 504 / error event + [DONE] ${TIMEOUT_MS}–${TIMEOUT_MS + SLACK_MS} ms after the request (timeout ${TIMEOUT_MS} ms); 0 wrong answers of 600 stalled; RSS growth ≤ 64 MiB; 0 in flight after`,
    pass,
  );
  assert.equal(head.status, 504, JSON.stringify(head.json));
  assert.ok(isOpenAiError(head.json));
  assert.ok(inWindow(head.ms), `headers timeout took ${head.ms} ms`);
  assert.ok(inWindow(body.ms), `idle timeout (non-streamed) took ${body.ms} ms`);
  assert.ok(inWindow(streamMs), `idle timeout (stream) took ${streamMs} ms`);
  assert.equal(headStream.status, 504);
  assert.equal(body.status, 504, JSON.stringify(body.json));
  assert.ok(isOpenAiError(body.json));
  assert.equal(stream.status, 200);
  assert.ok(stream.error && stream.sawDone, "the stalled stream ended with an error event and [DONE]");
  assert.equal(waveBad, 0);
  assert.ok(growthMiB <= 64, `RSS grew ${growthMiB} MiB`);
  assert.equal(inFlight, 0);
});
