/**
 * A non-streamed answer the server translates is held whole, so it is read within the same
 * limit a relayed chat answer is checked within (`maxResponseBufferBytes`): past it the
 * translated APIs answer a 502 in their own shape, while the same answer on the chat route is
 * relayed unchecked (relay-whole.ts). The engine is a stand-in giving one oversized chat answer
 * in vLLM's non-streamed ChatCompletionResponse shape.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import { type InferaServer, startServer } from "../../../src/server/index.ts";
import { mixedRecord } from "../../helpers/records.ts";

const MODEL = "big-model";
const LIMIT = 64 * 1024;
const TEXT = "x".repeat(4 * LIMIT);

describe("a translated answer past the response buffer limit", () => {
  let engine: Server;
  let server: InferaServer;
  before(async () => {
    engine = createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            id: "chatcmpl-1",
            object: "chat.completion",
            created: 1,
            model: MODEL,
            choices: [{ index: 0, message: { role: "assistant", content: TEXT }, finish_reason: "stop" }],
            usage: { prompt_tokens: 3, completion_tokens: 9, total_tokens: 12 },
          }),
        );
      });
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
    const memory = new MemoryDiscovery([mixedRecord({ id: "w0", model: MODEL, url, engine: "vllm" })]);
    server = await startServer(
      { port: 0, scrapeIntervalMs: 0, maxResponseBufferBytes: LIMIT },
      { discovery: memory },
    );
  });
  after(async () => {
    await server?.close();
    await new Promise((r) => engine?.close(r));
  });

  it("is a 502 in each API's shape; on chat the same answer is relayed", async () => {
    const anthropic = new Anthropic({ baseURL: server.url, apiKey: "none", maxRetries: 0 });
    await assert.rejects(
      anthropic.messages.create({ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "x" }] }),
      (e: unknown) =>
        e instanceof Anthropic.APIError &&
        e.status === 502 &&
        (e.error as { type?: string }).type === "error" &&
        (e.error as { error?: { type?: string } }).error?.type === "api_error",
    );
    const openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
    await assert.rejects(
      openai.responses.create({ model: MODEL, input: "x" }),
      (e: unknown) =>
        e instanceof OpenAI.APIError &&
        e.status === 502 &&
        (e.error as { code?: string }).code === "upstream_response_too_large",
    );
    const chat = await openai.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "x" }],
    });
    assert.equal(chat.choices[0]?.message.content?.length, TEXT.length);
  });
});
