/**
 * The engines' own `POST /v1/responses` and `POST /v1/messages`, minimal: vLLM serves both
 * (vllm-project/vllm vllm/entrypoints/openai/responses/api_router.py @ f6e93254,
 * vllm/entrypoints/anthropic/api_router.py @ 42fa4c09), SGLang serves Responses
 * (sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_responses.py @
 * 41c3e5a4c5fb0114363606c010dcf0377d29acfc). Each engine builds them on its chat pipeline
 * (vLLM's Anthropic serving subclasses its chat serving), so the sim answers them from its own
 * chat completions over loopback — same scheduling, timing, prefix cache and metrics — with the
 * request and answer mapped as the gateway maps them (src/server/api/): the stateless subset,
 * answers in OpenAI's and Anthropic's shapes. Errors keep the sim's (the engine's) error shape.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { ChatCompletion } from "../../../server/api/chat-sse.ts";
import { chatChunks } from "../../../server/api/chat-sse.ts";
import { messagesTranslation } from "../../../server/api/messages.ts";
import { responsesTranslation } from "../../../server/api/responses.ts";
import type { Translation } from "../../../server/api/translated.ts";
import { readJson } from "./sglang-generate.ts";
import type { PersonalityRouteDeps, PostRoute } from "./types.ts";

function overChat(t: Translation): PostRoute {
  return async (deps: PersonalityRouteDeps, req: IncomingMessage, res: ServerResponse) => {
    const client = await readJson(req);
    const chat = t.toChat(client);
    const stream = chat.stream === true;
    if (stream) chat.stream_options = { include_usage: true };
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (deps.cfg.apiKey) headers.authorization = `Bearer ${deps.cfg.apiKey}`;
    const rid = req.headers["x-request-id"];
    if (typeof rid === "string") headers["x-request-id"] = rid;
    const ac = new AbortController();
    res.on("close", () => ac.abort());
    const port = req.socket.localPort ?? deps.cfg.port;
    const r = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: "POST",
      headers,
      body: JSON.stringify(chat),
      signal: ac.signal,
    });
    if (!r.ok) {
      // The chat layer's refusal, in the engine's own error shape, as the engine would give it.
      res.writeHead(r.status, { "content-type": "application/json" });
      res.end(await r.text());
      return;
    }
    if (!stream) {
      const out = JSON.stringify(t.whole((await r.json()) as ChatCompletion, client));
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(out) });
      res.end(out);
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const s = t.streamer(client);
    res.write(s.start(() => undefined));
    let usage: Parameters<typeof s.end>[0] = null;
    for await (const c of chatChunks(r.body as unknown as AsyncIterable<Uint8Array>)) {
      if (c.usage) usage = c.usage;
      res.write(s.chunk(c));
    }
    res.end(s.end(usage));
  };
}

export const responsesRoute: PostRoute = overChat(responsesTranslation);
export const messagesRoute: PostRoute = overChat(messagesTranslation);
