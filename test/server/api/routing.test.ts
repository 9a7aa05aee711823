/**
 * /v1/responses and /v1/messages are routed like chat (issue #31 item 1): the prefix the
 * scheduler sees is the translated messages (`instructions` + `input` items, `system` +
 * `messages`), so a chat request that continues the same conversation lands on the worker that
 * served it, and its approx-prefix score shows the match. Real sims, the server in-process,
 * decisions read from GET /debug/decisions.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import Anthropic from "@anthropic-ai/sdk";
import { type Cluster, startCluster } from "../cluster.ts";

const MODEL = "sim-model";

interface Decision {
  requestId: string;
  winner: string;
  candidates: Array<{ worker: string; scores: Record<string, number> }>;
}

describe("translated endpoints are routed by the same prefix as chat", () => {
  let c: Cluster;
  before(async () => {
    c = await startCluster(2, { config: { policy: "approx-prefix" } });
  });
  after(async () => {
    await c?.close();
  });

  const decision = async (id: string): Promise<Decision> => {
    const r = (await (await fetch(`${c.server.url}/debug/decisions`)).json()) as { data: Decision[] };
    const d = r.data.find((x) => x.requestId === id);
    assert.ok(d, `decision for ${id}`);
    return d;
  };

  it("a Responses or Messages conversation and its chat continuation go to one worker", async () => {
    const anthropic = new Anthropic({ baseURL: c.server.url, apiKey: "none", maxRetries: 0 });
    for (let i = 0; i < 4; i++) {
      const system = `You are assistant number ${i}. ${"Follow the house style carefully. ".repeat(40)}`;
      const user = `Question ${i}: ${"tell me about the weather in a long way. ".repeat(20)}`;
      const first = `first-${i}`;
      if (i % 2 === 0)
        await c.client.responses.create(
          { model: MODEL, instructions: system, input: user, max_output_tokens: 2 },
          { headers: { "x-request-id": first } },
        );
      else
        await anthropic.messages.create(
          { model: MODEL, system, max_tokens: 2, messages: [{ role: "user", content: user }] },
          { headers: { "x-request-id": first } },
        );
      const next = `next-${i}`;
      await c.client.chat.completions.create(
        {
          model: MODEL,
          messages: [
            { role: "system", content: system },
            { role: "user", content: user },
          ],
          max_tokens: 2,
        },
        { headers: { "x-request-id": next } },
      );
      const a = await decision(first);
      const b = await decision(next);
      assert.equal(b.winner, a.winner, `request ${i}: the chat continuation follows its prefix`);
      const score = (d: Decision, w: string) =>
        d.candidates.find((x) => x.worker === w)?.scores["approx-prefix"];
      const other = b.candidates.find((x) => x.worker !== b.winner)!.worker;
      assert.ok(
        (score(b, b.winner) ?? 0) < (score(b, other) ?? 0),
        `the winner's prefix cost is lower (${JSON.stringify(b.candidates)})`,
      );
    }
  });
});
