/**
 * Idle cost of following a fleet (issue #32): one `infera-sim --fleet N` (KV events on), and
 * `infera server --policy kv-aware` (default scrape interval) from this checkout and, with
 * `--baseline DIR`, from another checkout (built the same way), each alone against the same
 * fleet, in alternating windows (this, baseline, this, baseline, …) so drift on the shared
 * machine hits both alike. Per window: the server's CPU share of one core and the fleet's (the
 * engines' side: answering the scrapes and keeping the KV subscriptions).
 *
 *   node bench/fleet-scale/idle.ts [--workers 1000] [--seconds 20] [--rounds 2]
 *     [--baseline /path/to/checkout] [--cpu-prof DIR]
 *
 * `--cpu-prof DIR` runs the servers under `node --cpu-prof` (DIR/this, DIR/baseline): the
 * profiler's sampling costs CPU itself, so take CPU figures from a run without it.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { handleFatalSignals } from "../../src/util/child-process.ts";
import { exitWithUsageIfAsked } from "../usage.ts";
import { cpuWindow, load } from "./measure.ts";
import { type Child, startFleet, startServer, waitServerReady, workerRecords } from "./procs.ts";

const argv = process.argv.slice(2);
exitWithUsageIfAsked(import.meta.url, argv);
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : def;
};
const N = Number(opt("workers", "1000"));
const SECONDS = Number(opt("seconds", "20"));
const ROUNDS = Number(opt("rounds", "2"));
const BASELINE = argv.includes("--baseline") ? opt("baseline", "") : undefined;
const PROF = argv.includes("--cpu-prof") ? opt("cpu-prof", "") : undefined;
const MODEL = "sim-model";
const BS = 16;
const BLOCKS = 256;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const say = (s: string) => process.stderr.write(`[idle] ${s}\n`);

handleFatalSignals();

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "infera-idle-"));
  const children: Child[] = [];
  try {
    const { child: fleet, manifest } = await startFleet({
      count: N,
      blockSize: BS,
      blocks: BLOCKS,
      manifest: join(dir, "fleet.json"),
      timeoutMs: 60_000 + N * 1000,
      maxRssMiB: 8000,
      model: MODEL,
    });
    children.push(fleet);
    const workersFile = join(dir, "workers.json");
    writeFileSync(workersFile, JSON.stringify(workerRecords(manifest, MODEL, BS, BLOCKS)));
    const targets: [string, string | undefined][] = [["this", undefined]];
    if (BASELINE) targets.push(["baseline", BASELINE]);
    const rows: Record<string, { server: number[]; fleet: number[]; machine: number[] }> = {};
    for (let r = 0; r < ROUNDS; r++) {
      for (const [name, root] of targets) {
        const nodeArgs = PROF ? ["--cpu-prof", "--cpu-prof-dir", join(PROF, name)] : [];
        const s = await startServer(workersFile, "warn", undefined, { root, nodeArgs });
        children.push(s);
        await waitServerReady(s, N, 120_000 + N * 200);
        // Past start-up (replays, first scrapes, JIT): then an idle window.
        await sleep(5000);
        const w = cpuWindow({ server: s.pid, fleet: fleet.pid });
        await sleep(SECONDS * 1000);
        const shares = w.end();
        rows[name] ??= { server: [], fleet: [], machine: [] };
        const row = rows[name];
        row.server.push(shares.server);
        row.fleet.push(shares.fleet);
        row.machine.push(shares.machine);
        say(`round ${r + 1} ${name}: ${JSON.stringify(shares)} load ${load()}`);
        await s.stop();
        children.splice(children.indexOf(s), 1);
      }
    }
    console.log(`idle ${N} workers, ${SECONDS} s windows × ${ROUNDS} rounds, load ${load()}`);
    console.log("| server | server CPU % of a core (each window) | fleet CPU % (engines) | machine busy % |");
    console.log("|---|---|---|---|");
    for (const [name, r] of Object.entries(rows))
      console.log(
        `| ${name} | ${r.server.join(" / ")} | ${r.fleet.join(" / ")} | ${r.machine.join(" / ")} |`,
      );
  } finally {
    for (const c of children) await c.stop().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
