/**
 * The kv-routing benchmark's seeded trace: multi-turn conversations that share a few system
 * prompts, plus document QA over a few long documents. Every request carries an arrival time;
 * a conversation's turn also waits for its previous turn (`after`). Assistant turns in the
 * history are fixed text, so the prompts (and the trace's reachable reuse) are known up front.
 */

import { chainBlocks, hashPrompt, type RouterBlockHash, routerHashAt } from "../../src/kv/hash.ts";
import { Prng, words } from "../../src/loadgen/prng.ts";
import type { BenchMessage, BenchRequest } from "../../src/loadgen/types.ts";
import type { Tokenizer } from "../../src/tokenizer/tokenizer.ts";

export interface TraceOptions {
  seed: number;
  systemPrompts: number;
  systemWords: number;
  conversations: number;
  turns: number;
  userWords: number;
  assistantWords: number;
  /** Seconds between a conversation's turns (at least; a turn also waits for the previous one). */
  turnGapS: number;
  documents: number;
  documentWords: number;
  questions: number;
  questionWords: number;
  /** Conversations start and questions arrive (Poisson) over this window. */
  windowS: number;
  maxTokens: number;
}

export const defaultTrace: TraceOptions = {
  seed: 7,
  systemPrompts: 4,
  systemWords: 700,
  conversations: 40,
  turns: 4,
  userWords: 40,
  assistantWords: 60,
  turnGapS: 2,
  documents: 5,
  documentWords: 2400,
  questions: 100,
  questionWords: 25,
  windowS: 20,
  maxTokens: 24,
};

export function buildTrace(o: TraceOptions): BenchRequest[] {
  const rng = new Prng(o.seed);
  const text = rng.fork("text");
  const systems = Array.from(
    { length: o.systemPrompts },
    (_, i) => `You are assistant persona ${i}. ${words(text, o.systemWords)}`,
  );
  const documents = Array.from(
    { length: o.documents },
    (_, i) => `Document ${i}.\n${words(text, o.documentWords)}`,
  );
  const reqs: BenchRequest[] = [];
  const arrivals = rng.fork("arrivals");
  for (let c = 0; c < o.conversations; c++) {
    const start = arrivals.next() * o.windowS * 1000;
    const sys = arrivals.int(0, o.systemPrompts - 1);
    const history: BenchMessage[] = [{ role: "system", content: systems[sys] }];
    let prev: number | undefined;
    for (let t = 0; t < o.turns; t++) {
      history.push({ role: "user", content: `Turn ${t}: ${words(text, o.userWords)}` });
      const index = reqs.length;
      reqs.push({
        index,
        messages: history.map((m) => ({ ...m })),
        maxTokens: o.maxTokens,
        arrivalMs: start + t * o.turnGapS * 1000,
        after: prev,
        group: `conv-sys${sys}`,
      });
      prev = index;
      history.push({ role: "assistant", content: words(text, o.assistantWords) });
    }
  }
  for (let q = 0; q < o.questions; q++) {
    const d = arrivals.int(0, o.documents - 1);
    reqs.push({
      index: reqs.length,
      messages: [
        { role: "system", content: "Answer from the document." },
        { role: "user", content: `${documents[d]}\n\nQuestion ${q}: ${words(text, o.questionWords)}` },
      ],
      maxTokens: o.maxTokens,
      arrivalMs: arrivals.next() * o.windowS * 1000,
      group: `doc-${d}`,
    });
  }
  // The runner expects index = position; order by arrival, keeping `after` links valid.
  const order = reqs.map((r) => r.index).sort((a, b) => reqs[a].arrivalMs! - reqs[b].arrivalMs!);
  const pos = new Map(order.map((old, i) => [old, i]));
  return order.map((old, i) => ({
    ...reqs[old],
    index: i,
    after: reqs[old].after === undefined ? undefined : pos.get(reqs[old].after!),
  }));
}

/**
 * The trace's reachable reuse: for each request (in arrival order), the leading full blocks it
 * shares with any earlier request's prompt, i.e. what a cache that never evicts, on a single
 * worker, could hit. Returns reachable and total prompt tokens.
 */
export function reachableReuse(
  reqs: readonly BenchRequest[],
  tok: Tokenizer,
  blockSize: number,
): { reachable: number; prompt: number; byGroup: Record<string, { reachable: number; prompt: number }> } {
  const seen = new Set<RouterBlockHash>();
  let reachable = 0;
  let prompt = 0;
  const byGroup: Record<string, { reachable: number; prompt: number }> = {};
  for (const r of reqs) {
    const ids = tok.encode(tok.applyChatTemplate(r.messages ?? []));
    prompt += ids.length;
    const chain = hashPrompt(ids, blockSize);
    const n = chainBlocks(chain);
    let k = 0;
    while (k < n && seen.has(routerHashAt(chain, k))) k++;
    // The engine always computes at least the prompt's last token.
    const got = Math.min(k * blockSize, Math.floor((ids.length - 1) / blockSize) * blockSize);
    reachable += got;
    const key = (r.group ?? "").split("-")[0];
    byGroup[key] ??= { reachable: 0, prompt: 0 };
    const g = byGroup[key];
    g.reachable += got;
    g.prompt += ids.length;
    for (let b = 0; b < n; b++) seen.add(routerHashAt(chain, b));
  }
  return { reachable, prompt, byGroup };
}
