import { writeFileSync } from "node:fs";
import { Session } from "node:inspector/promises";
import { envVar } from "../../config/env-table.ts";
import { createLogger } from "../../util/log.ts";
import { ArgParseError, parseSimArgs, SIM_HELP } from "./args.ts";
import type { SimEngine } from "./engine.ts";
import { fleetManifest, startSimFleet, writeFleetManifest } from "./fleet.ts";
import { startWithConfig } from "./server.ts";

/** `infera-sim [serve] MODEL [vLLM flags]`: runs the simulated engine until SIGTERM/SIGINT. */
export async function simMain(argv: string[]): Promise<void> {
  const log = createLogger("sim");
  let parsed: ReturnType<typeof parseSimArgs>;
  try {
    parsed = parseSimArgs(argv);
  } catch (err) {
    // argparse's behaviour: usage + `prog: error: ...` on stderr, exit status 2.
    process.stderr.write(
      err instanceof ArgParseError ? err.format() : `infera-sim: ${(err as Error).message}\n`,
    );
    process.exitCode = 2;
    return;
  }
  if (parsed.help) {
    process.stdout.write(`${SIM_HELP}\n`);
    return;
  }
  for (const f of parsed.ignored) log.debug({ flag: f }, "engine flag accepted and not modelled");
  let handle: { close(): Promise<void> };
  try {
    handle = parsed.fleet ? await startFleet(parsed, log) : await startWithConfig(parsed.config);
  } catch (err) {
    log.error({ err }, parsed.fleet ? "sim fleet failed to start" : "sim engine failed to start");
    // Exit even if some part of the start-up left a handle open: a launcher or test waiting
    // for this process must see it fail, not hang on a half-started engine.
    process.exitCode = 1;
    setTimeout(() => process.exit(1), 200).unref();
    return;
  }
  // INFERA_SIM_CPU_PROF=FILE: write a V8 CPU profile of this process on stop (for bench/sim-cpu).
  const profFile = envVar("INFERA_SIM_CPU_PROF");
  let profiler: Session | null = null;
  if (profFile) {
    profiler = new Session();
    profiler.connect();
    await profiler.post("Profiler.enable");
    await profiler.post("Profiler.start");
  }
  let stopping = false;
  const stop = (signal: string): void => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, "sim engine stopping");
    const force = setTimeout(() => process.exit(0), 5000);
    force.unref();
    const saveProfile = async (): Promise<void> => {
      if (!profiler || !profFile) return;
      const { profile } = await profiler.post("Profiler.stop");
      writeFileSync(profFile, JSON.stringify(profile));
    };
    saveProfile()
      .catch(() => undefined)
      .then(() => handle.close())
      .then(
        () => process.exit(0),
        () => process.exit(0),
      );
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
  if (envVar("INFERA_SIM_EXIT_WITH_PARENT") === "1") exitWithParent(() => stop("parent exited"));
}

/**
 * Stops when the process that started this one is gone (we were re-parented). A parent killed
 * with SIGKILL runs no exit handler, so `infera up` could not stop its fleet itself: the fleet
 * would stay, holding its ports. Node has no PR_SET_PDEATHSIG; a ppid poll is cheap.
 */
function exitWithParent(stop: () => void): void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    stop();
  }, 500);
  timer.unref();
}

/** `--fleet N`: N engines in this process; progress every batch, one "fleet ready" line, the manifest. */
async function startFleet(
  parsed: ReturnType<typeof parseSimArgs>,
  log: ReturnType<typeof createLogger>,
): Promise<{ close(): Promise<void> }> {
  const { count, manifest } = parsed.fleet!;
  const t0 = performance.now();
  const fleet = await startSimFleet({
    count,
    config: parsed.config,
    onProgress: (started, total) => {
      if (started < total) log.info({ started, count: total }, "sim fleet starting");
    },
  });
  try {
    if (manifest) await writeFleetManifest(manifest, fleetManifest(fleet));
  } catch (err) {
    await fleet.close();
    throw err;
  }
  log.info(
    {
      count,
      rssMiB: Math.round(process.memoryUsage.rss() / 2 ** 20),
      ms: Math.round(performance.now() - t0),
      first: fleet.engines[0].url,
      last: fleet.engines[count - 1].url,
      manifest,
    },
    "fleet ready",
  );
  const stats = fleetStats(
    fleet.engines.flatMap((h) => h.engines),
    log,
  );
  return {
    close: async () => {
      clearInterval(stats);
      await fleet.close();
    },
  };
}

/**
 * Every 10 s while the fleet worked: its CPU share (% of one core), steps, and the steps that
 * ran late because the event loop was busy. A late share well above 0 means the box, not the
 * simulated engines, set the pace: lower --speed so simulated time stays honest.
 */
function fleetStats(engines: SimEngine[], log: ReturnType<typeof createLogger>): NodeJS.Timeout {
  const sum = (f: (e: SimEngine) => number): number => engines.reduce((a, e) => a + f(e), 0);
  let last = { cpu: process.cpuUsage(), at: performance.now(), steps: 0, late: 0, lateMs: 0 };
  const timer = setInterval(() => {
    const now = { cpu: process.cpuUsage(), at: performance.now() };
    const steps = sum((e) => e.steps);
    const late = sum((e) => e.lateSteps);
    const lateMs = sum((e) => e.lateMs);
    if (steps > last.steps) {
      const cpuUs = now.cpu.user + now.cpu.system - last.cpu.user - last.cpu.system;
      const dl = late - last.late;
      log.info(
        {
          cpuPct: Math.round((cpuUs / 1000 / (now.at - last.at)) * 1000) / 10,
          steps: steps - last.steps,
          lateSteps: dl,
          meanLateMs: dl > 0 ? Math.round(((lateMs - last.lateMs) / dl) * 10) / 10 : 0,
          busyEngines: engines.filter((e) => e.scheduler.hasWork).length,
          rssMiB: Math.round(process.memoryUsage.rss() / 2 ** 20),
        },
        "fleet stats",
      );
    }
    last = { ...now, steps, late, lateMs };
  }, 10_000);
  timer.unref();
  return timer;
}
