/**
 * session-affinity through a real server (issue #29 item 5): three simulated engines, a profile
 * of `session-affinity` (weight 10) over the `round-robin` scorer (weight 1), the openai client.
 * A session (the `x-session-id` header, or the `user` field) sticks to the worker that served it
 * while requests without one rotate; when that worker saturates (long streams sent straight to
 * its engine, seen through its scraped /metrics) the session escapes to another worker and then
 * sticks there.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { DecisionExplanationJson } from "../../../src/router/pipeline/decision-wire.ts";
import { type InferaServer, startServer } from "../../../src/server/app.ts";
import { createLogger } from "../../../src/util/log.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { type SimProcess, startSim } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";

const MODEL = "sim-model";
const IDS = ["w0", "w1", "w2"];
const logger = createLogger("test");
logger.level = "silent";
let sims: SimProcess[] = [];
let server: InferaServer;
let client: OpenAI;

before(async () => {
  sims = await Promise.all(IDS.map(() => startSim({ args: ["--block-size", "16"] })));
  const memory = new MemoryDiscovery(
    IDS.map((id, i) => mixedRecord({ id, model: MODEL, url: sims[i]!.url, maxModelLen: 131072 })),
  );
  server = await startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "round-robin",
      scrapeIntervalMs: 100,
      // The load comes from behind this server's back (another replica's, in effect): scrape idle workers as fast.
      scrapeIdleIntervalMs: 100,
      profiles: {
        mixed: {
          scorers: [
            { name: "session-affinity", weight: 10, params: { useUserField: true } },
            { name: "round-robin", weight: 1 },
          ],
          picker: { name: "argmin" },
        },
      },
    },
    { discovery: memory, logger },
  );
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
});

after(async () => {
  await server?.close();
  await Promise.all(sims.map((s) => s.stop()));
});

async function ask(o: { session?: string; user?: string } = {}): Promise<void> {
  await client.chat.completions.create(
    {
      model: MODEL,
      messages: [{ role: "user", content: `turn ${Math.random()}` }],
      max_tokens: 2,
      ...(o.user ? { user: o.user } : {}),
    },
    { headers: o.session ? { "x-session-id": o.session } : {} },
  );
}

async function winners(n: number): Promise<string[]> {
  const r = await fetch(`${server.url}/debug/decisions?model=${MODEL}&limit=${n}`);
  return ((await r.json()) as { data: DecisionExplanationJson[] }).data.map((d) => d.winner);
}

test("a session sticks to its worker, by header or by the user field; others rotate", async () => {
  for (let i = 0; i < 6; i++) await ask({ session: "s1" });
  const s1 = await winners(6);
  assert.equal(new Set(s1).size, 1, `s1 went to ${s1}`);
  for (let i = 0; i < 6; i++) await ask();
  assert.equal(new Set(await winners(6)).size, 3, "requests without a session rotate");
  for (let i = 0; i < 4; i++) {
    await ask({ user: "u2" });
    await ask();
  }
  const mixed = await winners(8);
  const u2 = mixed.filter((_, i) => i % 2 === 0);
  assert.equal(new Set(u2).size, 1, `user u2 went to ${u2}`);
});

test("a session escapes its saturated worker, then sticks to the new one", async () => {
  await ask({ session: "s3" });
  const [home] = await winners(1);
  const sim = sims[IDS.indexOf(home!)]!;
  // Saturate it behind the router's back: long streams straight to its engine.
  const ac = new AbortController();
  const direct = Array.from({ length: 24 }, () =>
    fetch(`${sim.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL,
        messages: [{ role: "user", content: "keep going" }],
        max_tokens: 20000,
        ignore_eos: true,
        stream: true,
      }),
      signal: ac.signal,
    })
      .then(async (r) => {
        // Read on: a stream whose reader goes away is cancelled by the engine.
        for await (const _ of r.body ?? []) if (ac.signal.aborted) break;
      })
      .catch(() => {}),
  );
  try {
    const w = server.workers.list().find((x) => x.record.id === home)!;
    await waitUntil(
      () => (w.engineLoad?.running ?? 0) + (w.engineLoad?.waiting ?? 0) >= 20,
      10000,
      "scraped load",
    );
    await ask({ session: "s3" });
    const [escaped] = await winners(1);
    assert.notEqual(escaped, home, "the saturated worker is left");
    for (let i = 0; i < 3; i++) await ask({ session: "s3" });
    assert.deepEqual(await winners(3), [escaped, escaped, escaped], "and the session sticks to the new one");
  } finally {
    ac.abort();
    await Promise.all(direct);
  }
});
