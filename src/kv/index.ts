/**
 * The KV prefix index: which worker holds which prompt blocks, built from the engines' KV
 * events. Blocks are keyed on the router's own 64-bit chained hash of their token ids
 * (./hash.ts), never on an engine's hash; each worker rank keeps a map from the engine's hash to
 * the block's entry so `BlockRemoved` (which carries only engine hashes) can be applied, and so a
 * `BlockStored` whose parent is an engine hash can continue the router's chain.
 *
 * All workers share one table, router hash → holders (./block-table.ts), so matching a prompt
 * is one walk along its hash chain for the whole fleet: at each block the candidates that still
 * match move on, and a worker's overlap is the depth where it drops out. The walk stops when no
 * candidate is left, so its cost is the prompt's hashing plus the holders of the blocks the
 * candidates share, not one probe per worker.
 *
 * A worker with several data-parallel ranks has one KV pool per rank (vLLM and SGLang publish
 * each rank's events on their own socket), so each rank is a holder of its own: one rank's
 * `BlockRemoved` never erases what another rank still holds. A worker's overlap for a prompt is
 * its best rank's, and `overlaps` can say which rank that is.
 *
 * Each rank is capped (`capFor`): an engine cannot hold more blocks than its pool, so past the
 * cap the index has missed removals, and new stores are dropped (counted) rather than letting
 * one publisher grow the heap without bound.
 *
 * Length (≈ 540 lines, over the ~400 guide): one class whose parts share the per-rank state
 * (engine-hash map, cap, sync, holder ids) and must change together; the storage structures
 * it builds on are already split out (block-table, engine-block-map, holder-sets, walk).
 */

import { isStable } from "../util/stable-lists.ts";
import { BlockTable } from "./block-table.ts";
import { EngineBlockMap, MAX_VALUE as MAX_ENTRY } from "./engine-block-map.ts";
import { FULL_KINDS, isGpu, saltFromExtraKeys } from "./event-keys.ts";
import type { BlockStored, EngineBlockHash, KvEvent } from "./events.ts";
import { hashBlockInto, rootSeedInto } from "./hash.ts";
import type { IndexSync, PrefixIndex } from "./prefix-index.ts";
import { OffloadTiers, type Resolve, type TierOverlaps } from "./tiers.ts";
import { FleetWalk, plan, type WalkPlan } from "./walk.ts";

interface RankBlocks {
  /** The rank's holder id in the shared BlockTable. */
  hid: number;
  /** Engine block hash → the block's BlockTable entry id (one entry per engine hash held). */
  engine: EngineBlockMap;
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
  /**
   * Blocks held, all ranks together, kept up to date as events apply (`candidateRows` reads it:
   * one field per candidate, not a walk over its ranks' maps, whose objects a decision over
   * hundreds of workers would otherwise fetch from memory one by one).
   */
  held: number;
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

/** A worker's blocks, all ranks together, counted from its ranks' maps. */
function heldOf(w: WorkerBlocks): number {
  let n = 0;
  for (const r of w.rankList) n += r.engine.size;
  return n;
}

export { saltFromExtraKeys };

export class KvIndex implements PrefixIndex {
  private readonly workers = new Map<string, WorkerBlocks>();
  /**
   * Sync state per worker rank, as the subscribers report it. A rank never reported is
   * `synced` (an index fed directly, as in tests and the kvd), so only workers listed here can
   * read as untracked.
   */
  private readonly sync = new Map<string, Map<number, IndexSync>>();
  /** Workers with a rank not `synced` (the fast path of `overlaps` skips the check when empty). */
  private readonly unsynced = new Set<string>();
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
  /** Every rank's blocks, by router hash. */
  /** Entry ids past MAX_ENTRY would not fit a rank's EngineBlockMap: the table stops there. */
  private readonly table = new BlockTable(MAX_ENTRY);
  /** Holder ids of dropped ranks, for reuse (the walk's marks are indexed by holder id). */
  private readonly freeHids: number[] = [];
  private nextHid = 0;
  private readonly walker = new FleetWalk();
  /**
   * Bumped when a worker comes or goes, a rank is added or dropped, or a block size changes:
   * all of these invalidate the flattened candidate list (./walk.ts WalkPlan).
   */
  private version = 0;
  private lastVersion = -1;
  private lastIds: readonly string[] = [];
  private lastWs: readonly (WorkerBlocks | undefined)[] = [];
  /** The caller's stable array `lastIds` was copied from (identity is then proof enough). */
  private lastInput: readonly string[] | null = null;
  private lastPlan: WalkPlan = plan([]);
  /** The list `lastPlan` was made from. */
  private planOf: readonly (WorkerBlocks | undefined)[] = [];
  private readonly lanes = new Uint32Array(2);
  private readonly defaultMax: number;
  private readonly margin: number;
  /** Listeners of `onRemoval` (the pending bridges, one per model). */
  private readonly removalListeners = new Set<(workerId: string) => void>();
  /** Told of blocks dropped at a rank's cap (the ingest hangs its metric here). */
  onCapped?: (workerId: string, blocks: number) => void;
  /** Told of every decision of an overlap-aware step (a profile with `kv-prefix`); the server hangs its metrics here. */
  decisionObserver?: (reason: string, overlapBlocks: number, promptBlocks: number) => void;

