import { Prng, words } from "../prng.ts";
import type { BenchRequest } from "../types.ts";

export interface SyntheticSpec {
  kind: "synthetic";
  /** Prompt length range in tokens (about one token per filler word), inclusive. Default [128, 1024]. */
  inputLen?: [number, number];
  /** Output length range; used when no fixed max_tokens is given. Default [64, 256]. */
  outputLen?: [number, number];
}

/** Independent prompts of random length: no prefix sharing beyond chance. */
export function syntheticWorkload(
  spec: SyntheticSpec,
  n: number,
  seed: number,
  maxTokens?: number,
): BenchRequest[] {
  const rng = new Prng(seed).fork("synthetic");
  const [inLo, inHi] = spec.inputLen ?? [128, 1024];
  const [outLo, outHi] = spec.outputLen ?? [64, 256];
  const out: BenchRequest[] = [];
  for (let i = 0; i < n; i++) {
    const len = rng.int(inLo, inHi);
    const max = maxTokens ?? rng.int(outLo, outHi);
    out.push({ index: i, messages: [{ role: "user", content: words(rng, len) }], maxTokens: max });
  }
  return out;
}
