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
import type { RequestExecutor, UpstreamResponse } from "../../transport/types.ts";
import { type AbortLike, toAbortSignal } from "../../util/abort.ts";
import { WorkerClaim } from "../dispatch.ts";
import type { RequestTrace } from "../trace.ts";
import type { DisaggFactoryContext, ModelRouter, RoutingRequest, WorkerState } from "../types.ts";
import { PeerInfoCache } from "./peer-info.ts";
import {
  type ConcurrentProtocol,
  type PdInput,
  protocolForPair,
  type SerialProtocol,
} from "./protocols/index.ts";
import { choosePair, leastLoaded } from "./select.ts";
import { describeError, drain, errorMessage, isTimeout } from "./upstream.ts";

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
  readonly worker: WorkerState;
  readonly reason: unknown;
  constructor(worker: WorkerState, reason: unknown) {
    super(`prefill on ${worker.record.id} failed: ${describeError(reason)}`);
    this.worker = worker;
    this.reason = reason;
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
  private readonly ctx: DisaggFactoryContext;
  private readonly o: DisaggOptions;
  readonly kind = "disagg" as const;
  private readonly peers = new PeerInfoCache();
  /** Round-robin position over each prefill worker's DP ranks (id → next index). */
  private readonly rankTurns = new Map<string, number>();

  constructor(ctx: DisaggFactoryContext, o: DisaggOptions) {
    this.ctx = ctx;
    this.o = o;
  }

  async handle(req: RoutingRequest, exec: RequestExecutor, signal: AbortLike): Promise<UpstreamResponse> {
    const { ctx } = this;
    const excluded = new Set<WorkerState>();
    const failures: PrefillFailure[] = [];
    const attempts = this.o.maxPrefillAttempts ?? 3;
    while (failures.length < attempts) {
      const pCands = ctx.prefillWorkers();
      const rs = req.trace?.route("pd", pCands);
      const pair = choosePair(req, pCands, ctx.decodeWorkers(), ctx.policy, excluded);
      rs?.chose(pair?.prefill.worker ?? null, pair ? pair.prefill.reason : "no_pair", {
        "infera.route.decode": pair?.decode.record.id ?? "",
        "infera.route.connector": pair?.kind ?? "",
      });
      if (!pair) break;
      const p = pair.prefill.worker;
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
      const pClaim = new WorkerClaim(p, ctx, this.prefillTokens(req));
      const dClaim = new WorkerClaim(pair.decode, ctx);
      if (req.trace) {
        pClaim.traceAs(req.trace, "prefill");
        dClaim.traceAs(req.trace, "decode");
      }
      // P's claim reports how its prefill ends (the pending bridge listens).
      ctx.policy.onRouted?.(req, p, pClaim);
      try {
        return proto.mode === "serial"
          ? await this.serial(req, exec, signal, proto, pClaim, dClaim)
          : await this.concurrent(req, exec, signal, proto, pClaim, dClaim);
      } catch (err) {
        pClaim.release();
        dClaim.release();
        if (!(err instanceof PrefillFailure)) throw err;
        if (signal.aborted) throw err.reason;
        // Counted once per claim: a connection failure or 5xx answer already was, in send.
        pClaim.fail(err.reason);
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
    return this.ctx.trackPrefill === false ? 0 : req.promptTokens().length;
  }

  private async serial(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortLike,
    proto: SerialProtocol,
    pClaim: WorkerClaim,
    dClaim: WorkerClaim,
  ): Promise<UpstreamResponse> {
    const p = pClaim.worker;
    const { input, ranks } = await this.input(req, proto, p, dClaim.worker, signal);
    const headers = { "x-request-id": input.requestId };
    let params: Record<string, unknown>;
    try {
      const up = await pClaim
        .send(exec, req.endpoint, proto.prefillBody(input), {
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
      // P answered after its prefill: the prompt's blocks are computed there.
      pClaim.firstByte();
      pClaim.succeed();
    } finally {
      pClaim.release();
    }
    if (req.trace) traceKvTransfer(req.trace, input, dClaim);
    try {
      return await this.decode(req, exec, signal, dClaim, proto.decodeBody(input, params), headers);
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
    dClaim: WorkerClaim,
    body: Record<string, unknown>,
    headers: Record<string, string>,
    onAbort?: () => void,
  ): Promise<UpstreamResponse> {
    const d = dClaim.worker;
    let up: UpstreamResponse;
    try {
      up = await dClaim.send(exec, req.endpoint, body, {
        signal,
        headers,
        timeoutMs: this.o.decodeTimeoutMs,
      });
    } catch (err) {
      // The claim has ended (and counted a connection failure); timeouts count here.
      if (signal.aborted) throw err;
      dClaim.fail(err);
      throw decodeError(d, err);
    }
    if (up.status >= 500) {
      // Counted as a 5xx by send.
      const msg = await errorMessage(up);
      dClaim.release();
      throw decodeError(d, new UpstreamError(msg, up.status));
    }
    dClaim.succeed();
    return dClaim.wrap(up, onAbort);
  }

  private async concurrent(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortLike,
    proto: ConcurrentProtocol,
    pClaim: WorkerClaim,
    dClaim: WorkerClaim,
  ): Promise<UpstreamResponse> {
    const p = pClaim.worker;
    const { input, ranks } = await this.input(req, proto, p, dClaim.worker, signal);
    const headers = { "x-request-id": input.requestId };
    const bodies = proto.bodies(input);
    const pCtl = new AbortController();
    const dCtl = new AbortController();
    const prefill = pClaim.send(exec, req.endpoint, bodies.prefill, {
      signal: AbortSignal.any([toAbortSignal(signal), pCtl.signal]),
      headers: this.prefillHeaders(input, ranks),
      timeoutMs: this.o.prefillTimeoutMs,
    });
    const decode = this.decode(
      req,
      exec,
      AbortSignal.any([toAbortSignal(signal), dCtl.signal]),
      dClaim,
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
    pClaim.succeed();
    pClaim.firstByte();
    if (req.trace) traceKvTransfer(req.trace, input, dClaim);
    // P's claim (and its prompt's pending prefill) ends with its half.
    void drain(pUp).finally(pClaim.releaser());
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
    // An ordinary request, dispatched like the MixedRouter's (without its retries).
    const claim = new WorkerClaim(d, this.ctx, this.prefillTokens(req));
    if (req.trace) claim.traceAs(req.trace, "mixed");
    const up = await claim.send(exec, req.endpoint, req.body as Record<string, unknown>, {
      signal,
      headers,
      timeoutMs: this.o.decodeTimeoutMs,
    });
    if (up.status < 500) claim.succeed();
    return claim.wrap(up);
  }
}

/**
 * The KV transfer's bookkeeping as a span: from P's answer (its blocks ready to be pulled) to
 * D's first byte (D has them and generates), or D's claim ending without one.
 */
function traceKvTransfer(t: RequestTrace, input: PdInput, dClaim: WorkerClaim): void {
  const span = t.phase("kv_transfer");
  span.set("infera.prefill", input.prefill.id);
  span.set("infera.decode", input.decode.id);
  if (input.transferId !== undefined) span.set("infera.transfer_id", String(input.transferId));
  dClaim.watch({ prefilled: () => span.end(), dropped: (reason) => span.end(reason) });
}

function decodeError(d: WorkerState, err: unknown): Error {
  const msg = `Decode worker ${d.record.id} failed after prefill: ${describeError(err)}`;
  return isTimeout(err) ? new TimeoutError(msg) : new UpstreamError(msg, 502, "decode_failed");
}
