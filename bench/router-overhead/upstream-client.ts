/**
 * The upstream half alone: CPU per request of the request plane's client, undici's `Pool`
 * (what `HttpExecutor` used until issue #32's lane U) against `Http1Pool` (what it uses now),
 * both driven through their core `dispatch` API with the same minimal handler, against one
 * upstream in a child process that answers every request at once with fixed bytes (a
 * Content-Length JSON answer, or a chunked event stream of 6 events). Interleaved rounds;
 * CPU is this process's user+system time over the timed requests. A third client is the
 * whole request plane as the server calls it: `HttpExecutor.send` (over `Http1Pool`) with its
 * answer body attached to a sink, as the relay does.
 *
 *   node bench/router-overhead/upstream-client.ts [--requests 20000] [--concurrency 16] [--rounds 3]
 */
import { spawn } from "node:child_process";
import { once } from "node:events";
import { loadavg } from "node:os";
import { Pool } from "undici";
import type { WorkerState } from "../../src/router/types.ts";
import { HttpExecutor } from "../../src/transport/http.ts";
import { Http1Pool } from "../../src/transport/http1/pool.ts";
import type { Http1Handler } from "../../src/transport/http1/request.ts";
import { setRawBody } from "../../src/transport/types.ts";
import { pairedArgs } from "../usage.ts";

const args = pairedArgs(process.argv.slice(2));
const REQUESTS = Number(args.get("requests") ?? 20000);
const CONCURRENCY = Number(args.get("concurrency") ?? 16);
const ROUNDS = Number(args.get("rounds") ?? 3);

const UPSTREAM = `
const net = require("node:net");
const json = '{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"four words of text"},"finish_reason":"length"}],"usage":{"prompt_tokens":23,"completion_tokens":4,"total_tokens":27}}';
const CL = "HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: " + json.length + "\\r\\nx-request-id: 87480d7331294e94a3994e09a47cf1b8\\r\\nDate: Sat, 05 Dec 2026 01:55:35 GMT\\r\\nConnection: keep-alive\\r\\nKeep-Alive: timeout=65\\r\\n\\r\\n" + json;
let sse = "HTTP/1.1 200 OK\\r\\ncontent-type: text/event-stream\\r\\nx-request-id: 87480d7331294e94a3994e09a47cf1b8\\r\\nDate: Sat, 05 Dec 2026 01:55:35 GMT\\r\\nConnection: keep-alive\\r\\nKeep-Alive: timeout=65\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n";
for (let i = 0; i < 5; i++) { const ev = 'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"w' + i + '"}}]}\\n\\n'; sse += ev.length.toString(16) + "\\r\\n" + ev + "\\r\\n"; }
sse += "e\\r\\ndata: [DONE]\\n\\n\\r\\n0\\r\\n\\r\\n";
net.createServer((s) => {
  s.setNoDelay(true);
  let buf = "";
  s.on("data", (d) => {
    buf += d.toString("latin1");
    for (;;) {
      const e = buf.indexOf("\\r\\n\\r\\n");
      if (e < 0) return;
      const len = Number(/content-length: (\\d+)/i.exec(buf.slice(0, e))?.[1] ?? 0);
      if (buf.length < e + 4 + len) return;
      const body = buf.slice(e + 4, e + 4 + len);
      buf = buf.slice(e + 4 + len);
      s.write(body.includes('"stream":true') ? sse : CL);
    }
  });
}).listen(0, "127.0.0.1", function () { process.stdout.write(String(this.address().port) + "\\n"); });
`;

type Dispatch = (body: Buffer, handler: Http1Handler) => void;

function once1(dispatch: Dispatch, body: Buffer): Promise<number> {
  return new Promise((resolve, reject) => {
    let n = 0;
    dispatch(body, {
      onConnect() {},
      onHeaders: () => true,
      onData: (c) => {
        n += c.length;
        return true;
      },
      onComplete: () => resolve(n),
      onError: reject,
    });
  });
}

/** The executor's send, its body attached to a sink as the server's relay attaches it. */
function viaExecutor(ex: HttpExecutor, worker: WorkerState, raw: Buffer, h: Http1Handler): void {
  const body = { model: "m" };
  setRawBody(body, raw);
  ex.send(worker, "chat", body, {
    signal: NEVER,
    headers: { "x-request-id": "87480d7331294e94a3994e09a47cf1b8" },
  }).then((up) => {
    const b = up.body as unknown as {
      attach(s: { onData(c: Uint8Array): boolean; onEnd(): void; onError(e: Error): void }): void;
    };
    b.attach({ onData: (c) => h.onData(c as Buffer), onEnd: () => h.onComplete([]), onError: h.onError });
  }, h.onError);
}

const NEVER = new AbortController().signal;

async function run(dispatch: Dispatch, body: Buffer, requests: number): Promise<number> {
  let next = 0;
  const cpu0 = process.cpuUsage();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next++ < requests) await once1(dispatch, body);
    }),
  );
  const cpu = process.cpuUsage(cpu0);
  return (cpu.user + cpu.system) / requests;
}

async function main(): Promise<void> {
  const child = spawn(process.execPath, ["-e", UPSTREAM], { stdio: ["ignore", "pipe", "inherit"] });
  const [line] = (await once(child.stdout!, "data")) as [Buffer];
  const origin = `http://127.0.0.1:${Number(line.toString())}`;
  const undiciPool = new Pool(origin, { connections: 256, pipelining: 1 });
  const rawPool = new Http1Pool(origin, { connections: 256 });
  const executor = new HttpExecutor();
  const worker = { record: { url: origin } } as unknown as WorkerState;
  const headers = { "content-type": "application/json", "x-request-id": "87480d7331294e94a3994e09a47cf1b8" };
  const clients: [string, Dispatch][] = [
    [
      "undici Pool",
      (body, h) => {
        undiciPool.dispatch({ path: "/v1/chat/completions", method: "POST", headers, body }, h as never);
      },
    ],
    [
      "Http1Pool",
      (body, h) => rawPool.dispatch({ path: "/v1/chat/completions", method: "POST", headers, body }, h),
    ],
    ["HttpExecutor.send", (body, h) => viaExecutor(executor, worker, body, h)],
  ];
  const load0 = loadavg()[0]!.toFixed(1);
  const out: Record<string, number[]> = {};
  for (const stream of [false, true]) {
    const body = Buffer.from(
      JSON.stringify({
        model: "m",
        messages: [{ role: "user", content: "Benchmark request 1." }],
        max_tokens: 4,
        stream,
      }),
    );
    for (const [, d] of clients) await run(d, body, 3000); // warm-up
    for (let r = 0; r < ROUNDS; r++)
      for (const [name, d] of clients) {
        const key = `${name}, ${stream ? "chunked SSE" : "Content-Length"}`;
        const v = out[key] ?? [];
        out[key] = v;
        v.push(await run(d, body, REQUESTS));
      }
  }
  console.log(
    `load average ${load0} at start, ${loadavg()[0]!.toFixed(1)} at end; ${REQUESTS} requests × ${ROUNDS} rounds at concurrency ${CONCURRENCY}`,
  );
  console.log("| client, answer | CPU µs/request (each round) | median |");
  console.log("|---|---|---|");
  for (const [k, v] of Object.entries(out)) {
    const m = [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
    console.log(`| ${k} | ${v.map((x) => x.toFixed(1)).join(", ")} | ${m.toFixed(1)} |`);
  }
  await undiciPool.destroy();
  await rawPool.destroy();
  await executor.close();
  child.kill();
}

await main();
