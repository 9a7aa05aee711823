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
  return await new EngineRun(opts).run();
}

/** One run of the engine: the child, its exit, the registration and the stop in progress. */
class EngineRun {
  private readonly opts: LifecycleOptions;
  private readonly log: Logger;
  private readonly base: string;
  private exit: ExitInfo | null = null;
  private child!: ChildProcess;
  private exited!: Promise<ExitInfo>;
  // Registrar calls run one after another, so a stop never races a (re-)registration.
  private chain: Promise<void> = Promise.resolve();
  private registered = false;
  private stopping = false;
  private monitor: NodeJS.Timeout | null = null;
  // If the launcher itself goes down (uncaught error, process.exit), take the engine along.
  private readonly killOnExit = () => {
    if (this.exit === null) this.child.kill("SIGKILL");
  };
  private readonly sigint = () => this.onSignal("SIGINT");
  private readonly sigterm = () => this.onSignal("SIGTERM");

  constructor(opts: LifecycleOptions) {
    this.opts = opts;
    this.log = opts.log;
    this.base = healthBaseUrl(opts.spec);
  }

  async run(): Promise<number> {
    this.spawn();
    process.on("SIGINT", this.sigint);
    process.on("SIGTERM", this.sigterm);
    try {
      // 1. Wait for health.
      const t0 = Date.now();
      const up = await this.waitHealthy(t0);
      if (up === "timeout") return 1;
      // 2. Register (retrying while etcd is unreachable), then watch health.
      if (up === "up" && this.exit === null && !this.stopping) await this.registerAndWatch(t0);
      // 3. The engine's exit ends the launcher; the record goes at once.
      const info = await this.exited;
      if (this.monitor) clearInterval(this.monitor);
      if (!this.stopping) this.log.warn({ ...info }, "engine exited");
      else this.log.info({ ...info }, "engine stopped");
      await this.deregister();
      return exitStatus(info);
    } finally {
      if (this.monitor) clearInterval(this.monitor);
      process.off("SIGINT", this.sigint);
      process.off("SIGTERM", this.sigterm);
      process.off("exit", this.killOnExit);
      if (this.opts.registrar) await this.opts.registrar.close().catch(() => undefined);
    }
  }

  private spawn(): void {
    const { command, log } = this.opts;
    const [bin, ...args] = command.argv as [string, ...string[]];
    log.info({ argv: command.argv, env: command.env }, "starting engine");
    // Same process group as the launcher, so a supervisor that kills the group (kill -9 -PGID)
    // takes the engine along. A terminal's Ctrl-C then reaches both at once; the launcher still
    // deregisters first thing, and forwarding a second SIGINT is harmless to the engines.
    const child = spawn(bin, args, { env: { ...process.env, ...command.env }, stdio: "inherit" });
    this.child = child;
    process.once("exit", this.killOnExit);
    this.exited = new Promise<ExitInfo>((resolve) => {
      child.once("exit", (code, signal) => {
        this.exit = { code, signal };
        resolve(this.exit);
      });
      child.once("error", (err) => {
        log.error({ err: err.message, bin }, "engine could not be started");
        this.exit = { code: 127, signal: null };
        resolve(this.exit);
      });
    });
  }

  private serial(fn: () => Promise<void>): Promise<void> {
    this.chain = this.chain.then(fn, fn);
    return this.chain;
  }

  private deregister(): Promise<void> {
    return this.serial(async () => {
      const registrar = this.opts.registrar;
      if (!registrar || !this.registered) return;
      this.registered = false;
      await registrar
        .deregister()
        .catch((err: Error) => this.log.warn({ err: err.message }, "deregister failed"));
    });
  }

