/**
 * One worker rank's index sync (IndexSync, ./prefix-index.ts), the rules both event planes'
 * feeds share (ZMQ: ./feeds/zmq.ts, NATS: ./feeds/nats.ts):
 * - `syncing` while the start-up (or post-restart) replay runs; `settle()` ends it;
 * - a hole in the rank's history (no replay, a failed one, a buffer that no longer reaches back)
 *   makes it `unknown`: routed as untracked, never as empty;
 * - an unknown rank is rebuilt (`synced`) by the events that follow it: a GPU AllBlocksCleared;
 *   the eviction of a block the index holds (stored after the hole: the engine's LRU frees the
 *   blocks last used before the hole first, so those are gone); or, with a known pool size, a
 *   pool's worth of stores. Blocks kept cached across the hole by being hit all along are what
 *   this misses.
 */
import { isGpu } from "./event-keys.ts";
import type { EventBatch } from "./events.ts";
import type { KvIndex } from "./index.ts";
import type { IndexSync } from "./prefix-index.ts";

export class RankSync {
  private readonly index: KvIndex;
  private readonly workerId: string;
  private readonly rank: number;
  private readonly pool: number;
  private readonly onChange?: (state: IndexSync) => void;
  private readonly startedAt = performance.now();
  private hole = false;
  private stored = 0;
  private closed = false;
  state: IndexSync = "syncing";
  /** Ms from construction to the first `synced` (-1: not yet). */
  syncMs = -1;

  constructor(o: {
    index: KvIndex;
    workerId: string;
    rank: number;
    kvBlocks?: number;
    onChange?: (state: IndexSync) => void;
  }) {
    this.index = o.index;
    this.workerId = o.workerId;
    this.rank = o.rank;
    this.pool = o.kvBlocks ?? 0;
    this.onChange = o.onChange;
    this.index.setSync(this.workerId, this.rank, "syncing");
  }

  /** True while the rank's history has a hole (the rebuild rule is counting). */
  get open(): boolean {
    return this.hole;
  }

  /** Sets the state here and in the index (nothing once closed: a new feed may own the rank). */
  set(state: IndexSync): void {
    if (this.closed) return;
    if (state === "synced" && this.syncMs < 0) this.syncMs = performance.now() - this.startedAt;
    const changed = state !== this.state;
    this.state = state;
    this.index.setSync(this.workerId, this.rank, state);
    if (changed) this.onChange?.(state);
  }

  /** A replay (re)builds the rank from scratch: `syncing` until `settle()`. */
  begin(): void {
    this.hole = false;
    this.stored = 0;
    this.set("syncing");
  }

  /** The rank's history has a hole: unknown until rebuilt (kept `syncing` until `settle()`). */
  markHole(): void {
    this.hole = true;
    this.stored = 0;
    if (this.state !== "syncing") this.set("unknown");
  }

  /** Nothing is missing any more (the engine's first batch, a clear, a rebuild). */
  clearHole(): void {
    this.hole = false;
    this.stored = 0;
    if (this.state !== "syncing") this.set("synced");
  }

  /** The replay that began `syncing` is over: synced, or unknown when it left a hole. */
  settle(): void {
    this.set(this.hole ? "unknown" : "synced");
  }

  /** Applies a batch to the index, and counts it toward a rebuild while there is a hole. */
  apply(batch: EventBatch, blockSize: number): void {
    const removed = this.index.counters.removed;
    this.index.applyEvents(this.workerId, batch.events, blockSize, this.rank);
    if (!this.hole) return;
    if (this.index.counters.removed > removed) {
      this.clearHole();
      return;
    }
    for (const ev of batch.events) {
      if (ev.type === "AllBlocksCleared" && isGpu(ev.medium ?? null)) {
        this.clearHole();
        return;
      }
      if (ev.type === "BlockStored") this.stored += ev.blockHashes.length;
    }
    if (this.pool > 0 && this.stored >= this.pool) this.clearHole();
  }

  close(): void {
    this.closed = true;
  }
}
