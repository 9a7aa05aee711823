/**
 * SGLang's native `POST /generate`, served by the sim's own completions path over loopback.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { BadRequestError } from "../../../protocol/errors.ts";
import type { PersonalityRouteDeps } from "./types.ts";

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/** A JSON object body (empty: `{}`); anything else is a 400. Shared with native-apis.ts. */
export function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
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
  deps: PersonalityRouteDeps,
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
