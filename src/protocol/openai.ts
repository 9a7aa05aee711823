/**
 * Zod schemas for the OpenAI request bodies the server accepts. Only the fields the
 * server or router reads (or whose type a client most often gets wrong) are checked;
 * everything else passes through untouched (`passthrough`), so engine extras such as
 * vLLM's `kv_transfer_params`, `cache_salt`, `min_tokens` or SGLang's bootstrap fields
 * reach the worker as sent.
 */
import { z } from "zod";
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

const positiveInt = z.number().int().positive().nullable().optional();
const stop = z
  .union([z.string(), z.array(z.string())])
  .nullable()
  .optional();

/** Fields shared by chat and completions. */
const common = {
  model: z.string().min(1),
  stream: z.boolean().nullable().optional(),
  stream_options: streamOptions,
  max_tokens: positiveInt,
  n: positiveInt,
  temperature: z.number().min(0).max(2).nullable().optional(),
  top_p: z.number().min(0).max(1).nullable().optional(),
  presence_penalty: z.number().min(-2).max(2).nullable().optional(),
  frequency_penalty: z.number().min(-2).max(2).nullable().optional(),
  seed: z.number().int().nullable().optional(),
  stop,
  user: z.string().optional(),
  cache_salt: z.string().optional(),
  kv_transfer_params: z.record(z.unknown()).nullable().optional(),
};

export const chatCompletionRequestSchema = z
  .object({
    ...common,
    messages: z.array(chatMessageSchema).min(1),
    max_completion_tokens: positiveInt,
    logprobs: z.boolean().nullable().optional(),
    top_logprobs: z.number().int().min(0).max(20).nullable().optional(),
  })
  .passthrough();

const tokenArray = z.array(z.number().int().nonnegative());

export const completionRequestSchema = z
  .object({
    ...common,
    prompt: z.union([z.string(), z.array(z.string()).min(1), tokenArray.min(1), z.array(tokenArray).min(1)]),
    echo: z.boolean().nullable().optional(),
    logprobs: z.number().int().nonnegative().nullable().optional(),
  })
  .passthrough();

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
const optPosInt = (v: unknown) => v === undefined || v === null || (Number.isInteger(v) && (v as number) > 0);
const optInt = (v: unknown) => v === undefined || v === null || Number.isInteger(v);
const optRange = (v: unknown, lo: number, hi: number) =>
  v === undefined || v === null || (typeof v === "number" && v >= lo && v <= hi);

function fastCommonOk(b: Obj): boolean {
  const so = b.stream_options;
  const stop = b.stop;
  const kv = b.kv_transfer_params;
  return (
    typeof b.model === "string" &&
    b.model.length > 0 &&
    optBool(b.stream) &&
    (so === undefined || so === null || (isObj(so) && optBool(so.include_usage))) &&
    optPosInt(b.max_tokens) &&
    optPosInt(b.n) &&
    optRange(b.temperature, 0, 2) &&
    optRange(b.top_p, 0, 1) &&
    optRange(b.presence_penalty, -2, 2) &&
    optRange(b.frequency_penalty, -2, 2) &&
    optInt(b.seed) &&
    (stop === undefined || stop === null || typeof stop === "string") &&
    optStr(b.user) &&
    optStr(b.cache_salt) &&
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
  return (
    fastCommonOk(b) &&
    optPosInt(b.max_completion_tokens) &&
    optBool(b.logprobs) &&
    (b.top_logprobs === undefined ||
      b.top_logprobs === null ||
      (Number.isInteger(b.top_logprobs) &&
        (b.top_logprobs as number) >= 0 &&
        (b.top_logprobs as number) <= 20))
  );
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
  return (
    fastCommonOk(b) &&
    optBool(b.echo) &&
    (b.logprobs === undefined ||
      b.logprobs === null ||
      (Number.isInteger(b.logprobs) && (b.logprobs as number) >= 0))
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
