/**
 * DisaggRouter: one prefill worker (P) and one decode worker (D) per request, joined by
 * their connector's protocol (./protocols). Serial protocols await P's JSON and build D's
 * body from its `kv_transfer_params`; concurrent ones fire both halves together and return
 * D's answer, holding it back only until P has accepted its half (D cannot produce a token
 * before P's KV exists, so this costs no latency and lets a failed P be retried).
 *
 * One request id (`X-Request-Id`) for both halves. D's answer (streamed or not) goes to the
 * client as it comes, so its usage covers the whole request. A client abort cancels both.
 *
 * Faults: P unreachable / 5xx / timeout / no params → another P (at most
 * `maxPrefillAttempts`), then, with `pdFallbackMixed`, the whole request on a D as an
 * ordinary request; otherwise a 502. D failing after P → a clean 502 (504 on timeouts); P
 * frees the held blocks on its own hold timeout (or when D's aborted pull ends).
 */
import { InferaError, NoWorkerError, TimeoutError, UpstreamError } from "../../protocol/errors.ts";
import { type AbortLike, toAbortSignal } from "../../util/abort.ts";
import type {
  DisaggFactoryContext,
  ModelRouter,
  RequestExecutor,
  RoutingRequest,
  UpstreamResponse,
  WorkerState,
} from "../types.ts";
import { PeerInfoCache } from "./peer-info.ts";
import {
  type ConcurrentProtocol,
  type PdInput,
  protocolForPair,
  type SerialProtocol,
} from "./protocols/index.ts";
import { choosePair, leastLoaded } from "./select.ts";
import {
  describeError,
  drain,
  errorMessage,
  failureKind,
  isTimeout,
  tracked,
  WorkerSlot,
} from "./upstream.ts";

export interface DisaggOptions {
  /** Limit for P's half (to its answer). */
  prefillTimeoutMs?: number;
  /** Limit for D's half (to its response headers). */
  decodeTimeoutMs?: number;
  /** When no prefill worker can serve, run the request on a decode worker as an ordinary request. */
  pdFallbackMixed?: boolean;
  /** Prefill workers tried per request. */
  maxPrefillAttempts?: number;
}

/** P could not do its half; the router may try another P. */
class PrefillFailure extends Error {
  constructor(
    readonly worker: WorkerState,
    readonly reason: unknown,
  ) {
    super(`prefill on ${worker.record.id} failed: ${describeError(reason)}`);
  }
}

function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) && v > 0 ? v : undefined;
}

export function disaggOptionsFrom(
  o: Readonly<Record<string, unknown>>,
  defaults: DisaggOptions,
): DisaggOptions {
  return {
    prefillTimeoutMs: num(o.prefillTimeoutMs) ?? defaults.prefillTimeoutMs,
    decodeTimeoutMs: num(o.decodeTimeoutMs) ?? defaults.decodeTimeoutMs,
    pdFallbackMixed: typeof o.pdFallbackMixed === "boolean" ? o.pdFallbackMixed : defaults.pdFallbackMixed,
    maxPrefillAttempts: num(o.maxPrefillAttempts) ?? defaults.maxPrefillAttempts,
  };
}

export class DisaggRouter implements ModelRouter {
  readonly kind = "disagg" as const;
  private readonly peers = new PeerInfoCache();
  /** Round-robin position over each prefill worker's DP ranks (id → next index). */
  private readonly rankTurns = new Map<string, number>();

  constructor(
    private readonly ctx: DisaggFactoryContext,
    private readonly o: DisaggOptions,
  ) {}

