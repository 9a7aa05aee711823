/**
 * The TTFT predictor through a real server (issue #29 item 4): two simulated engines (child
 * processes), a profile with the `ttft-saturation` filter, the `predicted-ttft` scorer and a
 * round-robin picker (so both workers keep getting samples), streamed requests through the
 * `openai` client. Worker A (at --speed 0.25: TTFTs well above a busy box's event-loop noise) is then restarted at a fifth of that speed on the same port (another
 * GPU, another quantization: the record does not change): the predictor re-fits it from its new
 * samples, a request whose TTFT target lies between the two workers' predictions goes to B only,
 * `/debug/decisions` shows predicted vs observed TTFT, and the error histogram is exported.
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

const MODEL = "sim-model";
const logger = createLogger("test");
logger.level = "silent";
let sims: SimProcess[] = [];
let server: InferaServer;
let client: OpenAI;

const WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november".split(
  " ",
);
let seed = 12345;
function rand(): number {
  seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
  return seed / 2 ** 32;
}
/** A prompt of about `n` words that shares no prefix with any other (no cache hits in the sim). */
function prompt(n: number): string {
  const w: string[] = [`req-${rand().toString(36).slice(2)}`];
  for (let i = 0; i < n; i++) w.push(WORDS[Math.floor(rand() * WORDS.length)]!);
  return w.join(" ");
}

async function ask(n: number, headers: Record<string, string> = {}): Promise<string> {
  const stream = await client.chat.completions.create(
    { model: MODEL, messages: [{ role: "user", content: prompt(n) }], max_tokens: 2, stream: true },
    { headers },
  );
  let id = "";
  for await (const c of stream) id ||= c.id;
  return id;
}

async function decisions(limit: number): Promise<DecisionExplanationJson[]> {
  const r = await fetch(`${server.url}/debug/decisions?model=${MODEL}&limit=${limit}`);
  return ((await r.json()) as { data: DecisionExplanationJson[] }).data;
}

const SIM_ARGS = (speed: number) => ["--block-size", "16", "--speed", String(speed)];

before(async () => {
  sims = await Promise.all([startSim({ args: SIM_ARGS(0.25) }), startSim({ args: SIM_ARGS(0.25) })]);
  const memory = new MemoryDiscovery(
    ["a", "b"].map((id, i) => mixedRecord({ id, model: MODEL, url: sims[i]!.url, maxModelLen: 131072 })),
  );
  server = await startServer(
    {
      host: "127.0.0.1",
      port: 0,
      policy: "round-robin",
      scrapeIntervalMs: 200,
      profiles: {
        mixed: {
          filters: [{ name: "ttft-saturation" }],
          scorers: [{ name: "predicted-ttft", weight: 1 }],
          picker: { name: "round-robin" },
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

/** Sequential requests of 1–4k words; returns the decisions they made, oldest first. */
async function phase(n: number): Promise<DecisionExplanationJson[]> {
  for (let i = 0; i < n; i++) await ask(1000 + Math.floor(rand() * 3000));
  // The last observation lands when the stream's first byte is relayed; let the log catch up.
  await new Promise((r) => setTimeout(r, 50));
  return (await decisions(n)).filter((d) => d.observedTtftMs != null);
}

function relErrors(ds: DecisionExplanationJson[], worker: string): number[] {
  return ds
    .filter((d) => d.winner === worker)
    .map((d) => {
      const p = d.candidates.find((c) => c.worker === worker)!.predictedTtftMs;
      return p == null ? Number.NaN : Math.abs(p - d.observedTtftMs!) / d.observedTtftMs!;
    })
    .filter((e) => !Number.isNaN(e));
}

const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;

test("the predictor learns each worker, re-fits one that slows down, and the filter avoids it", async () => {
  // Phase 1: both at speed 0.25. Every decision shows a prediction per candidate once one sample exists.
  const p1 = await phase(24);
  assert.ok(p1.length >= 16, `observed TTFTs recorded: ${p1.length}: ${JSON.stringify(await decisions(24))}`);
  assert.ok(
    p1.every((d) => d.candidates.every((c) => "predictedTtftMs" in c)),
    "predicted TTFT per candidate",
  );
  const learnt = p1.slice(8);
  const e1 = [...relErrors(learnt, "a"), ...relErrors(learnt, "b")];
  assert.ok(
    median(e1) < 0.5,
    `median relative error at speed 1: ${median(e1)} (${e1.map((e) => e.toFixed(2))})`,
  );
  const aBefore = server.ttft.predictFeatures(MODEL, "a", new Float64Array([1, 3, 0, 0]));

  // A is restarted at a fifth of its speed on the same port: same record, slower worker.
  const port = sims[0]!.port;
  await sims[0]!.stop();
  sims[0] = await startSim({ port, args: SIM_ARGS(0.05) });

  // The first requests on the slowed A are predicted far too low; its later ones are re-fitted.
  const p2 = await phase(32);
  const eA = relErrors(p2, "a");
  assert.ok(eA.length >= 12, `A's observations after the slowdown: ${eA.length}`);
  assert.ok(eA[0]! > 0.5, `first prediction on the slowed A is off: ${eA[0]}`);
  const lateA = eA.slice(-5);
  assert.ok(median(lateA) < 0.4, `A re-fitted: late errors ${lateA.map((e) => e.toFixed(2))}`);
  const aAfter = server.ttft.predictFeatures(MODEL, "a", new Float64Array([1, 3, 0, 0]));
  const bNow = server.ttft.predictFeatures(MODEL, "b", new Float64Array([1, 3, 0, 0]));
  assert.ok(aAfter > 2.5 * aBefore, `A's 3k-token prediction ${aBefore} → ${aAfter} ms`);

  // A target between the two: every such request goes to B (round-robin alone would alternate).
  const target = Math.round(Math.sqrt(aAfter * bNow));
  for (let i = 0; i < 4; i++) await ask(3000, { "x-infera-ttft-target-ms": String(target) });
  const last = await decisions(4);
  assert.deepEqual(
    last.map((d) => [d.winner, d.candidates.find((c) => c.worker === "a")?.filtered ?? false]),
    [
      ["b", true],
      ["b", true],
      ["b", true],
      ["b", true],
    ],
    `target ${target} ms between A ${aAfter} and B ${bNow}: ${JSON.stringify(last.map((d) => d.candidates))}`,
  );

  // The error metric is exported.
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const m = /infera_ttft_prediction_relative_error_count\{model="sim-model"\} (\d+)/.exec(text);
  assert.ok(m && Number(m[1]) >= 40, `histogram count: ${m?.[1]}`);
  // And the dashboard's predictor panel reads the same observations.
  const st = (await (await fetch(`${server.url}/dashboard/state`)).json()) as {
    ttftPrediction?: { model: string; samples: number; median: number; p90: number }[];
  };
  const row = st.ttftPrediction?.find((r) => r.model === MODEL);
  assert.ok(
    row && row.samples >= 40 && row.median >= 0 && row.p90 >= row.median,
    JSON.stringify(st.ttftPrediction),
  );
});
