import type { KvEvent } from "./kv-events.ts";

/**
 * The paged KV block pool with prefix caching, after vLLM V1's BlockPool: blocks are
 * reference counted; a block whose count drops to zero joins the tail of an LRU free queue
 * but keeps its hash, so a later request with the same prefix can take it back (a cache
 * hit); allocation pops the queue's head and evicts that block's hash (BlockRemoved).
 * Every store, eviction and clear appends an event to `pending`, which the engine drains
 * once per scheduler step.
 */
export class BlockPool {
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly enableCaching: boolean;
  /** Events since the last drain, in the order they happened. */
  pending: KvEvent[] = [];

  private readonly refCount: Int32Array;
  /** Doubly linked free queue; index numBlocks is the sentinel. */
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private readonly inFree: Uint8Array;
  private freeCount = 0;
  private readonly hashOf: (bigint | null)[];
  private readonly cached = new Map<bigint, number>();

  /**
   * vLLM's native CPU offloading (OffloadingConnector, `num_cpu_blocks`): every block the pool
   * caches is offloaded to a CPU LRU of this many blocks, and reported as the connector reports
   * it (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py
   * @ 0072b0b7443bdddf17824c78d4feae8e1fc12fb4, take_events: BlockStored with medium "CPU", the
   * block hashes, token_ids [], no parent and the offloaded `block_size`; BlockRemoved "CPU" when
   * the LRU drops one). An offloaded block holds `cpuFactor` GPU blocks (extra config
   * `block_size`), offloaded once the request has all of them, aligned from its start. Its hash
   * is what the connector sends: raw bytes, never converted to an int, the concatenation of its
   * GPU blocks' digests (vllm/v1/core/kv_cache_utils.py BlockHashListWithBlockSize @
   * 001cabc1be16a59a70d720ed61a13b678c060a18); the sim's 64-bit hash is a 32-byte digest's low 64
   * bits, as the GPU events' ints are under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES. The offloaded
   * copy is not loaded back on a hit (the sim recomputes): only the events are modelled. The LRU
   * is keyed by the group's last GPU hash (it names the whole prefix) and holds the event hash.
   */
  private readonly cpu: Map<bigint, Uint8Array> | null;
  private readonly cpuBlocks: number;
  private readonly cpuFactor: number;

  constructor(numBlocks: number, blockSize: number, enableCaching = true, cpuBlocks = 0, cpuFactor = 1) {
    this.cpuBlocks = cpuBlocks;
    this.cpuFactor = cpuFactor;
    this.cpu = cpuBlocks > 0 ? new Map() : null;
    this.numBlocks = numBlocks;
    this.blockSize = blockSize;
    this.enableCaching = enableCaching;
    this.refCount = new Int32Array(numBlocks);
    this.prev = new Int32Array(numBlocks + 1);
    this.next = new Int32Array(numBlocks + 1);
    this.inFree = new Uint8Array(numBlocks);
    this.hashOf = new Array(numBlocks).fill(null);
    const s = numBlocks;
    this.prev[s] = s;
    this.next[s] = s;
    for (let i = 0; i < numBlocks; i++) this.pushTail(i);
  }

  /** Blocks that can be allocated now (free, cached or not). */
  get numFree(): number {
    return this.freeCount;
  }

  get numUsed(): number {
    return this.numBlocks - this.freeCount;
  }

  /** Fraction of blocks in use (vLLM's kv_cache_usage_perc). */
  usage(): number {
    return this.numBlocks === 0 ? 0 : this.numUsed / this.numBlocks;
  }

  get numCachedBlocks(): number {
    return this.cached.size;
  }

  /** The cached block holding `hash`, if any. */
  lookup(hash: bigint): number | undefined {
    return this.enableCaching ? this.cached.get(hash) : undefined;
  }

  isFree(blockId: number): boolean {
    return this.inFree[blockId] === 1;
  }

  refs(blockId: number): number {
    return this.refCount[blockId];
  }

  hashOfBlock(blockId: number): bigint | null {
    return this.hashOf[blockId];
  }

  /** Takes a reference on a cached block (a prefix hit), pulling it off the free queue. */
  touch(blockId: number): void {
    if (this.refCount[blockId] === 0 && this.inFree[blockId] === 1) this.unlink(blockId);
    this.refCount[blockId]++;
  }

  /** Allocates `n` blocks from the free queue's head (evicting their hashes), or null if too few. */
  allocate(n: number): number[] | null {
    if (n > this.freeCount) return null;
    const out: number[] = new Array(n);
    const removed: bigint[] = [];
    for (let k = 0; k < n; k++) {
      const id = this.next[this.numBlocks];
      this.unlink(id);
      const h = this.hashOf[id];
      if (h !== null) {
        this.cached.delete(h);
        this.hashOf[id] = null;
        removed.push(h);
      }
      this.refCount[id] = 1;
      out[k] = id;
    }
    if (removed.length > 0) this.pending.push({ type: "BlockRemoved", blockHashes: removed });
    return out;
  }

