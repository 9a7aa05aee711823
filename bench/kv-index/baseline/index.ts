// Frozen copy of src/kv/index.ts before the one-walk rewrite (bench/kv-index baseline); do not edit.
/**
 * The KV prefix index: which worker holds which prompt blocks, built from the engines' KV
 * events. Blocks are keyed on the router's own chained hash of their token ids (./hash.ts),
 * never on an engine's hash; each worker keeps a map from the engine's hash to the router's so
 * `BlockRemoved` (which carries only engine hashes) can be applied, and so a `BlockStored` whose
 * parent is an engine hash can continue the router's chain.
 *
 * A worker with several data-parallel ranks has one KV pool per rank (vLLM and SGLang publish
 * each rank's events on their own socket), so the tables are kept per rank: one rank's
 * `BlockRemoved` never erases what another rank still holds. A worker's overlap for a prompt is
 * its best rank's, and `overlaps` can say which rank that is.
 *
 * Per rank the state is two typed-array tables (./tables.ts): 16 bytes per block at most,
 * so 1,000 workers × 100k blocks fit in about 2 GiB. Each rank is capped (`capFor`): an engine
 * cannot hold more blocks than its pool, so past the cap the index has missed removals, and new
 * stores are dropped (counted) rather than letting one publisher grow the heap without bound.
 */
import type { BlockStored, KvEvent } from "../../../src/kv/events.ts";
import type { PrefixIndex } from "../../../src/kv/prefix-index.ts";
import { hashBlock, hashPrompt, rootSeed } from "./hash.ts";
import { F64U32Map, U32MultiSet } from "./tables.ts";

interface RankBlocks {
  /** Router hashes of the blocks the rank holds (a multiset). */
  blocks: U32MultiSet;
  /** Engine block hash → router hash. */
  engine: F64U32Map;
  /** The KV-cache group that holds full attention, once an event named its kind. */
  fullGroup: number | null;
}

interface WorkerBlocks {
  blockSize: number;
  /** Per data-parallel rank (rank 0 for an engine without DP). */
  ranks: Map<number, RankBlocks>;
  /** The same, as arrays, for the lookup hot path (no iterator per worker). */
  rankIds: number[];
  rankList: RankBlocks[];
  /** Blocks one rank may hold in the index. */
  cap: number;
}

export interface KvIndexCounters {
  stored: number;
  removed: number;
  cleared: number;
  /** BlockStored events whose parent the index does not know (missed events): skipped. */
  orphans: number;
  /** BlockRemoved hashes the index did not hold. */
  unknownRemovals: number;
  /** Events for other media (CPU offload) or other KV groups, which do not make GPU prefix hits. */
  ignored: number;
  /** Partial last pages (block_size below the worker's): not indexed, block size kept. */
  partialPages: number;
  /** Stored blocks dropped because the rank was at its cap. */
  capped: number;
}

export interface KvIndexOptions {
  /** Cap per rank when the worker's record gives no `kvBlocks` (default 524,288 blocks). */
  defaultMaxBlocks?: number;
  /** Margin over the record's `kvBlocks` (default 0.25: the cap is 1.25 × kvBlocks). */
  capMargin?: number;
}

export const DEFAULT_MAX_BLOCKS = 524_288;

/** vLLM KVCacheSpecKind values whose blocks make full-prefix hits (vllm/v1/kv_cache_interface.py). */
const FULL_KINDS = new Set(["full_attention", "mla_attention", "sink_full_attention"]);

function isGpu(medium: string | null): boolean {
  return medium === null || medium.toUpperCase() === "GPU";
}

/**
 * The cache salt in vLLM's extra keys of a sequence's first block. vLLM builds them as
 * `lora_name? + mm keys (tuples) + [cache_salt] (first block only) + prompt-embeds digests (bytes)`
 * (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys), so the salt is the string
 * after the leading LoRA name. Accepts a per-block list (`[[...first block keys], null, ...]`), a
 * flat list, a bare string or a map with `cache_salt`.
 */
