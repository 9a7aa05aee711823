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
 * Which prefix a request is judged by: the longest head of its prompt that earlier decisions in
 * the window also routed (sampled every `strideChars` characters of its first `maxChars`). A
 * hot tenant's requests share its system prompt and differ after it, so that head is the
 * tenant's prompt, and its share is the tenant's. A conversation's next turn shares its own
 * history, carried by a handful of decisions, so it is never hot however popular the platform
 * preamble or the tenant prompt in front of it: moving it would cost its history, not just a
 * copy of a popular prefix. (A fixed key, the first 1,024 characters, made every request hot
 * when all traffic starts with the same preamble, and the filter then pushed conversations off
 * the worker holding their history: bench/fleet-routing goals, chat at 1.5×, README "The
 * kv-aware preset".) A prompt that shares nothing deeper than a prefix common to all traffic is
 * judged by that prefix: it is new, anywhere holding the shared part serves it as well.
 */
import { z } from "zod";
import { APPROX_TEXT_CAP, ApproxPrefixTree } from "../../../kv/approx-tree.ts";
import type { RoutingRequest } from "../../types.ts";
import { defineFilter } from "../plugin.ts";

const CHUNK = 64;

const params = z
  .object({
    strideChars: z.number().int().min(CHUNK).default(512),
    maxChars: z.number().int().positive().default(APPROX_TEXT_CAP),
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

/**
 * Decayed shares of decisions per prompt head: one decision counts once for each sampled head
 * of its prompt, so a head's share is the (decayed) fraction of decisions whose prompt began
 * with it. Heads no decision of the last ~`window`·ln(1/PRUNE) decisions had are dropped every
 * `window` decisions, which bounds the map by a few windows × the heads per prompt.
 */
class HeadShares {
  private readonly raw = new Map<number, number>();
  private total = 0;
  private step = 1;
  private sinceRescale = 0;
  private readonly growth: number;
  private readonly window: number;
  private static readonly PRUNE = 0.01;

  constructor(window: number) {
    this.window = window;
    this.growth = 1 / (1 - 1 / window);
  }

  get weight(): number {
    return this.total / this.step;
  }

  add(heads: readonly number[]): void {
    this.step *= this.growth;
    for (const h of heads) this.raw.set(h, (this.raw.get(h) ?? 0) + this.step);
    this.total += this.step;
    if (++this.sinceRescale >= this.window) this.rescale();
  }

  /** Decayed decisions that had this head (1 = one decision just now). */
  count(h: number): number {
    return (this.raw.get(h) ?? 0) / this.step;
  }

  share(h: number): number {
    return this.total > 0 ? (this.raw.get(h) ?? 0) / this.total : 0;
  }

  private rescale(): void {
    const f = 1 / this.step;
    this.total *= f;
    for (const [k, v] of this.raw) {
      const nv = v * f;
      if (nv < HeadShares.PRUNE) this.raw.delete(k);
      else this.raw.set(k, nv);
    }
    this.step = 1;
    this.sinceRescale = 0;
  }
}

/** A head counts as routed before once some decision of about the last two windows had it. */
const SEEN = Math.exp(-2);

export default defineFilter("hot-spread", {
  doc: "a prefix with more than its share of recent traffic avoids workers above ratio × the mean share",
  params,
  needs: ["approxTree"],
  create: (_scope, p) => {
    const hasher = new ApproxPrefixTree({ chunkChars: CHUNK, maxChars: p.maxChars });
    const every = Math.floor(p.strideChars / CHUNK);
    // The sampled heads of a prompt, shallowest first; the last step's request is kept so
    // that filter and onRouted of one decision hash its prompt once.
    let last: { req: RoutingRequest; heads: number[] } | null = null;
    const headsOf = (req: RoutingRequest): number[] => {
      if (last?.req === req) return last.heads;
      const path = hasher.path(req.promptText());
      const heads: number[] = [];
      for (let i = every - 1; i < path.length; i += every) heads.push(path[i]);
      // A prompt shorter than one stride is its own head.
      if (heads.length === 0 && path.length > 0) heads.push(path[path.length - 1]);
      last = { req, heads };
      return heads;
    };
    const keys = new HeadShares(p.window);
    const workers = new DecayedShares<string>(p.window);
    return {
      name: "hot-spread",
      needs: ["approxTree"],
      filter(ctx, at) {
        // Too little history for shares to mean anything.
        if (at.length < 2 || keys.weight < p.window / 4) return at;
        // The share of the longest head routed before (shares only shrink with depth).
        const heads = headsOf(ctx.req);
        let share = 0;
        for (let d = heads.length - 1; d >= 0; d--)
          if (keys.count(heads[d]) >= SEEN) {
            share = keys.share(heads[d]);
            break;
          }
        if (share <= p.hotShare / at.length) return at;
        let sum = 0;
        for (const i of at) sum += workers.share(ctx.all[i].record.id);
        const ceiling = (sum / at.length) * p.ratio;
        const kept = at.filter((i) => workers.share(ctx.all[i].record.id) <= ceiling);
        return kept.length > 0 ? kept : at;
      },
      onRouted(req, worker) {
        keys.add(headsOf(req));
        workers.add(worker.record.id);
      },
      onWorkerRemoved(id) {
        workers.delete(id);
      },
    };
  },
});
