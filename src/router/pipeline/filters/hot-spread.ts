/**
 * hot-spread: spreads a hot prefix over more workers before any queue forms.
 *
 * Prefix affinity keeps a tenant on the worker that caches its prefix. When one tenant carries
 * a large share of the traffic, that worker takes it all: its requests are quick hits, so
 * nothing queues and no load signal fires (imbalance-guard, load-ceiling and engine-queue all
 * read requests in flight or waiting), yet it serves several times the mean (bench/fleet-routing,
 * hot-spot case). This filter reads routed *shares* instead, over the last ~`window` decisions
 * of this step (exponentially decayed): a request whose prefix key carries more than `hotShare`
 * / N of them (N candidates) is hot, and a hot request may not go to a worker whose share is
 * above `ratio` × the candidates' mean. The scorers then choose among the rest, so the hot
 * prefix spills to the next-best worker, which caches it too, until its holders share the load.
 * Requests of ordinary prefixes are never filtered, so a uniform load keeps its locality.
 *
 * The key is the prompt's first `keyChars` characters (the approximate tree's chunk hashes):
 * tenants that differ only past that point count as one prefix.
 */
import { z } from "zod";
import { ApproxPrefixTree } from "../../../kv/approx-tree.ts";
import { defineFilter } from "../plugin.ts";

const params = z
  .object({
    keyChars: z.number().int().positive().default(1024),
    window: z.number().int().min(8).default(256),
    hotShare: z.number().positive().default(1),
    ratio: z.number().min(1).default(1.25),
  })
  .strict();

/** Decayed counts: every `add` weighs 1/(1 − 1/window) more than the one before. */
class DecayedShares<K> {
  private readonly raw = new Map<K, number>();
  private total = 0;
  private step = 1;
  private readonly growth: number;

  constructor(window: number) {
    this.growth = 1 / (1 - 1 / window);
  }

  /** Decayed decisions seen (≈ window once warm). */
  get weight(): number {
    return this.total / this.step;
  }

  add(k: K): void {
    this.step *= this.growth;
    this.raw.set(k, (this.raw.get(k) ?? 0) + this.step);
    this.total += this.step;
    if (this.step > 1e100) this.rescale();
  }

  share(k: K): number {
    return this.total > 0 ? (this.raw.get(k) ?? 0) / this.total : 0;
  }

  delete(k: K): void {
    const v = this.raw.get(k);
    if (v === undefined) return;
    this.raw.delete(k);
    this.total -= v;
  }

  /** Keeps the numbers finite and drops keys too small to matter. */
  private rescale(): void {
    const f = 1 / this.step;
    this.total = 0;
    for (const [k, v] of this.raw) {
      const nv = v * f;
      if (nv < 1e-6) this.raw.delete(k);
      else {
        this.raw.set(k, nv);
        this.total += nv;
      }
    }
    this.step = 1;
  }
}

export default defineFilter("hot-spread", {
  doc: "a prefix with more than its share of recent traffic avoids workers above ratio × the mean share",
  params,
  needs: ["approxTree"],
  create: (_scope, p) => {
    const hasher = new ApproxPrefixTree({ chunkChars: 64, maxChars: p.keyChars });
    const keyOf = (text: string): number => {
      const path = hasher.path(text);
      return path.length > 0 ? path[path.length - 1] : 0;
    };
    const keys = new DecayedShares<number>(p.window);
    const workers = new DecayedShares<string>(p.window);
    return {
      name: "hot-spread",
      needs: ["approxTree"],
      filter(ctx, at) {
        // Too little history for shares to mean anything.
        if (at.length < 2 || keys.weight < p.window / 4) return at;
        if (keys.share(keyOf(ctx.req.promptText())) <= p.hotShare / at.length) return at;
        let sum = 0;
        for (const i of at) sum += workers.share(ctx.all[i].record.id);
        const ceiling = (sum / at.length) * p.ratio;
        const kept = at.filter((i) => workers.share(ctx.all[i].record.id) <= ceiling);
        return kept.length > 0 ? kept : at;
      },
      onRouted(req, worker) {
        keys.add(keyOf(req.promptText()));
        workers.add(worker.record.id);
      },
      onWorkerRemoved(id) {
        workers.delete(id);
      },
    };
  },
});
