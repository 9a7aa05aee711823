/**
 * What the server's garbage collector does per request: `infera server` (and optionally a
 * baseline checkout's) under `node --trace-gc-nvp`, one sim behind it, a closed loop of
 * requests at concurrency 16; of the collections during the measured requests (after the
 * warm-up) it prints how many there were, the bytes promoted to the old generation per
 * request, and the pause time. A proxy's per-request objects should die young: promotion
 * near 0 per request. Several KB per request means something keeps each request alive
 * through young-generation collections (see RESULTS.md, 2026-12-05 lane L: closures over
 * an object written into that object under Maglev).
 *
 *   node bench/router-overhead/gc.ts [--requests 8000] [--warmup 3000] [--stream 0]
 *     [--baseline <checkout>]
 */
import { type ChildProcess, spawn } from "node:child_process";
import { loadavg } from "node:os";
import { fileURLToPath } from "node:url";
import { handleFatalSignals, killOnExit } from "../../src/util/child-process.ts";
import { serverArgs } from "../../test/helpers/infera.ts";
import { freePort } from "../../test/helpers/ports.ts";
import { startSim } from "../../test/helpers/sim.ts";
import { waitFor200 } from "../../test/helpers/wait.ts";
import { exitWithUsageIfAsked, pairedArgs } from "../usage.ts";
import { closedLoop } from "./closed-loop.ts";

exitWithUsageIfAsked(import.meta.url, process.argv.slice(2));

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const args = pairedArgs(process.argv.slice(2));
const REQUESTS = Number(args.get("requests") ?? 8000);
const WARMUP = Number(args.get("warmup") ?? 3000);
const STREAM = args.get("stream") === "1";
const BASELINE = args.get("baseline");

handleFatalSignals();

function start(argv: string[], cwd: string): { proc: ChildProcess; out: () => string } {
  const proc = killOnExit(
    spawn(process.execPath, argv, {
      cwd,
      stdio: ["ignore", "pipe", "ignore"],
      env: { ...process.env, INFERA_LOG_LEVEL: "warn" },
    }),
  );
  let out = "";
  proc.stdout?.on("data", (d) => {
    out += d;
  });
  return { proc, out: () => out };
}

const load = (url: string, n: number): Promise<number> => closedLoop(url, n, STREAM);

interface GcStats {
  scavenges: number;
  markCompacts: number;
  promoted: number;
  pauseMs: number;
}

/** Sums `--trace-gc-nvp` lines (`gc=s` scavenge, `gc=mc` mark-compact, `promoted=`, `pause=`). */
function gcStats(text: string): GcStats {
  const s: GcStats = { scavenges: 0, markCompacts: 0, promoted: 0, pauseMs: 0 };
  for (const line of text.split("\n")) {
    const kind = / gc=(\w+)/.exec(line)?.[1];
    if (!kind) continue;
    if (kind === "s") s.scavenges++;
    else if (kind === "mc") s.markCompacts++;
    s.promoted += Number(/ promoted=(\d+)/.exec(line)?.[1] ?? 0);
    s.pauseMs += Number(/ pause=([\d.]+)/.exec(line)?.[1] ?? 0);
  }
  return s;
}

async function measure(root: string, simUrl: string): Promise<GcStats & { errors: number }> {
  const port = await freePort();
  const server = start(
    ["--trace-gc-nvp", "bin/infera.js", ...serverArgs(port), "--worker", simUrl, "--scrape-interval", "0"],
    root,
  );
  try {
    const url = `http://127.0.0.1:${port}`;
    await waitFor200(`${url}/ready`, { timeoutMs: 30_000, what: "infera server", output: server.out });
    let errors = await load(url, WARMUP);
    const from = server.out().length;
    errors += await load(url, REQUESTS);
    return { ...gcStats(server.out().slice(from)), errors };
  } finally {
    server.proc.kill("SIGTERM");
  }
}

async function main(): Promise<void> {
  const sim = await startSim({ args: ["--speed", "10000", "--max-num-seqs", "256"] });
  try {
    const load0 = loadavg()[0]!.toFixed(1);
    const rows: [string, GcStats & { errors: number }][] = [["this checkout", await measure(ROOT, sim.url)]];
    if (BASELINE) rows.push([`baseline (${BASELINE})`, await measure(BASELINE, sim.url)]);
    console.log(
      `gc: ${REQUESTS} ${STREAM ? "streamed" : "non-streamed"} requests after ${WARMUP} warm-up, c=16; load average ${load0} → ${loadavg()[0]!.toFixed(1)}`,
    );
    console.log(
      "| server | scavenges | mark-compacts | promoted KB/req | GC pause ms per 1000 req | errors |",
    );
    console.log("|---|---|---|---|---|---|");
    for (const [name, s] of rows) {
      console.log(
        `| ${name} | ${s.scavenges} | ${s.markCompacts} | ${(s.promoted / 1024 / REQUESTS).toFixed(2)} | ${((s.pauseMs * 1000) / REQUESTS).toFixed(1)} | ${s.errors} |`,
      );
    }
  } finally {
    await sim.stop();
  }
}

await main();
