import { BadRequestError, ContextLengthError, ModelNotFoundError } from "../../protocol/errors.ts";
import {
  addsSpecialTokens,
  type ChatMessageLike,
  messageText,
  type Tokenizer,
} from "../../tokenizer/tokenizer.ts";

/** An OpenAI chat or completions request, validated and tokenised. */
export interface SimRequest {
  kind: "chat" | "completion";
  model: string;
  /** One prompt for chat; one or more for completions (a batch). */
  prompts: number[][];
  n: number;
  /** Explicit output limit, or null (the simulated EOS decides). */
  maxTokens: number | null;
  stop: string[];
  stream: boolean;
  includeUsage: boolean;
  seed: number | null;
  salt: string | null;
  ignoreEos: boolean;
  kvTransferParams: Record<string, unknown> | null;
  /** Alternatives per token when logprobs were asked for (chat `top_logprobs`, completions `logprobs`); else null. */
  logprobs: number | null;
  /** `echo`: text put before each choice's text, per prompt (completions: the prompt; chat: a final assistant message). */
  echoTexts: string[] | null;
  /** Completions `echo` with `max_tokens: 0`: the prompt alone, the one sampled token not returned. */
  echoOnly: boolean;
  body: Record<string, unknown>;
}

type Obj = Record<string, unknown>;

function optNumber(body: Obj, key: string): void {
  const v = body[key];
  if (v !== undefined && v !== null && (typeof v !== "number" || !Number.isFinite(v))) {
    throw new BadRequestError(`'${key}' must be a number`, key);
  }
}

function optInt(body: Obj, key: string, min: number, max = Number.MAX_SAFE_INTEGER): number | null {
  const v = body[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new BadRequestError(`'${key}' must be an integer between ${min} and ${max}`, key);
  }
  return v;
}

function optBool(body: Obj, key: string): boolean {
  const v = body[key];
  if (v === undefined || v === null) return false;
  if (typeof v !== "boolean") throw new BadRequestError(`'${key}' must be a boolean`, key);
  return v;
}

function parseStop(v: unknown): string[] {
  if (v === undefined || v === null) return [];
  if (typeof v === "string") return [v];
  if (Array.isArray(v) && v.every((s) => typeof s === "string")) return v as string[];
  throw new BadRequestError("'stop' must be a string or an array of strings", "stop");
}

function parseMessages(v: unknown): ChatMessageLike[] {
  if (!Array.isArray(v) || v.length === 0) {
    throw new BadRequestError("'messages' must be a non-empty array", "messages");
  }
  return v.map((m, i) => {
    if (m === null || typeof m !== "object" || typeof (m as Obj).role !== "string") {
      throw new BadRequestError(`messages[${i}] must be an object with a string 'role'`, "messages");
    }
    const c = (m as Obj).content;
    const okContent =
      c === undefined ||
      c === null ||
      typeof c === "string" ||
      (Array.isArray(c) &&
        c.every((p) => p !== null && typeof p === "object" && typeof (p as Obj).type === "string"));
    if (!okContent) {
      throw new BadRequestError(
        `messages[${i}].content must be a string or an array of content parts`,
        "messages",
      );
    }
    return m as ChatMessageLike;
  });
}

function isTokenArray(v: unknown): v is number[] {
  return (
    Array.isArray(v) && v.length > 0 && v.every((t) => typeof t === "number" && Number.isInteger(t) && t >= 0)
  );
}

function parsePrompts(v: unknown, tok: Tokenizer, special: boolean): number[][] {
  if (typeof v === "string") return [tok.encode(v, special)];
  if (isTokenArray(v)) return [v.slice()];
  if (Array.isArray(v) && v.length > 0) {
    if (v.every((p) => typeof p === "string")) return (v as string[]).map((p) => tok.encode(p, special));
    if (v.every(isTokenArray)) return (v as number[][]).map((p) => p.slice());
  }
  throw new BadRequestError(
    "'prompt' must be a string, an array of strings, an array of token ids, or an array of token-id arrays",
    "prompt",
  );
}

export interface ParseLimits {
  servedModelNames: readonly string[];
  maxModelLen: number;
  /** vLLM's --max-logprobs: the most alternatives a request may ask for (20). */
  maxLogprobs: number;
}

/** Chat: `logprobs: true` plus `top_logprobs` 0..max; completions: `logprobs` 0..max. vLLM's messages. */
function parseLogprobs(kind: "chat" | "completion", body: Obj, max: number): number | null {
  if (kind === "chat") {
    const want = optBool(body, "logprobs");
    const top = optInt(body, "top_logprobs", 0, Number.MAX_SAFE_INTEGER);
    if (top !== null && top > 0 && !want)
      throw new BadRequestError("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs");
    if (!want) return null;
    if ((top ?? 0) > max)
      throw new BadRequestError(
        `Requested top logprobs of ${top}, which is greater than max allowed logprobs of ${max}.`,
        "top_logprobs",
      );
    return top ?? 0;
  }
  const k = optInt(body, "logprobs", 0, Number.MAX_SAFE_INTEGER);
  if (k !== null && k > max)
    throw new BadRequestError(
      `Requested sample logprobs of ${k}, which is greater than max allowed logprobs of ${max}.`,
      "logprobs",
    );
  return k;
}

/** The text `echo` puts before a choice: the prompt as sent, or its token ids decoded. */
function echoTexts(prompt: unknown, ids: number[][], tok: Tokenizer): string[] {
  if (typeof prompt === "string") return [prompt];
  if (Array.isArray(prompt) && typeof prompt[0] === "string") return prompt as string[];
  return ids.map((p) => tok.decode(p));
}

