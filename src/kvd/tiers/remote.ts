/**
 * L4: a distributed store behind a small interface, so Redis can be swapped for another
 * (NATS object store, Mooncake, S3) without touching the tiering logic. Values carry a
 * crc32 so a truncated or foreign value reads as a miss, like L3.
 */
import { crc32 } from "node:zlib";

export interface RemoteTier {
  readonly url: string;
  put(id: string, data: Buffer, ttlMs: number): Promise<void>;
  get(id: string): Promise<Buffer | null>;
  has(id: string): Promise<boolean>;
  /** True when a value was removed. */
  delete(id: string): Promise<boolean>;
  close(): Promise<void>;
}

const VALUE_MAGIC = 0x3456444b; // "KDV4"

export function wrapValue(data: Buffer): Buffer[] {
  const h = Buffer.alloc(12);
  h.writeUInt32LE(VALUE_MAGIC, 0);
  h.writeUInt32LE(data.length, 4);
  h.writeUInt32LE(crc32(data), 8);
  return [h, data];
}

export function unwrapValue(v: Buffer | null): Buffer | null {
  if (!v || v.length < 12 || v.readUInt32LE(0) !== VALUE_MAGIC) return null;
  const data = v.subarray(12);
  if (data.length !== v.readUInt32LE(4) || crc32(data) !== v.readUInt32LE(8)) return null;
  return data;
}

/** Opens the remote tier named by a URL. Only redis:// (and rediss://) is built in. */
export async function openRemote(url: string): Promise<RemoteTier> {
  if (url.startsWith("redis://") || url.startsWith("rediss://")) {
    const { RedisTier } = await import("./remote-redis.ts");
    const t = new RedisTier(url);
    await t.connect();
    return t;
  }
  throw new Error(`unsupported --remote URL "${url}" (supported: redis://host:port/db)`);
}
