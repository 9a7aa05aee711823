/** Test fixture: N real sims + an in-process infera server with memory discovery. */
import OpenAI from "openai";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import type { WorkerRecord } from "../../src/discovery/types.ts";
import { probeRoutes } from "../../src/engine/launcher/routes-probe.ts";
import { type InferaServer, type ServerConfigInput, startServer } from "../../src/server/index.ts";
import { parseMetric, type SimProcess, startSim } from "../helpers/sim.ts";

export interface Cluster {
  sims: SimProcess[];
  records: WorkerRecord[];
  server: InferaServer;
  memory: MemoryDiscovery;
  client: OpenAI;
  close(): Promise<void>;
}

export function simRecord(sim: SimProcess, i: number, model = sim.model): WorkerRecord {
  return completeRecord({
    id: `sim-${i}`,
    url: sim.url,
    model,
    servedModelNames: [model],
    engine: "sim",
    role: "mixed",
  });
}

export async function startCluster(
  n: number,
  opts: {
    simArgs?: string[];
    config?: ServerConfigInput;
    model?: string;
    /** Fill each record's `routes` from the launcher's probe of its sim (as `infera engine` does). */
    probeRoutes?: boolean;
  } = {},
): Promise<Cluster> {
  const sims = await Promise.all(
    Array.from({ length: n }, () =>
      startSim({
        model: opts.model,
        args: opts.simArgs ?? ["--speed", "100", "--seed", "1"],
        timeoutMs: 60_000,
      }),
    ),
  );
  const records = await Promise.all(
    sims.map(async (s, i) => {
      const r = simRecord(s, i);
      return opts.probeRoutes ? { ...r, routes: await probeRoutes(s.url) } : r;
    }),
  );
  const memory = new MemoryDiscovery(records);
  const server = await startServer({ port: 0, scrapeIntervalMs: 0, ...opts.config }, { discovery: memory });
  const client = new OpenAI({
    baseURL: `${server.url}/v1`,
    apiKey: opts.config?.apiKeys?.[0] ?? "none",
    maxRetries: 0,
  });
  return {
    sims,
    records,
    server,
    memory,
    client,
    async close() {
      await server.close();
      await Promise.all(sims.map((s) => s.stop()));
    },
  };
}

export async function simMetric(sim: SimProcess, name: string): Promise<number> {
  return parseMetric(await sim.metrics(), name) ?? 0;
}

export async function waitFor(
  cond: () => Promise<boolean> | boolean,
  timeoutMs = 5000,
  what = "condition",
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}
