/**
 * Fuzz: ≥ 10,000 generated bad requests against `infera server` (its own process) —
 * malformed JSON, wrong types, huge fields, invalid UTF-8, odd routes and headers over
 * keep-alive undici connections; broken framing, oversized and slowloris-style bodies over
 * raw sockets. Goals: the server never crashes, every answer is a 4xx whose body has OpenAI's
 * error shape, and no bad request reaches the worker.
 */
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { type AddressInfo, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { Pool } from "undici";
import { parseChatRequest, parseCompletionRequest } from "../../src/protocol/openai.ts";
import { spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { waitFor200 } from "../helpers/wait.ts";
import {
  badFraming,
  CHAT,
  type HttpCase,
  hugeFields,
  invalidUtf8,
  MODEL,
  malformedJson,
  oddRoutes,
  rng,
  wrongTypes,
} from "./fuzz-cases.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
const LIMIT = 64 * 1024;
const SEED = Number(process.env.INFERA_FUZZ_SEED ?? 20261202);

let server: ChildProcess | undefined;
let worker: Server | undefined;
let pool: Pool | undefined;
const dir = mkdtempSync(join(tmpdir(), "infera-fuzz-"));
after(async () => {
  await pool?.destroy();
  server?.kill("SIGKILL");
  worker?.closeAllConnections();
  await new Promise((r) => (worker ? worker.close(r) : r(null)));
  rmSync(dir, { recursive: true, force: true });
  fileDone(import.meta.url);
});

interface Answer {
  status: number;
  body: string;
}

/** One request on its own socket, written in `pieces` with `gapMs` between them. */
function raw(port: number, bytes: Buffer, pieces = 1, gapMs = 0): Promise<Answer> {
  return new Promise((resolve) => {
    const s = connect(port, "127.0.0.1");
    let buf = Buffer.alloc(0);
    let settled = false;
    const finish = () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      s.destroy();
      const text = buf.toString("latin1");
      const end = text.indexOf("\r\n\r\n");
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0);
      resolve({ status, body: end >= 0 ? buf.subarray(end + 4).toString("utf8") : "" });
    };
    const timer = setTimeout(finish, 10_000);
    s.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const text = buf.toString("latin1");
      const end = text.indexOf("\r\n\r\n");
      if (end < 0) return;
      const len = /\r\ncontent-length: *(\d+)/i.exec(text.slice(0, end))?.[1];
      if (len !== undefined && buf.length - end - 4 >= Number(len)) finish();
    });
    s.on("close", finish);
    s.on("error", () => {});
    s.on("connect", async () => {
      const size = Math.ceil(bytes.length / pieces);
      for (let i = 0; i < pieces && !settled; i++) {
        s.write(bytes.subarray(i * size, (i + 1) * size));
        if (gapMs > 0 && i < pieces - 1) await new Promise((r) => setTimeout(r, gapMs));
      }
    });
  });
}

const isOpenAiError = (body: string): boolean => {
  try {
    const e = (JSON.parse(body) as { error?: Record<string, unknown> }).error;
    return (
      !!e &&
      typeof e.message === "string" &&
      typeof e.type === "string" &&
      "param" in e &&
      (e.param === null || typeof e.param === "string") &&
      "code" in e &&
      (e.code === null || typeof e.code === "string")
    );
  } catch {
    return false;
  }
};

/** A generated JSON case the server's own schema would accept for the served model is not bad. */
function accidentallyValid(c: HttpCase): boolean {
  if (c.method !== "POST" || !c.body) return false;
  try {
    const v = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(c.body)) as { model?: unknown };
    if (v?.model !== MODEL) return false;
    if (c.path === CHAT) parseChatRequest(v);
    else parseCompletionRequest(v);
    return true;
  } catch {
    return false;
  }
}

