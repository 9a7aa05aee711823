/**
 * The tokenizer and chat template shared by the simulated engine and the router.
 * Both must produce the same token ids for the same request, so that the router's block
 * boundaries and prefix hashes line up with what the engine caches.
 *
 * Default: the o200k BPE vocabulary shipped in the `gpt-tokenizer` package with a ChatML
 * template. With a model directory: its `tokenizer.json` and the `chat_template` of its
 * `tokenizer_config.json` (see ./hf-tokenizer.ts).
 */
import gptApi, { decode as gptDecode, encode as gptEncode } from "gpt-tokenizer";
import { type PieceCache, pieceEncoder } from "./piece-cache.ts";

export interface ChatMessageLike {
  role: string;
  /** String content, or OpenAI content parts (text parts are concatenated). */
  content?: string | ReadonlyArray<{ type: string; text?: string }> | null;
  name?: string;
}

export interface Tokenizer {
  /** Identifies the vocabulary (e.g. "o200k_base" or the model dir); logged and put in worker records. */
  readonly id: string;
  /**
   * Token ids of `text`. `addSpecialTokens` adds what the tokenizer's post-processor adds (a
   * BOS for Llama-style tokenizers), as HF's `add_special_tokens=True` does; special-token
   * strings written in the text map to their ids either way. See `addsSpecialTokens`.
   */
  encode(text: string, addSpecialTokens?: boolean): number[];
  decode(ids: readonly number[]): string;
  /** Renders a chat into the prompt string the engine would tokenize (generation prompt appended). */
  applyChatTemplate(messages: readonly ChatMessageLike[]): string;
  /** Token id to use as end-of-sequence, when the vocabulary has one. */
  readonly eosTokenId: number | null;
}

/**
 * Whether a prompt is tokenized with the tokenizer's special tokens, as vLLM does: a request's
 * own `add_special_tokens` wins; else completions add them (a BOS) and chat does not (its
 * template already wrote the BOS). The router and the sim both follow this, so the router's
 * token ids, and so its block hashes, match the engine's.
 */
export function addsSpecialTokens(
  kind: "chat" | "completion",
  body: Readonly<Record<string, unknown>>,
): boolean {
  const v = body.add_special_tokens;
  return typeof v === "boolean" ? v : kind === "completion";
}

export function messageText(content: ChatMessageLike["content"]): string {
  if (content == null) return "";
  if (typeof content === "string") return content;
  let out = "";
  for (const part of content) if (part.type === "text" && typeof part.text === "string") out += part.text;
  return out;
}

/** ChatML, as used by Qwen and many others: `<|im_start|>role\ncontent<|im_end|>\n`. */
export function renderChatML(messages: readonly ChatMessageLike[]): string {
  let out = "";
  for (const m of messages) out += `<|im_start|>${m.role}\n${messageText(m.content)}<|im_end|>\n`;
  return `${out}<|im_start|>assistant\n`;
}

class GptTokenizer implements Tokenizer {
  readonly id = "o200k_base";
  readonly eosTokenId = 199999;
  /** Recent pieces in front of the 200,000-entry vocabulary (./piece-cache.ts); null if gpt-tokenizer's internals changed. */
  private readonly pieces: PieceCache | null = pieceEncoder(gptApi);
  /** o200k_base has no post-processor (no BOS), so `addSpecialTokens` adds nothing. */
  encode(text: string): number[] {
    // Special-token strings are treated as plain text (the template markers are tokenised
    // as ordinary text on both sides, so the ids still agree).
    return this.pieces ? this.pieces.encode(text) : gptEncode(text, { disallowedSpecial: new Set() });
  }
  decode(ids: readonly number[]): string {
    return gptDecode(ids as number[]);
  }
  applyChatTemplate(messages: readonly ChatMessageLike[]): string {
    return renderChatML(messages);
  }
}

let defaultTokenizer: Tokenizer | null = null;

export function getDefaultTokenizer(): Tokenizer {
  defaultTokenizer ??= new GptTokenizer();
  return defaultTokenizer;
}

const dirCache = new Map<string, Promise<Tokenizer>>();

/** Loads the tokenizer for a model directory, or the default one when `dir` is undefined. */
export function loadTokenizer(dir?: string): Promise<Tokenizer> {
  if (!dir) return Promise.resolve(getDefaultTokenizer());
  let p = dirCache.get(dir);
  if (!p) {
    p = import("./hf-tokenizer.ts").then((m) => m.loadHfTokenizer(dir));
    dirCache.set(dir, p);
  }
  return p;
}
