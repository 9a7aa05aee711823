/**
 * D's half of the side channel: pulls one request's KV from P's listener (see
 * ./side-channel.ts for the wire format) and turns every failure into a clean typed error:
 * 504 TimeoutError past the pull timeout, 502 UpstreamError (`kv_transfer_failed`) when P is
 * unreachable, answers with an error, or the payload is cut short. A client abort rethrows
 * the abort so the core treats it as a cancellation.
 */
import { TimeoutError, UpstreamError } from "../../../protocol/errors.ts";
import type { KvHeader } from "./side-channel.ts";

export interface PullOptions {
  signal: AbortSignal;
  timeoutMs: number;
  /** Concurrent protocols: how long P may take to offer the KV. */
  waitMs?: number;
  /** Serial protocols that name the blocks (Nixl, MoRIIO, ATOM): P checks they are the held ones. */
  blockIds?: readonly number[];
}

export interface PullResult {
  header: KvHeader;
  /** Payload bytes received (== header.payloadBytes on success). */
  bytes: number;
}

function hostPort(host: string, port: number): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]:${port}` : `${host}:${port}`;
}

export function sideChannelUrl(host: string, port: number, key: string): string {
  return `http://${hostPort(host, port)}/kv/${encodeURIComponent(key)}`;
}

export async function pullKv(url: string, opts: PullOptions): Promise<PullResult> {
  const timeout = AbortSignal.timeout(opts.timeoutMs);
  const signal = AbortSignal.any([opts.signal, timeout]);
  const u = new URL(url);
  if (opts.waitMs) u.searchParams.set("wait_ms", String(Math.max(0, Math.floor(opts.waitMs))));
  if (opts.blockIds) u.searchParams.set("block_ids", opts.blockIds.join(","));
  const fail = (err: unknown): never => {
    if (opts.signal.aborted) throw opts.signal.reason ?? err;
    if (timeout.aborted)
      throw new TimeoutError(`KV pull from ${u.host} timed out after ${opts.timeoutMs} ms`);
    if (err instanceof UpstreamError || err instanceof TimeoutError) throw err;
    const msg = err instanceof Error ? (err.cause instanceof Error ? err.cause.message : err.message) : "";
    throw new UpstreamError(
      `KV pull from ${u.host} failed: ${msg || "connection error"}`,
      502,
      "kv_transfer_failed",
    );
  };
  try {
    const res = await fetch(u, { signal });
    if (res.status !== 200) {
      let detail = `HTTP ${res.status}`;
      let code: string | undefined;
      try {
        const j = (await res.json()) as { error?: { message?: string; code?: string } };
        if (j.error?.message) detail = j.error.message;
        code = j.error?.code;
      } catch {
        // non-JSON error body: the status says enough
      }
      // A waiting pull that P answers "not held" means P waited out `wait_ms` without the KV
      // being offered: the pull timed out, whichever side's timer fired first (on a loaded
      // machine P's can fire before ours, which turned a 504 into a 502).
      if (opts.waitMs && res.status === 404 && code === "kv_not_found")
        throw new TimeoutError(`KV pull from ${u.host} timed out after ${opts.waitMs} ms: ${detail}`);
      throw new UpstreamError(`KV pull from ${u.host} failed: ${detail}`, 502, "kv_transfer_failed");
    }
    if (!res.body)
      throw new UpstreamError(`KV pull from ${u.host} returned no body`, 502, "kv_transfer_failed");
    return await readPull(res.body, u.host);
  } catch (err) {
    return fail(err);
  }
}

async function readPull(body: ReadableStream<Uint8Array>, from: string): Promise<PullResult> {
  let pending = Buffer.alloc(0);
  let header: KvHeader | null = null;
  let bytes = 0;
  for await (const chunk of body as AsyncIterable<Uint8Array>) {
    if (header) {
      bytes += chunk.byteLength;
      continue;
    }
    pending = Buffer.concat([pending, chunk]);
    if (pending.length < 4) continue;
    const len = pending.readUInt32BE(0);
    if (pending.length < 4 + len) continue;
    header = JSON.parse(pending.subarray(4, 4 + len).toString("utf8")) as KvHeader;
    bytes += pending.length - 4 - len;
    pending = Buffer.alloc(0);
  }
  if (!header) throw new UpstreamError(`KV pull from ${from}: truncated header`, 502, "kv_transfer_failed");
  if (bytes !== header.payloadBytes) {
    throw new UpstreamError(
      `KV pull from ${from}: got ${bytes} of ${header.payloadBytes} payload bytes`,
      502,
      "kv_transfer_failed",
    );
  }
  return { header, bytes };
}

/** The pulled tokens D may import: the common prefix of what P held and D's own prompt. */
export function importableTokens(pulled: readonly number[], prompt: readonly number[]): number[] {
  let n = 0;
  const max = Math.min(pulled.length, prompt.length);
  while (n < max && pulled[n] === prompt[n]) n++;
  return pulled.slice(0, n);
}

/** Waits `ms` unless `signal` aborts first (then rejects with its reason). */
export function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
