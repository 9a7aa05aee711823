/**
 * Which DP rank serves a request: the one the personality's pin names (header or body, see
 * personalities/), else the least loaded.
 */
import type { IncomingMessage } from "node:http";
import { BadRequestError } from "../../protocol/errors.ts";
import type { SimConfig } from "./config.ts";
import type { SimEngine } from "./engine.ts";
import type { Personality } from "./personalities/types.ts";

/** Minimal view of the API's dependencies (kept apart from api.ts to avoid an import cycle). */
interface RouteDeps {
  cfg: SimConfig;
  personality: Personality;
  engines: SimEngine[];
}

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/** The rank a request pins, if any, where the personality reads it. */
export function pinnedRank(
  p: Personality,
  req: IncomingMessage,
  body: Record<string, unknown>,
): number | null {
  const raw = p.pinnedRankRaw(header(req, "x-data-parallel-rank"), body);
  if (raw === undefined || raw === null || raw === "") return null;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0)
    throw new BadRequestError(
      `data_parallel_rank must be an integer >= 0 (got ${String(raw)})`,
      "data_parallel_rank",
    );
  return n;
}

let rr = 0;
/** The pinned rank's engine, else the least loaded (running + waiting), ties round-robin. */
export function pickEngine(deps: RouteDeps, req: IncomingMessage, body: Record<string, unknown>): SimEngine {
  const pin = pinnedRank(deps.personality, req, body);
  if (pin !== null) {
    const e = deps.engines.find((x) => x.rank === pin);
    if (!e)
      throw new BadRequestError(
        `data_parallel_rank ${pin} is out of range [0, ${deps.cfg.dpSize}).`,
        "data_parallel_rank",
      );
    return e;
  }
  if (deps.engines.length === 1) return deps.engines[0];
  const load = (e: SimEngine): number =>
    e.scheduler.running.length + e.scheduler.waiting.length + e.pendingPulls;
  const start = rr++ % deps.engines.length;
  let best = deps.engines[start];
  for (let i = 1; i < deps.engines.length; i++) {
    const e = deps.engines[(start + i) % deps.engines.length];
    if (load(e) < load(best)) best = e;
  }
  return best;
}
