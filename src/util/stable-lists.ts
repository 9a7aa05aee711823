/**
 * Arrays their owner promises never to change after handing them out (the WorkerSet's candidate
 * lists, the ids derived from them), so that what is derived from one can be kept by the array's
 * identity (src/router/pipeline/util.ts candidateView, the KV index's resolved list).
 *
 * Not `Object.freeze`: V8 (Node 24) reads a frozen array's elements on a slower path, 5× slower
 * for a loop over 256 workers (PACKED_FROZEN_ELEMENTS), and a decision runs a dozen such loops.
 */
const stable = new WeakSet<readonly unknown[]>();

/** Marks `list` as never changing from now on; returns it. */
export function markStable<T extends readonly unknown[]>(list: T): T {
  stable.add(list);
  return list;
}

export function isStable(list: readonly unknown[]): boolean {
  return stable.has(list);
}
