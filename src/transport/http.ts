/**
 * The HTTP request plane: sends an OpenAI body straight to a worker's engine URL over an
 * undici `Pool` per worker (keep-alive, no pipelining so that one slow stream never blocks
 * another). Connection failures before any response byte become `WorkerUnreachableError`,
 * which the MixedRouter retries on another worker.
 */
import { type Dispatcher, Pool } from "undici";
import { TimeoutError, UpstreamError } from "../protocol/errors.ts";
import { connectionFailureKind, WorkerUnreachableError } from "../router/errors.ts";
import type {
  EndpointKind,
  RequestExecutor,
  SendOptions,
  UpstreamResponse,
  WorkerState,
} from "../router/types.ts";

export interface HttpExecutorOptions {
  /** Max open connections per worker. */
  connections?: number;
  /** Wait for response headers (a non-streamed answer's headers come at its end). */
  headersTimeoutMs?: number;
  /** Max gap between body chunks. */
  bodyTimeoutMs?: number;
  keepAliveTimeoutMs?: number;
}

const PATHS: Record<EndpointKind, string> = { chat: "/v1/chat/completions", completion: "/v1/completions" };

/**
 * The client's own bytes of a body the server parsed and forwards unchanged, so the hot path
 * skips a JSON.stringify. Keyed by the parsed object: a router that builds a new body (PD)
 * naturally falls back to serialising it.
 */
const rawBodies = new WeakMap<object, Buffer>();

/** Marks `raw` as the exact serialisation of `body` (the caller must not mutate `body` after). */
export function setRawBody(body: object, raw: Buffer): void {
  rawBodies.set(body, raw);
}

export class HttpExecutor implements RequestExecutor {
  private readonly pools = new Map<string, Pool>();

  constructor(private readonly opts: HttpExecutorOptions = {}) {}

  private pool(url: string): Pool {
    let p = this.pools.get(url);
    if (!p) {
      p = new Pool(url, {
        connections: this.opts.connections ?? 256,
        pipelining: 1,
        keepAliveTimeout: this.opts.keepAliveTimeoutMs ?? 4000,
        headersTimeout: this.opts.headersTimeoutMs ?? 600_000,
        bodyTimeout: this.opts.bodyTimeoutMs ?? 300_000,
      });
      this.pools.set(url, p);
    }
    return p;
  }

  async send(
    worker: WorkerState,
    endpoint: EndpointKind,
    body: Record<string, unknown>,
    opts: SendOptions,
  ): Promise<UpstreamResponse> {
    const url = worker.record.url;
    const headers: Record<string, string> =
      opts.headers === undefined
        ? { "content-type": "application/json" }
        : { "content-type": "application/json", ...opts.headers };
    let res: Awaited<ReturnType<Pool["request"]>>;
    try {
      res = await this.pool(url).request({
        path: PATHS[endpoint],
        method: "POST",
        headers,
        body: rawBodies.get(body) ?? JSON.stringify(body),
        signal: opts.signal,
        headersTimeout: opts.timeoutMs,
      });
    } catch (err) {
      throw classify(err, url);
    }
    const outHeaders: Record<string, string> = {};
    for (const k in res.headers) {
      const v = res.headers[k];
      if (v !== undefined) outHeaders[k] = Array.isArray(v) ? v.join(", ") : v;
    }
    return new UndiciUpstream(res.statusCode, outHeaders, res.body);
  }

  /** Drops the pool of a worker that left the fleet. */
  forget(url: string): void {
    const p = this.pools.get(url);
    if (!p) return;
    this.pools.delete(url);
    p.destroy().catch(() => {});
  }

  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.destroy().catch(() => {})));
  }
}

/**
 * A worker's answer. A class rather than an object of closures: prototype methods cost nothing
 * per request, where tsx's keepNames wraps every per-request closure in a defineProperty call.
 */
class UndiciUpstream implements UpstreamResponse {
  constructor(
    readonly status: number,
    readonly headers: Record<string, string>,
    readonly body: Dispatcher.ResponseData["body"],
  ) {}

  json(): Promise<unknown> {
    return this.body.json();
  }

  abort(): void {
    if (!this.body.destroyed) this.body.destroy();
  }
}

function classify(err: unknown, url: string): Error {
  const e = err as { name?: string; code?: string; message?: string };
  if (e?.name === "AbortError") return err as Error;
  const kind = connectionFailureKind(err);
  if (kind) return new WorkerUnreachableError(url, kind, e.code ?? e.message ?? "connection error");
  if (e?.code === "UND_ERR_HEADERS_TIMEOUT") return new TimeoutError(`Worker ${url} did not answer in time.`);
  return new UpstreamError(`Request to worker failed: ${e?.message ?? String(err)}`);
}