export function saltFromExtraKeys(extraKeys: unknown, loraName: string | null = null): string | null {
  if (extraKeys == null) return null;
  if (typeof extraKeys === "string") return extraKeys === loraName ? null : extraKeys;
  if (Array.isArray(extraKeys)) {
    if (extraKeys.length === 0) return null;
    const perBlock = extraKeys.every((k) => k === null || Array.isArray(k));
    const keys: unknown = perBlock ? extraKeys[0] : extraKeys;
    if (!Array.isArray(keys)) return saltFromExtraKeys(keys, loraName);
    const from = loraName !== null && keys[0] === loraName ? 1 : 0;
    for (let i = keys.length - 1; i >= from; i--) if (typeof keys[i] === "string") return keys[i] as string;
    return null;
  }
  if (typeof extraKeys === "object") {
    const salt = (extraKeys as Record<string, unknown>).cache_salt;
    return typeof salt === "string" ? salt : null;
  }
  return null;
}

export class KvIndex implements PrefixIndex {
  private readonly workers = new Map<string, WorkerBlocks>();
  readonly counters: KvIndexCounters = {
    stored: 0,
    removed: 0,
    cleared: 0,
    orphans: 0,
    unknownRemovals: 0,
    ignored: 0,
    partialPages: 0,
    capped: 0,
  };
  /** LoRA adapter names the engines' events have named (a request for one hashes with it). */
  private readonly loras = new Set<string>();
  private scratch = new Uint32Array(1024);
  private readonly defaultMax: number;
  private readonly margin: number;
  /** Told of blocks dropped at a rank's cap (the ingest hangs its metric here). */
  onCapped?: (workerId: string, blocks: number) => void;
  /** Told of every kv-aware routing decision (the server hangs its metrics here). */
  decisionObserver?: (reason: string, overlapBlocks: number, promptBlocks: number) => void;

  constructor(opts: KvIndexOptions = {}) {
    this.defaultMax =
      opts.defaultMaxBlocks && opts.defaultMaxBlocks > 0 ? opts.defaultMaxBlocks : DEFAULT_MAX_BLOCKS;
    this.margin = opts.capMargin !== undefined && opts.capMargin >= 0 ? opts.capMargin : 0.25;
  }

  /** The per-rank cap for a worker whose pool holds `kvBlocks` blocks (unknown: the default). */
  capFor(kvBlocks?: number): number {
    return kvBlocks && kvBlocks > 0 ? Math.ceil(kvBlocks * (1 + this.margin)) : this.defaultMax;
  }

  /** Starts tracking a worker (idempotent); `blockSize` from its record until events say otherwise. */
  addWorker(id: string, blockSize: number, expectedBlocks = 0, kvBlocks?: number): void {
    const cur = this.workers.get(id);
    if (cur) {
      if (kvBlocks) cur.cap = this.capFor(kvBlocks);
      return;
    }
    const w: WorkerBlocks = {
      blockSize,
      ranks: new Map(),
      rankIds: [],
      rankList: [],
      cap: this.capFor(kvBlocks),
    };
    this.workers.set(id, w);
    if (expectedBlocks > 0) this.rankOf(w, 0, expectedBlocks);
  }

  hasWorker(id: string): boolean {
    return this.workers.has(id);
  }

  workerIds(): string[] {
    return [...this.workers.keys()];
  }

  /** Drops a worker and all its entries (worker gone). */
  removeWorker(id: string): void {
    this.workers.delete(id);
  }

  /** Empties a worker, or only one of its ranks (AllBlocksCleared, a restart, an unfillable gap). */
  clearWorker(id: string, rank?: number): void {
    const w = this.workers.get(id);
    if (!w) return;
    if (rank === undefined) w.ranks.clear();
    else w.ranks.delete(rank);
    w.rankIds = [...w.ranks.keys()];
    w.rankList = [...w.ranks.values()];
  }

  blockSizeOf(id: string): number | undefined {
    return this.workers.get(id)?.blockSize;
  }

  /** Blocks the worker holds, all ranks together (or one rank's). */
  blockCount(id: string, rank?: number): number {
    const w = this.workers.get(id);
    if (!w) return 0;
    if (rank !== undefined) return w.ranks.get(rank)?.blocks.size ?? 0;
    let n = 0;
    for (const r of w.ranks.values()) n += r.blocks.size;
    return n;
  }

