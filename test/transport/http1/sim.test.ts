/**
 * The raw HTTP/1.1 client end to end: `infera server` proxying to a real sim through its
 * request plane (now `Http1Pool`), driven by the official `openai` client, non-streamed,
 * streamed (a chunked event stream of many events) and concurrently; with the load scraper's
 * `/metrics` GETs on the same pool.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import type { InferaServer } from "../../../src/server/index.ts";
import { gatewayFor } from "../../helpers/gateway.ts";
import { type SimProcess, startSim } from "../../helpers/sim.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

describe("raw HTTP/1.1 request plane, end to end with a sim and the openai client", () => {
  let sim: SimProcess;
  let server: InferaServer;
  let client: OpenAI;

  before(async () => {
    sim = await startSim({ model: "h1", args: ["--speed", "1000", "--seed", "7"], timeoutMs: 60_000 });
    ({ server, client } = await gatewayFor(sim.url, "h1"));
  });
  after(async () => {
    await server?.close();
    await sim?.stop();
  });

  const messages = [{ role: "user" as const, content: "Say something." }];

  it("a non-streamed answer arrives whole, with its usage", async () => {
    const r = await client.chat.completions.create({ model: "h1", messages, max_tokens: 12 });
    assert.equal(r.object, "chat.completion");
    assert.ok((r.choices[0]?.message.content ?? "").length > 0);
    assert.equal(r.usage?.completion_tokens, 12);
  });

  it("a streamed answer arrives as events, then the usage", async () => {
    const s = await client.chat.completions.create({
      model: "h1",
      messages,
      max_tokens: 64,
      stream: true,
      stream_options: { include_usage: true },
    });
    let events = 0;
    let text = "";
    let finish: string | null = null;
    let tokens = 0;
    for await (const c of s) {
      events++;
      text += c.choices[0]?.delta.content ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
      tokens = c.usage?.completion_tokens ?? tokens;
    }
    // The sim sends the tokens of one engine step in one event, so events ≤ tokens here.
    assert.ok(tokens > 0 && events >= 2, `${events} events for ${tokens} tokens`);
    assert.ok(text.length > 0);
    assert.ok(finish === "length" || finish === "stop", String(finish));
  });

  it("concurrent streamed and non-streamed requests, with scrapes between, all complete", async () => {
    const one = async (i: number): Promise<number> => {
      if (i % 2 === 0) {
        const r = await client.chat.completions.create({ model: "h1", messages, max_tokens: 5 });
        return r.usage?.completion_tokens ?? 0;
      }
      const s = await client.chat.completions.create({
        model: "h1",
        messages,
        max_tokens: 5,
        stream: true,
        stream_options: { include_usage: true },
      });
      let n = 0;
      for await (const c of s) n = c.usage?.completion_tokens ?? n;
      return n;
    };
    for (let round = 0; round < 3; round++) {
      const got = await Promise.all(Array.from({ length: 12 }, (_, i) => one(i)));
      assert.deepEqual(got, Array(12).fill(5));
      await server.scraper.scrapeAll();
    }
    assert.ok(server.workers.list()[0]?.engineLoad, "the scrape over the raw pool read the engine's load");
  });
});
