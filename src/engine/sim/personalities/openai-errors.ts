/** The OpenAI error answer vLLM serves (and SGLang, not yet checked against its source). */
import type { InferaError } from "../../../protocol/errors.ts";

export function openAiErrorAnswer(e: InferaError): { body: unknown; headers: Record<string, string> } {
  return { body: e.toJSON(), headers: e.headers };
}

/** Engines that take the served name as-is leave the model check to the OpenAI layer. */
export function noModelCheck(): void {}