  /** Offloaded (host, disk) copies of the workers' blocks: ./tiers.ts. */
  private readonly tiers: OffloadTiers;

  constructor(opts: KvIndexOptions = {}) {
    this.tiers = new OffloadTiers(() => new KvIndex(opts));
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
      held: 0,
    };
    this.workers.set(id, w);
    this.version++;
    if (expectedBlocks > 0) this.rankOf(w, 0, expectedBlocks);
  }

  /** Calls `fn` whenever blocks of a worker are dropped; returns the unsubscribe. */
  onRemoval(fn: (workerId: string) => void): () => void {
    this.removalListeners.add(fn);
    return () => this.removalListeners.delete(fn);
  }

  /** How many `onRemoval` listeners are subscribed (leak checks). */
  get removalListenerCount(): number {
    return this.removalListeners.size;
  }

  private removed(workerId: string): void {
    for (const fn of this.removalListeners) fn(workerId);
  }

  hasWorker(id: string): boolean {
    return this.workers.has(id) && !this.unsynced.has(id);
  }

  /** True while the worker is tracked at all, in sync or not. */
  tracks(id: string): boolean {
    return this.workers.has(id);
  }

  /** Records a rank's sync state (a feed: src/kv/feeds/); `synced` is also what no record means. */
  setSync(id: string, rank: number, state: IndexSync): void {
    let ranks = this.sync.get(id);
    if (!ranks) {
      ranks = new Map();
      this.sync.set(id, ranks);
    }
    ranks.set(rank, state);
    let all = true;
    for (const s of ranks.values()) if (s !== "synced") all = false;
    if (all) this.unsynced.delete(id);
    else this.unsynced.add(id);
  }

  /** Forgets a rank's sync record (its subscriber closed). */
  dropSync(id: string, rank: number): void {
    const ranks = this.sync.get(id);
    if (!ranks) return;
    ranks.delete(rank);
    if (ranks.size === 0) this.sync.delete(id);
    let all = true;
    for (const s of ranks.values()) if (s !== "synced") all = false;
    if (all) this.unsynced.delete(id);
  }

  syncOf(id: string): IndexSync | null {
    if (!this.workers.has(id)) return null;
    const ranks = this.sync.get(id);
    if (!ranks || !this.unsynced.has(id)) return "synced";
    let state: IndexSync = "synced";
    for (const s of ranks.values()) if (s === "unknown" || (s === "syncing" && state === "synced")) state = s;
    return state;
  }

  rankSyncOf(id: string): ReadonlyMap<number, IndexSync> {
    if (!this.workers.has(id)) return new Map();
    const out = new Map<number, IndexSync>(this.sync.get(id));
    for (const r of this.workers.get(id)?.rankIds ?? []) if (!out.has(r)) out.set(r, "synced");
    return out;
  }

  workerIds(): string[] {
    return [...this.workers.keys()];
  }

  /** Drops a worker and all its entries (worker gone). */
  removeWorker(id: string): void {
    const w = this.workers.get(id);
    if (!w) return;
    for (const r of w.rankList) this.dropRank(r);
    this.tiers.removeWorker(id);
    this.workers.delete(id);
    this.sync.delete(id);
    this.unsynced.delete(id);
    this.version++;
    this.removed(id);
  }

  /** Empties a worker, or only one of its ranks (AllBlocksCleared, a restart, an unfillable gap). */
  clearWorker(id: string, rank?: number): void {
    const w = this.workers.get(id);
    if (!w) return;
    this.tiers.clearWorker(id, rank);
    if (rank === undefined) {
      for (const r of w.rankList) this.dropRank(r);
      w.ranks.clear();
    } else {
      const r = w.ranks.get(rank);
      if (!r) return;
      this.dropRank(r);
      w.ranks.delete(rank);
    }
    w.rankIds = [...w.ranks.keys()];
    w.rankList = [...w.ranks.values()];
    w.held = heldOf(w);
    this.version++;
    this.removed(id);
  }

