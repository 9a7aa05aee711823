/**
 * Reads (and caches per worker) a prefill worker's control endpoint: Mooncake's bootstrap
 * `GET /query`, ATOM's `GET /kv_transfer_info`. The answer is stable for a worker's life,
 * so it is fetched once per worker id + start time; a failure is not cached.
 */
import { request } from "undici";
import type { WorkerRecord } from "../../discovery/types.ts";
import { UpstreamError } from "../../protocol/errors.ts";
import { type AbortLike, toAbortSignal } from "../../util/abort.ts";

export class PeerInfoCache {
  private readonly timeoutMs;
  private readonly cache = new Map<string, Promise<Record<string, unknown>>>();

  constructor(timeoutMs = 3000) {
    this.timeoutMs = timeoutMs;
  }

  get(rec: WorkerRecord, url: string, signal: AbortLike): Promise<Record<string, unknown>> {
    const key = `${rec.id}@${rec.startedAt}:${url}`;
    let p = this.cache.get(key);
    if (!p) {
      p = this.fetch(url, signal);
      this.cache.set(key, p);
      p.catch(() => this.cache.delete(key));
    }
    return p;
  }

  forget(workerId: string): void {
    for (const k of this.cache.keys()) if (k.startsWith(`${workerId}@`)) this.cache.delete(k);
  }

  private async fetch(url: string, signal: AbortLike): Promise<Record<string, unknown>> {
    try {
      const res = await request(url, {
        method: "GET",
        signal: AbortSignal.any([toAbortSignal(signal), AbortSignal.timeout(this.timeoutMs)]),
        headersTimeout: this.timeoutMs,
        bodyTimeout: this.timeoutMs,
      });
      if (res.statusCode !== 200) {
        await res.body.dump();
        throw new Error(`HTTP ${res.statusCode}`);
      }
      const j = (await res.body.json()) as unknown;
      if (!j || typeof j !== "object" || Array.isArray(j)) throw new Error("not a JSON object");
      return j as Record<string, unknown>;
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      throw new UpstreamError(`Prefill worker control endpoint ${url} failed: ${msg}`, 502, "prefill_failed");
    }
  }
}