  /** Ranks the index holds blocks for. */
  ranksOf(id: string): number[] {
    return [...(this.workers.get(id)?.ranks.keys() ?? [])];
  }

  /** True when some engine's events named `name` as a LoRA adapter. */
  isLora(name: string): boolean {
    return this.loras.has(name);
  }

  /** Applies a list of events from one worker's rank (a decoded batch). Unknown workers are added. */
  applyEvents(workerId: string, events: readonly KvEvent[], defaultBlockSize = 16, rank = 0): void {
    let w = this.workers.get(workerId);
    if (!w) {
      this.addWorker(workerId, defaultBlockSize);
      w = this.workers.get(workerId)!;
    }
    const r = this.rankOf(w, rank);
    for (let i = 0; i < events.length; i++) this.applyTo(workerId, w, r, events[i]);
  }

  apply(workerId: string, ev: KvEvent, defaultBlockSize = 16, rank = 0): void {
    this.applyEvents(workerId, [ev], defaultBlockSize, rank);
  }

  private rankOf(w: WorkerBlocks, rank: number, expected = 0): RankBlocks {
    let r = w.ranks.get(rank);
    if (!r) {
      r = { blocks: new U32MultiSet(expected), engine: new F64U32Map(expected), fullGroup: null };
      w.ranks.set(rank, r);
      w.rankIds.push(rank);
      w.rankList.push(r);
    }
    return r;
  }

  /**
   * Whether an event of KV-cache group `groupIdx` is about the full-attention group. A hybrid
   * model (sliding window, Mamba) publishes one group per kind with the same block hashes, so
   * only the full-attention group's blocks stand for a reusable prefix. vLLM's BlockStored says
   * the group's `kv_cache_spec_kind`; BlockRemoved carries only `group_idx`, matched against the
   * group the stores named. Without any kind, group 0 (or no group) is taken.
   */
  private inFullGroup(r: RankBlocks, groupIdx: number | null, kind: string | null): boolean {
    if (kind !== null) {
      if (!FULL_KINDS.has(kind)) return false;
      if (groupIdx !== null) r.fullGroup ??= groupIdx;
      return groupIdx === null || groupIdx === r.fullGroup;
    }
    return groupIdx === null || groupIdx === (r.fullGroup ?? 0);
  }

  private applyTo(workerId: string, w: WorkerBlocks, r: RankBlocks, ev: KvEvent): void {
    const c = this.counters;
    switch (ev.type) {
      case "BlockStored":
        if (!isGpu(ev.medium) || !this.inFullGroup(r, ev.groupIdx, ev.kvCacheSpecKind ?? null)) {
          c.ignored++;
          return;
        }
        this.store(workerId, w, r, ev);
        return;
      case "BlockRemoved": {
        if (!isGpu(ev.medium) || !this.inFullGroup(r, ev.groupIdx, null)) {
          c.ignored++;
          return;
        }
        this.removeHashes(r, ev.blockHashes);
        return;
      }
      case "BlockTransferred": {
        // Only a move out of GPU memory changes what a GPU prefix hit can use; a move in carries
        // no token ids, so the router cannot hash it.
        if (isGpu(ev.fromMedium) && ev.toMedium !== null && !isGpu(ev.toMedium))
          this.removeHashes(r, ev.blockHashes);
        else c.ignored++;
        return;
      }
      case "AllBlocksCleared":
        if (!isGpu(ev.medium ?? null)) {
          c.ignored++;
          return;
        }
        r.blocks.clear();
        r.engine.clear();
        c.cleared++;
        return;
    }
  }

