/**
 * One engine's life under the launcher: spawn it, wait for `/health` (logging progress),
 * register its record, keep checking health (deregister while it is unhealthy), forward
 * SIGINT/SIGTERM after deregistering, and when the engine exits for any reason revoke the
 * record at once and return the engine's exit status.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { constants } from "node:os";
import type { DiscoveryRegistrar, WorkerRecord } from "../../discovery/types.ts";
import type { Logger } from "../../util/log.ts";
import { waitForDrain } from "./drain.ts";
import { reportedKvBlocks, reportedMaxModelLen } from "./facts.ts";
import { buildWorkerRecord } from "./record.ts";
import { probeRoutes } from "./routes-probe.ts";
import type { EngineAdapter, EngineCommand, LaunchSpec } from "./types.ts";

export interface LifecycleOptions {
  spec: LaunchSpec;
  adapter: EngineAdapter;
  command: EngineCommand;
  /** null: `--discovery none`, just run the engine. */
  registrar: DiscoveryRegistrar | null;
  log: Logger;
  healthTimeoutMs: number;
  /** Poll period while waiting for the first healthy answer. */
  healthPollMs?: number;
  /** Progress log period while waiting. */
  progressEveryMs?: number;
  /** Health check period once registered; 3 failures in a row deregister. 0 disables. */
  healthIntervalMs?: number;
  /** After a forwarded signal, SIGKILL the engine if it has not exited by then. */
  stopTimeoutMs?: number;
  /**
   * SIGTERM drains: deregister, then wait up to this long for the engine's running and
   * waiting requests to reach 0 before forwarding the signal (a rolling update must not cut
   * streams). 0 or absent forwards at once; SIGINT always forwards at once.
   */
  drainTimeoutMs?: number;
  onRegistered?: (rec: WorkerRecord) => void;
}

