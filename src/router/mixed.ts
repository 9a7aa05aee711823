/**
 * MixedRouter: one worker per request, chosen by the policy. Keeps the server's in-flight
 * accounting per worker (released when the answer's body ends, fails or is aborted) and
 * retries a request whose worker could not be reached (refused / reset before the first
 * byte) on ANOTHER worker, at most `maxRetries` times.
 */
import type { Readable } from "node:stream";
import { NoWorkerError } from "../protocol/errors.ts";
import { PushBody } from "../transport/push-body.ts";
import type { AbortLike } from "../util/abort.ts";
import type { Logger } from "../util/log.ts";
import { connectionFailureKind, WorkerUnreachableError } from "./errors.ts";
import type {
  ModelRouter,
  RequestExecutor,
  RoutingPolicy,
  RoutingRequest,
  Selection,
  UpstreamResponse,
} from "./types.ts";
import type { LiveWorker, WorkerSet } from "./worker-set.ts";

export { WorkerUnreachableError } from "./errors.ts";

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
  readonly kind = "mixed" as const;

  constructor(private readonly o: MixedRouterOptions) {}

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
      const sel = o.policy.select(req, cands);
      const w = sel.worker as LiveWorker;
      o.observer?.onDecision?.(o.model, o.policy.name, "mixed", sel);
      const prefill = o.trackPrefill ? req.promptTokens().length : 0;
      w.inFlight++;
      w.routed++;
      w.pendingPrefillTokens += prefill;
      o.policy.onRouted?.(req, w);
      let up: UpstreamResponse;
      // vLLM runs a request on the DP rank its OpenAI server reads from `X-data-parallel-rank`
      // (vllm/entrypoints/openai/serving_engine.py _get_data_parallel_rank); the policy pins the
      // rank holding the cached prefix.
      const sendHeaders =
        sel.dpRank === undefined ? headers : { ...headers, "x-data-parallel-rank": String(sel.dpRank) };
      try {
        up = await exec.send(w, req.endpoint, req.body as Record<string, unknown>, {
          signal,
          headers: sendHeaders,
        });
      } catch (err) {
        w.inFlight--;
        w.pendingPrefillTokens -= prefill;
        const kind = err instanceof WorkerUnreachableError ? err.kind : connectionFailureKind(err);
        if (kind === null || signal.aborted) throw err;
        o.workers.reportFailure(w, kind);
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
      if (up.status >= 500) o.workers.reportFailure(w, "5xx");
      else o.workers.reportSuccess(w);
      return trackRelease(up, w, prefill);
    }
  }
}

export function isReadable(b: AsyncIterable<Uint8Array>): b is Readable {
  return typeof (b as Readable).on === "function" && typeof (b as Readable).pause === "function";
}

/** An answer's content type: its `contentType` when the transport gives one, else from `headers`. */
export function contentTypeOf(up: UpstreamResponse): string | undefined {
  return "contentType" in up ? up.contentType : up.headers["content-type"];
}

/** Wraps an answer so the worker's in-flight count drops exactly once, however it ends. */
export function trackRelease(up: UpstreamResponse, w: LiveWorker, prefill: number): UpstreamResponse {
  return new TrackedUpstream(up, w, prefill);
}

/**
 * An answer whose worker's in-flight count drops exactly once, however it ends. A class with
 * prototype methods: per-request closures each cost a `__name` defineProperty under tsx.
 */
class TrackedUpstream implements UpstreamResponse {
  readonly status: number;
  readonly body: AsyncIterable<Uint8Array>;
  private released = false;
  private prefillPending: boolean;
  /** Bound once, for the body's 'close' listener (assigned, not a class field: no keepNames wrap). */
  private readonly releaseFn: () => void;

  constructor(
    private readonly up: UpstreamResponse,
    private readonly w: LiveWorker,
    private readonly prefill: number,
  ) {
    this.status = up.status;
    this.prefillPending = prefill > 0;
    this.releaseFn = () => this.release();
    const src = up.body;
    if (!this.prefillPending && src instanceof PushBody) {
      // The HTTP executor's body: handed through unwrapped, so the server relays it with plain
      // calls instead of a promise per chunk; onClose follows end, failure or destroy.
      src.onClose(this.releaseFn);
      this.body = src;
    } else if (!this.prefillPending && isReadable(src)) {
      // A Node stream body: likewise unwrapped, pumped with events; 'close' follows end, error or destroy.
      src.once("close", this.releaseFn);
      this.body = src;
    } else {
      this.body = this.wrap(src);
    }
  }

  private async *wrap(src: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
    try {
      for await (const chunk of src) {
        if (this.prefillPending) this.firstByte();
        yield chunk;
      }
    } finally {
      this.release();
    }
  }

  private firstByte(): void {
    if (this.prefillPending) {
      this.prefillPending = false;
      this.w.pendingPrefillTokens -= this.prefill;
    }
  }

  private release(): void {
    if (this.released) return;
    this.released = true;
    this.firstByte();
    this.w.inFlight--;
  }

  // Getters: the wrapped answer may build its headers lazily.
  get headers(): Record<string, string> {
    return this.up.headers;
  }

  get contentType(): string | undefined {
    return contentTypeOf(this.up);
  }

  json(): Promise<unknown> {
    return this.up.json().finally(this.releaseFn);
  }

  abort(): void {
    this.up.abort();
    this.release();
  }
}
