/**
 * Issue #32: upstream connections per request. A TCP relay in front of a sim counts the
 * connections `infera server` opens to the engine while it proxies requests (non-streamed,
 * streamed, concurrent) and scrapes the engine's `/metrics`. Kept-alive connections are reused:
 * sequential requests and scrapes go over one connection, concurrent ones over at most as many
 * as were in flight. Before the fix the scraper used undici's global dispatcher, a second
 * connection set to every engine (one more connect per worker, and twice the sockets on each
 * engine per server replica).
 */
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, describe, it } from "node:test";
import type OpenAI from "openai";
import type { InferaServer } from "../../src/server/index.ts";
import { gatewayFor } from "../helpers/gateway.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

/** Relays TCP to `target`, counting the connections made to it. */
function startCounter(target: number): Promise<{ server: net.Server; url: string; opened: () => number }> {
  let opened = 0;
  const server = net.createServer((c) => {
    opened++;
    const up = net.connect(target, "127.0.0.1");
    c.pipe(up).pipe(c);
    c.on("error", () => up.destroy());
    up.on("error", () => c.destroy());
    c.on("close", () => up.destroy());
    up.on("close", () => c.destroy());
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        server,
        url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
        opened: () => opened,
      }),
    ),
  );
}

describe("upstream connections are reused (issue #32)", () => {
  let sim: SimProcess;
  let counter: Awaited<ReturnType<typeof startCounter>>;
  let server: InferaServer;
  let client: OpenAI;

  before(async () => {
    sim = await startSim({ model: "conn", args: ["--speed", "1000", "--seed", "1"], timeoutMs: 60_000 });
    counter = await startCounter(sim.port);
    // The scraper's own timer is off: the test scrapes when it wants (scrapeAll).
    ({ server, client } = await gatewayFor(counter.url, "conn"));
  });
  after(async () => {
    await server?.close();
    counter?.server.close();
    await sim?.stop();
  });

  const ask = async (stream: boolean, i: number): Promise<void> => {
    const messages = [{ role: "user" as const, content: `hello ${i}` }];
    if (stream) {
      const s = await client.chat.completions.create({ model: "conn", messages, max_tokens: 3, stream });
      for await (const _ of s) {
        // drain
      }
    } else {
      const r = await client.chat.completions.create({ model: "conn", messages, max_tokens: 3 });
      assert.equal(r.usage?.completion_tokens, 3);
    }
  };

  it("sequential requests and /metrics scrapes share one kept-alive connection", async () => {
    const at = counter.opened();
    for (let i = 0; i < 10; i++) {
      await ask(i % 2 === 1, i);
      // A scrape between requests, as the scraper's timer would: it must find the proxy's
      // idle connection rather than open its own.
      await server.scraper.scrapeAll();
    }
    assert.ok(server.workers.list()[0]?.engineLoad, "the scrape read the engine's load");
    assert.equal(counter.opened() - at, 1, "one upstream connection for 10 requests + 10 scrapes");
  });

  it("concurrent requests open at most one connection per request in flight, reused after", async () => {
    const at = counter.opened();
    const burst = async (): Promise<void> => {
      await Promise.all(Array.from({ length: 6 }, (_, i) => ask(i % 2 === 0, i)));
    };
    await burst();
    const afterFirst = counter.opened() - at;
    assert.ok(afterFirst <= 6, `${afterFirst} connections for 6 concurrent requests`);
    for (let r = 0; r < 3; r++) await burst();
    await server.scraper.scrapeAll();
    assert.ok(
      counter.opened() - at <= 6,
      `${counter.opened() - at} connections for 4 bursts of 6 (at most 6 in flight)`,
    );
  });
});
