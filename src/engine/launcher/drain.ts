/**
 * Graceful drain of a deregistered engine: servers stop routing to it once the record is gone,
 * but requests already sent (and streams in flight) must finish before the engine is stopped.
 * The engine's own `/metrics` says how much work it still holds (running + waiting, with the
 * gauge names of its kind, as the server's load scraper reads them).
 */

import type { EngineKind } from "../../discovery/types.ts";
import { parseEngineLoad } from "../../server/load-scraper.ts";
import type { Logger } from "../../util/log.ts";

export interface DrainOptions {
  /** The engine's base URL (`http://127.0.0.1:8000`). */
  base: string;
  engine: EngineKind;
  timeoutMs: number;
  log: Logger;
  /** Resolves when the engine exits (nothing left to wait for). */
  gone: Promise<unknown>;
  /** Poll period (default 250 ms). */
  pollMs?: number;
  /**
   * Idle readings in a row that count as drained (default 2): a request a server routed just
   * before it saw the deregistration may reach the engine a moment later.
   */
  idleReadings?: number;
}

export type DrainResult = "drained" | "timeout" | "exited" | "no-metrics";

/** Work the engine still holds, or null when its metrics cannot be read. */
async function heldRequests(base: string, engine: EngineKind): Promise<number | null> {
  try {
    const res = await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(2000) });
    if (!res.ok) {
      await res.arrayBuffer().catch(() => undefined);
      return null;
    }
    const load = parseEngineLoad(await res.text(), Date.now(), engine);
    return load ? load.running + load.waiting : null;
  } catch {
    return null;
  }
}

export async function waitForDrain(opts: DrainOptions): Promise<DrainResult> {
  const { log } = opts;
  const pollMs = opts.pollMs ?? 250;
  const need = opts.idleReadings ?? 2;
  const t0 = Date.now();
  let exited = false;
  void opts.gone.then(() => {
    exited = true;
  });
  let idle = 0;
  let failures = 0;
  let lastLog = t0;
  while (!exited) {
    const held = await heldRequests(opts.base, opts.engine);
    if (held === null) {
      // An engine that never serves metrics cannot be drained by reading them; do not hold
      // the stop for the whole timeout.
      if (++failures >= 3) {
        log.warn({ url: `${opts.base}/metrics` }, "drain: engine metrics unreadable; stopping now");
        return "no-metrics";
      }
    } else {
      failures = 0;
      idle = held === 0 ? idle + 1 : 0;
      if (idle >= need) {
        log.info({ drainedMs: Date.now() - t0 }, "drain: engine idle");
        return "drained";
      }
      if (Date.now() - lastLog >= 5000) {
        lastLog = Date.now();
        log.info(
          { held, waitedS: Math.round((lastLog - t0) / 1000) },
          "drain: waiting for requests to finish",
        );
      }
    }
    if (Date.now() - t0 >= opts.timeoutMs) {
      log.warn({ held, drainTimeoutMs: opts.timeoutMs }, "drain: timeout; stopping with requests in flight");
      return "timeout";
    }
    await Promise.race([new Promise((r) => setTimeout(r, pollMs)), opts.gone]);
  }
  return "exited";
}