  async handle(req: RoutingRequest, exec: RequestExecutor, signal: AbortLike): Promise<UpstreamResponse> {
    const { ctx } = this;
    const excluded = new Set<WorkerState>();
    const failures: PrefillFailure[] = [];
    const attempts = this.o.maxPrefillAttempts ?? 3;
    while (failures.length < attempts) {
      const pair = choosePair(req, ctx.prefillWorkers(), ctx.decodeWorkers(), ctx.policy, excluded);
      if (!pair) break;
      const p = pair.prefill.worker;
      ctx.policy.onRouted?.(req, p);
      ctx.logger.debug(
        {
          requestId: req.requestId,
          prefill: p.record.id,
          decode: pair.decode.record.id,
          connector: pair.kind,
        },
        "pd pair",
      );
      const proto = protocolForPair(pair.kind, p.record);
      // Claimed before any await, so concurrent requests see each other's choices.
      const pSlot = new WorkerSlot(p, this.prefillTokens(req));
      const dSlot = new WorkerSlot(pair.decode);
      try {
        return proto.mode === "serial"
          ? await this.serial(req, exec, signal, proto, pSlot, dSlot)
          : await this.concurrent(req, exec, signal, proto, pSlot, dSlot);
      } catch (err) {
        pSlot.release();
        dSlot.release();
        if (!(err instanceof PrefillFailure)) throw err;
        if (signal.aborted) throw err.reason;
        const kind = failureKind(err.reason);
        if (kind) ctx.reportFailure?.(p, kind);
        ctx.logger.warn(
          { requestId: req.requestId, worker: p.record.id, err: err.message },
          "prefill failed",
        );
        excluded.add(p);
        failures.push(err);
      }
    }
    if (this.o.pdFallbackMixed) {
      const d = leastLoaded(ctx.decodeWorkers());
      if (d) return this.mixedOnDecode(req, exec, signal, d);
    }
    if (failures.length > 0) {
      const last = failures[failures.length - 1];
      throw new UpstreamError(
        `Prefill failed on ${failures.length} worker(s); last: ${describeError(last.reason)}`,
        502,
        "prefill_failed",
      );
    }
    throw new NoWorkerError(ctx.model);
  }

  private async input(
    req: RoutingRequest,
    proto: SerialProtocol | ConcurrentProtocol,
    p: WorkerState,
    d: WorkerState,
    signal: AbortLike,
  ): Promise<{ input: PdInput; ranks: number }> {
    let peer: Record<string, unknown> | undefined;
    if (proto.peerInfo) {
      try {
        peer = await this.peers.get(p.record, proto.peerInfo(p.record).url, signal);
      } catch (err) {
        throw new PrefillFailure(p, err);
      }
    }
    const requestId = proto.requestId?.(req.requestId, p.record, d.record) ?? req.requestId;
    const input: PdInput = { body: req.body, requestId, prefill: p.record, decode: d.record, peer };
    input.transferId = proto.newTransferId?.();
    const ranks = proto.dpRanks?.(p.record, peer) ?? [];
    if (ranks.length > 0) input.prefillDpRank = this.nextRank(p.record.id, ranks);
    return { input, ranks: ranks.length };
  }

  private nextRank(workerId: string, ranks: readonly number[]): number {
    const turn = this.rankTurns.get(workerId) ?? 0;
    this.rankTurns.set(workerId, turn + 1);
    return ranks[turn % ranks.length]!;
  }

  /**
   * Headers of P's half: the shared request id, and `X-data-parallel-rank` when P's URL
   * serves several ranks, which vLLM's API server reads to run the request on that rank
   * (vllm-project/vllm vllm/entrypoints/openai/engine/serving.py `_get_data_parallel_rank`
   * @ 619e4b3). One rank per URL: nothing to pin.
   */
  private prefillHeaders(input: PdInput, ranks: number): Record<string, string> {
    const h: Record<string, string> = { "x-request-id": input.requestId };
    if (ranks > 1 && input.prefillDpRank !== undefined)
      h["x-data-parallel-rank"] = String(input.prefillDpRank);
    return h;
  }

  private prefillTokens(req: RoutingRequest): number {
    return this.ctx.options.trackPrefill === false ? 0 : req.promptTokens().length;
  }

  private async serial(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortLike,
    proto: SerialProtocol,
    pSlot: WorkerSlot,
    dSlot: WorkerSlot,
  ): Promise<UpstreamResponse> {
    const p = pSlot.worker;
    const { input, ranks } = await this.input(req, proto, p, dSlot.worker, signal);
    const headers = { "x-request-id": input.requestId };
    let params: Record<string, unknown>;
    try {
      const up = await exec
        .send(p, req.endpoint, proto.prefillBody(input), {
          signal,
          headers: this.prefillHeaders(input, ranks),
          timeoutMs: this.o.prefillTimeoutMs,
        })
        .catch((err: unknown) => {
          throw new PrefillFailure(p, err);
        });
      if (up.status >= 400) {
        const msg = await errorMessage(up);
        // A 4xx is the request's fault, not P's: the client gets it as it is.
        if (up.status < 500) throw new InferaError(up.status, msg, { code: "prefill_rejected" });
        throw new PrefillFailure(p, new UpstreamError(msg, up.status));
      }
      const answer = (await up.json().catch((err: unknown) => {
        throw new PrefillFailure(p, err);
      })) as Record<string, unknown> | null;
      const kvp = answer?.kv_transfer_params;
      if (!kvp || typeof kvp !== "object") {
        throw new PrefillFailure(p, new UpstreamError("prefill answer carries no kv_transfer_params"));
      }
      params = kvp as Record<string, unknown>;
      this.ctx.reportSuccess?.(p);
    } finally {
      pSlot.release();
    }
    try {
      return await this.decode(req, exec, signal, dSlot, proto.decodeBody(input, params), headers);
    } catch (err) {
      // D will never pull what P holds: free it now where the protocol can.
      proto.releasePrefill?.(input, params).catch(() => {});
      throw err;
    }
  }

