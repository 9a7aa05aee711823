/**
 * The load report's wire format (one scrape shared among replicas, ./load-share.ts): framed and
 * signed like an announcement (./wire.ts `sealFrame`), body `msgpack([2, sender, seq, sentAt,
 * periodMs, readings, busy, bye?])`:
 *
 * - `readings`: `[worker, running, waiting, kvUsage, pdBacklog (-1: none), ageMs]` per engine
 *   reading the sender scraped; `ageMs` is the reading's age at `sentAt` on the sender's clock, so
 *   the receiver dates it on its own clock (a clock skew between hosts does not make it fresh or
 *   stale).
 * - `busy`: workers the sender has requests in flight on (their owner scrapes them at the busy
 *   pace although it sends them nothing itself).
 * - `periodMs`: the sender's report period; a report is also its heartbeat, so it counts as live
 *   for a few periods after each.
 * - `bye` (a trailing `1`): the sender stops scraping (its server closes): its peers take its
 *   workers over at once instead of after its live window.
 *
 * Bounded: at most `MAX_READINGS` readings and `MAX_BUSY` busy workers a frame (a sender splits
 * longer lists over several frames), names ≤ 512 characters; a frame past ./wire.ts
 * `MAX_FRAME_BYTES` is not unpacked.
 */
import { pack } from "msgpackr";
import { isNum, isStr, sealFrame } from "./wire.ts";

const TAG = 2;
/** Readings per frame at most (~60 bytes each with a 32-char worker id: ~60 KiB). */
export const MAX_READINGS = 1024;
/** Busy workers per frame at most. */
export const MAX_BUSY = 1024;

/** One engine's load as its scraper read it (src/router/types.ts EngineLoad, dated by age). */
export interface LoadReading {
  worker: string;
  running: number;
  waiting: number;
  kvUsage: number;
  pdBacklog?: number;
  /** Age of the reading at the report's `sentAt` (ms). */
  ageMs: number;
}

export interface LoadReport {
  sender: string;
  seq: number;
  /** Sender's clock, ms since the epoch. */
  sentAt: number;
  /** How often the sender reports (its scrape tick): it counts as live for a few of these. */
  periodMs: number;
  readings: LoadReading[];
  busy: string[];
  /** The sender stops scraping: count it gone now. */
  bye?: boolean;
}

export type DecodedReport = { ok: true; r: LoadReport } | { ok: false; reason: "malformed" };

export function encodeLoadReport(r: LoadReport, secret: Buffer | null): Uint8Array {
  const readings = r.readings.map((x) => [
    x.worker,
    x.running,
    x.waiting,
    x.kvUsage,
    x.pdBacklog ?? -1,
    Math.max(0, Math.round(x.ageMs)),
  ]);
  const fields = [TAG, r.sender, r.seq, r.sentAt, r.periodMs, readings, r.busy];
  return sealFrame(pack(r.bye ? [...fields, 1] : fields), secret);
}

/** Whether an opened body (./wire.ts `openFrame`) is a load report. */
export const isLoadReport = (v: unknown[]): boolean => v[0] === TAG;

function parseReading(x: unknown): LoadReading | null {
  if (!Array.isArray(x) || x.length !== 6) return null;
  const [worker, running, waiting, kvUsage, backlog, ageMs] = x as unknown[];
  if (!isStr(worker) || !isNum(running) || !isNum(waiting) || !isNum(kvUsage) || !isNum(ageMs)) return null;
  if (typeof backlog !== "number" || !(backlog === -1 || isNum(backlog))) return null;
  const r: LoadReading = { worker, running, waiting, kvUsage, ageMs };
  if (backlog >= 0) r.pdBacklog = backlog;
  return r;
}

/** An opened body as a load report; anything off-shape or past the bounds is malformed. */
export function parseLoadReport(v: unknown[]): DecodedReport {
  const bad = { ok: false, reason: "malformed" } as const;
  if ((v.length !== 7 && v.length !== 8) || v[0] !== TAG) return bad;
  const [, sender, seq, sentAt, periodMs, rawReadings, rawBusy, bye] = v;
  if (bye !== undefined && bye !== 1) return bad;
  if (!isStr(sender) || !isNum(seq) || !isNum(sentAt) || !isNum(periodMs) || periodMs === 0) return bad;
  if (!Array.isArray(rawReadings) || rawReadings.length > MAX_READINGS) return bad;
  if (!Array.isArray(rawBusy) || rawBusy.length > MAX_BUSY || !rawBusy.every(isStr)) return bad;
  const readings: LoadReading[] = [];
  for (const x of rawReadings) {
    const r = parseReading(x);
    if (!r) return bad;
    readings.push(r);
  }
  const r: LoadReport = { sender, seq, sentAt, periodMs, readings, busy: rawBusy as string[] };
  if (bye === 1) r.bye = true;
  return { ok: true, r };
}