interface ExitInfo {
  code: number | null;
  signal: NodeJS.Signals | null;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export function healthBaseUrl(spec: LaunchSpec): string {
  const h =
    spec.host === "0.0.0.0" || spec.host === "" ? "127.0.0.1" : spec.host === "::" ? "[::1]" : spec.host;
  return `http://${h.includes(":") && !h.startsWith("[") ? `[${h}]` : h}:${spec.port}`;
}

async function healthy(base: string): Promise<boolean> {
  try {
    const res = await fetch(`${base}/health`, { signal: AbortSignal.timeout(2000) });
    await res.arrayBuffer().catch(() => undefined);
    return res.ok;
  } catch {
    return false;
  }
}

/** vLLM and the sim report max_model_len in /v1/models; others may not. */
export function exitStatus(info: ExitInfo): number {
  if (info.code !== null) return info.code;
  const n = info.signal ? constants.signals[info.signal] : undefined;
  return n ? 128 + n : 1;
}

export async function runLifecycle(opts: LifecycleOptions): Promise<number> {
  const { spec, adapter, command, registrar, log } = opts;
  const [bin, ...args] = command.argv as [string, ...string[]];
  const base = healthBaseUrl(spec);
  log.info({ argv: command.argv, env: command.env }, "starting engine");
  let exit: ExitInfo | null = null;
  // Same process group as the launcher, so a supervisor that kills the group (kill -9 -PGID)
  // takes the engine along. A terminal's Ctrl-C then reaches both at once; the launcher still
  // deregisters first thing, and forwarding a second SIGINT is harmless to the engines.
  const child: ChildProcess = spawn(bin, args, { env: { ...process.env, ...command.env }, stdio: "inherit" });
  // If the launcher itself goes down (uncaught error, process.exit), take the engine along.
  const killOnExit = () => {
    if (exit === null) child.kill("SIGKILL");
  };
  process.once("exit", killOnExit);
  const exited = new Promise<ExitInfo>((resolve) => {
    child.once("exit", (code, signal) => {
      exit = { code, signal };
      resolve(exit);
    });
    child.once("error", (err) => {
      log.error({ err: err.message, bin }, "engine could not be started");
      exit = { code: 127, signal: null };
      resolve(exit);
    });
  });

  // Registrar calls run one after another, so a stop never races a (re-)registration.
  let chain: Promise<void> = Promise.resolve();
  const serial = (fn: () => Promise<void>): Promise<void> => {
    chain = chain.then(fn, fn);
    return chain;
  };
  let registered = false;
  let stopping = false;
  const deregister = () =>
    serial(async () => {
      if (!registrar || !registered) return;
      registered = false;
      await registrar.deregister().catch((err: Error) => log.warn({ err: err.message }, "deregister failed"));
    });

  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) {
      log.warn({ signal: sig }, "second signal: killing the engine");
      child.kill("SIGKILL");
      return;
    }
    stopping = true;
    const drainMs = sig === "SIGTERM" ? (opts.drainTimeoutMs ?? 0) : 0;
    log.info(
      { signal: sig, drainTimeoutMs: drainMs },
      "stopping: deregistering, draining, then forwarding the signal to the engine",
    );
    void deregister()
      .then(() =>
        drainMs > 0 && exit === null
          ? waitForDrain({ base, engine: spec.engine, timeoutMs: drainMs, log, gone: exited })
          : undefined,
      )
      .then(() => {
        if (exit === null) child.kill(sig);
        setTimeout(() => {
          if (exit === null) {
            log.warn({ stopTimeoutMs: opts.stopTimeoutMs ?? 30_000 }, "engine did not stop in time: SIGKILL");
            child.kill("SIGKILL");
          }
        }, opts.stopTimeoutMs ?? 30_000).unref();
      });
  };
  const sigint = () => onSignal("SIGINT");
  const sigterm = () => onSignal("SIGTERM");
  process.on("SIGINT", sigint);
  process.on("SIGTERM", sigterm);

  let monitor: NodeJS.Timeout | null = null;
  try {
    // 1. Wait for health.
    const t0 = Date.now();
    let lastProgress = t0;
    let up = false;
    while (exit === null && !stopping) {
      if (await healthy(base)) {
        up = true;
        break;
      }
      const now = Date.now();
      if (now - t0 > opts.healthTimeoutMs) {
        log.error(
          { url: `${base}/health`, timeoutMs: opts.healthTimeoutMs },
          "engine not healthy in time; stopping it",
        );
        stopping = true;
        child.kill("SIGTERM");
        setTimeout(() => exit === null && child.kill("SIGKILL"), 5000).unref();
        await exited;
        return 1;
      }
      if (now - lastProgress >= (opts.progressEveryMs ?? 5000)) {
        lastProgress = now;
        log.info(
          { url: `${base}/health`, waitedS: Math.round((now - t0) / 1000) },
          "waiting for engine health",
        );
      }
      await Promise.race([sleep(opts.healthPollMs ?? 250), exited]);
    }

    // 2. Register (retrying while etcd is unreachable), then watch health.
    if (up && exit === null && !stopping) {
      const rec = buildWorkerRecord(spec, adapter, {
        startedAt: new Date(),
        maxModelLen: spec.maxModelLen ?? (await reportedMaxModelLen(base)),
        kvBlocks: await reportedKvBlocks(spec, base, spec.blockSize ?? adapter.defaultBlockSize),
        routes: await probeRoutes(base),
      });
      log.info({ id: rec.id, url: rec.url, healthyAfterMs: Date.now() - t0 }, "engine healthy");
      if (registrar) {
        const register = () =>
          serial(async () => {
            let delay = 200;
            while (!stopping && exit === null && !registered) {
              try {
                await registrar.register(rec);
                registered = true;
                opts.onRegistered?.(rec);
              } catch (err) {
                log.warn({ err: (err as Error).message, retryMs: delay }, "registration failed; retrying");
                await Promise.race([sleep(delay), exited]);
                delay = Math.min(delay * 2, 5000);
              }
            }
          });
        await register();
        const every = opts.healthIntervalMs ?? 5000;
        let failures = 0;
        if (every > 0) {
          monitor = setInterval(() => {
            void healthy(base).then((ok) => {
              if (stopping || exit !== null) return;
              if (ok) {
                if (failures >= 3) log.info({ id: rec.id }, "engine healthy again; re-registering");
                failures = 0;
                if (!registered) void register();
              } else if (++failures === 3) {
                log.warn({ id: rec.id }, "engine failed 3 health checks; deregistering until it recovers");
                void deregister();
              }
            });
          }, every);
          monitor.unref();
        }
      } else {
        opts.onRegistered?.(rec);
      }
    }

    // 3. The engine's exit ends the launcher; the record goes at once.
    const info = await exited;
    if (monitor) clearInterval(monitor);
    if (!stopping) log.warn({ ...info }, "engine exited");
    else log.info({ ...info }, "engine stopped");
    await deregister();
    return exitStatus(info);
  } finally {
    if (monitor) clearInterval(monitor);
    process.off("SIGINT", sigint);
    process.off("SIGTERM", sigterm);
    process.off("exit", killOnExit);
    if (registrar) await registrar.close().catch(() => undefined);
  }
}
