/**
 * One request's choices as sequences: each with its seeded PRNG (the request's `seed`, or greedy
 * temperature 0: the prompt itself, so the same request gives the same text), its output limit,
 * and, when the request constrains the answer (tools, structured outputs), its scripted text.
 */
import { Mulberry32 } from "../../util/mulberry32.ts";
import type { SimConfig } from "./config.ts";
import { pieces } from "./json-gen.ts";
import type { SimRequest } from "./openai-request.ts";
import { hashString, OutputText, type OutputVocab } from "./output.ts";
import { type AnswerPlan, type RequestRules, scriptFor } from "./request-plan.ts";
import type { RequestResponder } from "./response.ts";
import { Sequence } from "./sequence.ts";

export interface ChoiceContext {
  cfg: SimConfig;
  r: SimRequest;
  plan: AnswerPlan;
  rules: RequestRules;
  vocab: OutputVocab;
  requestId: string;
  phase: "prefill" | "decode" | null;
  responder: RequestResponder;
  arrivalMs: number;
}

function seedKey(c: ChoiceContext, prompt: readonly number[], index: number): string {
  if (c.r.seed !== null) return `seed:${c.r.seed}:${index}`;
  if (c.plan.greedy) return `greedy:${prompt.join(",")}:${index}`;
  return `req:${c.requestId}:${index}`;
}

/** The output limit: the phase's, the request's, the script's natural end, or the simulated EOS. */
function limitOf(
  c: ChoiceContext,
  room: number,
  scriptLen: number | null,
  rng: Mulberry32,
): { maxTokens: number; limitReason: "length" | "stop" } {
  const { r, cfg } = c;
  if (c.phase === "prefill") return { maxTokens: 1, limitReason: "length" };
  const cap = r.maxTokens ?? room;
  if (scriptLen !== null)
    return scriptLen <= cap
      ? { maxTokens: scriptLen, limitReason: "stop" }
      : { maxTokens: cap, limitReason: "length" };
  if (r.maxTokens !== null) return { maxTokens: r.maxTokens, limitReason: "length" };
  if (r.ignoreEos) return { maxTokens: room, limitReason: "length" };
  const p = cfg.profile;
  const span = p.default_output_len_max - p.default_output_len_min + 1;
  const maxTokens = Math.min(room, p.default_output_len_min + Math.floor(rng.next() * span));
  return { maxTokens, limitReason: maxTokens === room ? "length" : "stop" };
}

/** Adds the request's sequences (prompts × n) to its responder. */
export function addChoices(c: ChoiceContext): void {
  const { r, cfg, responder } = c;
  const n = c.phase === "prefill" ? 1 : r.n;
  r.prompts.forEach((prompt, p) => {
    for (let i = 0; i < n; i++) {
      const index = p * n + i;
      const rng = new Mulberry32(
        hashString(seedKey(c, prompt, index), (cfg.seed * 2654435761) >>> 0 || 0x811c9dc5),
      );
      const script = scriptFor(c.plan, rng, c.rules);
      const parts = script ? pieces(script.text) : null;
      const limit = limitOf(c, cfg.maxModelLen - prompt.length, parts ? parts.length : null, rng);
      const seq = new Sequence({
        requestId: c.requestId,
        index,
        promptIds: prompt,
        ...limit,
        salt: r.salt,
        output: new OutputText(c.vocab, rng, r.stop, r.logprobs !== null, {
          script: parts,
          stopTokenIds: c.plan.stopTokenIds,
        }),
        sink: responder,
        // PD moves one sequence's KV: the first prompt's.
        holdOnFinish: c.phase === "prefill" && index === 0,
        arrivalMs: c.arrivalMs,
        priority: c.plan.priority,
      });
      responder.addSeq(seq, script?.shape ?? null);
    }
  });
}
