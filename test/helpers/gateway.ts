/**
 * `infera server` in-process in front of one worker URL (memory discovery, the scraper's timer
 * off: tests scrape when they want), with the official `openai` client pointed at it.
 */
import OpenAI from "openai";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { waitUntil } from "./wait.ts";

export interface Gateway {
  server: InferaServer;
  client: OpenAI;
}

/** Starts the server with worker `w` at `url` serving `model` (vLLM), once it is registered. */
export async function gatewayFor(url: string, model: string): Promise<Gateway> {
  const memory = new MemoryDiscovery([completeRecord({ id: "w", url, model, engine: "vllm" })]);
  const server = await startServer({ port: 0, scrapeIntervalMs: 0 }, { discovery: memory });
  await waitUntil(() => server.workers.list().length === 1, 15_000, "worker registered");
  const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
  return { server, client };
}
