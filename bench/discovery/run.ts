/**
 * etcd discovery at fleet scale: 1,000 workers registered directly with etcd3 (one lease
 * each, as 1,000 launchers would), then
 *   - EtcdWatcher: time to load them (start()), heap used, time to see one new worker /
 *     one revoke (p50/p99 over many probes), time to follow a burst of 1,000 updates;
 *   - infera server --discovery etcd (a real process): time until /v1/workers lists all
 *     1,000, its RSS beside an idle server on an empty prefix, and time until /v1/models
 *     shows a newly registered model.
 * Run: node --expose-gc bench/discovery/run.ts [--workers 1000] [--probes 50]
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Etcd3, type Lease } from "etcd3";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { handleFatalSignals, killOnExit } from "../../src/util/child-process.ts";
import { startEtcd } from "../../test/helpers/etcd.ts";
import { serverArgs } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";

const arg = (name: string, dflt: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const N = arg("workers", 1000);
const PROBES = arg("probes", 50);
const PREFIX = "/bench";
const INFERA = fileURLToPath(new URL("../../bin/infera.js", import.meta.url));
process.env.INFERA_LOG_LEVEL ??= "silent";

function record(i: number, model = `model-${i % 10}`): WorkerRecord {
  return {
    id: `w-${i}`,
    model,
    servedModelNames: [model],
    engine: "vllm",
    role: i % 3 === 0 ? "prefill" : i % 3 === 1 ? "decode" : "mixed",
    url: `http://10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}:8000`,
    connector: { kind: "nixl", bootstrapHost: "10.0.0.1", bootstrapPort: 5600 },
    blockSize: 16,
    dpSize: 1,
    tpSize: 8,
    maxModelLen: 131072,
    startedAt: new Date().toISOString(),
    labels: { host: `node-${i}`, zone: `z${i % 4}` },
  };
}
const key = (r: WorkerRecord) =>
  `${PREFIX}/workers/${encodeURIComponent(r.model)}/${encodeURIComponent(r.id)}`;

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
};
const ms = (x: number) => `${x.toFixed(1)} ms`;
const mib = (b: number) => `${(b / 1024 / 1024).toFixed(1)} MiB`;
const gc = (globalThis as { gc?: () => void }).gc;

async function pool<T>(items: T[], width: number, fn: (t: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (next < items.length) await fn(items[next++] as T);
    }),
  );
}

function rssOf(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) * 1024 : Number.NaN;
}

async function startServer(endpoint: string, prefix: string): Promise<{ proc: ChildProcess; base: string }> {
  const port = await freePort();
  const proc = spawn(
    process.execPath,
    [
      INFERA,
      ...serverArgs(port),
      "--discovery",
      "etcd",
      "--etcd",
      endpoint,
      "--discovery-prefix",
      prefix,
      "--scrape-interval",
      "0",
    ],
    { stdio: "ignore", env: { ...process.env, INFERA_LOG_LEVEL: "warn" } },
  );
  killOnExit(proc);
  return { proc, base: `http://127.0.0.1:${port}` };
}

async function poll(cond: () => Promise<boolean>, timeoutMs: number, everyMs = 2): Promise<number> {
  const t0 = performance.now();
  for (;;) {
    try {
      if (await cond()) return performance.now() - t0;
    } catch {
      // not up yet
    }
    if (performance.now() - t0 > timeoutMs) throw new Error("timeout");
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

async function main(): Promise<void> {
  const etcd = await startEtcd();
  const raw = new Etcd3({ hosts: etcd.endpoint });
  const leases: Lease[] = [];
  const children: ChildProcess[] = [];
  try {
    // 1. Register N workers, one lease each (no keep-alive needed inside a short run).
    const t0 = performance.now();
    await pool(
      Array.from({ length: N }, (_, i) => i),
      64,
      async (i) => {
        const lease = raw.lease(120, { autoKeepAlive: false });
        leases.push(lease);
        await lease.put(key(record(i))).value(JSON.stringify(record(i)));
      },
    );
    const registerMs = performance.now() - t0;

    // 2. Watcher load time and heap.
    gc?.();
    const heap0 = process.memoryUsage().heapUsed;
    const watcher = new EtcdWatcher({ endpoints: [etcd.endpoint], prefix: PREFIX });
    const s0 = performance.now();
    await watcher.start();
    const loadMs = performance.now() - s0;
    gc?.();
    const heapDelta = process.memoryUsage().heapUsed - heap0;
    if (watcher.workers().length !== N) throw new Error(`watcher saw ${watcher.workers().length}/${N}`);

    // 3. Time to see one change (put of a new worker, then its revoke).
    const putLat: number[] = [];
    const delLat: number[] = [];
    for (let p = 0; p < PROBES; p++) {
      const rec = record(N + p, "probe");
      const seen = (type: "put" | "delete") =>
        new Promise<number>((resolve) => {
          const off = watcher.onChange((ev) => {
            const id = ev.type === "put" ? ev.worker.id : ev.type === "delete" ? ev.id : "";
            if (ev.type === type && id === rec.id) {
              off();
              resolve(performance.now());
            }
          });
        });
      const lease = raw.lease(30, { autoKeepAlive: false });
      await lease.grant();
      const gotPut = seen("put");
      const a = performance.now();
      await lease.put(key(rec)).value(JSON.stringify(rec));
      putLat.push((await gotPut) - a);
      const gotDel = seen("delete");
      const b = performance.now();
      await lease.revoke();
      delLat.push((await gotDel) - b);
    }

    // 4. Follow a burst: every worker re-puts its record (e.g. all relaunched).
    let updates = 0;
    const burstDone = new Promise<void>((resolve) => {
      const off = watcher.onChange((ev) => {
        if (ev.type === "put" && ++updates === N) {
          off();
          resolve();
        }
      });
    });
    const u0 = performance.now();
    await pool(
      Array.from({ length: N }, (_, i) => i),
      64,
      async (i) => {
        const r = { ...record(i), startedAt: new Date(Date.now() + 1).toISOString(), labels: { v: "2" } };
        await (leases[i] as Lease).put(key(r)).value(JSON.stringify(r));
      },
    );
    const burstPutMs = performance.now() - u0;
    await burstDone;
    const burstSeenMs = performance.now() - u0;
    await watcher.close();

    // 5. A real server process: load, memory beside an idle one, change visibility.
    // Started one after the other so neither's start-up competes with the other's.
    const healthOf = (base: string) => async () => (await fetch(`${base}/health`)).ok;
    const idle = await startServer(etcd.endpoint, "/bench-empty");
    children.push(idle.proc);
    const idleUpMs = await poll(healthOf(idle.base), 60_000, 20);
    const full = await startServer(etcd.endpoint, PREFIX);
    children.push(full.proc);
    const fullUpMs = await poll(healthOf(full.base), 60_000, 20);
    const listedMs = await poll(
      async () => {
        const body = (await (await fetch(`${full.base}/v1/workers`)).json()) as
          | { data?: unknown[] }
          | unknown[];
        const list = Array.isArray(body) ? body : (body.data ?? []);
        return list.length >= N;
      },
      60_000,
      20,
    );
    await new Promise((r) => setTimeout(r, 500));
    const rssFull = rssOf(full.proc.pid as number);
    const rssIdle = rssOf(idle.proc.pid as number);

    const serverSee: number[] = [];
    for (let p = 0; p < Math.min(PROBES, 20); p++) {
      const name = `new-model-${p}`;
      const rec = record(N + 1000 + p, name);
      const lease = raw.lease(30, { autoKeepAlive: false });
      await lease.grant();
      const a = performance.now();
      await lease.put(key(rec)).value(JSON.stringify(rec));
      await poll(
        async () => {
          const body = (await (await fetch(`${full.base}/v1/models`)).json()) as {
            data: Array<{ id: string }>;
          };
          return body.data.some((m) => m.id === name);
        },
        10_000,
        1,
      );
      serverSee.push(performance.now() - a);
      await lease.revoke();
    }

    console.log(`etcd discovery benchmark: ${N} workers, ${PROBES} change probes (etcd ${etcd.endpoint})`);
    console.log(`  register ${N} records (64 in flight, 1 lease each)   ${ms(registerMs)}`);
    console.log(`  EtcdWatcher.start() (list + watch)                 ${ms(loadMs)}`);
    console.log(
      `  EtcdWatcher heap for ${N} records                  ${gc ? mib(heapDelta) : "n/a (run with --expose-gc)"}`,
    );
    console.log(`  put -> watcher event      p50 ${ms(pct(putLat, 50))}  p99 ${ms(pct(putLat, 99))}`);
    console.log(`  revoke -> watcher event   p50 ${ms(pct(delLat, 50))}  p99 ${ms(pct(delLat, 99))}`);
    console.log(`  burst of ${N} updates: puts done ${ms(burstPutMs)}, all seen ${ms(burstSeenMs)}`);
    console.log(
      `  server spawn -> /health: ${N} workers ${ms(fullUpMs)} vs empty ${ms(idleUpMs)} (x${(fullUpMs / idleUpMs).toFixed(2)}); all ${N} in /v1/workers ${ms(listedMs)} later`,
    );
    console.log(
      `  server RSS with ${N} workers ${mib(rssFull)} vs idle ${mib(rssIdle)} (+${mib(rssFull - rssIdle)})`,
    );
    console.log(`  put -> server /v1/models  p50 ${ms(pct(serverSee, 50))}  p99 ${ms(pct(serverSee, 99))}`);
  } finally {
    for (const c of children) c.kill("SIGKILL");
    raw.close();
    await etcd.dispose();
  }
}

// Interrupted (SIGINT/SIGTERM/SIGHUP, or EPIPE on stdout): stop the servers before exiting.
handleFatalSignals();
await main();
