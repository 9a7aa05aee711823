/**
 * The fleet-routing benchmark's seeded trace, in the shape of llm-d's prefix-cache benchmark:
 * T tenants, each with one long shared prefix (its system prompt: instructions, documents, tool
 * schemas), and short questions, one tenant per request, with Poisson arrivals at a given rate.
 * Optionally one dominant tenant takes a given share of the traffic (the hot-spot case).
 *
 * Prompts are known up front, so the trace's reachable reuse (what a cache that never evicts
 * could hit) is computed from the tokens, not from the run.
 */

import { chainBlocks, hashPrompt, type RouterBlockHash, routerHashAt } from "../../src/kv/hash.ts";
import { Prng, words } from "../../src/loadgen/prng.ts";
import type { BenchRequest } from "../../src/loadgen/types.ts";
import type { Tokenizer } from "../../src/tokenizer/tokenizer.ts";

export interface TenantSet {
  seed: number;
  tenants: number;
  /** Words per tenant prefix; the default tokenizer makes one token of each generated word. */
  prefixWords: number;
}

export interface StepTraceOptions {
  /** Seed of this step's arrivals, tenant choices and questions (the prefixes come from the TenantSet). */
  seed: number;
  /** Poisson arrival rate, requests per second (of wall time). */
  rate: number;
  /** Arrivals over this many seconds (wall). */
  durationS: number;
  questionWords: number;
  maxTokens: number;
  /** One tenant (tenant 0) gets this share of the requests; the others share the rest evenly. */
  dominantShare?: number;
}

/** The tenants' prefixes, fixed by the TenantSet's seed. */
export function tenantPrefixes(t: TenantSet): string[] {
  const rng = new Prng(t.seed).fork("prefixes");
  return Array.from(
    { length: t.tenants },
    (_, i) => `Tenant ${i}. You answer from the context below.\n${words(rng, t.prefixWords)}`,
  );
}

/**
 * One rate step: Poisson arrivals over `durationS`, each request one tenant's prefix as the system
 * message and a fresh question. `group` is `tenant-<i>`.
 */
export function buildStep(prefixes: readonly string[], o: StepTraceOptions): BenchRequest[] {
  const rng = new Prng(o.seed).fork(`step-${o.rate}`);
  const arrivals = rng.fork("arrivals");
  const pick = rng.fork("tenants");
  const text = rng.fork("questions");
  const reqs: BenchRequest[] = [];
  const share = o.dominantShare;
  let t = 0;
  for (;;) {
    t += arrivals.exponential(o.rate) * 1000;
    if (t >= o.durationS * 1000) break;
    let tenant: number;
    if (share !== undefined && prefixes.length > 1) {
      tenant = pick.next() < share ? 0 : pick.int(1, prefixes.length - 1);
    } else tenant = pick.int(0, prefixes.length - 1);
    const index = reqs.length;
    reqs.push({
      index,
      messages: [
        { role: "system", content: prefixes[tenant] },
        { role: "user", content: `Question ${index} at ${o.rate}/s: ${words(text, o.questionWords)}` },
      ],
      maxTokens: o.maxTokens,
      arrivalMs: t,
      group: `tenant-${tenant}`,
    });
  }
  return reqs;
}

/**
 * The warm-up before the measured stages: one request per tenant, tenants in a seeded random
 * order, Poisson arrivals at `rate`, so every policy starts from caches that have seen each
 * prefix once (the first measured stage is not all cold misses). It lasts until its last arrival.
 */
export function buildWarmup(
  prefixes: readonly string[],
  o: { seed: number; rate: number; questionWords: number; maxTokens: number },
): BenchRequest[] {
  const rng = new Prng(o.seed).fork("warmup");
  const order = prefixes.map((_, i) => i);
  for (let i = order.length - 1; i > 0; i--) {
    const j = rng.int(0, i);
    [order[i], order[j]] = [order[j], order[i]];
  }
  let t = 0;
  return order.map((tenant, index) => {
    t += rng.exponential(o.rate) * 1000;
    return {
      index,
      messages: [
        { role: "system", content: prefixes[tenant] },
        { role: "user", content: `Warm-up ${index}: ${words(rng, o.questionWords)}` },
      ],
      maxTokens: o.maxTokens,
      arrivalMs: t,
      group: `tenant-${tenant}`,
    };
  });
}

/** Tokens of the trace's prompts, and what a never-evicting cache could have hit. */
export interface Reuse {
  prompt: number;
  reachable: number;
  /** Per request of the step (by index): its prompt tokens and reachable tokens. */
  perRequest: Array<{ prompt: number; reachable: number }>;
}

/**
 * Reachable reuse over a sequence of steps that share caches (a fleet whose caches are not
 * reset between them): for each request, in arrival order, the leading full blocks it shares
 * with any earlier request's prompt, earlier steps included. The engine always computes at least
 * the prompt's last token, so a prompt's final block never counts when it ends exactly on it.
 */
export class ReuseTracker {
  private readonly seen = new Set<RouterBlockHash>();
  private readonly tok: Tokenizer;
  private readonly blockSize: number;
  constructor(tok: Tokenizer, blockSize: number) {
    this.tok = tok;
    this.blockSize = blockSize;
  }

  /** Adds one step's requests (in arrival order) and returns that step's reuse. */
  add(reqs: readonly BenchRequest[]): Reuse {
    let prompt = 0;
    let reachable = 0;
    const perRequest: Reuse["perRequest"] = [];
    const bs = this.blockSize;
    for (const r of reqs) {
      const ids = this.tok.encode(this.tok.applyChatTemplate(r.messages ?? []));
      prompt += ids.length;
      const chain = hashPrompt(ids, bs);
      const n = chainBlocks(chain);
      let k = 0;
      while (k < n && this.seen.has(routerHashAt(chain, k))) k++;
      const got = Math.min(k * bs, Math.floor((ids.length - 1) / bs) * bs);
      reachable += got;
      perRequest.push({ prompt: ids.length, reachable: got });
      for (let b = 0; b < n; b++) this.seen.add(routerHashAt(chain, b));
    }
    return { prompt, reachable, perRequest };
  }
}
