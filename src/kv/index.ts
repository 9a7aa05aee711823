/**
 * The KV prefix index: which worker holds which prompt blocks, built from the engines' KV
 * events. Blocks are keyed on the router's own chained hash of their token ids (./hash.ts),
 * never on an engine's hash; each worker keeps a map from the engine's hash to the router's so
 * `BlockRemoved` (which carries only engine hashes) can be applied, and so a `BlockStored` whose
 * parent is an engine hash can continue the router's chain.
 *
 * Per worker the state is two typed-array tables (./tables.ts): 16 bytes per block at most,
 * so 1,000 workers × 100k blocks fit in about 2 GiB.
 */
import type { KvEvent } from "./events.ts";
import { hashBlock, hashPrompt, rootSeed } from "./hash.ts";
import { F64U32Map, U32MultiSet } from "./tables.ts";

interface WorkerBlocks {
  blockSize: number;
  /** Router hashes of the blocks the worker holds (a multiset). */
  blocks: U32MultiSet;
  /** Engine block hash → router hash. */
  engine: F64U32Map;
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
}

function isGpu(medium: string | null): boolean {
  return medium === null || medium.toUpperCase() === "GPU";
}

/**
 * The cache salt vLLM adds to the first block's extra keys (the last string among them).
 * Accepts a per-block list (`[[...first block keys], null, ...]`), a flat list, a bare string
 * or a map with `cache_salt`.
 */
export function saltFromExtraKeys(extraKeys: unknown): string | null {
  if (extraKeys == null) return null;
  if (typeof extraKeys === "string") return extraKeys;
  if (Array.isArray(extraKeys)) {
    if (extraKeys.length === 0) return null;
    const perBlock = extraKeys.every((k) => k === null || Array.isArray(k));
    const keys: unknown = perBlock ? extraKeys[0] : extraKeys;
    if (!Array.isArray(keys)) return saltFromExtraKeys(keys);
    for (let i = keys.length - 1; i >= 0; i--) if (typeof keys[i] === "string") return keys[i] as string;
    return null;
  }
  if (typeof extraKeys === "object") {
    const salt = (extraKeys as Record<string, unknown>).cache_salt;
    return typeof salt === "string" ? salt : null;
  }
  return null;
}

export class KvIndex {
  private readonly workers = new Map<string, WorkerBlocks>();
  readonly counters: KvIndexCounters = {
    stored: 0,
    removed: 0,
    cleared: 0,
    orphans: 0,
    unknownRemovals: 0,
    ignored: 0,
  };
  private scratch = new Uint32Array(1024);
  /** Told of every kv-aware routing decision (the server hangs its metrics here). */
  decisionObserver?: (reason: string, overlapBlocks: number, promptBlocks: number) => void;

