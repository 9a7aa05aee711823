/**
 * The pending bridge's lifecycle through a real server (in-process `startServer`, the `kv-aware`
 * preset, real simulated engines publishing KV events over ZMQ, a worker that answers 500):
 * a routed prompt counts as cached on its worker (`bridgeBlocks` in /debug/decisions) from
 * routing until its request fails or is cancelled before its prefill is done, or the engine's
 * events drop the blocks after it. The grace after a prefill is set to a minute here, so only
 * those signals can end an entry within the test (before them the bridge lasted as long as the
 * worker's pending-prefill count plus a grace, whatever had happened to the request).
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import type { DecisionExplanation } from "../../../src/router/pipeline/types.ts";
import { type InferaServer, startServer } from "../../../src/server/app.ts";
import { createLogger } from "../../../src/util/log.ts";
import { mixedRecord } from "../../helpers/records.ts";
import {
  kvEventsReceived,
  parseMetric,
  type SimProcess,
  simWorkerRecord,
  startSim,
} from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";
import { FakePublisher, waitFor } from "../../kv/fake-publisher.ts";

const BS = 16;
const logger = createLogger("test");
logger.level = "silent";
let sims: SimProcess[] = [];
let broken: Server;
let brokenEvents: FakePublisher;
let server: InferaServer;

const doc = Array.from(
  { length: 80 },
  (_, i) => `Section ${i} of the tenant's manual covers item ${i * 3} in some detail.`,
).join(" ");
const chat = (q: string) => [
  { role: "user" as const, content: doc },
  { role: "user" as const, content: q },
];

before(async () => {
  // Slow engines (the 8B default profile at 1/20 speed): a ~1.5k-token prefill takes ~0.5 s of
  // wall time, long enough to cancel a request before its first token.
  sims = await Promise.all(
    ["a", "b"].map(() => startSim({ args: ["--block-size", String(BS), "--speed", "0.05"] })),
  );
  // A worker of its own model that answers 500 after 400 ms. Its KV events come from a publisher
  // with an empty history (replay answers at once), so the index tracks it in sync, holding
  // nothing, and the bridge's credit shows as bridgeBlocks rather than through the fallback tree
  // (an endpoint nobody answers would leave it `unknown`, routed on that tree: src/kv/README.md).
  brokenEvents = new FakePublisher();
  await brokenEvents.start();
  broken = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const answer = () => {
        res.writeHead(500, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "boom", type: "server_error" } }));
      };
      if (brokenHeld) brokenHeld.push(answer);
      else answer();
    });
  });
  await new Promise<void>((r) => broken.listen(0, "127.0.0.1", r));
  const port = (broken.address() as AddressInfo).port;
  const memory = new MemoryDiscovery([
    ...["a", "b"].map((id, i) =>
      simWorkerRecord(sims[i]!, { id, model: "sim-model", maxModelLen: 32768, blockSize: BS }),
    ),
    mixedRecord({
      id: "c",
      model: "m-broken",
      url: `http://127.0.0.1:${port}`,
      maxModelLen: 32768,
      kvEvents: {
        endpoint: brokenEvents.endpoint,
        replayEndpoint: brokenEvents.replayEndpoint,
        topic: brokenEvents.topic,
        framing: "seq",
      },
    }),
  ]);
  server = await startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "kv-aware",
      policyOptions: { bridgeGraceMs: 60_000 },
      scrapeIntervalMs: 0,
      // The whole prompt is scored (its bridge credit counted) even on a loaded box: at the
      // default 100 ms of tokenizing, a run at load average 25 scored 16 of its 82 blocks.
      promptBudgetMs: 5000,
    },
    { discovery: memory, logger },
  );
  // Both sims' events reach the index before a test relies on them (no "SUB joined" sleep).
  const index = server.kvIngest!.indexFor("sim-model")!;
  await Promise.all(sims.map((s, i) => kvEventsReceived(s, () => index.blockCount(["a", "b"][i]!) > 0)));
});

after(async () => {
  await server?.close();
  await new Promise((r) => broken?.close(r));
  await brokenEvents?.close();
  await Promise.all(sims.map((s) => s.stop()));
});

async function decisionOf(requestId: string): Promise<DecisionExplanation> {
  const r = await fetch(`${server.url}/debug/decisions?limit=256`);
  const list = (await r.json()) as { data: DecisionExplanation[] };
  const d = list.data.find((x) => x.requestId === requestId);
  assert.ok(d, `decision of ${requestId}`);
  return d;
}

function send(
  model: string,
  q: string,
  requestId: string,
  o: { stream?: boolean; signal?: AbortSignal } = {},
) {
  return fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-request-id": requestId },
    body: JSON.stringify({ model, messages: chat(q), max_tokens: 4, stream: o.stream ?? false }),
    signal: o.signal,
  });
}

/** The server's count of bridge entries that ended with `event` (e.g. cancelled). */
async function bridgeEnded(event: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  return parseMetric(text, "infera_routing_bridge_entries_total", { model: "sim-model", event }) ?? 0;
}

/**
 * Until both sims run and queue nothing (what the tests aborted has left them too), so a reset
 * of their prefix cache is not refused for blocks in use. vllm-project/vllm
 * vllm/v1/metrics/loggers.py @ a6f0308cfe806b7731ad4979c9bea6e470c35efd:
 * vllm:num_requests_running / vllm:num_requests_waiting.
 */
async function simsIdle(): Promise<void> {
  await waitUntil(
    async () => {
      for (const s of sims) {
        const m = await s.metrics();
        if (
          (parseMetric(m, "vllm:num_requests_running") ?? 0) +
            (parseMetric(m, "vllm:num_requests_waiting") ?? 0) >
          0
        )
          return false;
      }
      return true;
    },
    10_000,
    "sims idle",
  );
}

