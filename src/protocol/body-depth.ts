/**
 * The nesting limit of request bodies, in a module of its own with no imports: the server's
 * body parser worker (src/server/body-parser-worker.ts) runs the same check off the loop.
 */

/** Deepest nesting of arrays and objects a request body may have. */
export const MAX_BODY_DEPTH = 128;

/** Whether `v` (a JSON.parse result) nests objects and arrays deeper than `left` levels. */
export function tooDeep(v: unknown, left: number): boolean {
  if (left === 0) return true;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const x: unknown = v[i];
      if (x !== null && typeof x === "object" && tooDeep(x, left - 1)) return true;
    }
    return false;
  }
  const o = v as Record<string, unknown>;
  for (const k in o) {
    const x = o[k];
    if (x !== null && typeof x === "object" && tooDeep(x, left - 1)) return true;
  }
  return false;
}
