import { readFileSync } from "node:fs";
import { BadRequestError } from "../../protocol/errors.ts";
import { Prng, words } from "../prng.ts";
import type { BenchMessage, BenchRequest } from "../types.ts";

export interface TraceSpec {
  kind: "trace";
  /** JSONL file, one request a line. */
  path?: string;
  /** Or the lines themselves (programmatic use). */
  lines?: string[];
}

/** Fields a trace line may carry; any other field is passed through into the request body. */
const KNOWN = new Set([
  "timestamp_ms",
  "arrival_ms",
  "offset_ms",
  "timestamp",
  "messages",
  "prompt",
  "max_tokens",
  "max_completion_tokens",
  "input_length",
  "output_length",
  "hash_ids",
  "group",
  "model",
  "stream",
  "stream_options",
]);

/** Mooncake traces give prompts as lists of 512-token block hashes. */
const MOONCAKE_BLOCK = 512;

/**
 * Parses a JSONL trace. A line holds `messages` (chat) or `prompt` (text), or the Mooncake shape
 * `{timestamp, input_length, output_length, hash_ids}` (each hash id becomes a deterministic
 * 512-token block, so lines that share hash ids share a prefix). Arrival: `timestamp_ms` or
 * `timestamp` (absolute ms, made relative to the first line), or `arrival_ms`/`offset_ms`
 * (offset from the start). Lines without an arrival time follow --rate/--concurrency.
 */
export function traceWorkload(spec: TraceSpec, n: number, maxTokens?: number): BenchRequest[] {
  const lines = spec.lines ?? readFileSync(spec.path ?? "", "utf8").split("\n");
  const out: BenchRequest[] = [];
  let firstTs: number | null = null;
  for (let ln = 0; ln < lines.length && out.length < n; ln++) {
    const text = lines[ln].trim();
    if (text === "" || text.startsWith("#")) continue;
    let obj: unknown;
    try {
      obj = JSON.parse(text);
    } catch (e) {
      throw new BadRequestError(`trace line ${ln + 1}: not JSON (${(e as Error).message})`);
    }
    if (typeof obj !== "object" || obj === null || Array.isArray(obj)) {
      throw new BadRequestError(`trace line ${ln + 1}: expected a JSON object`);
    }
    const rec = obj as Record<string, unknown>;
    const req: BenchRequest = { index: out.length, maxTokens: 0 };
    if (Array.isArray(rec.messages)) req.messages = parseMessages(rec.messages, ln);
    else if (typeof rec.prompt === "string") req.prompt = rec.prompt;
    else if (Array.isArray(rec.hash_ids) && typeof rec.input_length === "number") {
      req.prompt = mooncakePrompt(rec.hash_ids, rec.input_length);
    } else throw new BadRequestError(`trace line ${ln + 1}: needs "messages", "prompt" or "hash_ids"`);
    const max = num(rec.max_tokens) ?? num(rec.max_completion_tokens) ?? num(rec.output_length);
    req.maxTokens = maxTokens ?? max ?? 128;
    const absolute = num(rec.timestamp_ms) ?? num(rec.timestamp);
    const offset = num(rec.arrival_ms) ?? num(rec.offset_ms);
    if (offset !== undefined) req.arrivalMs = offset;
    else if (absolute !== undefined) {
      firstTs ??= absolute;
      req.arrivalMs = absolute - firstTs;
    }
    if (typeof rec.group === "string") req.group = rec.group;
    const extra: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(rec)) if (!KNOWN.has(k)) extra[k] = v;
    if (Object.keys(extra).length > 0) req.extraBody = extra;
    out.push(req);
  }
  return out;
}

function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

function parseMessages(raw: unknown[], ln: number): BenchMessage[] {
  return raw.map((m, i) => {
    const r = m as Record<string, unknown> | null;
    const role = r?.role;
    if (role !== "system" && role !== "user" && role !== "assistant") {
      throw new BadRequestError(`trace line ${ln + 1}: message ${i} has no valid role`);
    }
    if (typeof r?.content !== "string")
      throw new BadRequestError(`trace line ${ln + 1}: message ${i} content must be a string`);
    return { role, content: r.content };
  });
}

function mooncakePrompt(hashIds: unknown[], inputLength: number): string {
  const parts: string[] = [];
  let left = inputLength;
  for (const h of hashIds) {
    if (left <= 0) break;
    const take = Math.min(MOONCAKE_BLOCK, left);
    parts.push(words(new Prng(Number(h) >>> 0), take));
    left -= take;
  }
  return parts.join(" ");
}
