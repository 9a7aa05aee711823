/**
 * The last decisions of a server, explained (GET /debug/decisions, debug logs). A fixed ring of
 * slots overwritten in place: recording a decision keeps references to the candidate list and
 * the kept positions, and copies the per-scorer values, the totals and the prompt's cached and
 * full blocks per candidate into typed arrays the slot owns (grown only when a step has more
 * candidates than any before it in that slot), so the dashboard can show absolute overlap. The
 * step's own rows are then free to be reused (the scheduler does) or die young: a ring holding
 * 256 decisions' rows over 256 workers (≈ 3 MB) kept them alive past the young generation, and
 * the old generation's collections grew with the fleet. The JSON form is built only when
 * someone asks.
 */
import type { IndexSync } from "../../kv/prefix-index.ts";
import type { WorkerState } from "../types.ts";
import type { DecisionExplanation, Step, StepContext } from "./types.ts";

/** One ring slot: a class, so every slot has the same shape and is overwritten in place. */
class Slot {
  requestId = "";
  model = "";
  step: Step = "mixed";
  at = 0;
  all: readonly WorkerState[] = [];
  kept: readonly number[] = [];
  scorerNames: readonly string[] = [];
  /** values[s * kept.length + k]: scorer s's weighted value for candidate kept[k] (a view of valuesBuf). */
  values: Float64Array | null = null;
  /** A view of totalsBuf. */
  totals: Float64Array = new Float64Array(0);
  valuesBuf = new Float64Array(0);
  totalsBuf = new Float64Array(0);
  winner = 0;
  reason = "";
  /** cached[pos], promptBlocks[pos] for pos < all.length, when `hasOverlap`. */
  cachedBuf = new Int32Array(16);
  promptBuf = new Int32Array(16);
  bridgeBuf = new Int32Array(16);
  hasOverlap = false;
  /** syncBuf[pos]: the candidate's index sync (SYNC_CODES), when `hasSync`. */
  syncBuf = new Uint8Array(16);
  hasSync = false;
  hasBridge = false;
  /** predBuf[pos]: the TTFT predicted for the candidate (ms, NaN: none), when `hasPred`. */
  predBuf = new Float64Array(0);
  hasPred = false;
  observedMs = Number.NaN;
  get cached(): Int32Array | null {
    return this.hasOverlap ? this.cachedBuf : null;
  }
  get promptBlocks(): Int32Array | null {
    return this.hasOverlap ? this.promptBuf : null;
  }
  get bridged(): Int32Array | null {
    return this.hasBridge ? this.bridgeBuf : null;
  }
}

export interface DecisionRecord {
  requestId: string;
  model: string;
  step: Step;
  all: readonly WorkerState[];
  kept: readonly number[];
  scorerNames: readonly string[];
  values: Float64Array | null;
  totals: Float64Array;
  /** Position in `all` of the winner. */
  winner: number;
  reason: string;
  /**
   * Cached prefix blocks of the prompt per position of `all` (the step's overlap source), and the
   * prompt's full blocks at that candidate's block size; null when the profile has no overlap
   * source (round-robin, least-load). May be longer than `all`.
   */
  cached: Int32Array | null;
  promptBlocks: Int32Array | null;
  /** Of `cached`, the blocks the pending bridge credited, per position; null without a bridge. */
  bridged: Int32Array | null;
}

/** IndexSync as a byte per candidate (0: the index does not track the worker). */
const SYNC_CODES: readonly (IndexSync | null)[] = [null, "syncing", "synced", "unknown"];

function syncCode(state: IndexSync | null): number {
  return state === "synced" ? 2 : state === "syncing" ? 1 : state === "unknown" ? 3 : 0;
}

/** A slot buffer's new length: at least `need`, at least twice the old (few regrowths). */
const grow = (need: number, old: number) => Math.max(need, old * 2, 16);

export class DecisionLog {
  readonly capacity;
  /**
   * The KV index's sync state of a worker (the server sets it when it ingests KV events): each
   * decision with an overlap source keeps its candidates' states as they were.
   */
  syncOf?: (workerId: string) => IndexSync | null;
  private readonly slots: Slot[];
  private next = 0;
  private count = 0;

  constructor(capacity = 256) {
    this.capacity = capacity;
    this.slots = Array.from({ length: capacity }, () => new Slot());
  }

