/**
 * The body parser's worker thread (see ./body-parser-pool.ts): decodes, parses and
 * depth-checks one body at a time, with the same depth check as the loop's path (one
 * `tooDeep`, from src/protocol/body-depth.ts, which imports nothing). Started from this file
 * when running the sources, from dist/body-parser-worker.js when running the build.
 *
 * `workerData`: WorkerConfig. Messages: WorkerJob in, WorkerReply out, the body's buffer
 * transferred both ways.
 *
 * A string of at least `longChars` characters is sent as a span (where its bytes lie in the
 * body) rather than cloned, when its UTF-8 bytes, between quotes, are found in the body:
 * well-formed strings only, so those bytes decode to exactly it (whichever occurrence is
 * found). Candidates are found by a short prefix, then compared whole.
 */
import { parentPort, workerData } from "node:worker_threads";
import { tooDeep } from "../protocol/body-depth.ts";

export interface WorkerConfig {
  maxDepth: number;
  /** Test hook: the worker exits at once on a body containing this string ("" = never). */
  crashMarker: string;
  longChars: number;
  maxSpans: number;
}

export interface WorkerJob {
  id: number;
  buf: ArrayBuffer;
  off: number;
  len: number;
}

/** A long string left out of the cloned value: where it goes, and its bytes in the body. */
export type Span = [path: (string | number)[], start: number, end: number];

export type WorkerReply =
  | { id: number; ok: true; value: unknown; buf: ArrayBuffer; spans: Span[] }
  | { id: number; ok: false; kind: "json" | "depth"; message: string; buf: ArrayBuffer };

const QUOTE = Buffer.from('"');

/** `String.prototype.isWellFormed` (ES2024; the project's TypeScript lib is ES2022). */
const wellFormed = (s: string): boolean => (s as string & { isWellFormed(): boolean }).isWellFormed();

function findSpans(holder: { v: unknown }, raw: Buffer, longChars: number, maxSpans: number): Span[] {
  const spans: Span[] = [];
  const walk = (
    parent: Record<string | number, unknown>,
    key: string | number,
    path: (string | number)[],
  ) => {
    if (spans.length >= maxSpans) return;
    const v = parent[key];
    if (typeof v === "string") {
      if (v.length < longChars || !wellFormed(v)) return;
      const enc = Buffer.from(v, "utf8");
      const head = Buffer.concat([QUOTE, enc.subarray(0, 64)]);
      for (let at = raw.indexOf(head); at >= 0; at = raw.indexOf(head, at + 1)) {
        const start = at + 1;
        const end = start + enc.length;
        if (raw[end] === 0x22 && raw.subarray(start, end).equals(enc)) {
          spans.push([path.slice(1), start, end]);
          parent[key] = "";
          return;
        }
      }
      return;
    }
    if (v === null || typeof v !== "object") return;
    const o = v as Record<string | number, unknown>;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        path.push(i);
        walk(o, i, path);
        path.pop();
      }
    } else {
      for (const k in o) {
        path.push(k);
        walk(o, k, path);
        path.pop();
      }
    }
  };
  walk(holder as Record<string, unknown>, "v", ["v"]);
  return spans;
}

function main(): void {
  const port = parentPort;
  if (!port) throw new Error("body-parser-worker.ts runs as a worker thread only");
  const { maxDepth, crashMarker, longChars, maxSpans } = workerData as WorkerConfig;
  const reply = (r: WorkerReply): void => port.postMessage(r, [r.buf]);
  port.on("message", (m: WorkerJob) => {
    const raw = Buffer.from(m.buf, m.off, m.len);
    const text = raw.toString("utf8");
    if (crashMarker && text.includes(crashMarker)) process.exit(70);
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (err) {
      reply({ id: m.id, ok: false, kind: "json", message: (err as Error).message, buf: m.buf });
      return;
    }
    if (value !== null && typeof value === "object" && tooDeep(value, maxDepth)) {
      reply({ id: m.id, ok: false, kind: "depth", message: "", buf: m.buf });
      return;
    }
    const holder = { v: value };
    const spans =
      longChars > 0 && text.length >= longChars ? findSpans(holder, raw, longChars, maxSpans) : [];
    reply({ id: m.id, ok: true, value: holder.v, buf: m.buf, spans });
  });
}

main();
