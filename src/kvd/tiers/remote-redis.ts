import { createHash } from "node:crypto";
import { Redis } from "ioredis";
import { type RemoteTier, unwrapValue, wrapValue } from "./remote.ts";

/** L4 on Redis: one string value per chunk under `infera:kvd:<sha256(namespace, key)>`. */
export class RedisTier implements RemoteTier {
  readonly url: string;
  private readonly redis: Redis;

  constructor(url: string) {
    this.url = url;
    this.redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 2, enableOfflineQueue: false });
    // Errors surface through the failed commands; an unhandled 'error' event would crash.
    this.redis.on("error", () => {});
  }

  async connect(): Promise<void> {
    await this.redis.connect();
  }

  private k(id: string): string {
    return `infera:kvd:${createHash("sha256").update(id).digest("hex")}`;
  }

  async put(id: string, data: Buffer, ttlMs: number): Promise<void> {
    const v = Buffer.concat(wrapValue(data));
    if (ttlMs > 0) await this.redis.set(this.k(id), v, "PX", Math.ceil(ttlMs));
    else await this.redis.set(this.k(id), v);
  }

  async get(id: string): Promise<Buffer | null> {
    return unwrapValue(await this.redis.getBuffer(this.k(id)));
  }

  async has(id: string): Promise<boolean> {
    return (await this.redis.exists(this.k(id))) === 1;
  }

  async delete(id: string): Promise<boolean> {
    return (await this.redis.del(this.k(id))) > 0;
  }

  async close(): Promise<void> {
    this.redis.disconnect();
  }
}
