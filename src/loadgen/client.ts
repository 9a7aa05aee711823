import { performance } from "node:perf_hooks";
import { type Dispatcher, request, errors as undiciErrors } from "undici";
import { renderChatML } from "../tokenizer/tokenizer.ts";
import { SseParser } from "./sse.ts";
import type { BenchRequest, Endpoint, ErrorKind, RequestRecord } from "./types.ts";

export interface ClientConfig {
  /** Base URL of the server or engine, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted). */
  url: string;
  model: string;
  endpoint: Endpoint;
  stream: boolean;
  apiKey?: string;
  timeoutMs: number;
  ignoreEos?: boolean;
  /** Merged into every body (after the request's own extraBody). */
  extraBody?: Record<string, unknown>;
  headers?: Record<string, string>;
  dispatcher: Dispatcher;
}

export interface SendResult {
  record: RequestRecord;
  /** The generated text (for multi-turn with actual replies). */
  text: string;
}

export function endpointUrl(base: string, endpoint: Endpoint): string {
  let b = base.replace(/\/+$/, "");
  if (!b.endsWith("/v1")) b += "/v1";
  return `${b}/${endpoint === "chat" ? "chat/completions" : "completions"}`;
}

export function buildBody(cfg: ClientConfig, req: BenchRequest): Record<string, unknown> {
  const body: Record<string, unknown> = { model: cfg.model, max_tokens: req.maxTokens, stream: cfg.stream };
  if (cfg.endpoint === "chat") {
    body.messages = req.messages ?? [{ role: "user", content: req.prompt ?? "" }];
  } else {
    body.prompt = req.prompt ?? renderChatML(req.messages ?? []);
  }
  if (cfg.stream) body.stream_options = { include_usage: true };
  if (cfg.ignoreEos) body.ignore_eos = true;
  Object.assign(body, req.extraBody, cfg.extraBody);
  return body;
}

class Malformed extends Error {
  readonly kind: ErrorKind;
  constructor(message: string, kind: ErrorKind = "malformed") {
    super(message);
    this.kind = kind;
  }
}

interface Usage {
  prompt_tokens?: number;
  completion_tokens?: number;
  prompt_tokens_details?: { cached_tokens?: number } | null;
}

/**
 * Sends one request and measures it. Never throws: every failure becomes an error kind on the
 * record. `runStart` is the performance.now() of the run start; `signal` cancels the run.
 */
export async function sendRequest(
  cfg: ClientConfig,
  req: BenchRequest,
  runStart: number,
  signal?: AbortSignal,
): Promise<SendResult> {
  const t0 = performance.now();
  const rec: RequestRecord = {
    index: req.index,
    group: req.group ?? null,
    ok: false,
    error: null,
    error_message: null,
    start_ms: us(t0 - runStart),
    ttft_ms: null,
    e2e_ms: null,
    itl_ms: [],
    tpot_ms: null,
    prompt_tokens: null,
    completion_tokens: null,
    cached_tokens: null,
    usage_reported: false,
    chunks: 0,
  };
  let text = "";
  const ac = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    ac.abort();
  }, cfg.timeoutMs);
  const onCancel = () => ac.abort();
  signal?.addEventListener("abort", onCancel, { once: true });
  const headers: Record<string, string> = { "content-type": "application/json", ...cfg.headers };
  if (cfg.apiKey) headers.authorization = `Bearer ${cfg.apiKey}`;
  try {
    if (signal?.aborted) throw new Error("cancelled before start");
    const res = await request(endpointUrl(cfg.url, cfg.endpoint), {
      method: "POST",
      headers,
      body: JSON.stringify(buildBody(cfg, req)),
      signal: ac.signal,
      dispatcher: cfg.dispatcher,
      headersTimeout: 0,
      bodyTimeout: 0,
    });
    if (res.statusCode < 200 || res.statusCode >= 300) {
      const errText = (await res.body.text()).slice(0, 300);
      rec.error = `http_${res.statusCode}`;
      rec.error_message = errText;
      return { record: rec, text };
    }
    const read = cfg.stream ? await readStream(res.body, cfg, rec, t0) : await readWhole(res.body, cfg, rec);
    text = read.text;
    measured(rec, read.usage, t0, cfg.stream);
    rec.ok = true;
    return { record: rec, text };
  } catch (e) {
    const [kind, msg] = classify(e, timedOut, signal?.aborted === true);
    rec.error = kind;
    rec.error_message = msg;
    rec.ttft_ms = null;
    rec.itl_ms = [];
    return { record: rec, text: "" };
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onCancel);
  }
}

type Body = AsyncIterable<unknown> & { text(): Promise<string> };

