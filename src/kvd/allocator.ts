/**
 * Arena allocator: segregated free lists (TLSF-style, power-of-two size classes) over
 * page-granular extents, with immediate coalescing of neighbours on free.
 *
 * Why this and not the alternatives:
 * - Fixed slabs per size class strand memory: KV chunk sizes depend on model, dtype, TP and
 *   chunk length (0.5–32 MiB), so a slab sized for today's traffic is empty tomorrow while
 *   another class starves.
 * - A buddy allocator rounds every request up to a power of two: a 17 MiB chunk takes
 *   32 MiB, up to ~50% of the arena lost to internal fragmentation.
 * - Segregated fit keeps internal waste to the page rounding (4 KiB), finds a block in
 *   O(classes) by taking the first extent of the first class that surely fits, and
 *   coalescing on free means that freed neighbours always merge back, so the free space
 *   never collapses into slivers: after everything is freed the arena is one extent again.
 *   When no extent fits, the store evicts (LRU by class) until one does; eviction frees
 *   whole chunks, which merge with their free neighbours.
 * Alignment to 4 KiB keeps chunks page-aligned for O_DIRECT and for GPU DMA registration.
 */
export const ARENA_GRANULE = 4096;

export interface Extent {
  offset: number;
  size: number;
}

function classOf(size: number): number {
  return 31 - Math.clz32(Math.max(1, Math.floor(size / ARENA_GRANULE)));
}

export class ArenaAllocator {
  readonly capacity: number;
  private readonly byStart = new Map<number, number>();
  private readonly byEnd = new Map<number, number>();
  private readonly classes: Set<number>[] = [];
  private usedBytes = 0;

  constructor(capacity: number) {
    this.capacity = capacity;
    const usable = Math.floor(capacity / ARENA_GRANULE) * ARENA_GRANULE;
    for (let i = 0; i < 40; i++) this.classes.push(new Set());
    if (usable > 0) this.addFree(0, usable);
  }

  get used(): number {
    return this.usedBytes;
  }

  get freeExtents(): number {
    return this.byStart.size;
  }

  largestFree(): number {
    let best = 0;
    for (const s of this.byStart.values()) if (s > best) best = s;
    return best;
  }

  /** Rounded size a request of `size` bytes occupies. */
  static rounded(size: number): number {
    return Math.max(ARENA_GRANULE, Math.ceil(size / ARENA_GRANULE) * ARENA_GRANULE);
  }

  alloc(size: number): Extent | null {
    const need = ArenaAllocator.rounded(size);
    const c = classOf(need);
    // The request's own class may hold extents smaller than `need`: best fit there...
    let pick = -1;
    let pickSize = Number.POSITIVE_INFINITY;
    for (const off of this.classes[c] ?? []) {
      const s = this.byStart.get(off)!;
      if (s >= need && s < pickSize) {
        pick = off;
        pickSize = s;
        if (s === need) break;
      }
    }
    // ...every extent in a higher class fits, so take the first one of the lowest such class.
    if (pick < 0) {
      for (let k = c + 1; k < this.classes.length; k++) {
        const first = this.classes[k]!.values().next();
        if (!first.done) {
          pick = first.value;
          pickSize = this.byStart.get(pick)!;
          break;
        }
      }
    }
    if (pick < 0) return null;
    this.removeFree(pick, pickSize);
    if (pickSize > need) this.addFree(pick + need, pickSize - need);
    this.usedBytes += need;
    return { offset: pick, size: need };
  }

  free(ext: Extent): void {
    let { offset, size } = ext;
    this.usedBytes -= size;
    const before = this.byEnd.get(offset);
    if (before !== undefined) {
      const bs = this.byStart.get(before)!;
      this.removeFree(before, bs);
      offset = before;
      size += bs;
    }
    const afterSize = this.byStart.get(offset + size);
    if (afterSize !== undefined) {
      this.removeFree(offset + size, afterSize);
      size += afterSize;
    }
    this.addFree(offset, size);
  }

  private addFree(offset: number, size: number): void {
    this.byStart.set(offset, size);
    this.byEnd.set(offset + size, offset);
    this.classes[classOf(size)]!.add(offset);
  }

  private removeFree(offset: number, size: number): void {
    this.byStart.delete(offset);
    this.byEnd.delete(offset + size);
    this.classes[classOf(size)]!.delete(offset);
  }
}
