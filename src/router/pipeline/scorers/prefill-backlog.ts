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
import { defineScorer } from "../plugin.ts";

interface Ledger {
  prompt: number[];
  uncached: number[];
  sumPrompt: number;
  sumUncached: number;
}

export default defineScorer("prefill-backlog", {
  doc: "prefill backlog (tokens not yet past their first token, uncached part) in blocks",
  params: z.object({}).strict(),
  needs: ["promptTokens"],
  create: (scope) => {
    const ledgers = scope.shared("prefill-ledger", () => new Map<string, Ledger>());
    function backlogOf(id: string, pending: number): number {
      const l = ledgers.get(id);
      if (!l) return pending;
      while (l.prompt.length > 0 && l.sumPrompt > pending) {
        l.sumPrompt -= l.prompt.shift()!;
        l.sumUncached -= l.uncached.shift()!;
      }
      return l.sumUncached + Math.max(0, pending - l.sumPrompt);
    }
    return {
      name: "prefill-backlog",
      needs: ["promptTokens"],
      score(ctx, at, weight, out) {
        // Trim every candidate's ledger, scored or filtered out (the ledger follows pending).
        const all = ctx.all;
        const backlog = new Float64Array(all.length);
        for (let i = 0; i < all.length; i++)
          backlog[i] = backlogOf(all[i].record.id, all[i].pendingPrefillTokens);
        for (let k = 0; k < at.length; k++) out[k] = (weight * backlog[at[k]]) / ctx.blockSize(at[k]);
      },
      onRouted(req, worker, ctx) {
        const id = worker.record.id;
        const prompt = req.promptTokens().length;
        let uncached = prompt;
        const pos = ctx ? ctx.all.indexOf(worker) : -1;
        if (ctx && pos >= 0) uncached = Math.max(0, prompt - ctx.overlaps()[pos] * ctx.blockSize(pos));
        let l = ledgers.get(id);
        if (!l) {
          l = { prompt: [], uncached: [], sumPrompt: 0, sumUncached: 0 };
          ledgers.set(id, l);
        }
        l.prompt.push(prompt);
        l.uncached.push(uncached);
        l.sumPrompt += prompt;
        l.sumUncached += uncached;
      },
      onWorkerRemoved(id) {
        ledgers.delete(id);
      },
    };
  },
});
