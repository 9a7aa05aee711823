/**
 * prefill-backlog: the tokens still to prefill on the worker, in blocks:
 * `(weight × backlog) / blockSize`.
 *
 * The server's `pendingPrefillTokens` counts whole prompts of requests not yet past their first
 * token, but a backlog of prefix hits is quick to clear and must not push the next hit
 * elsewhere. So a FIFO ledger keeps, per worker, the (prompt, uncached) sizes of what was sent
 * there in order, drops the oldest while their prompts add up to more than
 * `pendingPrefillTokens` (first tokens come roughly in order), and counts the uncached tokens of
 * the rest (plus any pending it cannot account for, in full). The ledger is per model, shared
 * by every step, and trimmed for every candidate a step sees (filtered or not), as before.
 */
import { z } from "zod";
import type { WorkerState } from "../../types.ts";
import { defineScorer } from "../plugin.ts";
import { type CandidateView, candidateView } from "../util.ts";

interface Ledger {
  prompt: number[];
  uncached: number[];
  sumPrompt: number;
  sumUncached: number;
}

/** Every worker's ledger (one per model, shared by its steps); `gen` moves when one comes or goes. */
class Ledgers {
  readonly map = new Map<string, Ledger>();
  gen = 0;
}

/** `worker`'s position in `all` (-1: not there), by its id's cached position rather than a scan. */
function positionIn(all: readonly WorkerState[], worker: WorkerState): number {
  const i = candidateView(all).pos.get(worker.record.id);
  return i !== undefined && all[i] === worker ? i : all.indexOf(worker);
}

export default defineScorer("prefill-backlog", {
  doc: "prefill backlog (tokens not yet past their first token, uncached part) in blocks",
  params: z.object({}).strict(),
  needs: ["promptTokens"],
  create: (scope) => {
    const shared = scope.shared("prefill-ledger", () => new Ledgers());
    const ledgers = shared.map;
    function trim(l: Ledger | undefined, pending: number): number {
      if (!l) return pending;
      while (l.prompt.length > 0 && l.sumPrompt > pending) {
        l.sumPrompt -= l.prompt.shift()!;
        l.sumUncached -= l.uncached.shift()!;
      }
      return l.sumUncached + Math.max(0, pending - l.sumPrompt);
    }
    // The candidates' ledgers by position, kept while the candidate list and the set of ledgers
    // are the same: a decision over 256 workers then reads no map.
    let rowView: CandidateView | null = null;
    let rowGen = -1;
    let row: (Ledger | undefined)[] = [];
    const rowOf = (all: readonly WorkerState[]) => {
      const view = candidateView(all);
      if (view !== rowView || rowGen !== shared.gen) {
        row = view.ids.map((id) => ledgers.get(id));
        rowView = view;
        rowGen = shared.gen;
      }
      return row;
    };
    return {
      name: "prefill-backlog",
      needs: ["promptTokens"],
      score(ctx, at, weight, out) {
        // Trim every candidate's ledger, scored or filtered out (the ledger follows pending).
        const all = ctx.all;
        const ls = rowOf(all);
        if (at.length === all.length) {
          // Nothing filtered (the usual case): `at` is 0..n−1, one pass.
          for (let i = 0; i < all.length; i++)
            out[i] = (weight * trim(ls[i], all[i].pendingPrefillTokens)) / ctx.blockSize(i);
          return;
        }
        const backlog = ctx.rows.f64(all.length);
        for (let i = 0; i < all.length; i++) backlog[i] = trim(ls[i], all[i].pendingPrefillTokens);
        for (let k = 0; k < at.length; k++) out[k] = (weight * backlog[at[k]]) / ctx.blockSize(at[k]);
      },
      onRouted(req, worker, ctx) {
        const id = worker.record.id;
        const prompt = req.promptTokens().length;
        let uncached = prompt;
        const pos = ctx ? positionIn(ctx.all, worker) : -1;
        if (ctx && pos >= 0) uncached = Math.max(0, prompt - ctx.overlaps()[pos] * ctx.blockSize(pos));
        let l = ledgers.get(id);
        if (!l) {
          l = { prompt: [], uncached: [], sumPrompt: 0, sumUncached: 0 };
          ledgers.set(id, l);
          shared.gen++;
        }
        l.prompt.push(prompt);
        l.uncached.push(uncached);
        l.sumPrompt += prompt;
        l.sumUncached += uncached;
      },
      onWorkerRemoved(id) {
        if (ledgers.delete(id)) shared.gen++;
      },
    };
  },
});
