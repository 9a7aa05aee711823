/**
 * What differs between the personalities' HTTP surfaces: the DP-rank pin, the unknown-model
 * answer, and the native routes (SGLang /generate, /get_server_info, /get_model_info; ATOM
 * /server_info, /kv_transfer_info).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { BadRequestError } from "../../protocol/errors.ts";
import type { SimConfig } from "./config.ts";
import type { SimEngine } from "./engine.ts";

/** Minimal view of the API's dependencies (kept apart from api.ts to avoid an import cycle). */
interface RouteDeps {
  cfg: SimConfig;
  engines: SimEngine[];
}

/**
 * ATOM refuses a model name other than its served name with FastAPI's HTTPException shape:
 * ROCm/ATOM atom/entrypoints/openai/api_server.py validate_model() @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21
 * → 400 {"detail": "Requested model 'X' does not match server model 'Y'"} (trailing "/" ignored).
 * vLLM answers 404 model_not_found (OpenAI shape, openai-request.ts).
 */
export class AtomModelMismatchError extends Error {
  readonly status = 400;
  constructor(requested: string, served: string) {
    super(`Requested model '${requested}' does not match server model '${served}'`);
    this.name = "AtomModelMismatchError";
  }
  /** FastAPI's HTTPException body. */
  toJSON(): { detail: string } {
    return { detail: this.message };
  }
}

export function checkModelName(cfg: SimConfig, body: unknown): void {
  if (cfg.engine !== "atom" || body === null || typeof body !== "object") return;
  const model = (body as Record<string, unknown>).model;
  if (typeof model !== "string") return;
  const served = cfg.servedModelNames[0];
  if (model.replace(/\/+$/, "") !== served.replace(/\/+$/, ""))
    throw new AtomModelMismatchError(model, served);
  // Accepted (a trailing "/" aside): the rest of the request path sees the served name.
  (body as Record<string, unknown>).model = served;
}

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/**
 * The rank a request pins, if any:
 * - vLLM: header `X-data-parallel-rank` (vllm/entrypoints/openai/serving_engine.py _get_data_parallel_rank).
 * - SGLang: header `X-Data-Parallel-Rank` over body `routed_dp_rank` (deprecated `data_parallel_rank`)
 *   (python/sglang/srt/entrypoints/openai/serving_base.py extract_routed_dp_rank_from_header).
 * - ATOM: body `data_parallel_rank` (atom/entrypoints/openai/api_server.py, request.data_parallel_rank).
 */
export function pinnedRank(
  cfg: SimConfig,
  req: IncomingMessage,
  body: Record<string, unknown>,
): number | null {
  let raw: unknown;
  if (cfg.engine === "vllm") raw = header(req, "x-data-parallel-rank");
  else if (cfg.engine === "sglang")
    raw = header(req, "x-data-parallel-rank") ?? body.routed_dp_rank ?? body.data_parallel_rank;
  else raw = body.data_parallel_rank;
  if (raw === undefined || raw === null || raw === "") return null;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0)
    throw new BadRequestError(
      `data_parallel_rank must be an integer >= 0 (got ${String(raw)})`,
      "data_parallel_rank",
    );
  return n;
}

let rr = 0;
/** The pinned rank's engine, else the least loaded (running + waiting), ties round-robin. */
export function pickEngine(deps: RouteDeps, req: IncomingMessage, body: Record<string, unknown>): SimEngine {
  const pin = pinnedRank(deps.cfg, req, body);
  if (pin !== null) {
    const e = deps.engines.find((x) => x.rank === pin);
    if (!e)
      throw new BadRequestError(
        `data_parallel_rank ${pin} is out of range [0, ${deps.cfg.dpSize}).`,
        "data_parallel_rank",
      );
    return e;
  }
  if (deps.engines.length === 1) return deps.engines[0];
  const load = (e: SimEngine): number =>
    e.scheduler.running.length + e.scheduler.waiting.length + e.pendingPulls;
  const start = rr++ % deps.engines.length;
  let best = deps.engines[start];
  for (let i = 1; i < deps.engines.length; i++) {
    const e = deps.engines[(start + i) % deps.engines.length];
    if (load(e) < load(best)) best = e;
  }
  return best;
}

/** GET routes of the personality's own (non-OpenAI) surface, or null. */
export function personalityGetRoute(deps: RouteDeps, path: string): (() => unknown) | null {
  const { cfg } = deps;
  if (cfg.engine === "sglang") {
    if (path === "/get_server_info" || path === "/server_info")
      return () => ({
        model_path: cfg.model,
        served_model_name: cfg.servedModelNames[0],
        tp_size: cfg.tpSize,
        dp_size: cfg.dpSize,
        page_size: cfg.blockSize,
        context_length: cfg.maxModelLen,
        max_running_requests: cfg.maxNumSeqs,
        chunked_prefill_size: cfg.maxNumBatchedTokens,
        disaggregation_mode: cfg.role === "mixed" ? "null" : cfg.role,
        disaggregation_bootstrap_port: cfg.kvTransferConfig.bootstrap_port ?? 8998,
        host: cfg.host,
        port: cfg.port,
        version: "0.0.0-infera-sim",
      });
    if (path === "/get_model_info" || path === "/model_info")
      return () => ({
        model_path: cfg.model,
        tokenizer_path: cfg.tokenizerDir ?? cfg.model,
        is_generation: true,
        preferred_sampling_params: null,
        weight_version: "default",
        has_image_understanding: false,
        has_audio_understanding: false,
      });
  }
  if (cfg.engine === "atom") {
    // ROCm/ATOM atom/entrypoints/openai/api_server.py server_info() / kv_transfer_info() @ ffdf3bb5
    if (path === "/server_info")
      return () => ({
        model_id: cfg.servedModelNames[0],
        served_model_name: cfg.servedModelNames[0],
        tp_size: cfg.tpSize,
        dp_size: cfg.dpSize,
      });
    if (path === "/kv_transfer_info")
      return () => ({
        tp_size: cfg.tpSize,
        dp_size: cfg.dpSize,
        kv_role: cfg.kvTransferConfig.kv_role ?? null,
        handshake_port: cfg.kvTransferConfig.handshake_port ?? 6301,
      });
  }
  return null;
}

