/**
 * The KV side channel between a prefill sim and a decode sim: a real HTTP listener on P that
 * serves the held KV of one request, and the client D uses to pull it. It stands in for the
 * RDMA/NIXL/Mooncake/MoRI data path, so the bytes really cross a socket.
 *
 * Wire format of a pull (`GET /kv/<key>?wait_ms=N&block_ids=1,2`): 200 with
 * `[u32 BE header length][header JSON][payload]`. The header carries the prompt token ids
 * (so D can import them as computed), the block ids, the real KV size of those blocks
 * (`kvBytes` = blocks × kvBytesPerBlock) and `payloadBytes`, the bytes that follow: the real
 * size capped at `maxTransferBytes` (default 8 MiB) so tests and benches on a small machine
 * do not move gigabytes through loopback. Errors are OpenAI-shaped JSON with 404/409/503.
 *
 * Concurrent protocols (Mooncake, SGLang) let D ask before P has finished: the listener
 * waits up to `wait_ms` for the key to be offered.
 */
import { once } from "node:events";
import http from "node:http";
import type { Logger } from "../../../util/log.ts";
import type { TransferSettings } from "./config.ts";
import type { HeldKv, SimKvHost } from "./types.ts";

export interface KvHeader {
  key: string;
  requestId: string;
  engineId: string;
  tokenIds: number[];
  blockIds: number[];
  kvBytes: number;
  payloadBytes: number;
}

/** When P lets go of an offered request's blocks. */
export type ReleasePolicy = "after-pull" | "on-notify";

interface Offer {
  held: HeldKv;
  policy: ReleasePolicy;
  timer: NodeJS.Timeout;
}

const CHUNK = Buffer.alloc(64 * 1024, 0x5a);

function errorJson(res: http.ServerResponse, status: number, message: string, code: string): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify({ error: { message, type: "server_error", param: null, code } });
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

function drainOrClose(res: http.ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}

export class KvSideChannel {
  private readonly host: SimKvHost;
  private readonly settings: TransferSettings;
  private readonly log: Logger;
  private readonly offers = new Map<string, Offer>();
  private readonly waiters = new Map<string, Set<() => void>>();
  private readonly server: http.Server;
  private boundPort = 0;
  /** Counters for logs and tests. */
  readonly stats = { pulls: 0, failedPulls: 0, bytesSent: 0, expired: 0 };

  constructor(host: SimKvHost, settings: TransferSettings, log: Logger) {
    this.host = host;
    this.settings = settings;
    this.log = log;
    this.server = http.createServer((req, res) => {
      this.handle(req, res).catch((err: unknown) => {
        this.log.warn({ err }, "side-channel request failed");
        errorJson(res, 500, "KV side channel failure", "kv_transfer_failed");
      });
    });
    this.server.keepAliveTimeout = 5_000;
  }

  get port(): number {
    return this.boundPort;
  }

  async listen(port: number, bindHost: string): Promise<number> {
    this.server.listen(port, bindHost);
    await once(this.server, "listening");
    const addr = this.server.address();
    this.boundPort = typeof addr === "object" && addr ? addr.port : port;
    return this.boundPort;
  }

  /** Makes a finished prefill's KV pullable under `key`; P frees it after the pull, notify or expiry. */
  offer(key: string, held: HeldKv, policy: ReleasePolicy = "after-pull"): void {
    const prev = this.offers.get(key);
    if (prev) this.release(key, "replaced");
    const timer = setTimeout(() => {
      this.stats.expired++;
      this.log.warn({ key, requestId: held.requestId }, "held KV expired before D pulled it; releasing");
      this.release(key, "expired");
    }, this.settings.holdTimeoutMs);
    timer.unref();
    this.offers.set(key, { held, policy, timer });
    const ws = this.waiters.get(key);
    if (ws) for (const wake of ws) wake();
  }

  has(key: string): boolean {
    return this.offers.has(key);
  }

  /** Frees the held blocks of `key` (idempotent). */
  release(key: string, reason: string): void {
    const offer = this.offers.get(key);
    if (!offer) return;
    clearTimeout(offer.timer);
    this.offers.delete(key);
    this.host.releaseHeld(offer.held.requestId);
    this.log.debug({ key, reason }, "released held KV");
  }

  async close(): Promise<void> {
    for (const key of [...this.offers.keys()]) this.release(key, "shutdown");
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private waitForOffer(key: string, waitMs: number, req: http.IncomingMessage): Promise<Offer | undefined> {
    const now = this.offers.get(key);
    if (now || waitMs <= 0) return Promise.resolve(now);
    return new Promise((resolve) => {
      let set = this.waiters.get(key);
      if (!set) {
        set = new Set();
        this.waiters.set(key, set);
      }
      const done = () => {
        clearTimeout(timer);
        req.off("close", done);
        set.delete(done);
        if (set.size === 0) this.waiters.delete(key);
        resolve(this.offers.get(key));
      };
      const timer = setTimeout(done, Math.min(waitMs, this.settings.pullTimeoutMs));
      req.on("close", done);
      set.add(done);
    });
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://side-channel");
    const m = /^\/kv\/(.+)$/.exec(url.pathname);
    if (req.method !== "GET" || !m) {
      errorJson(res, 404, `no such side-channel route ${req.method} ${url.pathname}`, "not_found");
      return;
    }
    const key = decodeURIComponent(m[1]);
    const waitMs = Number(url.searchParams.get("wait_ms") ?? "0") || 0;
    const offer = await this.waitForOffer(key, waitMs, req);
    if (req.destroyed) return;
    if (!offer) {
      this.stats.failedPulls++;
      errorJson(res, 404, `no KV held for ${key} on engine ${this.host.engineId}`, "kv_not_found");
      return;
    }
    const wanted = url.searchParams.get("block_ids");
    if (wanted !== null && wanted !== offer.held.blockIds.join(",")) {
      this.stats.failedPulls++;
      this.release(key, "block-id-mismatch");
      errorJson(res, 409, `block ids ${wanted} are not the blocks held for ${key}`, "kv_block_mismatch");
      return;
    }
    await this.send(key, offer, res);
  }

  private async send(key: string, offer: Offer, res: http.ServerResponse): Promise<void> {
    const { held } = offer;
    const kvBytes = held.blockIds.length * this.host.kvBytesPerBlock;
    const payloadBytes = Math.min(kvBytes, this.settings.maxTransferBytes);
    const header: KvHeader = {
      key,
      requestId: held.requestId,
      engineId: this.host.engineId,
      tokenIds: held.tokenIds,
      blockIds: held.blockIds,
      kvBytes,
      payloadBytes,
    };
    const headerBuf = Buffer.from(JSON.stringify(header));
    const lenBuf = Buffer.alloc(4);
    lenBuf.writeUInt32BE(headerBuf.length);
    res.writeHead(200, {
      "content-type": "application/octet-stream",
      "content-length": 4 + headerBuf.length + payloadBytes,
    });
    let finished = false;
    res.on("close", () => {
      if (finished && offer.policy === "on-notify") return;
      if (!finished) this.stats.failedPulls++;
      this.release(key, finished ? "pulled" : "pull-aborted");
    });
    res.write(lenBuf);
    res.write(headerBuf);
    let left = payloadBytes;
    while (left > 0 && !res.destroyed) {
      const n = Math.min(left, CHUNK.length);
      const ok = res.write(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n));
      left -= n;
      this.stats.bytesSent += n;
      if (!ok) await drainOrClose(res);
    }
    if (res.destroyed) return;
    finished = true;
    this.stats.pulls++;
    res.end();
  }
}
