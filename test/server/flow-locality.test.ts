/**
 * Flow control's locality (src/router/flow/locality.ts) through a real server: two simulated
 * engines publishing KV events over ZMQ, the `kv-aware` preset, the `load` headroom signal at one
 * in-flight request per worker. A conversation's first turn leaves its history on one worker
 * (its "home"); a long streamed request sharing that history holds the home, so the next turn
 * finds headroom only on the other worker. With `flow.locality` the turn waits for its home:
 * when the home frees within `waitMs` it goes there (a warm prefill); when it does not, it
 * escapes to the other worker after `waitMs`. Before locality it went to the other worker at
 * once (the queue released it wherever headroom was: RESULTS.md Run I).
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import type { DecisionExplanation } from "../../src/router/pipeline/types.ts";
import { type InferaServer, startServer } from "../../src/server/app.ts";
import { createLogger } from "../../src/util/log.ts";
import { parseMetric, type SimProcess, simWorkerRecord, startSim } from "../helpers/sim.ts";
import { waitUntil } from "../helpers/wait.ts";

const BS = 16;
const WAIT_MS = 2500;
const logger = createLogger("test");
logger.level = "silent";

const history = Array.from(
  { length: 60 },
  (_, i) => `Turn ${i}: the user asked about item ${i * 7} and the assistant explained it at length.`,
).join(" ");
const turn = (q: string) => [
  { role: "user" as const, content: history },
  { role: "user" as const, content: q },
];

describe("infera server: flow control keeps a queued turn on the worker holding its history", () => {
  let sims: SimProcess[] = [];
  let server: InferaServer;
  before(async () => {
    sims = await Promise.all(
      ["a", "b"].map(() => startSim({ args: ["--block-size", String(BS), "--speed", "0.05"] })),
    );
    const memory = new MemoryDiscovery(
      ["a", "b"].map((id, i) =>
        simWorkerRecord(sims[i]!, { id, model: "sim-model", maxModelLen: 32768, blockSize: BS }),
      ),
    );
    server = await startServer(
      {
        host: "127.0.0.1",
        port: 0,
        policy: "kv-aware",
        flow: {
          enabled: true,
          headroom: [{ name: "load", params: { maxInFlight: 1, maxWaiting: 1000, maxKvUsage: 1 } }],
          maxWaitMs: 60_000,
          locality: { waitMs: WAIT_MS, minGainTokens: 64 },
        },
      },
      { discovery: memory, logger },
    );
    await new Promise((r) => setTimeout(r, 300)); // SUB sockets joined
  });
  after(async () => {
    await server?.close();
    await Promise.all(sims.map((s) => s.stop()));
  });

  const send = (q: string, requestId: string, o: { maxTokens?: number; signal?: AbortSignal } = {}) =>
    fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": requestId },
      body: JSON.stringify({
        model: "sim-model",
        messages: turn(q),
        max_tokens: o.maxTokens ?? 2,
        ignore_eos: true,
        stream: o.maxTokens !== undefined,
      }),
      signal: o.signal,
    });

  async function decisionOf(requestId: string): Promise<DecisionExplanation> {
    let found: DecisionExplanation | undefined;
    await waitUntil(
      async () => {
        const r = await fetch(`${server.url}/debug/decisions?limit=256`);
        found = ((await r.json()) as { data: DecisionExplanation[] }).data.find(
          (x) => x.requestId === requestId,
        );
        return found !== undefined;
      },
      10_000,
      `decision of ${requestId}`,
    );
    return found!;
  }

  /** A long stream sharing the history: the router sends it home (its prefix), where it holds the only slot. */
  async function holdHome(home: string, id: string) {
    const ac = new AbortController();
    const r = await send(`${id}: tell me everything`, id, { maxTokens: 4000, signal: ac.signal });
    assert.equal(r.status, 200);
    // Drained, so the GC cannot cancel an unread stream (test/server/flow.test.ts).
    const drained = r.body ? r.body.pipeTo(new WritableStream()).catch(() => {}) : Promise.resolve();
    assert.equal((await decisionOf(id)).winner, home, "the blocker went home by its prefix");
    return () => {
      ac.abort();
      return drained;
    };
  }

  const locality = async (outcome: string) =>
    parseMetric(await (await fetch(`${server.url}/metrics`)).text(), "infera_flow_locality_total", {
      outcome,
    }) ?? 0;

  let home = "";
  it("the first turn leaves the history on one worker", async () => {
    const r = await send("first question", "t1");
    assert.equal(r.status, 200, await r.clone().text());
    await r.json();
    home = (await decisionOf("t1")).winner;
    const index = server.kvIngest!.indexFor("sim-model")!;
    await waitUntil(async () => index.blockCount(home) > 20, 5000, "the history indexed on its worker");
  });

  it("a queued turn waits for its home and goes there when it frees within the wait", async () => {
    const release = await holdHome(home, "hold-1");
    const deferredBefore = await locality("deferred");
    const t0 = Date.now();
    const next = send("second question", "t2");
    // It waits (the other worker is free): nothing comes back while the home is held.
    await waitUntil(async () => (await locality("deferred")) > deferredBefore, 5000, "deferred for locality");
    await new Promise((r) => setTimeout(r, 300));
    await release();
    const r = await next;
    assert.equal(r.status, 200);
    const body = (await r.json()) as { usage: { prompt_tokens_details?: { cached_tokens?: number } } };
    assert.equal(
      (await decisionOf("t2")).winner,
      home,
      "the turn went back to the worker holding its history",
    );
    assert.ok(Date.now() - t0 >= 300, "it waited for the home");
    // The engine's own count: the history was a cache hit there.
    assert.ok((body.usage.prompt_tokens_details?.cached_tokens ?? 0) > 20 * BS, JSON.stringify(body.usage));
  });

  it("escapes to the other worker once the wait is over", async () => {
    const release = await holdHome(home, "hold-2");
    const escapedBefore = await locality("escaped");
    const t0 = Date.now();
    const r = await send("third question", "t3");
    const waited = Date.now() - t0;
    assert.equal(r.status, 200);
    await r.json();
    assert.notEqual((await decisionOf("t3")).winner, home, "it left its held home");
    assert.ok(waited >= WAIT_MS - 50, `it waited its locality wait first (${waited} ms)`);
    assert.equal(await locality("escaped"), escapedBefore + 1);
    await release();
  });
});
