/**
 * MixedRouter: one worker per request, chosen by the policy. Each attempt is a `WorkerClaim`
 * (./dispatch.ts: the server's in-flight accounting per worker, released when the answer's
 * body ends, fails or is aborted, and the breaker's reports). A request whose worker could
 * not be reached (refused / reset before the first byte) is retried on ANOTHER worker, at
 * most `maxRetries` times.
 */
import { NoWorkerError } from "../protocol/errors.ts";
import {
  connectionKindOf,
  type RequestExecutor,
  type UpstreamResponse,
  WorkerUnreachableError,
} from "../transport/types.ts";
import type { AbortLike } from "../util/abort.ts";
import type { Logger } from "../util/log.ts";
import { WorkerClaim } from "./dispatch.ts";
import type { ModelRouter, RoutingPolicy, RoutingRequest, Selection } from "./types.ts";
import type { LiveWorker, WorkerSet } from "./worker-set.ts";

/** Callbacks the server uses for its metrics; all optional so routers work without them. */
export interface RouterObserver {
  onDecision?(model: string, policy: string, router: string, sel: Selection): void;
  onRetry?(model: string, reason: string): void;
}

export interface MixedRouterOptions {
  model: string;
  /** Available candidate workers, read on every request. */
  candidates: () => readonly LiveWorker[];
  policy: RoutingPolicy;
  workers: WorkerSet;
  maxRetries: number;
  /** Count prompt tokens into `pendingPrefillTokens` (load-aware policies need it; costs tokenization). */
  trackPrefill: boolean;
  logger: Logger;
  observer?: RouterObserver;
}

export class MixedRouter implements ModelRouter {
  private readonly o: MixedRouterOptions;
  readonly kind = "mixed" as const;

  constructor(o: MixedRouterOptions) {
    this.o = o;
  }

  async handle(req: RoutingRequest, exec: RequestExecutor, signal: AbortLike): Promise<UpstreamResponse> {
    const o = this.o;
    const headers = { "x-request-id": req.requestId };
    let tried: LiveWorker[] | null = null;
    for (let attempt = 0; ; attempt++) {
      let cands = o.candidates();
      if (tried !== null) {
        const t = tried;
        cands = cands.filter((w) => !t.includes(w));
      }
      // Out of candidates (possibly after failed attempts): the fleet cannot serve now.
      if (cands.length === 0) throw new NoWorkerError(o.model);
      // Flow control let the request through for the workers that had headroom: keep to them
      // while any is still a candidate (src/router/flow/queue.ts).
      const adm = req.admission;
      if (adm && adm.fits.size > 0 && adm.fits.size < cands.length) {
        const kept = cands.filter((c) => adm.fits.has(c.id));
        if (kept.length > 0) cands = kept;
      }
      const rs = req.trace?.route("mixed", cands);
      const sel = o.policy.select(req, cands);
      const w = sel.worker as LiveWorker;
      rs?.chose(w, sel.reason, { "infera.route.policy": o.policy.name, "infera.route.attempt": attempt });
      adm?.routed(w);
      o.observer?.onDecision?.(o.model, o.policy.name, "mixed", sel);
      const claim = new WorkerClaim(w, o.workers, o.trackPrefill ? req.promptTokens().length : 0);
      if (req.trace) claim.traceAs(req.trace, "mixed");
      // The claim reports how the prompt's prefill ends (the pending bridge listens).
      o.policy.onRouted?.(req, w, claim);
      let up: UpstreamResponse;
      // vLLM runs a request on the DP rank its OpenAI server reads from `X-data-parallel-rank`
      // (vllm/entrypoints/openai/serving_engine.py _get_data_parallel_rank); the policy pins the
      // rank holding the cached prefix.
      const sendHeaders =
        sel.dpRank === undefined ? headers : { ...headers, "x-data-parallel-rank": String(sel.dpRank) };
      try {
        up = await claim.send(exec, req.endpoint, req.body as Record<string, unknown>, {
          signal,
          headers: sendHeaders,
        });
      } catch (err) {
        // The claim has ended and counted a connection failure; only those are retried.
        const kind = connectionKindOf(err);
        if (kind === null || signal.aborted) throw err;
        if (attempt >= o.maxRetries) {
          throw err instanceof WorkerUnreachableError
            ? err
            : new WorkerUnreachableError(w.record.url, kind, "");
        }
        o.logger.warn(
          { requestId: req.requestId, worker: w.id, kind, attempt },
          "worker unreachable; retrying",
        );
        o.observer?.onRetry?.(o.model, kind);
        tried ??= [];
        tried.push(w);
        continue;
      }
      if (up.status < 500) claim.succeed();
      return claim.wrap(up);
    }
  }
}
