/**
 * Zod schemas for the OpenAI request bodies the server accepts. Only what the server or the
 * router reads is checked: the model, the prompt (messages or prompt), `stream` and
 * `stream_options`, `cache_salt` and `kv_transfer_params`. Everything else (sampling
 * parameters, logprobs, limits, engine extras such as vLLM's `min_tokens` or `prompt_embeds`)
 * passes through untouched, so the engine decides and its own error comes back: vLLM accepts
 * `temperature` above 2, `top_logprobs` up to its `--max-logprobs`, `max_tokens: 0` with
 * `echo` and `prompt_embeds` without `prompt`
 * (vllm-project/vllm vllm/entrypoints/openai/completion/protocol.py and
 * chat_completion/protocol.py @ 002032ee2b18e1f7bd924ec47b62504ba3866063).
 */
import { z } from "zod";
import { MAX_BODY_DEPTH, tooDeep } from "./body-depth.ts";
import { BadRequestError } from "./errors.ts";

const contentPart = z.object({ type: z.string(), text: z.string().optional() }).passthrough();

export const chatMessageSchema = z
  .object({
    role: z.string(),
    content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
    name: z.string().optional(),
  })
  .passthrough();

const streamOptions = z
  .object({ include_usage: z.boolean().nullable().optional() })
  .passthrough()
  .nullable()
  .optional();

/** Fields shared by chat and completions. */
const common = {
  model: z.string().min(1),
  stream: z.boolean().nullable().optional(),
  stream_options: streamOptions,
  cache_salt: z.string().nullable().optional(),
  kv_transfer_params: z.record(z.unknown()).nullable().optional(),
};

export const chatCompletionRequestSchema = z
  .object({
    ...common,
    messages: z.array(chatMessageSchema).min(1),
  })
  .passthrough();

const tokenArray = z.array(z.number().int().nonnegative());

export const completionRequestSchema = z
  .object({
    ...common,
    // Optional only when `prompt_embeds` is given (checked below; the engine checks the rest).
    prompt: z
      .union([z.string(), z.array(z.string()).min(1), tokenArray.min(1), z.array(tokenArray).min(1)])
      .optional(),
  })
  .passthrough()
  .superRefine((b, ctx) => {
    if (b.prompt === undefined && (b as Record<string, unknown>).prompt_embeds == null)
      ctx.addIssue({
        code: z.ZodIssueCode.invalid_type,
        expected: "string",
        received: "undefined",
        path: ["prompt"],
      });
  });

export type ChatMessage = z.infer<typeof chatMessageSchema>;
export type ChatCompletionRequest = z.infer<typeof chatCompletionRequestSchema>;
export type CompletionRequest = z.infer<typeof completionRequestSchema>;

/** Renders a zod path like OpenAI does in `param`: `messages[0].content`. */
export function zodPathToParam(path: ReadonlyArray<string | number>): string {
  let out = "";
  for (const seg of path) {
    if (typeof seg === "number") out += `[${seg}]`;
    else out += out === "" ? seg : `.${seg}`;
  }
  return out;
}

function validate<T>(schema: z.ZodType<T>, body: unknown): T {
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new BadRequestError("The request body must be a JSON object.", null, "invalid_type");
  }
  const res = schema.safeParse(body);
  if (res.success) return res.data;
  const issue = res.error.issues[0]!;
  const param = zodPathToParam(issue.path);
  const message =
    issue.code === "invalid_type" && issue.received === "undefined"
      ? `Missing required parameter: '${param}'.`
      : `Invalid value for '${param}': ${issue.message}.`;
  throw new BadRequestError(
    message,
    param || null,
    issue.code === "invalid_type" ? "invalid_type" : "invalid_value",
  );
}

// Fast path: a conservative hand-written check of the same rules. When it says yes, the
// schema would accept the body too, and zod's walk and copy (~20 µs) is skipped; anything
// it is unsure of goes through zod, which also writes the precise error.
type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => v !== null && typeof v === "object" && !Array.isArray(v);
const optStr = (v: unknown) => v === undefined || typeof v === "string";
const optBool = (v: unknown) => v === undefined || v === null || typeof v === "boolean";

function fastCommonOk(b: Obj): boolean {
  const so = b.stream_options;
  const kv = b.kv_transfer_params;
  return (
    typeof b.model === "string" &&
    b.model.length > 0 &&
    optBool(b.stream) &&
    (so === undefined || so === null || (isObj(so) && optBool(so.include_usage))) &&
    (b.cache_salt === null || optStr(b.cache_salt)) &&
    (kv === undefined || kv === null || isObj(kv))
  );
}

function fastChatOk(b: Obj): boolean {
  const msgs = b.messages;
  if (!Array.isArray(msgs) || msgs.length === 0) return false;
  for (const m of msgs) {
    if (!isObj(m) || typeof m.role !== "string" || !optStr(m.name)) return false;
    const c = m.content;
    if (c !== undefined && c !== null && typeof c !== "string") return false;
  }
  return fastCommonOk(b);
}

function fastCompletionOk(b: Obj): boolean {
  const p = b.prompt;
  if (typeof p !== "string") {
    if (!Array.isArray(p) || p.length === 0) return false;
    if (typeof p[0] === "string") {
      for (const x of p) if (typeof x !== "string") return false;
    } else {
      for (const x of p) if (!Number.isInteger(x) || (x as number) < 0) return false;
    }
  }
  return fastCommonOk(b);
}

export { MAX_BODY_DEPTH };

/**
 * Refuses a body nested deeper than MAX_BODY_DEPTH (400): re-serialising one (for a router
 * that rewrites the body) overflowed the stack, and no OpenAI request needs such depth.
 */
export function assertBodyDepth(body: unknown): void {
  if (tooDeep(body, MAX_BODY_DEPTH)) throw bodyDepthError();
}

/** The error for a body nested deeper than MAX_BODY_DEPTH (also raised by the off-loop parser). */
export function bodyDepthError(): BadRequestError {
  return new BadRequestError(
    `The request body is nested deeper than ${MAX_BODY_DEPTH} levels.`,
    null,
    "invalid_value",
  );
}

export function parseChatRequest(body: unknown): ChatCompletionRequest {
  if (isObj(body) && fastChatOk(body)) return body as ChatCompletionRequest;
  return validate(chatCompletionRequestSchema, body);
}

export function parseCompletionRequest(body: unknown): CompletionRequest {
  if (isObj(body) && fastCompletionOk(body)) return body as CompletionRequest;
  return validate(completionRequestSchema, body);
}
