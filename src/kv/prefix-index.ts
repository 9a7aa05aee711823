/**
 * What routing reads from a KV prefix index: the contract between the index (src/kv/index.ts,
 * fed by the engines' KV events) and the scorers that use it. Routing code depends on this
 * interface only, so the index's representation can change without touching a scorer.
 */
export interface PrefixIndex {
  /** True while the index tracks the worker (it publishes KV events). */
  hasWorker(id: string): boolean;
  /** The worker's block size in tokens, as its events (or record) say. */
  blockSizeOf(id: string): number | undefined;
  /** Blocks the worker holds, all ranks together (or one rank's). */
  blockCount(id: string, rank?: number): number;
  /** True when some engine's events named `name` as a LoRA adapter. */
  isLora(name: string): boolean;
  /**
   * For each of `workerIds`, how many leading full blocks of `tokens` the worker's best rank
   * holds (-1 for a worker the index does not track). `bestRank`, when given, receives that
   * rank per worker (-1 when none holds any).
   */
  overlaps(
    tokens: ArrayLike<number>,
    workerIds: readonly string[],
    cacheSalt?: string | null,
    loraName?: string | null,
    bestRank?: Int32Array,
  ): Int32Array;
  /**
   * Calls `fn` with a worker's id whenever the index drops blocks of that worker (BlockRemoved,
   * a move out of GPU memory, AllBlocksCleared, a reset or removal); returns the unsubscribe.
   * The pending bridge listens, so that an eviction is never overridden by its credit.
   */
  onRemoval?(fn: (workerId: string) => void): () => void;
  /** Told of every decision of an overlap-aware step (a profile with `kv-prefix`); the server hangs its metrics here. */
  decisionObserver?: (reason: string, overlapBlocks: number, promptBlocks: number) => void;
}