/** A streamed answer: TTFT and ITL from its content chunks, its usage chunk if any. */
async function readStream(
  body: Body,
  cfg: ClientConfig,
  rec: RequestRecord,
  t0: number,
): Promise<{ text: string; usage: Usage | null }> {
  const parser = new SseParser();
  let text = "";
  let usage: Usage | null = null;
  let done = false;
  let last = 0;
  const onData = (data: string) => {
    if (done) return;
    if (data === "[DONE]") {
      done = true;
      return;
    }
    let chunk: Record<string, unknown>;
    try {
      chunk = JSON.parse(data) as Record<string, unknown>;
    } catch {
      throw new Malformed(`bad JSON in stream: ${data.slice(0, 120)}`);
    }
    if (chunk.error) throw new Malformed(JSON.stringify(chunk.error).slice(0, 300), "stream_error");
    if (chunk.usage) usage = chunk.usage as Usage;
    const piece = chunkText(chunk, cfg.endpoint);
    if (piece) {
      const now = performance.now();
      if (rec.chunks === 0) rec.ttft_ms = now - t0;
      else rec.itl_ms.push(us(now - last));
      last = now;
      rec.chunks++;
      text += piece;
    }
  };
  for await (const buf of body) for (const d of parser.push(buf as Buffer)) onData(d);
  for (const d of parser.end()) onData(d);
  if (!done) throw new Malformed("stream ended without [DONE]");
  return { text, usage };
}

/** A whole (non-streamed) answer: one chunk. */
async function readWhole(
  body: Body,
  cfg: ClientConfig,
  rec: RequestRecord,
): Promise<{ text: string; usage: Usage | null }> {
  const raw = await body.text();
  let obj: Record<string, unknown>;
  try {
    obj = JSON.parse(raw) as Record<string, unknown>;
  } catch {
    throw new Malformed(`bad JSON body: ${raw.slice(0, 120)}`);
  }
  if (!Array.isArray(obj.choices) || obj.choices.length === 0) throw new Malformed("answer has no choices");
  const text = completeText(obj, cfg.endpoint);
  rec.chunks = 1;
  return { text, usage: (obj.usage as Usage | undefined) ?? null };
}

/** E2E, TTFT, token counts (from usage, else content chunks when streamed) and TPOT. */
function measured(rec: RequestRecord, u: Usage | null, t0: number, stream: boolean): void {
  const end = performance.now();
  rec.e2e_ms = us(end - t0);
  rec.ttft_ms = rec.ttft_ms === null ? rec.e2e_ms : us(rec.ttft_ms);
  if (u) {
    rec.usage_reported = true;
    rec.prompt_tokens = u.prompt_tokens ?? null;
    rec.completion_tokens = u.completion_tokens ?? null;
    rec.cached_tokens = u.prompt_tokens_details?.cached_tokens ?? 0;
  } else if (stream) {
    rec.completion_tokens = rec.chunks;
  }
  const outTok = rec.completion_tokens ?? 0;
  if (outTok >= 2) rec.tpot_ms = us((rec.e2e_ms - rec.ttft_ms) / (outTok - 1));
}

/** Milliseconds rounded to the microsecond: finer digits are noise and bloat the JSON. */
function us(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}

function chunkText(chunk: Record<string, unknown>, endpoint: Endpoint): string {
  const choices = chunk.choices as Array<Record<string, unknown>> | undefined;
  const c = choices?.[0];
  if (!c) return "";
  if (endpoint === "completions") return typeof c.text === "string" ? c.text : "";
  const delta = c.delta as Record<string, unknown> | undefined;
  const content = delta?.content ?? delta?.reasoning_content;
  return typeof content === "string" ? content : "";
}

function completeText(obj: Record<string, unknown>, endpoint: Endpoint): string {
  const c = (obj.choices as Array<Record<string, unknown>>)[0];
  if (endpoint === "completions") return typeof c.text === "string" ? c.text : "";
  const m = c.message as Record<string, unknown> | undefined;
  return typeof m?.content === "string" ? m.content : "";
}

function classify(e: unknown, timedOut: boolean, cancelled: boolean): [ErrorKind, string] {
  const err = e as Error & { code?: string };
  const msg = err?.message ?? String(e);
  if (timedOut) return ["timeout", "request timeout"];
  if (cancelled) return ["cancelled", "run cancelled"];
  if (e instanceof Malformed) return [e.kind, msg];
  if (e instanceof undiciErrors.HeadersTimeoutError || e instanceof undiciErrors.BodyTimeoutError) {
    return ["timeout", msg];
  }
  return ["connection", err?.code ? `${err.code}: ${msg}` : msg];
}
