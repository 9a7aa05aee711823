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
 * profiler's sampling costs CPU itself, so take CPU figures from a run without it. Each window is
 * printed on the profiles' clock (`node scripts/cpu-prof-top.mjs DIR/this --window START,END`).
 *
 * The window starts `--settle` seconds (default 30) after the server is ready (all N routed,
 * subscribed, replay asked of each): past the start-up tail — the replays' ingest, the JIT, the
 * first scrape of every worker, its second (a worker is only seen idle once two scrapes agree)
 * and the first idle round (the idle pace is 20 s ± 25 %, so every worker has had its first idle
 * scrape by 2 + 2 + 25 s). A window that starts earlier charges the idle figure with start-up.
 * Per second of the window the server's CPU is also sampled (`--series`: printed), to show
 * whether what is left is steady or bursts.
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
const SETTLE_S = Number(opt("settle", "30"));
const SERIES = argv.includes("--series");
/** µs on CLOCK_MONOTONIC, the clock of a `.cpuprofile`'s samples. */
const monoUs = () => Number(process.hrtime.bigint() / 1000n);
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
        // Past start-up (replays, first scrapes, the first idle round, JIT): then the window.
        await sleep(SETTLE_S * 1000);
        const w = cpuWindow({ server: s.pid, fleet: fleet.pid });
        const from = monoUs();
        const perSecond: number[] = [];
        for (let k = 0; k < SECONDS; k++) {
          const c = cpuWindow({ server: s.pid });
          await sleep(1000);
          perSecond.push(c.end().server);
        }
        const shares = w.end();
        const to = monoUs();
        if (SERIES) say(`round ${r + 1} ${name}: server % per second ${perSecond.join(" ")}`);
        say(`round ${r + 1} ${name}: profile window ${from},${to}`);
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
