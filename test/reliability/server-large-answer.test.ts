/**
 * Large non-streamed answers (issue #17 item 3): six concurrent 64 MiB answers used to be held
 * whole by the server (836 MB RSS). Now an answer is held only up to maxResponseBufferBytes
 * (16 MiB by default) and relayed past it with backpressure. `infera server` and the worker run
 * as their own processes; the server's peak RSS growth is held to 6 × 16 MiB + 128 MiB, and
 * every client gets its whole answer. The 128 MiB over the buffer cap is the relayed pieces not
 * yet collected, which grows when the box is loaded (+121 MiB alone, +162 beside other files);
 * holding the answers whole grows by at least 6 × 64 = 384 MiB (836 MB RSS before the cap).
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
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
const MODEL = "big-model";
const ANSWER_MIB = 64;
const CONCURRENT = 6;
const BUFFER_MIB = 16;
/** Relayed 1 MiB pieces the GC has not collected yet (see the header). */
const SLACK_MIB = 128;

const procs: ChildProcess[] = [];
const dir = mkdtempSync(join(tmpdir(), "infera-big-"));
after(() => {
  for (const p of procs) p.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
  fileDone(import.meta.url);
});

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : 0;
}

/** A worker answering every completion with a valid 64 MiB JSON object, written in 1 MiB pieces. */
async function bigWorker(): Promise<string> {
  const port = await freePort();
  const src = `
    const { createServer } = require("node:http");
    const piece = "x".repeat(1024 * 1024);
    createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, { "content-type": "application/json" });
        if (req.method === "GET") return res.end(JSON.stringify({ object: "list", data: [{ id: ${JSON.stringify(MODEL)} }] }));
        res.write('{"id":"b","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"');
        let left = ${ANSWER_MIB};
        const more = () => {
          while (left > 0) { left--; if (!res.write(piece)) return res.once("drain", more); }
          res.end('"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":9,"total_tokens":10}}');
        };
        more();
      });
    }).listen(${port}, "127.0.0.1");`;
  procs.push(spawn(process.execPath, ["-e", src], { stdio: "ignore" }));
  const url = `http://127.0.0.1:${port}`;
  await waitFor200(`${url}/v1/models`, { timeoutMs: 10_000, what: "big worker", stepMs: 50 });
  return url;
}

test("six 64 MiB answers at once: server memory stays bounded", { timeout: 180_000 }, async () => {
  const workerUrl = await bigWorker();
  const port = await freePort();
  const cfg = join(dir, "server.json");
  writeFileSync(
    cfg,
    JSON.stringify({
      host: "127.0.0.1",
      port,
      scrapeIntervalMs: 0,
      discovery: {
        kind: "static",
        records: [
          { id: "w", url: workerUrl, model: MODEL, servedModelNames: [MODEL], engine: "vllm", role: "mixed" },
        ],
      },
    }),
  );
  const spawned = spawnInfera(["server", "--config", cfg], { logLevel: "error", keepChars: 4000 });
  procs.push(spawned.proc);
  const base = `http://127.0.0.1:${port}`;
  await waitFor200(`${base}/ready`, {
    // A deadline, not a wait: at load ~15 one start took longer than 20 s.
    timeoutMs: 60_000,
    what: "server ready",
    stepMs: 50,
    output: spawned.output,
  });
  const pid = spawned.proc.pid!;
  const baseline = rssKiB(pid);
  let peak = baseline;
  const sampler = setInterval(() => {
    peak = Math.max(peak, rssKiB(pid));
  }, 20);
  const t0 = performance.now();
  const sizes = await Promise.all(
    Array.from({ length: CONCURRENT }, async () => {
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "x" }] }),
      });
      let n = 0;
      let tail = "";
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        n += chunk.length;
        tail = (tail + Buffer.from(chunk).toString("latin1")).slice(-200);
      }
      return { status: res.status, bytes: n, complete: tail.includes('"completion_tokens":9') };
    }),
  );
  clearInterval(sampler);
  const s = (performance.now() - t0) / 1000;
  const growthMiB = (peak - baseline) / 1024;
  const limitMiB = CONCURRENT * BUFFER_MIB + SLACK_MIB;
  const whole = sizes.every((x) => x.status === 200 && x.complete && x.bytes > ANSWER_MIB * 1024 * 1024);
  const pass = whole && growthMiB <= limitMiB;
  const figure =
    `${CONCURRENT} × ${ANSWER_MIB} MiB answers in ${s.toFixed(1)} s, all whole: ${whole}; server RSS ` +
    `${(baseline / 1024).toFixed(0)} → peak ${(peak / 1024).toFixed(0)} MiB (+${growthMiB.toFixed(0)})`;
  record(
    import.meta.url,
    "large answers (buffer cap)",
    figure,
    `every answer whole; RSS growth ≤ ${CONCURRENT} × ${BUFFER_MIB} MiB buffer cap + ${SLACK_MIB} MiB = ${limitMiB} MiB`,
    pass,
  );
  assert.ok(whole, JSON.stringify(sizes));
  assert.ok(growthMiB <= limitMiB, figure);
});
