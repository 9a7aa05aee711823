/** A sequence's simulated logprobs (logprobs.ts's model) for its output and, under `echo`, its prompt. */
import { completionLogprobs, type LogprobModel, type TokenLogprob } from "./logprobs.ts";
import type { Sequence } from "./sequence.ts";

/** Logprobs of a sequence's output tokens from `from` on (k alternatives each). */
export function outputLogprobs(
  seq: Sequence,
  model: LogprobModel | null,
  k: number,
  from: number,
): TokenLogprob[] {
  const drawn = seq.output.drawn;
  if (!drawn || !model) return [];
  const out: TokenLogprob[] = [];
  for (let j = from; j < drawn.length; j++) {
    const pos = seq.numPromptTokens + j;
    out.push(model.drawnEntry(seq.tokens[pos - 1] ?? 0, drawn[j], pos, k));
  }
  return out;
}

/** Under `echo`: the logprobs of the prompt tokens (the first has none). */
export function promptLogprobs(seq: Sequence, model: LogprobModel | null, k: number): TokenLogprob[] {
  if (!model) return [];
  const out: TokenLogprob[] = [];
  for (let pos = 0; pos < seq.numPromptTokens; pos++) {
    const id = seq.tokens[pos];
    out.push(pos === 0 ? model.first(id) : model.entry(seq.tokens[pos - 1], id, model.tokenText(id), pos, k));
  }
  return out;
}

/** Completions list the sampled token among the alternatives even when 0 were asked for. */
export function completionLogprobsWithSampled(entries: TokenLogprob[], offset: number): unknown {
  return completionLogprobs(
    entries.map((e) =>
      e.logprob !== null && e.top.length === 0 ? { ...e, top: [{ token: e.token, logprob: e.logprob }] } : e,
    ),
    offset,
  );
}
