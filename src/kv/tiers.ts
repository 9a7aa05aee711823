/**
 * Offloaded KV tiers in the prefix index (issue #29 item 6): what a worker holds in host memory
 * or on disk beside its GPU pool, so a prefix evicted from the GPU but offloaded still attracts
 * its follow-ups, at a lower weight than a GPU hit (loading it costs a copy, not a recompute).
 *
 * What the engines send (vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py @ 0072b0b7443bdddf17824c78d4feae8e1fc12fb4,
 * `take_events`): the offloading connector reports an offload as `BlockStored` with the medium
 * of its backend (`CPULoadStoreSpec.medium()` is "CPU"), the engine's block hashes, and NO
 * token ids and no parent (`token_ids=[]`, `parent_block_hash=None`); an eviction from that
 * medium as `BlockRemoved` with the same medium. Such a store cannot be hashed from tokens, so
 * each engine hash is resolved through the same rank's GPU blocks (the connector offloads blocks
 * the GPU computed, and reported, first) and the router hash found there is held by the tier.
 * A store that carries token ids (LMCache, KVBM-style publishers) is hashed as usual. A move
 * out of GPU memory (`BlockTransferred` GPU → other) puts the blocks in that tier too. Only
 * offloaded blocks of the GPU block size are resolved; larger ones (a `block_size` factor > 1:
 * one hash per group of GPU blocks) are counted as ignored.
 *
 * Media: "CPU", "CPU_PINNED", "CPU_TIER1", "HOST" → host; anything else not GPU ("DISK",
 * "CPU_TIER2", "NVME", "SSD", remote stores) → disk, the lowest tier — the classes Dynamo's
 * KV router uses (ai-dynamo/dynamo lib/llm/src/kv_router: StorageTier Device / HostPinned / Disk,
 * "CPU" an alias of host-pinned).
 */
import type { BlockStored, EngineBlockHash, KvEvent } from "./events.ts";

export type Tier = "host" | "disk";

const HOST = new Set(["CPU", "CPU_PINNED", "CPU_TIER1", "HOST"]);

export function tierOf(medium: string): Tier {
  return HOST.has(medium.toUpperCase()) ? "host" : "disk";
}

/** What a tier needs of an index (a KvIndex of its own, built by the owner: no import cycle). */
export interface TierIndex {
  applyEvents(workerId: string, events: readonly KvEvent[], defaultBlockSize?: number, rank?: number): void;
  /** Holds router hash (lo, hi) for engine hash `eh` on the worker's rank. */
  adopt(
    workerId: string,
    rank: number,
    blockSize: number,
    eh: EngineBlockHash,
    lo: number,
    hi: number,
  ): boolean;
  removeWorker(id: string): void;
  clearWorker(id: string, rank?: number): void;
  overlaps(
    tokens: ArrayLike<number>,
    workerIds: readonly string[],
    cacheSalt?: string | null,
    loraName?: string | null,
  ): Int32Array;
  totalBlocks(): number;
  counters: { ignored: number };
}

/** The router hash a rank's GPU blocks hold under an engine hash, or null. */
export type Resolve = (eh: EngineBlockHash) => { lo: number; hi: number } | null;

export interface TierOverlaps {
  host: Int32Array;
  disk: Int32Array;
}

export class OffloadTiers {
  private readonly make: () => TierIndex;
  private readonly tiers: Partial<Record<Tier, TierIndex>> = {};

  constructor(make: () => TierIndex) {
    this.make = make;
  }

  private tier(t: Tier): TierIndex {
    let x = this.tiers[t];
    if (!x) {
      x = this.make();
      this.tiers[t] = x;
    }
    return x;
  }

  /**
   * Applies a non-GPU event of `workerId`'s `rank` (GPU block size `blockSize`); `resolve` maps
   * an engine hash to the router hash the rank's GPU blocks hold. Returns false when ignored.
   */
  apply(
    workerId: string,
    rank: number,
    blockSize: number,
    ev: KvEvent,
    medium: string,
    resolve: Resolve,
  ): boolean {
    const t = this.tier(tierOf(medium));
    switch (ev.type) {
      case "BlockStored":
        if (ev.tokenIds.length >= ev.blockSize && ev.blockSize > 0) {
          // A full payload: hashed from its tokens like a GPU store, in the tier's own index.
          t.applyEvents(workerId, [{ ...ev, medium: null } as BlockStored], blockSize, rank);
          return true;
        }
        if (ev.blockSize !== 0 && ev.blockSize !== blockSize) return false;
        return this.adopt(t, workerId, rank, blockSize, ev.blockHashes, resolve);
      case "BlockRemoved":
        t.applyEvents(workerId, [{ ...ev, medium: null }], blockSize, rank);
        return true;
      case "AllBlocksCleared":
        t.clearWorker(workerId, rank);
        return true;
      default:
        return false;
    }
  }

  /** GPU blocks moved to `medium` (BlockTransferred): the tier holds them now. */
  moved(
    workerId: string,
    rank: number,
    blockSize: number,
    hashes: readonly EngineBlockHash[],
    medium: string,
    resolve: Resolve,
  ): void {
    this.adopt(this.tier(tierOf(medium)), workerId, rank, blockSize, hashes, resolve);
  }

  private adopt(
    t: TierIndex,
    workerId: string,
    rank: number,
    blockSize: number,
    hashes: readonly EngineBlockHash[],
    resolve: Resolve,
  ): boolean {
    let any = false;
    for (const eh of hashes) {
      const r = resolve(eh);
      if (r && t.adopt(workerId, rank, blockSize, eh, r.lo, r.hi)) any = true;
      else t.counters.ignored++;
    }
    return any;
  }

  removeWorker(id: string): void {
    for (const t of Object.values(this.tiers)) t.removeWorker(id);
  }

  clearWorker(id: string, rank?: number): void {
    for (const t of Object.values(this.tiers)) t.clearWorker(id, rank);
  }

  /** Leading prompt blocks each worker holds per tier; null when no tier holds anything. */
  overlaps(
    tokens: ArrayLike<number>,
    workerIds: readonly string[],
    cacheSalt?: string | null,
    loraName?: string | null,
  ): TierOverlaps | null {
    const h = this.tiers.host;
    const d = this.tiers.disk;
    const hn = h ? h.totalBlocks() : 0;
    const dn = d ? d.totalBlocks() : 0;
    if (hn === 0 && dn === 0) return null;
    const zero = () => new Int32Array(workerIds.length);
    const clamp = (a: Int32Array) => a.map((v) => Math.max(0, v));
    return {
      host: h && hn > 0 ? clamp(h.overlaps(tokens, workerIds, cacheSalt, loraName)) : zero(),
      disk: d && dn > 0 ? clamp(d.overlaps(tokens, workerIds, cacheSalt, loraName)) : zero(),
    };
  }

  /** Blocks held per tier. */
  blocks(): Record<Tier, number> {
    return { host: this.tiers.host?.totalBlocks() ?? 0, disk: this.tiers.disk?.totalBlocks() ?? 0 };
  }
}