function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      try {
        const text = Buffer.concat(chunks).toString("utf8");
        const v = text.length === 0 ? {} : (JSON.parse(text) as unknown);
        if (v === null || typeof v !== "object" || Array.isArray(v))
          reject(new BadRequestError("body must be a JSON object"));
        else resolve(v as Record<string, unknown>);
      } catch (err) {
        reject(new BadRequestError(`invalid JSON: ${(err as Error).message}`));
      }
    });
    req.on("error", reject);
  });
}

interface CompletionChoice {
  text: string;
  finish_reason: string | null;
}

/**
 * SGLang's native `POST /generate` (python/sglang/srt/entrypoints/http_server.py generate_request;
 * GenerateReqInput in managers/io_struct.py): `text` or `input_ids`, `sampling_params`
 * (max_new_tokens, stop, ignore_eos, temperature...), `stream`, `rid`. The answer is
 * `{text, output_ids?, meta_info: {id, finish_reason: {type, ...}, prompt_tokens,
 * completion_tokens, cached_tokens}}`; streamed, each `data:` event carries the text so far,
 * then `data: [DONE]`. Served by the sim's own completions path over loopback, so scheduling,
 * timing, prefix caching and metrics are the same as for /v1/completions.
 */
export async function handleGenerate(
  deps: RouteDeps,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  const body = await readJson(req);
  const prompt = body.input_ids ?? body.text;
  if (prompt === undefined)
    throw new BadRequestError("Either text, input_ids or input_embeds should be provided.", "text");
  const sp = (body.sampling_params ?? {}) as Record<string, unknown>;
  const stream = body.stream === true;
  const rid = typeof body.rid === "string" ? body.rid : undefined;
  const completion: Record<string, unknown> = {
    model: deps.cfg.servedModelNames[0],
    prompt,
    stream,
    max_tokens: sp.max_new_tokens ?? 128,
    ...(sp.stop !== undefined ? { stop: sp.stop } : {}),
    ...(sp.ignore_eos !== undefined ? { ignore_eos: sp.ignore_eos } : {}),
    ...(sp.temperature !== undefined ? { temperature: sp.temperature } : {}),
    ...(stream ? { stream_options: { include_usage: true } } : {}),
    ...(body.routed_dp_rank !== undefined ? { routed_dp_rank: body.routed_dp_rank } : {}),
    ...(body.data_parallel_rank !== undefined ? { data_parallel_rank: body.data_parallel_rank } : {}),
  };
  const port = req.socket.localPort ?? deps.cfg.port;
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (rid) headers["x-request-id"] = rid;
  const dpHeader = header(req, "x-data-parallel-rank");
  if (dpHeader) headers["x-data-parallel-rank"] = dpHeader;
  if (deps.cfg.apiKey) headers.authorization = `Bearer ${deps.cfg.apiKey}`;
  const ac = new AbortController();
  res.on("close", () => ac.abort());
  const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: "POST",
    headers,
    body: JSON.stringify(completion),
    signal: ac.signal,
  });
  const id = rid ?? r.headers.get("x-request-id") ?? "";
  const meta = (finish: string | null, usage: Record<string, unknown> | undefined) => ({
    id,
    finish_reason:
      finish === null
        ? null
        : finish === "length"
          ? { type: "length", length: usage?.completion_tokens ?? 0 }
          : { type: "stop", matched: null },
    prompt_tokens: usage?.prompt_tokens ?? 0,
    completion_tokens: usage?.completion_tokens ?? 0,
    cached_tokens: (usage?.prompt_tokens_details as Record<string, unknown> | undefined)?.cached_tokens ?? 0,
  });
  if (!r.ok) {
    const text = await r.text();
    res.writeHead(r.status, { "content-type": "application/json" });
    res.end(text);
    return;
  }
  if (!stream) {
    const j = (await r.json()) as { choices: CompletionChoice[]; usage?: Record<string, unknown> };
    const c = j.choices[0];
    const out = JSON.stringify({ text: c.text, meta_info: meta(c.finish_reason, j.usage) });
    res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(out) });
    res.end(out);
    return;
  }
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  let text = "";
  let finish: string | null = null;
  let buf = "";
  const decoder = new TextDecoder();
  for await (const chunk of r.body as unknown as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true });
    let nl = buf.indexOf("\n\n");
    while (nl >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 2);
      nl = buf.indexOf("\n\n");
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") continue;
      const ev = JSON.parse(data) as { choices: CompletionChoice[]; usage?: Record<string, unknown> };
      const c = ev.choices[0];
      if (c) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
        if (!c.finish_reason)
          res.write(`data: ${JSON.stringify({ text, meta_info: meta(null, undefined) })}\n\n`);
      }
      if (ev.usage) res.write(`data: ${JSON.stringify({ text, meta_info: meta(finish, ev.usage) })}\n\n`);
    }
  }
  res.end("data: [DONE]\n\n");
}
