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

export function parseChatRequest(body: unknown): ChatCompletionRequest {
  return validate(chatCompletionRequestSchema, body);
}

export function parseCompletionRequest(body: unknown): CompletionRequest {
  return validate(completionRequestSchema, body);
}
