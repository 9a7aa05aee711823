/** Shared by the personality tests: a ZMQ SUB collector, the sim binary, a fixed prompt. */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { Unpackr } from "msgpackr";
import { Subscriber } from "zeromq";
import type { SimHandle } from "../../../src/engine/sim/server.ts";

const BIN = fileURLToPath(new URL("../../../bin/infera-sim.js", import.meta.url));
const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
export const unpackr = new Unpackr({ int64AsType: "bigint", useRecords: false, mapsAsObjects: true });

export function runBin(args: string[], env: Record<string, string> = {}): ReturnType<typeof spawnSync> {
  return spawnSync(process.execPath, [BIN, ...args], {
    cwd: ROOT,
    encoding: "utf8",
    env: { ...process.env, INFERA_LOG_LEVEL: "error", ...env },
    timeout: 30_000,
  });
}

/** Collects [topic?, seq?, payload] frames from a SUB socket. */
export class Sub {
  readonly frames: Buffer[][] = [];
  private readonly sock = new Subscriber();
  constructor(endpoint: string) {
    this.sock.connect(endpoint);
    this.sock.subscribe();
    void (async () => {
      try {
        for await (const f of this.sock) this.frames.push(f);
      } catch {
        // closed
      }
    })();
  }
  async first(ms = 5000): Promise<Buffer[]> {
    const end = Date.now() + ms;
    while (this.frames.length === 0) {
      if (Date.now() > end) throw new Error("no KV event frame");
      await new Promise((r) => setTimeout(r, 20));
    }
    return this.frames[0];
  }
  close(): void {
    this.sock.close();
  }
}

/** A prompt of token ids: 2 full blocks of 16 plus 3 tokens. */
export const PROMPT = Array.from({ length: 35 }, (_, i) => 1000 + i);

export async function complete(
  url: string,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
): Promise<Response> {
  return fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
}

/** Starts a subscriber, waits for it to join (PUB drops frames to late joiners), sends one request. */
export async function firstBatch(
  sim: SimHandle,
  endpoint: string,
  body: Record<string, unknown>,
  headers?: Record<string, string>,
): Promise<Buffer[]> {
  const sub = new Sub(endpoint);
  try {
    await new Promise((r) => setTimeout(r, 300));
    const r = await complete(sim.url, body, headers);
    assert.equal(r.status, 200, await r.clone().text());
    await r.text();
    return await sub.first();
  } finally {
    sub.close();
  }
}
