/**
 * A fleet behind a real `infera server` (static discovery from the fleet's manifest) with the
 * kv-aware policy: the router sees every engine as its own worker, with its own KV-event
 * stream, and sends each follow-up to the one engine that holds its prefix.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import type { PartialWorkerRecord } from "../../../src/discovery/static.ts";
import { kvEventsReceived, parseMetric } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";
import { type FleetProcess, type ServerProcess, spawnFleet, startStaticServer } from "./fleet-helpers.ts";

const MODEL = "fleet-kv-model";
const N = 4;
const docs = ["alpha", "bravo", "charlie", "delta"].map((w) =>
  Array.from(
    { length: 30 },
    (_, i) => `The ${w} manual, section ${i}, covers procedure ${w}-${i * 13}.`,
  ).join(" "),
);
const chat = (doc: string, q: string) => [
  { role: "system" as const, content: doc },
  { role: "user" as const, content: q },
];

async function promptTokens(url: string): Promise<number> {
  const t = await (await fetch(`${url}/metrics`)).text();
  return parseMetric(t, "vllm:prompt_tokens_total") ?? 0;
}

describe(`infera server --policy kv-aware over a fleet of ${N}`, () => {
  let fleet: FleetProcess;
  let server: ServerProcess;
  before(async () => {
    fleet = await spawnFleet(N, [
      "serve",
      MODEL,
      "--host",
      "127.0.0.1",
      "--port",
      "0",
      "--kv-events-config",
      JSON.stringify({
        enable_kv_cache_events: true,
        publisher: "zmq",
        endpoint: "tcp://127.0.0.1:*",
        replay_endpoint: "tcp://127.0.0.1:*",
        topic: "kv-events",
      }),
      "--speed",
      "20",
    ]);
    const records: PartialWorkerRecord[] = fleet.manifest.engines.map((e) => ({
      id: `fleet-${e.index}`,
      url: e.url,
      model: MODEL,
      servedModelNames: [MODEL],
      engine: "sim",
      role: "mixed",
      blockSize: 16,
      maxModelLen: 8192,
      kvEvents: {
        endpoint: e.kvRanks[0].endpoint,
        replayEndpoint: e.kvRanks[0].replayEndpoint ?? undefined,
        topic: "kv-events",
        framing: "seq",
      },
    }));
    server = await startStaticServer(records, ["--policy", "kv-aware"]);
  });
  after(async () => {
    await server?.stop();
    await fleet?.stop();
  });

  it("every engine is a worker of its own; each follow-up goes to the engine holding its document", async () => {
    const urls = fleet.manifest.engines.map((e) => e.url);
    const workers = (await (await fetch(`${server.url}/v1/workers`)).json()) as {
      data: { url: string; kvEvents?: { endpoint: string } }[];
    };
    assert.deepEqual(workers.data.map((w) => w.url).sort(), [...urls].sort());
    assert.equal(new Set(workers.data.map((w) => w.kvEvents?.endpoint)).size, N);
    // The server receives every engine's events (not a sleep while its SUB sockets join).
    const batches = async (d: number) =>
      parseMetric(await (await fetch(`${server.url}/metrics`)).text(), "infera_kv_event_batches_total", {
        worker: `fleet-${d}`,
      }) ?? 0;
    for (let d = 0; d < N; d++) {
      const before = await batches(d);
      // No reset: its AllBlocksCleared could still be on its way when `sent` is read below.
      await kvEventsReceived({ url: urls[d]!, model: MODEL }, async () => (await batches(d)) > before, {
        reset: false,
      });
    }
    const sent = await Promise.all(urls.map((_, d) => batches(d)));

    // Engine d reads document d, straight (not through the router): only its events say so.
    for (let d = 0; d < N; d++) {
      const r = await fetch(`${urls[d]}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: MODEL, messages: chat(docs[d], "warm-up"), max_tokens: 2 }),
      });
      assert.equal(r.status, 200, await r.text());
    }
    // Each engine's BlockStored (its one batch since `sent`) reached the server's index.
    await waitUntil(
      async () => (await Promise.all(urls.map((_, d) => batches(d)))).every((n, d) => n > sent[d]!),
      10_000,
      "the warm-ups' KV events",
    );
    const m = await (await fetch(`${server.url}/metrics`)).text();
    assert.ok((parseMetric(m, "infera_kv_events_total", { type: "BlockStored" }) ?? 0) >= N, m);

    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
    // Each question, sent in turn, is served by the engine holding its document (the one
    // engine whose prompt-token counter moves), with that document's blocks as cached tokens.
    for (const d of [2, 0, 3, 1, 1, 3]) {
      const before = await Promise.all(urls.map(promptTokens));
      const r = await client.chat.completions.create({
        model: MODEL,
        messages: chat(docs[d], `question for ${d}`),
        max_tokens: 3,
      });
      const after = await Promise.all(urls.map(promptTokens));
      const served = after.map((v, i) => v - before[i]);
      assert.deepEqual(
        served.map((v) => v > 0),
        urls.map((_, i) => i === d),
        `doc ${d} served by ${JSON.stringify(served)}`,
      );
      assert.ok((r.usage?.prompt_tokens_details?.cached_tokens ?? 0) >= 200, JSON.stringify(r.usage));
    }
  });
});
