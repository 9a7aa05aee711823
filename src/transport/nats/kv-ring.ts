/**
 * The agent's buffer of recent KV batches (already in their NATS wire form), for subscribers
 * that missed some: a fixed-capacity ring ordered by sequence number, like vLLM's replay buffer
 * (buffer_steps). Sequence numbers in it are strictly increasing.
 */
export class KvRing {
  readonly capacity: number;
  private readonly seqs: number[];
  private readonly msgs: (Uint8Array | undefined)[];
  private start = 0;
  private count = 0;

  constructor(capacity: number) {
    this.capacity = capacity;
    if (capacity < 1) throw new Error("KvRing capacity must be >= 1");
    this.seqs = new Array<number>(capacity).fill(0);
    this.msgs = new Array<Uint8Array | undefined>(capacity).fill(undefined);
  }

  get size(): number {
    return this.count;
  }

  /** Oldest buffered seq, or -1 when empty. */
  get oldest(): number {
    return this.count === 0 ? -1 : this.seqs[this.start];
  }

  /** Newest buffered seq, or -1 when empty. */
  get newest(): number {
    return this.count === 0 ? -1 : this.seqs[(this.start + this.count - 1) % this.capacity];
  }

  /** Appends; a seq not above the newest (an engine restart) clears what came before. */
  push(seq: number, msg: Uint8Array): void {
    if (this.count > 0 && seq <= this.newest) this.clear();
    const i = (this.start + this.count) % this.capacity;
    this.seqs[i] = seq;
    this.msgs[i] = msg;
    if (this.count < this.capacity) this.count++;
    else this.start = (this.start + 1) % this.capacity;
  }

  clear(): void {
    this.msgs.fill(undefined);
    this.start = 0;
    this.count = 0;
  }

  /** Calls fn for each buffered message with seq >= from, in order, at most max (0 = all). */
  forEachFrom(from: number, max: number, fn: (seq: number, msg: Uint8Array) => void): number {
    // Binary search for the first index with seq >= from.
    let lo = 0;
    let hi = this.count;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.seqs[(this.start + mid) % this.capacity] < from) lo = mid + 1;
      else hi = mid;
    }
    let n = 0;
    for (let k = lo; k < this.count && (max === 0 || n < max); k++, n++) {
      const i = (this.start + k) % this.capacity;
      fn(this.seqs[i], this.msgs[i]!);
    }
    return n;
  }
}
