/**
 * Engine `/metrics` requests per second with 1 and 4 server replicas (issue #32: "adding server
 * replicas does not multiply the load on engines"), today and with one scrape shared among the
 * replicas (src/router/peers/load-share.ts), side by side in one run.
 *
 * One `infera-sim --fleet N`; a counting proxy in this process in front of it (each worker's
 * record names `http://proxy/<worker>`, so every scrape is counted at the engines' side, not
 * by the servers); `infera server` replicas on a loopback ZMQ peer mesh (`--peers`), profile
 * least-load (it reads the engines' load; no KV index). Per phase, in this order for each
 * pace and replica count: today (`--baseline DIR`: that checkout's server, e.g. the commit
 * before; without it, this checkout with INFERA_PEERS_SHARE_LOAD=false), then shared (this
 * checkout). Two paces: `idle` (the defaults: a worker seen idle every 20 s ± 25 %, else every
 * 2 s) and `busy` (`--scrape-idle-interval 0`: every worker every 2 s, the pace every replica
 * keeps today for a busy worker). Per phase: scrapes/s at the engines (all workers together,
 * and per worker), the servers' CPU (all replicas, % of one core) and the fleet's.
 *
 *   node bench/fleet-scale/replica-scrapes.ts [--workers 200] [--replicas 1,4]
 *     [--paces idle,busy] [--seconds-idle 40] [--seconds-busy 20] [--baseline DIR]
 *     [--cpu-prof DIR]
 *
 * `--cpu-prof DIR` runs the servers under `node --cpu-prof` (DIR/<pace>-<replicas>-<variant>/,
 * one profile per replica; `node scripts/cpu-prof-top.mjs DIR/… --markdown` sums them): the
 * profiler costs CPU itself, so take CPU figures from a run without it.
 *
 * Prints one JSON line per phase on stdout and a markdown table at the end.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { handleFatalSignals } from "../../src/util/child-process.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { exitWithUsageIfAsked } from "../usage.ts";
import { cpuWindow, load, round1 } from "./measure.ts";
import { type Child, type Server, startFleet, startServer, workerRecords } from "./procs.ts";

const argv = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, argv);
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : def;
};
const N = Number(opt("workers", "200"));
const REPLICAS = opt("replicas", "1,4").split(",").map(Number);
const PACES = opt("paces", "idle,busy").split(",") as ("idle" | "busy")[];
const SECONDS = { idle: Number(opt("seconds-idle", "40")), busy: Number(opt("seconds-busy", "20")) };
const BASELINE = argv.includes("--baseline") ? opt("baseline", "") : undefined;
const PROF = argv.includes("--cpu-prof") ? opt("cpu-prof", "") : undefined;
const MODEL = "sim-model";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const say = (s: string) => process.stderr.write(`[replica-scrapes] ${s}\n`);

handleFatalSignals();

/** Forwards `/<worker>/…` to that engine; counts GET …/metrics. */
async function countingProxy(targets: Map<string, string>) {
  let scrapes = 0;
  const server = createServer((req, res) => {
    const url = req.url ?? "/";
    const slash = url.indexOf("/", 1);
    const target = targets.get(url.slice(1, slash < 0 ? undefined : slash));
    if (!target) {
      res.writeHead(404).end();
      return;
    }
    const rest = slash < 0 ? "/" : url.slice(slash);
    if (req.method === "GET" && rest === "/metrics") scrapes++;
    const up = request(`${target}${rest}`, { method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    count: () => scrapes,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

async function waitReady(s: Server, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (s.proc.exitCode !== null) throw new Error(`server exited: ${s.output()}`);
    try {
      const j = (await (await fetch(`${s.url}/ready`)).json()) as { workers?: number };
      if (j.workers === N) return;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`server not ready: ${s.output()}`);
    await sleep(200);
  }
}

interface Row {
  pace: string;
  replicas: number;
  variant: "today" | "shared";
  scrapesPerS: number;
  perWorkerPerS: number;
  serversCpu: number;
  fleetCpu: number;
  machine: number;
  load: string;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "infera-replica-scrapes-"));
  const children: Child[] = [];
  let proxy: Awaited<ReturnType<typeof countingProxy>> | null = null;
  const rows: Row[] = [];
  try {
    const { child: fleet, manifest } = await startFleet({
      count: N,
      blockSize: 16,
      blocks: 256,
      manifest: join(dir, "fleet.json"),
      timeoutMs: 60_000 + N * 1000,
      maxRssMiB: 8000,
      model: MODEL,
    });
    children.push(fleet);
    const records = workerRecords(manifest, MODEL, 16, 256);
    proxy = await countingProxy(new Map(records.map((r) => [r.id, r.url])));
    const px = proxy;
    const workersFile = join(dir, "workers.json");
    writeFileSync(workersFile, JSON.stringify(records.map((r) => ({ ...r, url: `${px.url}/${r.id}` }))));
    const profile = join(dir, "profile.yaml");
    writeFileSync(
      profile,
      "policy: round-robin\nprofiles:\n  mixed:\n    scorers: []\n    picker: { name: least-load }\n",
    );
    for (const pace of PACES)
      for (const replicas of REPLICAS)
        for (const variant of ["today", "shared"] as const) {
          const eps = await Promise.all(
            Array.from({ length: replicas }, async () => `tcp://127.0.0.1:${await freePort()}`),
          );
          say(`${pace} pace, ${replicas} replica(s), ${variant}: starting (load ${load()})`);
          const servers: Server[] = [];
          for (const e of eps) {
            const s = await startServer(workersFile, "warn", undefined, {
              root: variant === "today" ? BASELINE : undefined,
              nodeArgs: PROF
                ? ["--cpu-prof", "--cpu-prof-dir", join(PROF, `${pace}-${replicas}-${variant}`)]
                : [],
              policy: "round-robin",
              args: [
                "--config",
                profile,
                "--peers-bind",
                e,
                "--peers",
                eps.join(","),
                ...(pace === "busy" ? ["--scrape-idle-interval", "0"] : []),
              ],
              env: variant === "today" && !BASELINE ? { INFERA_PEERS_SHARE_LOAD: "false" } : {},
            });
            children.push(s);
            servers.push(s);
          }
          for (const s of servers) await waitReady(s, 120_000);
          // Past start-up (first scrapes of everything, the replicas hearing each other) and,
          // at the idle pace, past the first idle interval (the first scrapes' due times).
          await sleep(pace === "idle" ? 25_000 : 6000);
          const pids = Object.fromEntries(servers.map((s, i) => [`s${i}`, s.pid]));
          const w = cpuWindow({ ...pids, fleet: fleet.pid });
          const c0 = px.count();
          const seconds = SECONDS[pace];
          await sleep(seconds * 1000);
          const n = px.count() - c0;
          const shares = w.end();
          const serversCpu = round1(servers.reduce((a, _, i) => a + (shares[`s${i}`] ?? 0), 0));
          const row: Row = {
            pace,
            replicas,
            variant,
            scrapesPerS: round1(n / seconds),
            perWorkerPerS: Math.round((1000 * n) / seconds / N) / 1000,
            serversCpu,
            fleetCpu: shares.fleet,
            machine: shares.machine,
            load: load(),
          };
          rows.push(row);
          process.stdout.write(`${JSON.stringify(row)}\n`);
          for (const s of servers) {
            await s.stop();
            children.splice(children.indexOf(s), 1);
          }
        }
  } finally {
    for (const c of children.reverse()) await c.stop().catch(() => {});
    proxy?.close();
    rmSync(dir, { recursive: true, force: true });
  }
  printTable(rows);
}

/** Today and shared side by side, one line per pace and replica count. */
function printTable(rows: readonly Row[]): void {
  const table = [
    "| pace | replicas | today: scrapes/s (per worker) | shared: scrapes/s (per worker) | today: servers / fleet CPU % | shared: servers / fleet CPU % | load average |",
    "|---|---|---|---|---|---|---|",
  ];
  for (const pace of PACES)
    for (const replicas of REPLICAS) {
      const t = rows.find((r) => r.pace === pace && r.replicas === replicas && r.variant === "today");
      const s = rows.find((r) => r.pace === pace && r.replicas === replicas && r.variant === "shared");
      if (!t || !s) continue;
      table.push(
        `| ${pace} | ${replicas} | ${t.scrapesPerS} (${t.perWorkerPerS}) | ${s.scrapesPerS} (${s.perWorkerPerS}) | ${t.serversCpu} / ${t.fleetCpu} | ${s.serversCpu} / ${s.fleetCpu} | ${t.load} → ${s.load} |`,
      );
    }
  process.stdout.write(`${table.join("\n")}\n`);
}

main().catch((err) => {
  process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
