/**
 * What routing reads from a KV prefix index: the contract between the index (src/kv/index.ts,
 * fed by the engines' KV events) and the scorers that use it. Routing code depends on this
 * interface only, so the index's representation can change without touching a scorer.
 */
/**
 * How far the index's view of a worker rank can be believed (a feed in src/kv/feeds/ sets it):
 * - `syncing`: the start-up (or post-restart) replay of the engine's buffer is still running;
 * - `synced`: the index holds what the engine's events say the rank holds;
 * - `unknown`: the rank's history could not be had (no replay socket, the replay failed, or the
 *   engine's buffer no longer reaches back far enough). Routed as untracked (neutral), never as
 *   empty, until the events seen since hold a pool's worth of stores or the engine clears.
 */
export type IndexSync = "syncing" | "synced" | "unknown";

/** One worker rank's KV index sync (GET /dashboard/state, and counted on GET /ready). */
export interface KvRankSync {
  worker: string;
  rank: number;
  state: IndexSync;
  /** Ms from the subscriber's start to its first `synced`; null while not yet. */
  syncMs: number | null;
}

/** Per-rank sync of the KV index, with counts per state. */
export interface KvSyncReport {
  synced: number;
  syncing: number;
  unknown: number;
  ranks: KvRankSync[];
}

export interface PrefixIndex {
  /**
   * True while the index tracks the worker (it publishes KV events) and its view is in sync:
   * a worker with a rank `syncing` or `unknown` reads as untracked, so routing falls back to
   * what this server sent it (and keeps learning that) instead of believing it holds nothing.
   */
  hasWorker(id: string): boolean;
  /** The worker's sync state (its least synced rank's); null when the index does not track it. */
  syncOf?(id: string): IndexSync | null;
  /** Per-rank sync states of the worker (empty when the index does not track it). */
  rankSyncOf?(id: string): ReadonlyMap<number, IndexSync>;
  /** The worker's block size in tokens, as its events (or record) say. */
  blockSizeOf(id: string): number | undefined;
  /** Blocks the worker holds, all ranks together (or one rank's). */
  blockCount(id: string, rank?: number): number;
  /**
   * `blockSizeOf`, `hasWorker ? blockCount : −1` and `syncOf` (as a code: 0 not tracked,
   * 1 syncing, 2 synced, 3 unknown) for every worker of `workerIds` in one pass, into the rows
   * given (block size 0: not tracked). Optional: the scheduler asks per worker without it.
   */
  candidateRows?(
    workerIds: readonly string[],
    blockSize: Int32Array,
    held: Int32Array,
    sync: Uint8Array,
  ): void;
  /** True when some engine's events named `name` as a LoRA adapter. */
  isLora(name: string): boolean;
  /**
   * For each of `workerIds`, how many leading full blocks of `tokens` the worker's best rank
   * holds (-1 for a worker the index does not track or whose view is not `synced`). `bestRank`, when given, receives that
   * rank per worker (-1 when none holds any). `out`, when given, receives the overlaps and is
   * returned (a caller's reused row: nothing allocated per call).
   */
  overlaps(
    tokens: ArrayLike<number>,
    workerIds: readonly string[],
    cacheSalt?: string | null,
    loraName?: string | null,
    bestRank?: Int32Array,
    out?: Int32Array,
  ): Int32Array;
  /**
   * For each of `workerIds`, the leading blocks of `tokens` it holds offloaded in host memory and
   * on disk (src/kv/tiers.ts); null when the index knows of no offloaded block at all.
   */
  tierOverlaps?(
    tokens: ArrayLike<number>,
    workerIds: readonly string[],
    cacheSalt?: string | null,
    loraName?: string | null,
  ): { host: Int32Array; disk: Int32Array } | null;
  /**
   * Calls `fn` with a worker's id whenever the index drops blocks of that worker (BlockRemoved,
   * a move out of GPU memory, AllBlocksCleared, a reset or removal); returns the unsubscribe.
   * The pending bridge listens, so that an eviction is never overridden by its credit.
   */
  onRemoval?(fn: (workerId: string) => void): () => void;
  /** Told of every decision of an overlap-aware step (a profile with `kv-prefix`); the server hangs its metrics here. */
  decisionObserver?: (reason: string, overlapBlocks: number, promptBlocks: number) => void;
}
