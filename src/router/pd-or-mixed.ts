/**
 * The router of a model whose fleet has prefill and decode workers: disaggregated while a
 * healthy PD pair exists, the model's mixed workers otherwise. Membership alone is not
 * enough (issue #17): a prefill and a decode record on dead ports made the whole model
 * disaggregated, and nearly every request failed although healthy mixed workers existed.
 *
 * Healthy = available in the WorkerSet (breaker closed or half-open). A pair = an available
 * prefill and an available decode worker speaking the same connector. The choice is made per
 * request, since availability changes without a membership change. A disaggregated attempt
 * that fails before anything reached the client (no pair after all, prefill failed, decode
 * unreachable) is run on the mixed workers when there are any and no healthy pair is left:
 * the first requests to dead PD workers are what open their breakers.
 */
import { InferaError } from "../protocol/errors.ts";
import type { AbortLike } from "../util/abort.ts";
import type { ModelRouter, RequestExecutor, RoutingRequest, UpstreamResponse } from "./types.ts";
import type { LiveWorker, ModelGroup } from "./worker-set.ts";

/** Whether an available prefill and an available decode worker share a connector. */
export function hasHealthyPair(g: ModelGroup | undefined): boolean {
  if (!g) return false;
  const { prefill, decode } = g.availableByRole;
  if (prefill.length === 0 || decode.length === 0) return false;
  const kinds = new Set<string>();
  for (const d of decode) kinds.add(d.record.connector.kind);
  return prefill.some((p) => kinds.has(p.record.connector.kind));
}

/** A disaggregated failure that happened before any byte reached the client, and not a timeout. */
function retryableOnMixed(err: unknown): boolean {
  if (!(err instanceof InferaError)) return false;
  if (err.status === 504 || err.status < 500) return false;
  return (
    err.code === "no_worker_available" ||
    err.code === "prefill_failed" ||
    err.code === "decode_failed" ||
    err.code === "worker_unreachable"
  );
}

export class PdOrMixedRouter implements ModelRouter {
  private readonly group: () => ModelGroup | undefined;
  private readonly disagg: ModelRouter;
  private readonly mixed: ModelRouter;
  constructor(group: () => ModelGroup | undefined, disagg: ModelRouter, mixed: ModelRouter) {
    this.group = group;
    this.disagg = disagg;
    this.mixed = mixed;
  }

  /** What a request gets now (for /v1/workers): disagg while a healthy pair exists. */
  get kind(): "mixed" | "disagg" {
    const g = this.group();
    return hasHealthyPair(g) || !hasMixed(g) ? "disagg" : "mixed";
  }

  async handle(req: RoutingRequest, exec: RequestExecutor, signal: AbortLike): Promise<UpstreamResponse> {
    const g = this.group();
    if (!hasHealthyPair(g) && hasMixed(g)) return this.mixed.handle(req, exec, signal);
    try {
      return await this.disagg.handle(req, exec, signal);
    } catch (err) {
      const now = this.group();
      if (signal.aborted || !retryableOnMixed(err) || hasHealthyPair(now) || !hasMixed(now)) throw err;
      return this.mixed.handle(req, exec, signal);
    }
  }
}

function hasMixed(g: ModelGroup | undefined): g is ModelGroup {
  return !!g && g.availableByRole.mixed.length > 0;
}

/** The mixed candidates of a model: its mixed workers, else (PD-only fleet) every available one. */
export function mixedCandidates(g: ModelGroup | undefined): readonly LiveWorker[] {
  if (!g) return EMPTY;
  return g.availableByRole.mixed.length > 0 ? g.availableByRole.mixed : g.available;
}

const EMPTY: readonly LiveWorker[] = [];