  private store(workerId: string, w: WorkerBlocks, r: RankBlocks, ev: BlockStored): void {
    const c = this.counters;
    const bs = ev.blockSize;
    const hashes = ev.blockHashes;
    if (bs < w.blockSize && hashes.length <= 1) {
      // SGLang reports a node's last page with block_size = its token count when the page is
      // not full (block_size=len(page_tokens)); it is not a block the router can match, and it
      // says nothing about the worker's page size.
      c.partialPages++;
      return;
    }
    w.blockSize = bs;
    if (ev.loraName) this.loras.add(ev.loraName);
    let parent: number;
    if (ev.parentBlockHash === null)
      parent = rootSeed(ev.cacheSalt ?? saltFromExtraKeys(ev.extraKeys, ev.loraName), ev.loraName);
    else {
      const slot = r.engine.find(ev.parentBlockHash);
      if (slot < 0) {
        c.orphans++;
        return;
      }
      parent = r.engine.valueAt(slot);
    }
    const toks = ev.tokenIds;
    for (let b = 0; b < hashes.length; b++) {
      const end = (b + 1) * bs;
      if (end > toks.length) break;
      const rh = hashBlock(parent, toks, b * bs, end);
      const eh = hashes[b];
      const slot = r.engine.find(eh);
      if (slot >= 0) {
        const old = r.engine.valueAt(slot);
        if (old !== rh) {
          r.blocks.delete(old);
          r.blocks.add(rh);
          r.engine.setAt(slot, rh);
        }
      } else {
        if (r.engine.size >= w.cap) {
          // The rank holds more than its pool can: removals were missed. Drop the rest of the
          // event without hashing it (a flood must not cost CPU per dropped block either).
          const dropped = hashes.length - b;
          c.capped += dropped;
          this.onCapped?.(workerId, dropped);
          return;
        }
        r.engine.insertNew(eh, rh);
        r.blocks.add(rh);
      }
      parent = rh;
      c.stored++;
    }
  }

  private removeHashes(r: RankBlocks, hashes: readonly number[]): void {
    for (let i = 0; i < hashes.length; i++) {
      const slot = r.engine.find(hashes[i]);
      if (slot < 0) {
        this.counters.unknownRemovals++;
        continue;
      }
      r.blocks.delete(r.engine.valueAt(slot));
      r.engine.deleteAt(slot);
      this.counters.removed++;
    }
  }

  /**
   * For each of `workerIds`, how many leading full blocks of `tokens` the worker's best rank
   * holds (-1 for a worker the index does not track). The prompt is hashed once per distinct
   * block size. `bestRank`, when given, receives that rank per worker (-1 when none holds any).
   */
  overlaps(
    tokens: ArrayLike<number>,
    workerIds: readonly string[],
    cacheSalt?: string | null,
    loraName?: string | null,
    bestRank?: Int32Array,
  ): Int32Array {
    const out = new Int32Array(workerIds.length);
    let chains: Map<number, Uint32Array> | null = null;
    let firstBs = 0;
    let firstChain: Uint32Array | null = null;
    for (let i = 0; i < workerIds.length; i++) {
      const w = this.workers.get(workerIds[i]);
      if (bestRank) bestRank[i] = -1;
      if (!w) {
        out[i] = -1;
        continue;
      }
      let chain: Uint32Array | undefined;
      if (firstChain !== null && w.blockSize === firstBs) chain = firstChain;
      else if (firstChain === null) {
        const need = Math.floor(tokens.length / w.blockSize);
        if (this.scratch.length < need) this.scratch = new Uint32Array(need * 2);
        firstChain = hashPrompt(tokens, w.blockSize, cacheSalt, this.scratch, loraName);
        firstBs = w.blockSize;
        chain = firstChain;
      } else {
        chains ??= new Map();
        chain = chains.get(w.blockSize);
        if (!chain) {
          chain = hashPrompt(tokens, w.blockSize, cacheSalt, undefined, loraName);
          chains.set(w.blockSize, chain);
        }
      }
      let best = 0;
      const list = w.rankList;
      for (let j = 0; j < list.length; j++) {
        const blocks = list[j].blocks;
        let k = 0;
        while (k < chain.length && blocks.has(chain[k])) k++;
        if (k > best) {
          best = k;
          if (bestRank) bestRank[i] = w.rankIds[j];
        }
      }
      out[i] = best;
    }
    return out;
  }

  /** Memory held by the tables, in bytes (typed arrays only). */
  bytes(): number {
    let n = 0;
    for (const w of this.workers.values())
      for (const r of w.ranks.values()) n += r.blocks.bytes() + r.engine.bytes();
    return n;
  }

  totalBlocks(): number {
    let n = 0;
    for (const w of this.workers.values()) for (const r of w.ranks.values()) n += r.blocks.size;
    return n;
  }
}
