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
  pdProtocols,
  type SerialProtocol,
} from "./protocols/index.ts";
import { choosePair, leastLoaded } from "./select.ts";
import { describeError, drain, errorMessage, failureKind, isTimeout, tracked } from "./upstream.ts";

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

  constructor(
    private readonly ctx: DisaggFactoryContext,
    private readonly o: DisaggOptions,
  ) {}

  async handle(req: RoutingRequest, exec: RequestExecutor, signal: AbortSignal): Promise<UpstreamResponse> {
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
      const proto = pdProtocols[pair.kind];
      try {
        return proto.mode === "serial"
          ? await this.serial(req, exec, signal, proto, p, pair.decode)
          : await this.concurrent(req, exec, signal, proto, p, pair.decode);
      } catch (err) {
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
    signal: AbortSignal,
  ): Promise<PdInput> {
    let peer: Record<string, unknown> | undefined;
    if (proto.peerInfo) {
      try {
        peer = await this.peers.get(p.record, proto.peerInfo(p.record).url, signal);
      } catch (err) {
        throw new PrefillFailure(p, err);
      }
    }
    const requestId = proto.requestId?.(req.requestId, p.record, d.record) ?? req.requestId;
    return { body: req.body, requestId, prefill: p.record, decode: d.record, peer };
  }

  private prefillTokens(req: RoutingRequest): number {
    return this.ctx.options.trackPrefill === false ? 0 : req.promptTokens().length;
  }

  private async serial(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortSignal,
    proto: SerialProtocol,
    p: WorkerState,
    d: WorkerState,
  ): Promise<UpstreamResponse> {
    const input = await this.input(req, proto, p, d, signal);
    const headers = { "x-request-id": input.requestId };
    const tokens = this.prefillTokens(req);
    p.inFlight++;
    p.pendingPrefillTokens += tokens;
    let params: Record<string, unknown>;
    try {
      const up = await exec
        .send(p, req.endpoint, proto.prefillBody(input), {
          signal,
          headers,
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
      p.inFlight--;
      p.pendingPrefillTokens -= tokens;
    }
    return this.decode(req, exec, signal, d, proto.decodeBody(input, params), headers);
  }

  private async decode(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortSignal,
    d: WorkerState,
    body: Record<string, unknown>,
    headers: Record<string, string>,
    onAbort?: () => void,
  ): Promise<UpstreamResponse> {
    d.inFlight++;
    let up: UpstreamResponse;
    try {
      up = await exec.send(d, req.endpoint, body, { signal, headers, timeoutMs: this.o.decodeTimeoutMs });
    } catch (err) {
      d.inFlight--;
      if (signal.aborted) throw err;
      const kind = failureKind(err);
      if (kind) this.ctx.reportFailure?.(d, kind);
      throw decodeError(d, err);
    }
    if (up.status >= 500) {
      const msg = await errorMessage(up);
      d.inFlight--;
      this.ctx.reportFailure?.(d, "5xx");
      throw decodeError(d, new UpstreamError(msg, up.status));
    }
    this.ctx.reportSuccess?.(d);
    return tracked(up, d, onAbort);
  }

  private async concurrent(
    req: RoutingRequest,
    exec: RequestExecutor,
    signal: AbortSignal,
    proto: ConcurrentProtocol,
    p: WorkerState,
    d: WorkerState,
  ): Promise<UpstreamResponse> {
    const input = await this.input(req, proto, p, d, signal);
    const headers = { "x-request-id": input.requestId };
    const bodies = proto.bodies(input);
    const pCtl = new AbortController();
    const dCtl = new AbortController();
    const pSignal = AbortSignal.any([signal, pCtl.signal]);
    const tokens = this.prefillTokens(req);
    p.inFlight++;
    p.pendingPrefillTokens += tokens;
    let pReleased = false;
    const releaseP = () => {
      if (pReleased) return;
      pReleased = true;
      p.inFlight--;
      p.pendingPrefillTokens -= tokens;
    };
    const prefill = exec.send(p, req.endpoint, bodies.prefill, {
      signal: pSignal,
      headers,
      timeoutMs: this.o.prefillTimeoutMs,
    });
    const decode = this.decode(
      req,
      exec,
      AbortSignal.any([signal, dCtl.signal]),
      d,
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
      releaseP();
      cancelDecode();
      throw signal.aborted ? err : new PrefillFailure(p, err);
    }
    if (pUp.status >= 400) {
      const msg = await errorMessage(pUp);
      releaseP();
      cancelDecode();
      if (pUp.status < 500) throw new InferaError(pUp.status, msg, { code: "prefill_rejected" });
      throw new PrefillFailure(p, new UpstreamError(msg, pUp.status));
    }
    this.ctx.reportSuccess?.(p);
    void drain(pUp).finally(releaseP);
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
    signal: AbortSignal,
    d: WorkerState,
  ): Promise<UpstreamResponse> {
    this.ctx.logger.warn(
      { requestId: req.requestId, worker: d.record.id },
      "no prefill worker; running mixed on D",
    );
    const headers = { "x-request-id": req.requestId };
    d.inFlight++;
    let up: UpstreamResponse;
    try {
      up = await exec.send(d, req.endpoint, req.body as Record<string, unknown>, {
        signal,
        headers,
        timeoutMs: this.o.decodeTimeoutMs,
      });
    } catch (err) {
      d.inFlight--;
      throw err;
    }
    return tracked(up, d);
  }
}

function decodeError(d: WorkerState, err: unknown): Error {
  const msg = `Decode worker ${d.record.id} failed after prefill: ${describeError(err)}`;
  return isTimeout(err) ? new TimeoutError(msg) : new UpstreamError(msg, 502, "decode_failed");
}