  blockSizeOf(id: string): number | undefined {
    return this.workers.get(id)?.blockSize;
  }

  /** Blocks the worker holds, all ranks together (or one rank's). */
  blockCount(id: string, rank?: number): number {
    const w = this.workers.get(id);
    if (!w) return 0;
    if (rank !== undefined) return w.ranks.get(rank)?.engine.size ?? 0;
    let n = 0;
    for (const r of w.rankList) n += r.engine.size;
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
    const before = r.engine.size;
    for (let i = 0; i < events.length; i++) this.applyTo(workerId, w, r, events[i], rank);
    w.held += r.engine.size - before;
  }

  apply(workerId: string, ev: KvEvent, defaultBlockSize = 16, rank = 0): void {
    this.applyEvents(workerId, [ev], defaultBlockSize, rank);
  }

  private rankOf(w: WorkerBlocks, rank: number, expected = 0): RankBlocks {
    let r = w.ranks.get(rank);
    if (!r) {
      const hid = this.freeHids.pop() ?? this.nextHid++;
      this.walker.holder(hid);
      r = { hid, engine: new EngineBlockMap(expected), fullGroup: null };
      w.ranks.set(rank, r);
      w.rankIds.push(rank);
      w.rankList.push(r);
      this.version++;
    }
    return r;
  }

  /** Releases everything a rank holds (it keeps its holder id: see dropRank). */
  private emptyRank(r: RankBlocks): void {
    const table = this.table;
    const hid = r.hid;
    r.engine.forEachValue((e) => table.release(e, hid));
    r.engine.clear();
  }