  private async decode(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortLike,
    dSlot: WorkerSlot,
    body: Record<string, unknown>,
    headers: Record<string, string>,
    onAbort?: () => void,
  ): Promise<UpstreamResponse> {
    const d = dSlot.worker;
    let up: UpstreamResponse;
    try {
      up = await exec.send(d, req.endpoint, body, { signal, headers, timeoutMs: this.o.decodeTimeoutMs });
    } catch (err) {
      dSlot.release();
      if (signal.aborted) throw err;
      const kind = failureKind(err);
      if (kind) this.ctx.reportFailure?.(d, kind);
      throw decodeError(d, err);
    }
    if (up.status >= 500) {
      const msg = await errorMessage(up);
      dSlot.release();
      this.ctx.reportFailure?.(d, "5xx");
      throw decodeError(d, new UpstreamError(msg, up.status));
    }
    this.ctx.reportSuccess?.(d);
    return tracked(up, dSlot, onAbort);
  }

  private async concurrent(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortLike,
    proto: ConcurrentProtocol,
    pSlot: WorkerSlot,
    dSlot: WorkerSlot,
  ): Promise<UpstreamResponse> {
    const p = pSlot.worker;
    const { input, ranks } = await this.input(req, proto, p, dSlot.worker, signal);
    const headers = { "x-request-id": input.requestId };
    const bodies = proto.bodies(input);
    const pCtl = new AbortController();
    const dCtl = new AbortController();
    const prefill = exec.send(p, req.endpoint, bodies.prefill, {
      signal: AbortSignal.any([toAbortSignal(signal), pCtl.signal]),
      headers: this.prefillHeaders(input, ranks),
      timeoutMs: this.o.prefillTimeoutMs,
    });
    const decode = this.decode(
      req,
      exec,
      AbortSignal.any([toAbortSignal(signal), dCtl.signal]),
      dSlot,
      bodies.decode,
      headers,
      () => pCtl.abort(),
    );
    // Both run; neither rejection may go unobserved while the other is awaited.
    prefill.catch(() => {});
    decode.catch(() => {});
    const cancelDecode = () => {
      dCtl.abort();
      decode.then((up) => up.abort()).catch(() => {});
    };
    let pUp: UpstreamResponse;
    try {
      pUp = await prefill;
    } catch (err) {
      cancelDecode();
      throw signal.aborted ? err : new PrefillFailure(p, err);
    }
    if (pUp.status >= 400) {
      const msg = await errorMessage(pUp);
      cancelDecode();
      if (pUp.status < 500) throw new InferaError(pUp.status, msg, { code: "prefill_rejected" });
      throw new PrefillFailure(p, new UpstreamError(msg, pUp.status));
    }
    this.ctx.reportSuccess?.(p);
    void drain(pUp).finally(() => pSlot.release());
    try {
      return await decode;
    } catch (err) {
      pCtl.abort();
      throw err;
    }
  }

  private async mixedOnDecode(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortLike,
    d: WorkerState,
  ): Promise<UpstreamResponse> {
    this.ctx.logger.warn(
      { requestId: req.requestId, worker: d.record.id },
      "no prefill worker; running mixed on D",
    );
    const headers = { "x-request-id": req.requestId };
    const slot = new WorkerSlot(d, this.prefillTokens(req));
    let up: UpstreamResponse;
    try {
      up = await exec.send(d, req.endpoint, req.body as Record<string, unknown>, {
        signal,
        headers,
        timeoutMs: this.o.decodeTimeoutMs,
      });
    } catch (err) {
      slot.release();
      throw err;
    }
    return tracked(up, slot);
  }
}

function decodeError(d: WorkerState, err: unknown): Error {
  const msg = `Decode worker ${d.record.id} failed after prefill: ${describeError(err)}`;
  return isTimeout(err) ? new TimeoutError(msg) : new UpstreamError(msg, 502, "decode_failed");
}