  /**
   * Drops one reference on each block. Blocks reaching zero join the free queue's tail in
   * reverse order, so a sequence's last blocks are evicted before its shared prefix.
   */
  free(blockIds: readonly number[]): void {
    for (let k = blockIds.length - 1; k >= 0; k--) {
      const id = blockIds[k];
      if (this.refCount[id] <= 0) continue;
      if (--this.refCount[id] === 0) {
        if (this.hashOf[id] === null) this.pushHead(id);
        else this.pushTail(id);
      }
    }
  }

  /**
   * Registers full blocks as cached: `hashes[i]` for `blockIds[i]`, i in [from, to). A block
   * whose hash another block already holds stays uncached (no duplicate events). Emits one
   * BlockStored per run of consecutive newly cached blocks.
   */
  cacheBlocks(
    blockIds: readonly number[],
    hashes: readonly bigint[],
    tokens: readonly number[],
    from: number,
    to: number,
    salt: string | null,
  ): void {
    if (!this.enableCaching || from >= to) return;
    const bs = this.blockSize;
    let run: { start: number; hashes: bigint[] } | null = null;
    const flush = (end: number): void => {
      if (!run) return;
      const start = run.start;
      const extraKeys =
        salt !== null && start === 0 ? run.hashes.map((_, i) => (i === 0 ? [salt] : null)) : null;
      this.pending.push({
        type: "BlockStored",
        blockHashes: run.hashes,
        parentBlockHash: start === 0 ? null : hashes[start - 1],
        tokenIds: tokens.slice(start * bs, end * bs) as number[],
        blockSize: bs,
        extraKeys,
        salt,
      });
      run = null;
    };
    for (let b = from; b < to; b++) {
      const id = blockIds[b];
      const h = hashes[b];
      if (this.hashOf[id] === h) {
        flush(b);
        continue;
      }
      if (this.hashOf[id] !== null || this.cached.has(h)) {
        flush(b);
        continue;
      }
      this.hashOf[id] = h;
      this.cached.set(h, id);
      if (!run) run = { start: b, hashes: [] };
      run.hashes.push(h);
    }
    flush(to);
    if (this.cpu) this.offload(hashes, from, to);
  }

  /**
   * Offloads the groups of `cpuFactor` blocks that caching blocks [from, to) of a request
   * completed to the CPU LRU (see `cpu`), evicting its oldest past capacity.
   */
  private offload(hashes: readonly bigint[], from: number, to: number): void {
    const cpu = this.cpu!;
    const k = this.cpuFactor;
    const stored: Uint8Array[] = [];
    for (let g = Math.floor(from / k); (g + 1) * k <= to; g++) {
      const last = hashes[(g + 1) * k - 1];
      const known = cpu.get(last);
      if (known) {
        cpu.delete(last);
        cpu.set(last, known); // already offloaded: refreshed, no event
        continue;
      }
      const digest = offloadDigest(hashes, g * k, (g + 1) * k);
      cpu.set(last, digest);
      stored.push(digest);
    }
    const evicted: Uint8Array[] = [];
    while (cpu.size > this.cpuBlocks) {
      const [oldest, digest] = cpu.entries().next().value!;
      cpu.delete(oldest);
      evicted.push(digest);
    }
    if (stored.length > 0)
      this.pending.push({
        type: "BlockStored",
        blockHashes: stored,
        parentBlockHash: null,
        tokenIds: [],
        blockSize: this.blockSize * k,
        extraKeys: null,
        medium: "CPU",
      });
    if (evicted.length > 0) this.pending.push({ type: "BlockRemoved", blockHashes: evicted, medium: "CPU" });
  }

  /** Clears the prefix cache (vLLM reset_prefix_cache); refused while any block is in use. */
  reset(): boolean {
    if (this.numUsed > 0) return false;
    for (let i = 0; i < this.numBlocks; i++) this.hashOf[i] = null;
    this.cached.clear();
    this.pending.push({ type: "AllBlocksCleared" });
    return true;
  }

  drain(): KvEvent[] {
    const out = this.pending;
    this.pending = [];
    return out;
  }

  private unlink(id: number): void {
    const p = this.prev[id];
    const n = this.next[id];
    this.next[p] = n;
    this.prev[n] = p;
    this.inFree[id] = 0;
    this.freeCount--;
  }

  private pushTail(id: number): void {
    const s = this.numBlocks;
    const last = this.prev[s];
    this.next[last] = id;
    this.prev[id] = last;
    this.next[id] = s;
    this.prev[s] = id;
    this.inFree[id] = 1;
    this.freeCount++;
  }

  /** Uncached free blocks go to the head: they hold nothing worth keeping, so they go first. */
  private pushHead(id: number): void {
    const s = this.numBlocks;
    const first = this.next[s];
    this.prev[first] = id;
    this.next[id] = first;
    this.prev[id] = s;
    this.next[s] = id;
    this.inFree[id] = 1;
    this.freeCount++;
  }
}

/** GPU blocks [from, to)'s hashes as the offloading connector names their group (see `cpu`). */
function offloadDigest(hashes: readonly bigint[], from: number, to: number): Uint8Array {
  const out = Buffer.alloc(32 * (to - from));
  for (let i = from; i < to; i++) out.writeBigUInt64BE(hashes[i], 32 * (i - from) + 24);
  return out;
}