  /** Overwrites the oldest slot (positional, so recording allocates nothing). */
  record(
    requestId: string,
    model: string,
    step: Step,
    all: readonly WorkerState[],
    kept: readonly number[],
    scorerNames: readonly string[],
    values: Float64Array | null,
    totals: Float64Array,
    winner: number,
    reason: string,
    /** The step's context when its profile has an overlap source (its overlaps are read, not recomputed). */
    overlap: StepContext | null = null,
    /**
     * The candidates' sync codes as the step's index read them (PrefixIndex.candidateRows, the
     * same index as `syncOf`'s: one per server), instead of asking `syncOf` per candidate.
     */
    sync: Uint8Array | null = null,
  ): void {
    const s = this.slots[this.next];
    this.next = (this.next + 1) % this.capacity;
    if (this.count < this.capacity) this.count++;
    s.requestId = requestId;
    s.model = model;
    s.step = step;
    s.at = Date.now();
    s.all = all;
    s.kept = kept;
    s.scorerNames = scorerNames;
    if (values) {
      if (s.valuesBuf.length < values.length)
        s.valuesBuf = new Float64Array(grow(values.length, s.valuesBuf.length));
      s.valuesBuf.set(values);
      s.values = s.valuesBuf.subarray(0, values.length);
    } else s.values = null;
    if (s.totalsBuf.length < totals.length)
      s.totalsBuf = new Float64Array(grow(totals.length, s.totalsBuf.length));
    s.totalsBuf.set(totals);
    s.totals = s.totalsBuf.subarray(0, totals.length);
    s.winner = winner;
    s.reason = reason;
    s.hasPred = false;
    s.observedMs = Number.NaN;
    s.hasOverlap = overlap !== null;
    if (overlap) {
      const n = all.length;
      if (s.cachedBuf.length < n) {
        s.cachedBuf = new Int32Array(Math.max(n, s.cachedBuf.length * 2));
        s.promptBuf = new Int32Array(s.cachedBuf.length);
        s.bridgeBuf = new Int32Array(s.cachedBuf.length);
      }
      // Computed once per step by the overlap source and cached in the context: no index walk.
      // Whole rows are copied (a copy per row, not a call per cell).
      const b = overlap.bridged();
      s.hasBridge = b !== null;
      s.cachedBuf.set(overlap.overlaps().subarray(0, n));
      s.promptBuf.set(overlap.promptBlocksRow().subarray(0, n));
      if (b) s.bridgeBuf.set(b.subarray(0, n));
    } else s.hasBridge = false;
    const syncOf = this.syncOf;
    s.hasSync = overlap !== null && syncOf !== undefined;
    if (s.hasSync && syncOf) {
      if (s.syncBuf.length < all.length)
        s.syncBuf = new Uint8Array(Math.max(all.length, s.syncBuf.length * 2));
      if (sync) s.syncBuf.set(sync.subarray(0, all.length));
      else for (let i = 0; i < all.length; i++) s.syncBuf[i] = syncCode(syncOf(all[i].record.id));
    }
  }

  /** The newest slot of `requestId`'s `step` (a routed request's decision is nearly always the newest). */
  private find(requestId: string, step: string): Slot | null {
    for (let k = 0; k < this.count; k++) {
      const s = this.slots[(this.next - 1 - k + this.capacity) % this.capacity]!;
      if (s.requestId === requestId && s.step === step) return s;
    }
    return null;
  }

  /** The TTFT predicted per candidate position of a recorded decision (copied). */
  notePredicted(requestId: string, step: string, perCandidate: Float64Array): void {
    const s = this.find(requestId, step);
    if (!s) return;
    if (s.predBuf.length < perCandidate.length)
      s.predBuf = new Float64Array(Math.max(16, perCandidate.length));
    s.predBuf.set(perCandidate);
    s.hasPred = true;
  }

  /** The TTFT observed on a recorded decision's winner. */
  noteObserved(requestId: string, step: string, ms: number): void {
    const s = this.find(requestId, step);
    if (s) s.observedMs = ms;
  }

  /** Oldest first; `model` filters, `limit` keeps the newest. */
  list(opts: { model?: string; limit?: number } = {}): DecisionExplanation[] {
    const out: DecisionExplanation[] = [];
    for (let k = 0; k < this.count; k++) {
      const s = this.slots[(this.next - this.count + k + this.capacity) % this.capacity]!;
      if (opts.model !== undefined && s.model !== opts.model) continue;
      out.push(explain(s));
    }
    return opts.limit !== undefined && opts.limit < out.length ? out.slice(out.length - opts.limit) : out;
  }
}

/** The JSON form of one decision. */
export function explain(
  s: DecisionRecord & {
    at?: number;
    hasSync?: boolean;
    syncBuf?: Uint8Array;
    hasPred?: boolean;
    predBuf?: Float64Array;
    observedMs?: number;
  },
): DecisionExplanation {
  const pred = s.hasPred && s.predBuf ? s.predBuf : null;
  const ms = (v: number): number | null => (Number.isNaN(v) ? null : Math.round(v * 10) / 10);
  const n = s.kept.length;
  const row = new Map<number, number>();
  for (let k = 0; k < n; k++) row.set(s.kept[k], k);
  return {
    requestId: s.requestId,
    model: s.model,
    step: s.step,
    at: s.at ?? Date.now(),
    candidates: s.all.map((w, pos) => {
      const k = row.get(pos);
      const cachedBlocks = s.cached ? s.cached[pos] : null;
      const promptBlocks = s.promptBlocks ? s.promptBlocks[pos] : null;
      const sync = s.hasSync && s.syncBuf ? { indexSync: SYNC_CODES[s.syncBuf[pos]] ?? null } : {};
      const bridgeBlocks = s.bridged ? s.bridged[pos] : null;
      if (pred) Object.assign(sync, { predictedTtftMs: ms(pred[pos]) });
      if (k === undefined)
        return {
          worker: w.record.id,
          filtered: true,
          scores: {},
          total: Number.NaN,
          cachedBlocks,
          promptBlocks,
          bridgeBlocks,
          ...sync,
        };
      const scores: Record<string, number> = {};
      s.scorerNames.forEach((name, si) => {
        scores[name] = s.values ? s.values[si * n + k] : 0;
      });
      return {
        worker: w.record.id,
        scores,
        total: s.totals[k],
        cachedBlocks,
        promptBlocks,
        bridgeBlocks,
        ...sync,
      };
    }),
    winner: s.all[s.winner].record.id,
    reason: s.reason,
    ...(pred ? { observedTtftMs: ms(s.observedMs ?? Number.NaN) } : {}),
  };
}
