/**
 * The last decisions of a server, explained (GET /debug/decisions, debug logs). A fixed ring of
 * slots overwritten in place: recording a decision keeps references to arrays the step built
 * anyway (candidates, positions, per-scorer values, totals) and allocates nothing else; the
 * JSON form is built only when someone asks.
 */
import type { WorkerState } from "../types.ts";
import type { DecisionExplanation, Step } from "./types.ts";

/** One ring slot: a class, so every slot has the same shape and is overwritten in place. */
class Slot {
  requestId = "";
  model = "";
  step: Step = "mixed";
  at = 0;
  all: readonly WorkerState[] = [];
  kept: readonly number[] = [];
  scorerNames: readonly string[] = [];
  /** values[s * kept.length + k]: scorer s's weighted value for candidate kept[k]. */
  values: Float64Array | null = null;
  totals: Float64Array = new Float64Array(0);
  winner = 0;
  reason = "";
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
}

export class DecisionLog {
  readonly capacity;
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
    s.values = values;
    s.totals = totals;
    s.winner = winner;
    s.reason = reason;
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
export function explain(s: DecisionRecord & { at?: number }): DecisionExplanation {
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
      if (k === undefined) return { worker: w.record.id, filtered: true, scores: {}, total: Number.NaN };
      const scores: Record<string, number> = {};
      s.scorerNames.forEach((name, si) => {
        scores[name] = s.values ? s.values[si * n + k] : 0;
      });
      return { worker: w.record.id, scores, total: s.totals[k] };
    }),
    winner: s.all[s.winner].record.id,
    reason: s.reason,
  };
}