  private onSignal(sig: NodeJS.Signals): void {
    const { opts, log, child } = this;
    if (this.stopping) {
      log.warn({ signal: sig }, "second signal: killing the engine");
      child.kill("SIGKILL");
      return;
    }
    this.stopping = true;
    const drainMs = sig === "SIGTERM" ? (opts.drainTimeoutMs ?? 0) : 0;
    log.info(
      { signal: sig, drainTimeoutMs: drainMs },
      "stopping: deregistering, draining, then forwarding the signal to the engine",
    );
    const { base, exited } = this;
    void this.deregister()
      .then(() =>
        drainMs > 0 && this.exit === null
          ? waitForDrain({ base, engine: opts.spec.engine, timeoutMs: drainMs, log, gone: exited })
          : undefined,
      )
      .then(() => {
        if (this.exit === null) child.kill(sig);
        setTimeout(() => {
          if (this.exit === null) {
            log.warn({ stopTimeoutMs: opts.stopTimeoutMs ?? 30_000 }, "engine did not stop in time: SIGKILL");
            child.kill("SIGKILL");
          }
        }, opts.stopTimeoutMs ?? 30_000).unref();
      });
  }

  /**
   * Polls /health until it answers, the engine exits or a stop begins ("gone"), or the health
   * timeout passes: then the engine is stopped and "timeout" returned once it exited.
   */
  private async waitHealthy(t0: number): Promise<"up" | "gone" | "timeout"> {
    const { opts, log, base, child } = this;
    let lastProgress = t0;
    while (this.exit === null && !this.stopping) {
      if (await healthy(base)) return "up";
      const now = Date.now();
      if (now - t0 > opts.healthTimeoutMs) {
        log.error(
          { url: `${base}/health`, timeoutMs: opts.healthTimeoutMs },
          "engine not healthy in time; stopping it",
        );
        this.stopping = true;
        child.kill("SIGTERM");
        setTimeout(() => this.exit === null && child.kill("SIGKILL"), 5000).unref();
        await this.exited;
        return "timeout";
      }
      if (now - lastProgress >= (opts.progressEveryMs ?? 5000)) {
        lastProgress = now;
        log.info(
          { url: `${base}/health`, waitedS: Math.round((now - t0) / 1000) },
          "waiting for engine health",
        );
      }
      await Promise.race([sleep(opts.healthPollMs ?? 250), this.exited]);
    }
    return "gone";
  }

  /** Builds the record, registers it (retrying), and re-checks health every healthIntervalMs. */
  private async registerAndWatch(t0: number): Promise<void> {
    const { opts, log, base } = this;
    const { spec, adapter, registrar } = opts;
    const rec = buildWorkerRecord(spec, adapter, {
      startedAt: new Date(),
      maxModelLen: spec.maxModelLen ?? (await reportedMaxModelLen(base)),
      kvBlocks: await reportedKvBlocks(spec, base, spec.blockSize ?? adapter.defaultBlockSize),
    });
    log.info({ id: rec.id, url: rec.url, healthyAfterMs: Date.now() - t0 }, "engine healthy");
    if (!registrar) {
      opts.onRegistered?.(rec);
      return;
    }
    const register = () =>
      this.serial(async () => {
        let delay = 200;
        while (!this.stopping && this.exit === null && !this.registered) {
          try {
            await registrar.register(rec);
            this.registered = true;
            opts.onRegistered?.(rec);
          } catch (err) {
            log.warn({ err: (err as Error).message, retryMs: delay }, "registration failed; retrying");
            await Promise.race([sleep(delay), this.exited]);
            delay = Math.min(delay * 2, 5000);
          }
        }
      });
    await register();
    const every = opts.healthIntervalMs ?? 5000;
    let failures = 0;
    if (every <= 0) return;
    this.monitor = setInterval(() => {
      void healthy(base).then((ok) => {
        if (this.stopping || this.exit !== null) return;
        if (ok) {
          if (failures >= 3) log.info({ id: rec.id }, "engine healthy again; re-registering");
          failures = 0;
          if (!this.registered) void register();
        } else if (++failures === 3) {
          log.warn({ id: rec.id }, "engine failed 3 health checks; deregistering until it recovers");
          void this.deregister();
        }
      });
    }, every);
    this.monitor.unref();
  }
}