/** The prompts' token ids (chat: the templated messages) and the text chat `echo` starts with. */
function parsePromptIds(
  kind: "chat" | "completion",
  body: Obj,
  tok: Tokenizer,
): { prompts: number[][]; chatEcho: string | null } {
  let prompts: number[][];
  let chatEcho: string | null = null;
  if (kind === "chat") {
    const messages = parseMessages(body.messages);
    // vLLM's chat `echo`: the answer starts with the last message's text when that message is
    // the assistant's (a continuation); otherwise it echoes nothing.
    const last = messages[messages.length - 1];
    if (optBool(body, "echo") && last?.role === "assistant") chatEcho = messageText(last.content);
    for (const m of messages) messageText(m.content);
    prompts = [tok.encode(tok.applyChatTemplate(messages), addsSpecialTokens(kind, body))];
  } else {
    if (body.prompt === undefined) throw new BadRequestError("'prompt' is required", "prompt");
    prompts = parsePrompts(body.prompt, tok, addsSpecialTokens(kind, body));
  }
  return { prompts, chatEcho };
}

/** Refuses an empty prompt, and one that leaves no room for the answer in the context. */
function checkPromptLengths(
  kind: "chat" | "completion",
  prompts: number[][],
  maxTokens: number | null,
  maxModelLen: number,
): void {
  for (const p of prompts) {
    if (p.length === 0)
      throw new BadRequestError("The prompt is empty", kind === "chat" ? "messages" : "prompt");
    const want = maxTokens ?? 1;
    if (p.length + want > maxModelLen || p.length >= maxModelLen) {
      throw new ContextLengthError(p.length, maxTokens ?? 0, maxModelLen);
    }
  }
}

export function parseSimRequest(
  kind: "chat" | "completion",
  raw: unknown,
  tok: Tokenizer,
  limits: ParseLimits,
): SimRequest {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new BadRequestError("The request body must be a JSON object");
  }
  const body = raw as Obj;
  if (typeof body.model !== "string" || body.model.length === 0) {
    if (body.model !== undefined) throw new BadRequestError("'model' must be a string", "model");
  }
  const model = typeof body.model === "string" ? body.model : limits.servedModelNames[0];
  if (!limits.servedModelNames.includes(model)) throw new ModelNotFoundError(model);

  if (body.add_special_tokens !== undefined && typeof body.add_special_tokens !== "boolean")
    throw new BadRequestError("'add_special_tokens' must be a boolean", "add_special_tokens");
  const { prompts, chatEcho } = parsePromptIds(kind, body, tok);
  for (const k of [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
  ]) {
    optNumber(body, k);
  }
  const n = optInt(body, "n", 1, 128) ?? 1;
  // Completions with `echo` take max_tokens 0: the prompt comes back alone (vLLM samples one
  // token it does not return) — vllm-project/vllm vllm/entrypoints/openai/serving_completion.py
  // @ 00463e627b4cbe549b5e9815a2bdb0100ae88ea9 ("if request.max_tokens == 0: only return the prompt").
  const echoAsked = kind === "completion" && optBool(body, "echo");
  const askedMax =
    kind === "chat"
      ? (optInt(body, "max_completion_tokens", 1) ?? optInt(body, "max_tokens", 1))
      : optInt(body, "max_tokens", echoAsked ? 0 : 1);
  const echoOnly = askedMax === 0;
  const maxTokens = echoOnly ? 1 : askedMax;
  // `min_tokens: int = 0` (not Optional) in vLLM's request models, so pydantic refuses an
  // explicit null with a 400 — vllm-project/vllm vllm/entrypoints/openai/chat_completion/protocol.py
  // @ d5dba2d7b0ab9b98096560c69db7126b54b14d79 (SGLang's sampling params declare it the same way).
  if (body.min_tokens === null) {
    throw new BadRequestError("'min_tokens' must be an integer, not null", "min_tokens");
  }
  optInt(body, "min_tokens", 0);
  const seed = optInt(body, "seed", Number.MIN_SAFE_INTEGER);
  const stream = optBool(body, "stream");
  let includeUsage = false;
  if (body.stream_options !== undefined && body.stream_options !== null) {
    if (typeof body.stream_options !== "object" || Array.isArray(body.stream_options)) {
      throw new BadRequestError("'stream_options' must be an object", "stream_options");
    }
    includeUsage = (body.stream_options as Obj).include_usage === true;
  }
  const salt = body.cache_salt;
  if (salt !== undefined && salt !== null && (typeof salt !== "string" || salt.length === 0)) {
    throw new BadRequestError("'cache_salt' must be a non-empty string", "cache_salt");
  }
  const ktp = body.kv_transfer_params;
  if (ktp !== undefined && ktp !== null && (typeof ktp !== "object" || Array.isArray(ktp))) {
    throw new BadRequestError("'kv_transfer_params' must be an object", "kv_transfer_params");
  }
  const logprobs = parseLogprobs(kind, body, limits.maxLogprobs);
  const echo = echoAsked;
  checkPromptLengths(kind, prompts, maxTokens, limits.maxModelLen);
  return {
    kind,
    model,
    prompts,
    n,
    maxTokens,
    stop: parseStop(body.stop),
    stream,
    includeUsage,
    seed,
    salt: typeof salt === "string" ? salt : null,
    ignoreEos: optBool(body, "ignore_eos"),
    kvTransferParams: (ktp as Obj | undefined) ?? null,
    logprobs,
    echoTexts: echo ? echoTexts(body.prompt, prompts, tok) : chatEcho ? [chatEcho] : null,
    echoOnly,
    body,
  };
}