async function pooled(items: HttpCase[], concurrency: number): Promise<Answer[]> {
  const out: Answer[] = new Array(items.length);
  let next = 0;
  const lane = async () => {
    while (next < items.length) {
      const i = next++;
      const c = items[i]!;
      try {
        const res = await pool!.request({ method: c.method, path: c.path, headers: c.headers, body: c.body });
        out[i] = { status: res.statusCode, body: await res.body.text() };
      } catch (err) {
        out[i] = { status: 0, body: (err as Error).message };
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, lane));
  return out;
}

test("fuzz: ≥ 10,000 bad requests → 0 crashes, every answer a 4xx in OpenAI's shape", {
  timeout: 90_000,
}, async () => {
  let workerHits = 0;
  worker = createServer((req, res) => {
    req.resume();
    if (req.method === "POST") workerHits++;
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ object: "list", data: [{ id: MODEL }], choices: [] }));
  });
  await new Promise<void>((r) => worker!.listen(0, "127.0.0.1", r));
  const workerUrl = `http://127.0.0.1:${(worker.address() as AddressInfo).port}`;
  const port = await freePort();
  const cfg = join(dir, "server.json");
  writeFileSync(
    cfg,
    JSON.stringify({
      host: "127.0.0.1",
      port,
      scrapeIntervalMs: 0,
      maxBodyBytes: LIMIT,
      discovery: {
        kind: "static",
        records: [
          { id: "w", url: workerUrl, model: MODEL, servedModelNames: [MODEL], engine: "vllm", role: "mixed" },
        ],
      },
    }),
  );
  const spawned = spawnInfera(["server", "--config", cfg], { logLevel: "error", keepChars: 8000 });
  server = spawned.proc;
  const stderr = spawned.output;
  const base = `http://127.0.0.1:${port}`;
  await waitFor200(`${base}/ready`, {
    // A deadline, not a wait: at load ~15 one start took longer than 20 s.
    timeoutMs: 60_000,
    what: "server ready",
    stepMs: 50,
    output: stderr,
  });

  const r = rng(SEED);
  const gens: [number, () => HttpCase][] = [
    [2600, () => malformedJson(r)],
    [4000, () => wrongTypes(r)],
    [500, () => hugeFields(r, LIMIT)],
    [1300, () => invalidUtf8(r)],
    [1000, () => oddRoutes(r)],
  ];
  const cases: HttpCase[] = [];
  let regenerated = 0;
  for (const [n, gen] of gens) {
    for (let i = 0; i < n; i++) {
      let c = gen();
      while (accidentallyValid(c)) {
        regenerated++;
        c = gen();
      }
      cases.push(c);
    }
  }
  const t0 = performance.now();
  pool = new Pool(base, { connections: 8, pipelining: 1 });
  const answers = await pooled(cases, 16);
  const kinds = cases.map((c) => c.kind);

  // Raw sockets: broken framing / oversized, then slowloris-style bodies (bad JSON, trickled).
  const framing = Array.from({ length: 500 }, () => badFraming(r, LIMIT));
  for (let i = 0; i < framing.length; i += 25) {
    const batch = framing.slice(i, i + 25);
    answers.push(...(await Promise.all(batch.map((f) => raw(port, f.bytes)))));
    kinds.push(...batch.map((f) => f.kind));
  }
  const slow = Array.from({ length: 150 }, () => {
    const body = malformedJson(r).body!;
    return Buffer.concat([
      Buffer.from(
        `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`,
      ),
      body,
    ]);
  });
  answers.push(...(await Promise.all(slow.map((b) => raw(port, b, 8, 25)))));
  kinds.push(...slow.map(() => "slowloris"));
  const elapsedS = (performance.now() - t0) / 1000;

  const byStatus = new Map<number, number>();
  const bad: string[] = [];
  let notShaped = 0;
  let not4xx = 0;
  answers.forEach((a, i) => {
    byStatus.set(a.status, (byStatus.get(a.status) ?? 0) + 1);
    const is4xx = a.status >= 400 && a.status < 500;
    if (!is4xx) not4xx++;
    else if (!isOpenAiError(a.body)) notShaped++;
    if ((!is4xx || !isOpenAiError(a.body)) && bad.length < 5)
      bad.push(`${kinds[i]} → ${a.status} ${a.body.slice(0, 160)}`);
  });
  const alive = server.exitCode === null && server.signalCode === null && (await fetch(`${base}/health`)).ok;
  const statusText = [...byStatus.entries()]
    .sort((a, b) => a[0] - b[0])
    .map(([s, n]) => `${s}×${n}`)
    .join(", ");
  const figure =
    `${answers.length} bad requests in ${elapsedS.toFixed(1)} s: ${statusText}; non-4xx ${not4xx}, ` +
    `not OpenAI-shaped ${notShaped}, reached the worker ${workerHits}, crashes ${alive ? 0 : 1}`;
  const pass = answers.length >= 10_000 && not4xx === 0 && notShaped === 0 && workerHits === 0 && alive;
  record(
    import.meta.url,
    "fuzz (bad requests)",
    figure,
    "≥ 10,000; all 4xx in OpenAI shape; 0 reach the worker; 0 crashes",
    pass,
  );
  assert.ok(regenerated < cases.length / 10, `generator made ${regenerated} valid cases`);
  assert.ok(alive, `server died: ${stderr()}`);
  assert.ok(answers.length >= 10_000);
  assert.equal(not4xx, 0, bad.join("\n"));
  assert.equal(notShaped, 0, bad.join("\n"));
  assert.equal(workerHits, 0);
});
