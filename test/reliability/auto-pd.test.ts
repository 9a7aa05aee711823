/**
 * Issue #17: PD records of workers that are not there (a prefill and a decode worker on dead
 * ports) next to a real, healthy mixed sim. The model must keep being served by the mixed
 * worker: the AutoRouter routes disaggregated only while an available PD pair exists, and a
 * disaggregated attempt that fails before reaching the client (the dead prefill worker's
 * refused connection, which is also what opens its breaker) is run on the mixed worker.
 * Before the fix the two records switched the model to disaggregated routing and 273 of 276
 * requests failed.
 */
import assert from "node:assert/strict";
import { after, test } from "node:test";
import OpenAI from "openai";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import type { ConnectorKind } from "../../src/discovery/types.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { freePort } from "../helpers/ports.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";
import { simRecord } from "../server/cluster.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

fileStarted(import.meta.url);
process.env.INFERA_LOG_LEVEL ??= "silent";

let server: InferaServer | undefined;
let sim: SimProcess | undefined;
after(async () => {
  await server?.close();
  await sim?.stop();
  fileDone(import.meta.url);
});

const deadRecord = async (id: string, role: "prefill" | "decode", kind: ConnectorKind) =>
  completeRecord({
    id,
    url: `http://127.0.0.1:${await freePort()}`,
    model: "sim-model",
    servedModelNames: ["sim-model"],
    engine: "vllm",
    role,
    connector: { kind, bootstrapPort: await freePort() },
  });

test("dead PD records next to a healthy mixed worker: every request served", {
  timeout: 60_000,
}, async () => {
  sim = await startSim({ args: ["--speed", "100", "--seed", "1"] });
  const memory = new MemoryDiscovery([
    simRecord(sim, 0),
    // Both connector shapes: serial (nixl) and concurrent with a bootstrap GET (mooncake).
    await deadRecord("dead-p-nixl", "prefill", "nixl"),
    await deadRecord("dead-d-nixl", "decode", "nixl"),
    await deadRecord("dead-p-mc", "prefill", "mooncake"),
    await deadRecord("dead-d-mc", "decode", "mooncake"),
  ]);
  server = await startServer(
    // Long breaker cooldowns: the dead workers stay out once found out (no probe succeeds).
    { port: 0, scrapeIntervalMs: 0, breaker: { cooldownMs: 60_000, maxCooldownMs: 60_000 } },
    { discovery: memory },
  );
  const s = server;
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none", maxRetries: 0 });
  const total = 120;
  let failed = 0;
  const errors: string[] = [];
  let next = 0;
  const lane = async () => {
    while (next < total) {
      const n = next++;
      try {
        const r = await client.chat.completions.create({
          model: "sim-model",
          messages: [{ role: "user", content: `auto-pd ${n}` }],
          max_tokens: 4,
        });
        if (r.choices.length === 0) throw new Error("no choices");
      } catch (err) {
        failed++;
        if (errors.length < 5) errors.push((err as Error).message);
      }
    }
  };
  await Promise.all(Array.from({ length: 8 }, lane));
  const kind = s.router.kindFor("sim-model");
  const deadOut = ["dead-p-nixl", "dead-p-mc"].every((id) => s.workers.get(id)?.available === false);

  const pass = failed === 0 && kind === "mixed";
  record(
    import.meta.url,
    "dead PD records + healthy mixed worker (auto router)",
    `${failed}/${total} failed; model routed ${kind} afterwards; dead prefill workers out of rotation: ${deadOut}`,
    "0 failed, routed mixed",
    pass,
  );
  assert.equal(failed, 0, `failed requests: ${errors.join("; ")}`);
  assert.equal(kind, "mixed", "no healthy PD pair left: the model is served by its mixed worker");
  assert.ok(deadOut, "the requests that tried the dead prefill workers opened their breakers");
});
