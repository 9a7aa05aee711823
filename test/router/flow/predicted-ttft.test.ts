/**
 * The `predicted-ttft` headroom signal in the admission queue (issue #29 items 1 and 4), through
 * a real server and a simulated engine: once the predictor has learnt the worker, a request
 * whose TTFT target is below its prediction waits in the queue (no headers sent) and is answered
 * 429 `queue_timeout` with Retry-After at its band's maximum wait; one with a reachable target,
 * and one with none, go through at once.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { MemoryDiscovery } from "../../../src/discovery/memory.ts";
import { type InferaServer, startServer } from "../../../src/server/app.ts";
import { createLogger } from "../../../src/util/log.ts";
import { mixedRecord } from "../../helpers/records.ts";
import { type SimProcess, startSim } from "../../helpers/sim.ts";
import { waitUntil } from "../../helpers/wait.ts";

const MODEL = "sim-model";
const logger = createLogger("test");
logger.level = "silent";
let sim: SimProcess;
let server: InferaServer;

before(async () => {
  sim = await startSim({ args: ["--block-size", "16", "--speed", "0.25"] });
  server = await startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "round-robin",
      scrapeIntervalMs: 200,
      profiles: {
        mixed: { scorers: [{ name: "predicted-ttft", weight: 1 }], picker: { name: "argmin" } },
      },
      flow: { enabled: true, headroom: [{ name: "predicted-ttft" }], maxWaitMs: 600 },
    },
    {
      discovery: new MemoryDiscovery([
        mixedRecord({ id: "w", model: MODEL, url: sim.url, maxModelLen: 131072 }),
      ]),
      logger,
    },
  );
});

after(async () => {
  await server?.close();
  await sim?.stop();
});

let n = 0;
async function ask(target?: number): Promise<Response> {
  const words = Array.from({ length: 1500 }, (_, i) => `w${(i * 7 + n) % 101}`).join(" ");
  n++;
  return fetch(`${server.url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(target === undefined ? {} : { "x-infera-ttft-target-ms": String(target) }),
    },
    body: JSON.stringify({
      model: MODEL,
      messages: [{ role: "user", content: `${n} ${words}` }],
      max_tokens: 2,
      stream: true,
    }),
  });
}

/** A server whose only user of the predictor is the flow queue's signal, on worker `id` of the sim. */
function flowOnly(id: string): Promise<InferaServer> {
  return startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "round-robin",
      flow: { enabled: true, headroom: [{ name: "predicted-ttft" }], maxWaitMs: 600 },
    },
    {
      discovery: new MemoryDiscovery([mixedRecord({ id, model: MODEL, url: sim.url, maxModelLen: 131072 })]),
      logger,
    },
  );
}

test("without a pipeline plugin using it, the signal teaches the predictor from the queue's observations", async () => {
  const other = await flowOnly("w2");
  try {
    for (let i = 0; i < 3; i++) {
      const r = await fetch(`${other.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: MODEL,
          messages: [{ role: "user", content: `q${i}` }],
          max_tokens: 2,
          stream: true,
        }),
      });
      assert.equal(r.status, 200);
      await r.text();
    }
    // Learnt as the server ends each relay, which may come after the client has read the end.
    await waitUntil(() => other.ttft.samplesOf("w2") >= 3, 5000, "3 samples");
    assert.equal(other.ttft.samplesOf("w2"), 3, "each streamed request learnt once");
    // Its error is reported like the pipeline's: the 2nd and 3rd had a prediction (the 1st none).
    const m = await (await fetch(`${other.url}/metrics`)).text();
    const count = /^infera_ttft_prediction_relative_error_count\{[^}]*\} (\d+)/m.exec(m);
    assert.equal(
      Number(count?.[1]),
      2,
      m
        .split("\n")
        .filter((l) => l.includes("relative_error"))
        .join("\n"),
    );
  } finally {
    await other.close();
  }
});

test("a target below the worker's predicted TTFT waits, then 429 with Retry-After; reachable ones pass", async () => {
  for (let i = 0; i < 8; i++) {
    const r = await ask();
    assert.equal(r.status, 200);
    await r.text();
  }
  await waitUntil(() => server.ttft.samplesOf("w") >= 8, 5000, "8 samples");
  assert.equal(server.ttft.samplesOf("w"), 8, "the scorer and the signal learnt each request once");
  const predicted = server.ttft.predictFeatures(MODEL, "w", new Float64Array([1, 3, 0, 0]));
  assert.ok(predicted > 5, `learnt: ${predicted} ms for a 3k-token prompt`);
  const t0 = Date.now();
  const refused = await ask(1);
  const waited = Date.now() - t0;
  assert.equal(refused.status, 429);
  assert.ok(refused.headers.get("retry-after"), "Retry-After");
  const body = (await refused.json()) as { error: { code: string } };
  assert.equal(body.error.code, "queue_timeout");
  assert.ok(waited >= 500, `it waited its band's maximum wait (${waited} ms)`);
  const ok = await ask(60_000);
  assert.equal(ok.status, 200);
  await ok.text();
});

test("with no prediction yet, a worker takes only coldInFlight requests blind; the next waits for a sample", async () => {
  const other = await startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "round-robin",
      flow: {
        enabled: true,
        headroom: [{ name: "predicted-ttft", params: { targetMs: 60_000, coldInFlight: 1 } }],
        maxWaitMs: 30_000,
      },
    },
    {
      discovery: new MemoryDiscovery([
        mixedRecord({ id: "w3", model: MODEL, url: sim.url, maxModelLen: 131072 }),
      ]),
      logger,
    },
  );
  try {
    const send = (i: number) =>
      fetch(`${other.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: MODEL,
          messages: [{ role: "user", content: `cold ${i}` }],
          max_tokens: 8,
          stream: true,
        }),
      }).then(async (r) => {
        assert.equal(r.status, 200);
        await r.text();
      });
    await Promise.all([send(0), send(1)]);
    const m = await (await fetch(`${other.url}/metrics`)).text();
    const queued = /^infera_flow_dispatched_total\{band="normal",queued="true"\} (\d+)/m.exec(m);
    // Before: a worker without samples fitted every request (all went blind, none waited).
    assert.equal(Number(queued?.[1] ?? 0), 1, "the second waited for the first's observation");
    assert.equal(other.ttft.samplesOf("w3"), 2);
  } finally {
    await other.close();
  }
});

test("the signal learns at the first token, while the answer is still streaming", async () => {
  // Under overload an answer's end came 20–30 s wall after its first token (bench/fleet-routing
  // Run K); a fit learnt at the end lagged the queue it bounds by that much.
  const other = await flowOnly("w4");
  try {
    const r = await fetch(`${other.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL,
        messages: [{ role: "user", content: "a long answer" }],
        max_tokens: 400,
        ignore_eos: true,
        stream: true,
      }),
    });
    assert.equal(r.status, 200);
    const reader = r.body!.getReader();
    let ended = false;
    const rest = (async () => {
      for (;;) if ((await reader.read()).done) break;
      ended = true;
    })();
    await waitUntil(() => other.ttft.samplesOf("w4") > 0, 5000, "a sample");
    assert.equal(other.ttft.samplesOf("w4"), 1, "learnt");
    assert.equal(ended, false, "before the answer ended");
    await reader.cancel();
    await rest.catch(() => {});
  } finally {
    await other.close();
  }
});
