/**
 * The sim's `/detokenize`, as vLLM serves it: `{"model"?: str, "tokens": [int]}` →
 * `{"prompt": str}` (vllm-project/vllm vllm/entrypoints/serve/tokenize/protocol.py @
 * 343bacafc7bf4f973a105e8e7d99fa7de61f7e18, DetokenizeRequest / DetokenizeResponse). A body
 * without an integer `tokens` list is refused with a 400 as pydantic's validation would.
 */

import { BadRequestError } from "../../protocol/errors.ts";
import type { Tokenizer } from "../../tokenizer/tokenizer.ts";

export function detokenize(tok: Tokenizer, body: unknown): { prompt: string } {
  const t = typeof body === "object" && body !== null ? (body as Record<string, unknown>).tokens : undefined;
  if (!Array.isArray(t) || !t.every((x) => Number.isInteger(x) && x >= 0))
    throw new BadRequestError("'tokens' must be a list of token ids", "tokens");
  return { prompt: tok.decode(t as number[]) };
}