/**
 * While not null, the broken worker holds its answers here (until `answerBroken()`), so a
 * request is still pending when the next one is routed, however slow the box.
 */
let brokenHeld: Array<() => void> | null = null;
function answerBroken(): void {
  const held = brokenHeld ?? [];
  brokenHeld = null;
  for (const answer of held) answer();
}

const bridgeOn = (d: DecisionExplanation, worker: string) =>
  d.candidates.find((c) => c.worker === worker)?.bridgeBlocks ?? null;

test("a request that fails (upstream 500) ends its bridge entry; while it is pending it counts", async () => {
  brokenHeld = [];
  const first = send("m-broken", "q1", "fail-1");
  // Routed (its bridge entry pending) before the second one is.
  await waitForDecision("fail-1");
  const second = send("m-broken", "q2", "fail-2");
  const d2 = await waitForDecision("fail-2");
  assert.ok((bridgeOn(d2, "c") ?? 0) > 20, `pending on c: ${JSON.stringify(d2.candidates)}`);
  assert.equal(d2.candidates.find((c) => c.worker === "c")?.cachedBlocks, bridgeOn(d2, "c"));
  answerBroken();
  assert.equal((await first).status, 500);
  assert.equal((await second).status, 500);
  await (await first).text().catch(() => "");
  const third = send("m-broken", "q3", "fail-3");
  const d3 = await waitForDecision("fail-3");
  assert.equal(bridgeOn(d3, "c"), 0, `failed requests leave no credit: ${JSON.stringify(d3.candidates)}`);
  assert.equal(d3.candidates.find((c) => c.worker === "c")?.cachedBlocks, 0);
  await (await third).text();
});

test("a request the client cancels before its first token ends its bridge entry", async () => {
  const ctl = new AbortController();
  const first = send("sim-model", "cancel me", "cancel-1", { stream: true, signal: ctl.signal });
  // Read the stream: a Response nobody reads can be garbage-collected, and undici then cancels
  // its stream (fetch's FinalizationRegistry): the server would see the client go, and end the
  // bridge entry, before the follower below is routed.
  const firstRead = first.then((r) => r.body?.pipeTo(new WritableStream())).catch(() => {});
  const ctl2 = new AbortController();
  const cancelledBefore = await bridgeEnded("cancelled");
  // The engines are stopped (SIGSTOP) until both requests are routed and cancelled: the first
  // cannot have its first token, however slow the box (the window was a 0.5 s prefill).
  for (const s of sims) process.kill(s.pid, "SIGSTOP");
  try {
    const d1 = await waitForDecision("cancel-1");
    const home = d1.winner;
    // Before its first token, a follower sees the prompt on its worker through the bridge only.
    const follower = send("sim-model", "me too", "cancel-2", { signal: ctl2.signal });
    follower.catch(() => {});
    const d2 = await waitForDecision("cancel-2");
    assert.ok((bridgeOn(d2, home) ?? 0) > 20, JSON.stringify(d2.candidates));
    assert.equal(d2.winner, home, "the follower joins its prefix's queued prompt");
    ctl.abort();
    ctl2.abort();
  } finally {
    for (const s of sims) process.kill(s.pid, "SIGCONT");
  }
  await firstRead;
  // The server sees the client go and cancels both claims.
  await waitUntil(
    async () => (await bridgeEnded("cancelled")) >= cancelledBefore + 2,
    5000,
    "both entries cancelled",
  );
  const ctl3 = new AbortController();
  const probe = send("sim-model", "probe", "cancel-3", { signal: ctl3.signal });
  probe.catch(() => {});
  const d3 = await waitForDecision("cancel-3");
  ctl3.abort();
  for (const c of d3.candidates) assert.equal(c.bridgeBlocks, 0, `no credit left: ${JSON.stringify(c)}`);
  // The engines are done with what was aborted before the next test resets caches.
  await simsIdle();
});

test("after its prefill, an eviction the events report ends the entry (the bridge never overrides it)", async () => {
  const res = await send("sim-model", "evict me", "evict-1");
  assert.equal(res.status, 200, await res.clone().text());
  await res.json();
  const d1 = await decisionOf("evict-1");
  const home = d1.winner;
  const sim = sims[home === "a" ? 0 : 1]!;
  const index = server.kvIngest!.indexFor("sim-model")!;
  await waitFor(() => index.blockCount(home) > 0, 5000, "the prompt's blocks indexed");
  // The engine drops everything (vLLM's reset_prefix_cache → AllBlocksCleared).
  const reset = await fetch(`${sim.url}/reset_prefix_cache`, { method: "POST" });
  assert.equal(reset.status, 200, await reset.text());
  await waitFor(() => index.blockCount(home) === 0, 5000, "the clear applied");
  const ctl = new AbortController();
  const probe = send("sim-model", "probe", "evict-2", { signal: ctl.signal });
  probe.catch(() => {});
  const d2 = await waitForDecision("evict-2");
  ctl.abort();
  const c = d2.candidates.find((x) => x.worker === home)!;
  assert.equal(c.bridgeBlocks, 0, JSON.stringify(c));
  assert.equal(c.cachedBlocks, 0, "neither the index nor the bridge holds the evicted prompt");
  await simsIdle();
});

async function waitForDecision(requestId: string): Promise<DecisionExplanation> {
  const end = Date.now() + 5000;
  for (;;) {
    const r = await fetch(`${server.url}/debug/decisions?limit=256`);
    const d = ((await r.json()) as { data: DecisionExplanation[] }).data.find(
      (x) => x.requestId === requestId,
    );
    if (d) return d;
    if (Date.now() > end) throw new Error(`no decision for ${requestId}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
