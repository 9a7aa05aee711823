import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/**
 * Constants of the timing model and default engine sizes. The default profile
 * (profiles/default.json) stands for Llama-3.1-8B bf16 on one MI355X; its `derivation`
 * field says how each figure was obtained.
 */
export interface SimProfile {
  name: string;
  description?: string;
  /** Fixed cost of one forward pass (weights streamed once, launches, sampling). */
  step_overhead_s: number;
  /** Dense compute per prompt token prefilled in a step. */
  prefill_per_token_s: number;
  /** Attention per (prefilled token x context length). */
  attention_per_token_ctx_s: number;
  /** Per decoding sequence in the batch. */
  decode_per_seq_s: number;
  /** Per cached token a decoding sequence reads. */
  kv_read_per_token_s: number;
  kv_bytes_per_token: number;
  num_gpu_blocks: number;
  max_model_len: number;
  max_num_seqs: number;
  max_num_batched_tokens: number;
  /** Output length range used when a request gives no max_tokens (the simulated EOS). */
  default_output_len_min: number;
  default_output_len_max: number;
}

const NUMERIC_FIELDS = [
  "step_overhead_s",
  "prefill_per_token_s",
  "attention_per_token_ctx_s",
  "decode_per_seq_s",
  "kv_read_per_token_s",
  "kv_bytes_per_token",
  "num_gpu_blocks",
  "max_model_len",
  "max_num_seqs",
  "max_num_batched_tokens",
  "default_output_len_min",
  "default_output_len_max",
] as const;

export const DEFAULT_PROFILE_PATH = fileURLToPath(new URL("./profiles/default.json", import.meta.url));

/** Loads a profile; fields missing from `path` fall back to the default profile. */
export function loadProfile(path?: string): SimProfile {
  const base = JSON.parse(readFileSync(DEFAULT_PROFILE_PATH, "utf8")) as SimProfile;
  if (!path) return base;
  const over = JSON.parse(readFileSync(path, "utf8")) as Partial<SimProfile>;
  const merged = { ...base, ...over } as SimProfile;
  for (const f of NUMERIC_FIELDS) {
    const v = merged[f];
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
      throw new Error(`profile ${path}: field ${f} must be a non-negative number`);
    }
  }
  return merged;
}

/** What one scheduler step computes, as the timing model sees it. */
export interface StepShape {
  /** Prompt (or recomputed) tokens prefilled this step. */
  prefillTokens: number;
  /** Sum over prefill chunks of chunk length x context length at the chunk's end. */
  prefillTokenCtx: number;
  /** Sequences decoding one token each. */
  decodeSeqs: number;
  /** Sum of the context lengths those decoding sequences read. */
  decodeKvTokens: number;
}

/** Simulated seconds one step takes. */
export function stepSeconds(p: SimProfile, s: StepShape): number {
  return (
    p.step_overhead_s +
    p.prefill_per_token_s * s.prefillTokens +
    p.attention_per_token_ctx_s * s.prefillTokenCtx +
    p.decode_per_seq_s * s.decodeSeqs +
    p.kv_read_per_token_s * s.decodeKvTokens
  );
}
