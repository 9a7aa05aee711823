/**
 * What a replayed trace allows, computed from its prompts before the run (issue #28 item 5):
 * - ideal reuse: per request, the leading engine blocks whose hash appeared in an earlier
 *   request (an infinite cache shared by the whole fleet), tokens-weighted;
 * - fleet-wide LRU: the same with one LRU cache of the fleet's total KV blocks (all workers'
 *   pools together), touched in arrival order: what perfect routing with pooled memory reaches;
 * - offered prefill work, for `--load`: the profile's prefill cost of each request's uncached
 *   tokens at the ideal reuse, in worker-seconds, against the trace's span.
 * Blocks are the engines' (16 tokens), over the token ids the engines see (the chat template
 * applied), so the figures compare with the engines' cached/prompt tokens.
 */

import { hashPrompt } from "../../src/kv/hash.ts";
import type { BenchRequest } from "../../src/loadgen/types.ts";
import type { Tokenizer } from "../../src/tokenizer/tokenizer.ts";
import type { Reuse } from "./trace.ts";

/** The timing model's terms that prefill costs (bench/fleet-routing/qwen3-32b-tp2-h100.json). */
export interface PrefillModel {
  prefill_per_token_s: number;
  attention_per_token_ctx_s: number;
}

export interface TraceStats {
  requests: number;
  promptTokens: number;
  /** Per request: prompt tokens, and reachable tokens with an infinite shared cache. */
  ideal: Reuse;
  /** The same with a fleet-wide LRU of `fleetBlocks` blocks. */
  lru: Reuse;
  fleetBlocks: number;
  /** Distinct blocks of the whole trace (its footprint). */
  distinctBlocks: number;
  /** Model seconds from the first arrival to the last, at time scale 1. */
  spanS: number;
  /** Prefill work of the uncached tokens at the ideal reuse, in worker-seconds. */
  prefillWorkS: number;
}

/** Engine tokens of a request as the engine sees it (chat template applied). */
export function requestTokens(tok: Tokenizer, r: BenchRequest): number[] {
  const messages = r.messages ?? [{ role: "user" as const, content: r.prompt ?? "" }];
  return tok.encode(tok.applyChatTemplate(messages));
}

/**
 * Hits a prompt of `len` tokens can have when its first `k` full blocks are cached: the engine
 * always computes the last token, so a prompt that ends on a block boundary loses that block.
 */
function hitTokens(k: number, len: number, bs: number): number {
  return Math.min(k * bs, Math.floor((len - 1) / bs) * bs);
}

/** Seconds one worker spends prefilling `len - cached` new tokens after `cached` cached ones. */
export function prefillSeconds(m: PrefillModel, len: number, cached: number): number {
  const fresh = len - cached;
  // Each new token attends to its whole context: Σ ctx over the new tokens ≈ fresh × (cached + len) / 2.
  return fresh * m.prefill_per_token_s + m.attention_per_token_ctx_s * fresh * ((cached + len) / 2);
}

export function traceStats(
  reqs: readonly BenchRequest[],
  o: { tok: Tokenizer; blockSize: number; fleetBlocks: number; model: PrefillModel },
): TraceStats {
  const bs = o.blockSize;
  const seen = new Set<string>();
  const lru = new Map<string, true>();
  const ideal: Reuse = { prompt: 0, reachable: 0, perRequest: [] };
  const pooled: Reuse = { prompt: 0, reachable: 0, perRequest: [] };
  let work = 0;
  let first = Number.POSITIVE_INFINITY;
  let last = 0;
  for (const r of reqs) {
    const ids = requestTokens(o.tok, r);
    const chain = hashPrompt(ids, bs);
    const n = chain.length >>> 1;
    const keys: string[] = new Array(n);
    for (let b = 0; b < n; b++) keys[b] = `${chain[2 * b]}:${chain[2 * b + 1]}`;
    let k = 0;
    while (k < n && seen.has(keys[k])) k++;
    let kl = 0;
    while (kl < n && lru.has(keys[kl])) kl++;
    const got = hitTokens(k, ids.length, bs);
    const gotLru = hitTokens(kl, ids.length, bs);
    ideal.prompt += ids.length;
    ideal.reachable += got;
    ideal.perRequest.push({ prompt: ids.length, reachable: got });
    pooled.prompt += ids.length;
    pooled.reachable += gotLru;
    pooled.perRequest.push({ prompt: ids.length, reachable: gotLru });
    work += prefillSeconds(o.model, ids.length, got);
    // Most recently used last (delete and re-insert moves a key to the Map's end), touched from
    // the prompt's tail to its head, as vLLM frees a request's blocks "in reverse order so that
    // the tail blocks are evicted first" (vllm-project/vllm vllm/v1/core/kv_cache_manager.py, free).
    for (let b = n - 1; b >= 0; b--) {
      seen.add(keys[b]);
      lru.delete(keys[b]);
      lru.set(keys[b], true);
    }
    while (lru.size > o.fleetBlocks) lru.delete(lru.keys().next().value as string);
    const at = r.arrivalMs ?? 0;
    first = Math.min(first, at);
    last = Math.max(last, at);
  }
  return {
    requests: reqs.length,
    promptTokens: ideal.prompt,
    ideal,
    lru: pooled,
    fleetBlocks: o.fleetBlocks,
    distinctBlocks: seen.size,
    spanS: reqs.length > 0 ? (last - first) / 1000 : 0,
    prefillWorkS: work,
  };
}

/**
 * The time scale at which the trace offers `load` × the fleet's prefill capacity: the trace at
 * scale 1 asks prefillWorkS / spanS worker-seconds per second of `workers`; scale F multiplies it.
 */
export function timeScaleForLoad(s: TraceStats, workers: number, load: number): number {
  const atOne = s.prefillWorkS / Math.max(s.spanS, 1e-9) / workers;
  return load / atOne;
}

/** The offered load (× capacity) of the trace replayed at time scale `f`. */
export function loadAt(s: TraceStats, workers: number, f: number): number {
  return (s.prefillWorkS / Math.max(s.spanS, 1e-9) / workers) * f;
}