  /** Empties a rank that is going away and frees its holder id. */
  private dropRank(r: RankBlocks): void {
    this.emptyRank(r);
    this.freeHids.push(r.hid);
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

  /** A rank's router hash for an engine hash, for the offloaded tiers' hash-only stores. */
  private resolver(r: RankBlocks): Resolve {
    return (eh) => {
      const slot = r.engine.find(eh);
      if (slot < 0) return null;
      const e = r.engine.valueAt(slot);
      return { lo: this.table.loOf(e), hi: this.table.hiOf(e) };
    };
  }

  /**
   * Holds router hash (lo, hi) under engine hash `eh` on a worker's rank (an offloaded tier's
   * index adopting a block its GPU rank resolved). False at the rank's cap.
   */
  adopt(
    workerId: string,
    rank: number,
    blockSize: number,
    eh: EngineBlockHash,
    lo: number,
    hi: number,
  ): boolean {
    if (!this.workers.has(workerId)) this.addWorker(workerId, blockSize);
    const w = this.workers.get(workerId)!;
    const r = this.rankOf(w, rank);
    const before = r.engine.size;
    const ok = this.adoptInto(w, r, eh, lo, hi);
    w.held += r.engine.size - before;
    return ok;
  }

  private adoptInto(w: WorkerBlocks, r: RankBlocks, eh: EngineBlockHash, lo: number, hi: number): boolean {
    const slot = r.engine.find(eh);
    if (slot >= 0) {
      const old = r.engine.valueAt(slot);
      if (this.table.loOf(old) === lo && this.table.hiOf(old) === hi) return true;
      this.table.release(old, r.hid);
      r.engine.deleteAt(slot);
    }
    if (r.engine.size >= w.cap) return false;
    const e = this.table.acquire(lo, hi, r.hid);
    if (e === 0) return false;
    r.engine.insertNew(eh, e);
    this.counters.stored++;
    return true;
  }

  /**
   * Leading prompt blocks each worker holds in host memory and on disk (./tiers.ts); null when
   * no offloaded block is known (the common case costs nothing).
   */
  tierOverlaps(
    tokens: ArrayLike<number>,
    workerIds: readonly string[],
    cacheSalt?: string | null,
    loraName?: string | null,
  ): TierOverlaps | null {
    return this.tiers.overlaps(tokens, workerIds, cacheSalt, loraName);
  }

  /** Offloaded blocks held per tier, all workers together. */
  tierBlocks(): { host: number; disk: number } {
    return this.tiers.blocks();
  }

  private applyTo(workerId: string, w: WorkerBlocks, r: RankBlocks, ev: KvEvent, rank: number): void {
    const c = this.counters;
    // Another medium than GPU memory (CPU offload, disk): the offloaded tiers (./tiers.ts).
    const medium = ev.type === "BlockTransferred" ? null : (ev.medium ?? null);
    if (medium !== null && !isGpu(medium)) {
      if (!this.tiers.apply(workerId, rank, w.blockSize, ev, medium, this.resolver(r))) c.ignored++;
      return;
    }
    switch (ev.type) {
      case "BlockStored":
        if (!this.inFullGroup(r, ev.groupIdx, ev.kvCacheSpecKind ?? null)) {
          c.ignored++;
          return;
        }
        this.store(workerId, w, r, ev);
        return;
      case "BlockRemoved": {
        if (!this.inFullGroup(r, ev.groupIdx, null)) {
          c.ignored++;
          return;
        }
        this.removeHashes(r, ev.blockHashes);
        this.removed(workerId);
        return;
      }
      case "BlockTransferred": {
        // Only a move out of GPU memory changes what a GPU prefix hit can use; a move in carries
        // no token ids, so the router cannot hash it.
        if (isGpu(ev.fromMedium) && ev.toMedium !== null && !isGpu(ev.toMedium)) {
          this.tiers.moved(workerId, rank, w.blockSize, ev.blockHashes, ev.toMedium, this.resolver(r));
          this.removeHashes(r, ev.blockHashes);
          this.removed(workerId);
        } else c.ignored++;
        return;
      }
      case "AllBlocksCleared":
        this.emptyRank(r);
        c.cleared++;
        this.removed(workerId);
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
    if (w.blockSize !== bs) {
      w.blockSize = bs;
      this.version++;
    }
    if (ev.loraName) this.loras.add(ev.loraName);
    const table = this.table;
    const lanes = this.lanes;
    let pLo: number;
    let pHi: number;
    if (ev.parentBlockHash === null) {
      rootSeedInto(lanes, ev.cacheSalt ?? saltFromExtraKeys(ev.extraKeys, ev.loraName), ev.loraName);
      pLo = lanes[0];
      pHi = lanes[1];
    } else {
      const slot = r.engine.find(ev.parentBlockHash);
      if (slot < 0) {
        c.orphans++;
        return;
      }
      const e = r.engine.valueAt(slot);
      pLo = table.loOf(e);
      pHi = table.hiOf(e);
    }
    const toks = ev.tokenIds;
    const hid = r.hid;
    for (let b = 0; b < hashes.length; b++) {
      const end = (b + 1) * bs;
      if (end > toks.length) break;
      hashBlockInto(pLo, pHi, toks, b * bs, end, lanes, 0);
      const lo = lanes[0];
      const hi = lanes[1];
      const eh: EngineBlockHash = hashes[b];
      const slot = r.engine.find(eh);
      if (slot >= 0) {
        const old = r.engine.valueAt(slot);
        if (table.loOf(old) !== lo || table.hiOf(old) !== hi) {
          // The engine reused its hash for other tokens: the rank now holds the new block only.
          table.release(old, hid);
          const e = table.acquire(lo, hi, hid);
          if (e === 0) {
            r.engine.deleteAt(slot);
            this.capRest(workerId, hashes.length - b);
            return;
          }
          r.engine.setAt(slot, e);
        }
      } else {
        if (r.engine.size >= w.cap) {
          // The rank holds more than its pool can: removals were missed. Drop the rest of the
          // event without hashing it (a flood must not cost CPU per dropped block either).
          this.capRest(workerId, hashes.length - b);
          return;
        }
        const e = table.acquire(lo, hi, hid);
        if (e === 0) {
          // The fleet holds more distinct blocks than a rank map can name (268M): drop as at a cap.
          this.capRest(workerId, hashes.length - b);
          return;
        }
        r.engine.insertNew(eh, e);
      }
      pLo = lo;
      pHi = hi;
      c.stored++;
    }
  }

  /** Counts the `dropped` blocks left of an event as capped. */
  private capRest(workerId: string, dropped: number): void {
    this.counters.capped += dropped;
    this.onCapped?.(workerId, dropped);
  }

  private removeHashes(r: RankBlocks, hashes: readonly EngineBlockHash[]): void {
    for (let i = 0; i < hashes.length; i++) {
      const slot = r.engine.find(hashes[i]);
      if (slot < 0) {
        this.counters.unknownRemovals++;
        continue;
      }
      this.table.release(r.engine.valueAt(slot), r.hid);
      r.engine.deleteAt(slot);
      this.counters.removed++;
    }
  }

  /**
   * For each of `workerIds`, how many leading full blocks of `tokens` the worker's best rank
   * holds (-1 for a worker the index does not track). The prompt is hashed once per distinct
   * block size and walked once for all the workers of that size (./walk.ts). `bestRank`, when
   * given, receives that rank per worker (-1 when none holds any).
   */
  overlaps(
    tokens: ArrayLike<number>,
    workerIds: readonly string[],
    cacheSalt?: string | null,
    loraName?: string | null,
    bestRank?: Int32Array,
    into?: Int32Array,
  ): Int32Array {
    const out = this.walker.overlaps(
      this.table,
      tokens,
      this.resolve(workerIds),
      cacheSalt,
      loraName,
      bestRank,
      into,
    );
    // A worker whose view is not in sync is unknown, not empty: the caller's fallback decides.
    if (this.unsynced.size > 0)
      for (let i = 0; i < workerIds.length; i++)
        if (this.unsynced.has(workerIds[i])) {
          out[i] = -1;
          if (bestRank) bestRank[i] = -1;
        }
    return out;
  }

  /**
   * Per worker of `workerIds`, in one pass: its block size (0: not tracked), the blocks it holds,
   * all ranks together (−1 where `hasWorker` is false: not tracked, or not in sync), and its sync
   * as a code (0 not tracked, 1 syncing, 2 synced, 3 unknown). The list of the last `overlaps`
   * is resolved already, so a decision over N workers pays no lookup per worker here (three
   * `Map` reads per worker for `blockSizeOf`, `hasWorker` and `blockCount` took ≈ 25 µs at 256).
   */
  candidateRows(
    workerIds: readonly string[],
    blockSize: Int32Array,
    held: Int32Array,
    sync: Uint8Array,
  ): void {
    const ws = this.workersFor(workerIds);
    const checkSync = this.unsynced.size > 0;
    for (let i = 0; i < ws.length; i++) {
      const w = ws[i];
      if (!w) {
        blockSize[i] = 0;
        held[i] = -1;
        sync[i] = 0;
        continue;
      }
      blockSize[i] = w.blockSize;
      if (checkSync && this.unsynced.has(workerIds[i])) {
        held[i] = -1;
        const s = this.syncOf(workerIds[i]);
        sync[i] = s === "syncing" ? 1 : s === "unknown" ? 3 : 2;
        continue;
      }
      held[i] = w.held;
      sync[i] = 2;
    }
  }

  /** The candidates behind `ids`, flattened for the walk (see `workersFor`). */
  private resolve(ids: readonly string[]): WalkPlan {
    const ws = this.workersFor(ids);
    if (ws !== this.lastWs) return plan(ws);
    if (this.planOf !== ws) {
      this.lastPlan = plan(ws);
      this.planOf = ws;
    }
    return this.lastPlan;
  }

  /**
   * The entries behind `ids` (undefined: not tracked). Consecutive decisions for one model pass
   * the same candidates, so the last list (and its walk plan) is kept and reused while the ids
   * are the same (compared, not trusted by identity) and `version` has not moved: 1,000
   * `Map.get`s and the flattening are a good part of a fleet-wide match.
   */
  private workersFor(ids: readonly string[]): readonly (WorkerBlocks | undefined)[] {
    // The same stable list as last time (the scheduler's per-fleet ids) cannot have changed.
    if (ids === this.lastInput && this.lastVersion === this.version) return this.lastWs;
    const last = this.lastIds;
    let same = last.length === ids.length && this.lastVersion === this.version;
    for (let i = 0; same && i < ids.length; i++) same = last[i] === ids[i];
    if (same) {
      this.lastInput = isStable(ids) ? ids : null;
      return this.lastWs;
    }
    const ws = new Array<WorkerBlocks | undefined>(ids.length);
    for (let i = 0; i < ids.length; i++) ws[i] = this.workers.get(ids[i]);
    // A probe of one or two workers (the pending bridge's confirmations, between two decisions)
    // is cheap to resolve and must not evict the fleet's list that the next decision reuses.
    if (ids.length <= 2 && last.length > 2) return ws;
    this.lastIds = ids.slice();
    this.lastInput = isStable(ids) ? ids : null;
    this.lastWs = ws;
    this.lastVersion = this.version;
    return ws;
  }

  /** Memory held by the tables, in bytes (typed arrays only). */
  bytes(): number {
    let n = this.table.bytes() + this.walker.bytes();
    for (const w of this.workers.values()) for (const r of w.rankList) n += r.engine.bytes();
    return n;
  }

  /** Blocks held, all workers and ranks together (a block held by two ranks counts twice). */
  totalBlocks(): number {
    let n = 0;
    for (const w of this.workers.values()) for (const r of w.rankList) n += r.engine.size;
    return n;
  }

  /** Distinct router hashes held across the fleet. */
  distinctBlocks(): number {
    return this.table.size;
  }
}
