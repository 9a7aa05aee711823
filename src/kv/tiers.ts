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
 * out of GPU memory (`BlockTransferred` GPU → other) puts the blocks in that tier too.
 *
 * An offloaded block may span k GPU blocks (`block_size` = k × the GPU block size: the spec's
 * `offloaded_block_size`). Its hash is then the concatenation of its k GPU blocks' digests
 * (vllm/v1/core/kv_cache_utils.py BlockHashListWithBlockSize._get_value_at @
 * 001cabc1be16a59a70d720ed61a13b678c060a18, which the connector's `_get_block_hashes` uses), sent
 * as raw bytes: the event keeps them (./event-model.ts OffloadHashBytes) and each of the k
 * digests is resolved like a GPU hash, held under a key derived from the offloaded hash and its
 * position, so the tier's BlockRemoved of that hash drops all k. A digest resolves by its fold
 * (GPU events in bytes) or by its low 64 bits (GPU events under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
 * `maybe_convert_block_hash` keeps the low 64 bits; the connector's own events stay bytes). With
 * no `block_size` (0) a hash longer than one digest is split in 32-byte (sha256) digests. A group
 * whose digests do not all resolve is ignored, as is an offloaded hash that is one GPU block's
 * (vLLM versions that name a group by its last digest): the group's earlier blocks are unknown.
 *
 * Media: "CPU", "CPU_PINNED", "CPU_TIER1", "HOST" → host; anything else not GPU ("DISK",
 * "CPU_TIER2", "NVME", "SSD", remote stores) → disk, the lowest tier — the classes Dynamo's
 * KV router uses (ai-dynamo/dynamo lib/llm/src/kv_router: StorageTier Device / HostPinned / Disk,
 * "CPU" an alias of host-pinned).
 */
import { foldRange, type OffloadHashBytes } from "./event-model.ts";
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

const TWO32 = 4294967296;
/** sha256, vLLM's default prefix-caching hash: the digest length assumed when no size is sent. */
const DIGEST = 32;

/** The tier's key of GPU block `j` of offloaded hash `h` (k > 1): distinct per position. */
function partKey(h: EngineBlockHash, j: number): EngineBlockHash {
  const lo = (h % TWO32) >>> 0;
  const hi = Math.floor(h / TWO32) >>> 0;
  const l = Math.imul(lo ^ Math.imul(j + 1, 0x9e3779b1), 0x85ebca6b) >>> 0;
  const u = (hi ^ Math.imul(j + 1, 0xc2b2ae35) ^ (l >>> 16)) & 0xfffff;
  return u * TWO32 + l;
}

/**
 * Big-endian u64 of `b[to - 8, to)`, rounded to a number once, as the decoders round an int
 * hash above 2^53 (hi × 2^32 + lo).
 */
function low64(b: Uint8Array, to: number): number {
  if (to < 8) return Number.NaN;
  const u32 = (at: number) => ((b[at] << 24) | (b[at + 1] << 16) | (b[at + 2] << 8) | b[at + 3]) >>> 0;
  return u32(to - 8) * TWO32 + u32(to - 4);
}

export class OffloadTiers {
  private readonly make: () => TierIndex;
  private readonly tiers: Partial<Record<Tier, TierIndex>> = {};
  /** GPU blocks per offloaded block, per `worker\0rank`, once a larger store was seen. */
  private readonly factors = new Map<string, number>();

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
        return this.stored(t, workerId, rank, blockSize, ev, resolve);
      case "BlockRemoved": {
        const k = this.factors.get(`${workerId}\0${rank}`) ?? 1;
        const hashes = k > 1 ? ev.blockHashes.flatMap((h) => [h, ...parts(h, k)]) : ev.blockHashes;
        t.applyEvents(
          workerId,
          [{ type: "BlockRemoved", blockHashes: hashes, medium: null, groupIdx: ev.groupIdx }],
          blockSize,
          rank,
        );
        return true;
      }
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

  /** A hash-only store: each hash resolved whole (k = 1) or split into its k GPU digests. */
  private stored(
    t: TierIndex,
    workerId: string,
    rank: number,
    blockSize: number,
    ev: BlockStored,
    resolve: Resolve,
  ): boolean {
    const k = ev.blockSize === 0 ? 0 : ev.blockSize / blockSize;
    if (k !== 0 && (!Number.isInteger(k) || k < 1)) {
      t.counters.ignored += ev.blockHashes.length;
      return false;
    }
    if (k === 1) return this.adopt(t, workerId, rank, blockSize, ev.blockHashes, resolve, ev.hashBytes);
    let any = false;
    ev.blockHashes.forEach((h, i) => {
      const b = ev.hashBytes?.[i] ?? null;
      // Size unknown: a single digest is one GPU block's hash.
      const n = k !== 0 ? k : b && b.length > DIGEST && b.length % DIGEST === 0 ? b.length / DIGEST : 1;
      if (n === 1) {
        if (this.adopt(t, workerId, rank, blockSize, [h], resolve, b ? [b] : undefined)) any = true;
        return;
      }
      const found = b ? splitResolve(b, n, resolve) : null;
      if (!found) {
        t.counters.ignored++;
        return;
      }
      this.factors.set(`${workerId}\0${rank}`, n);
      found.forEach((r, j) => {
        if (t.adopt(workerId, rank, blockSize, partKey(h, j), r.lo, r.hi)) any = true;
        else t.counters.ignored++;
      });
    });
    return any;
  }

  private adopt(
    t: TierIndex,
    workerId: string,
    rank: number,
    blockSize: number,
    hashes: readonly EngineBlockHash[],
    resolve: Resolve,
    bytes?: OffloadHashBytes,
  ): boolean {
    let any = false;
    hashes.forEach((eh, i) => {
      const b = bytes?.[i];
      // The connector's bytes against GPU hashes sent as ints: their low 64 bits.
      const r = resolve(eh) ?? (b ? resolve(low64(b, b.length)) : null);
      if (r && t.adopt(workerId, rank, blockSize, eh, r.lo, r.hi)) any = true;
      else t.counters.ignored++;
    });
    return any;
  }

  removeWorker(id: string): void {
    for (const t of Object.values(this.tiers)) t.removeWorker(id);
    for (const key of this.factors.keys()) if (key.startsWith(`${id}\0`)) this.factors.delete(key);
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

/** The tier keys of offloaded hash `h`'s k GPU blocks. */
function parts(h: EngineBlockHash, k: number): EngineBlockHash[] {
  return Array.from({ length: k }, (_, j) => partKey(h, j));
}

/** `b` as n digests, each resolved by its fold or its low 64 bits; null unless all resolve. */
function splitResolve(b: Uint8Array, n: number, resolve: Resolve): { lo: number; hi: number }[] | null {
  if (b.length % n !== 0) return null;
  const d = b.length / n;
  const out: { lo: number; hi: number }[] = [];
  for (let j = 0; j < n; j++) {
    const r = resolve(foldRange(b, j * d, (j + 1) * d)) ?? resolve(low64(b, (j + 1) * d));
    if (!r) return null;
    out.push(r);
  }
  return out;
}