  /** Starts tracking a worker (idempotent); `blockSize` from its record until events say otherwise. */
  addWorker(id: string, blockSize: number, expectedBlocks = 0): void {
    if (this.workers.has(id)) return;
    this.workers.set(id, {
      blockSize,
      blocks: new U32MultiSet(expectedBlocks),
      engine: new F64U32Map(expectedBlocks),
    });
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

  /** Empties a worker (AllBlocksCleared, or a sequence gap that replay could not fill). */
  clearWorker(id: string): void {
    const w = this.workers.get(id);
    if (!w) return;
    w.blocks.clear();
    w.engine.clear();
  }

  blockSizeOf(id: string): number | undefined {
    return this.workers.get(id)?.blockSize;
  }

  blockCount(id: string): number {
    return this.workers.get(id)?.blocks.size ?? 0;
  }

  /** Applies a list of events from one worker (a decoded batch). Unknown workers are added. */
  applyEvents(workerId: string, events: readonly KvEvent[], defaultBlockSize = 16): void {
    let w = this.workers.get(workerId);
    if (!w) {
      this.addWorker(workerId, defaultBlockSize);
      w = this.workers.get(workerId)!;
    }
    for (let i = 0; i < events.length; i++) this.applyTo(w, events[i]);
  }

  apply(workerId: string, ev: KvEvent, defaultBlockSize = 16): void {
    this.applyEvents(workerId, [ev], defaultBlockSize);
  }

  private applyTo(w: WorkerBlocks, ev: KvEvent): void {
    const c = this.counters;
    switch (ev.type) {
      case "BlockStored": {
        if (!isGpu(ev.medium) || (ev.groupIdx !== null && ev.groupIdx > 0)) {
          c.ignored++;
          return;
        }
        const bs = ev.blockSize;
        w.blockSize = bs;
        let parent: number;
        if (ev.parentBlockHash === null) parent = rootSeed(saltFromExtraKeys(ev.extraKeys));
        else {
          const slot = w.engine.find(ev.parentBlockHash);
          if (slot < 0) {
            c.orphans++;
            return;
          }
          parent = w.engine.valueAt(slot);
        }
        const toks = ev.tokenIds;
        const hashes = ev.blockHashes;
        for (let b = 0; b < hashes.length; b++) {
          const end = (b + 1) * bs;
          if (end > toks.length) break;
          const rh = hashBlock(parent, toks, b * bs, end);
          const eh = hashes[b];
          const slot = w.engine.find(eh);
          if (slot >= 0) {
            const old = w.engine.valueAt(slot);
            if (old !== rh) {
              w.blocks.delete(old);
              w.blocks.add(rh);
              w.engine.setAt(slot, rh);
            }
          } else {
            w.engine.insertNew(eh, rh);
            w.blocks.add(rh);
          }
          parent = rh;
          c.stored++;
        }
        return;
      }
      case "BlockRemoved": {
        if (!isGpu(ev.medium) || (ev.groupIdx !== null && ev.groupIdx > 0)) {
          c.ignored++;
          return;
        }
        this.removeHashes(w, ev.blockHashes);
        return;
      }
      case "BlockTransferred": {
        // Only a move out of GPU memory changes what a GPU prefix hit can use; a move in carries
        // no token ids, so the router cannot hash it.
        if (isGpu(ev.fromMedium) && ev.toMedium !== null && !isGpu(ev.toMedium))
          this.removeHashes(w, ev.blockHashes);
        else c.ignored++;
        return;
      }
      case "AllBlocksCleared":
        w.blocks.clear();
        w.engine.clear();
        c.cleared++;
        return;
    }
  }

  private removeHashes(w: WorkerBlocks, hashes: readonly number[]): void {
    for (let i = 0; i < hashes.length; i++) {
      const slot = w.engine.find(hashes[i]);
      if (slot < 0) {
        this.counters.unknownRemovals++;
        continue;
      }
      w.blocks.delete(w.engine.valueAt(slot));
      w.engine.deleteAt(slot);
      this.counters.removed++;
    }
  }

  /**
   * For each of `workerIds`, how many leading full blocks of `tokens` the worker holds
   * (-1 for a worker the index does not track). The prompt is hashed once per distinct block size.
   */
  overlaps(tokens: ArrayLike<number>, workerIds: readonly string[], cacheSalt?: string | null): Int32Array {
    const out = new Int32Array(workerIds.length);
    let chains: Map<number, Uint32Array> | null = null;
    let firstBs = 0;
    let firstChain: Uint32Array | null = null;
    for (let i = 0; i < workerIds.length; i++) {
      const w = this.workers.get(workerIds[i]);
      if (!w) {
        out[i] = -1;
        continue;
      }
      let chain: Uint32Array | undefined;
      if (firstChain !== null && w.blockSize === firstBs) chain = firstChain;
      else if (firstChain === null) {
        const need = Math.floor(tokens.length / w.blockSize);
        if (this.scratch.length < need) this.scratch = new Uint32Array(need * 2);
        firstChain = hashPrompt(tokens, w.blockSize, cacheSalt, this.scratch);
        firstBs = w.blockSize;
        chain = firstChain;
      } else {
        chains ??= new Map();
        chain = chains.get(w.blockSize);
        if (!chain) {
          chain = hashPrompt(tokens, w.blockSize, cacheSalt);
          chains.set(w.blockSize, chain);
        }
      }
      const blocks = w.blocks;
      let k = 0;
      while (k < chain.length && blocks.has(chain[k])) k++;
      out[i] = k;
    }
    return out;
  }

  /** Memory held by the tables, in bytes (typed arrays only). */
  bytes(): number {
    let n = 0;
    for (const w of this.workers.values()) n += w.blocks.bytes() + w.engine.bytes();
    return n;
  }

  totalBlocks(): number {
    let n = 0;
    for (const w of this.workers.values()) n += w.blocks.size;
    return n;
  }
}
