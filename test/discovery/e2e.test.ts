/**
 * End to end over a real etcd: `infera engine vllm --engine-bin "node bin/infera-sim.js"`
 * registers, `infera server --discovery etcd` picks it up and serves it to the official
 * OpenAI client; through an etcd outage the server keeps serving (and says so in /metrics),
 * and after it the worker is registered again.
 */
import assert from "node:assert/strict";
import { type ChildProcess, execFileSync } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { Etcd3 } from "etcd3";
import OpenAI from "openai";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { serverArgs, spawnInfera } from "../helpers/infera.ts";
import { engineListenArgs } from "../helpers/launcher.ts";
import { freePort } from "../helpers/ports.ts";
import { waitUntil } from "../helpers/wait.ts";

const SIM = fileURLToPath(new URL("../../bin/infera-sim.js", import.meta.url));

/** Polls every 25 ms. */
const waitFor = (cond: () => boolean | Promise<boolean>, timeoutMs: number, what: string) =>
  waitUntil(cond, timeoutMs, what, 25);

function run(args: string[]): { proc: ChildProcess; log: () => string } {
  const { proc, output } = spawnInfera(args, {
    logLevel: "warn",
    detached: true,
    stdout: true,
    keepChars: 8000,
  });
  return { proc, log: output };
}

async function metric(base: string, name: string): Promise<number | undefined> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
  return line === undefined ? undefined : Number(line.split(" ").pop());
}

describe("engine launcher + server over etcd (end to end)", () => {
  let etcd: EtcdHandle;
  const procs: ChildProcess[] = [];
  const enginePids: number[] = [];
  let serverBase = "";
  let enginePort = 0;
  const prefix = "/e2e";

  let engine: ReturnType<typeof run>;
  let server: ReturnType<typeof run>;
  let engineExit: Promise<number | null>;
  /** Engine health → listed by the server, measured in before(). */
  let appearMs = Number.NaN;
  const logs = () => `\n--- engine ---\n${engine?.log()}\n--- server ---\n${server?.log()}`;
  const listsModel = async () => {
    try {
      const body = (await (await fetch(`${serverBase}/v1/models`)).json()) as {
        data?: Array<{ id: string }>;
      };
      return body.data?.some((m) => m.id === "e2e-model") ?? false;
    } catch {
      return false;
    }
  };

  before(async () => {
    etcd = await startEtcd();
    const serverPort = await freePort();
    server = run([
      ...serverArgs(serverPort),
      "--discovery",
      "etcd",
      "--etcd",
      etcd.endpoint,
      "--discovery-prefix",
      prefix,
    ]);
    procs.push(server.proc);
    serverBase = `http://127.0.0.1:${serverPort}`;
    await waitFor(
      async () => {
        try {
          return (await fetch(`${serverBase}/health`)).ok;
        } catch {
          return false;
        }
      },
      30_000,
      "server health",
    );
    enginePort = await freePort();
    engine = run([
      "engine",
      "vllm",
      "--engine-bin",
      `${process.execPath} ${SIM}`,
      "--model",
      "sim-model",
      "--served-model-name",
      "e2e-model",
      ...(await engineListenArgs(enginePort)),
      "--discovery",
      "etcd",
      "--etcd-endpoints",
      etcd.endpoint,
      "--etcd-prefix",
      prefix,
      "--lease-ttl",
      "2",
    ]);
    procs.push(engine.proc);
    engineExit = new Promise((resolve) => engine.proc.once("exit", (code) => resolve(code)));
    await waitFor(
      async () => {
        try {
          return (await fetch(`http://127.0.0.1:${enginePort}/health`, { signal: AbortSignal.timeout(300) }))
            .ok;
        } catch {
          return false;
        }
      },
      30_000,
      "engine health",
    );
    // Remember the engine for cleanup, in case its launcher dies alone.
    const pid = execFileSync("ps", ["-o", "pid=", "--ppid", String(engine.proc.pid)])
      .toString()
      .trim();
    if (pid !== "") enginePids.push(Number(pid));
    const t0 = Date.now();
    await waitFor(listsModel, 5000, "the server to list e2e-model");
    appearMs = Date.now() - t0;
  });

  it("the worker is in the server's set within 1 s of its health passing", () => {
    assert.ok(appearMs <= 1000, `appeared after ${appearMs} ms${logs()}`);
  });

  after(async () => {
    for (const pid of [...procs.map((p) => -(p.pid as number)), ...enginePids]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    await etcd?.dispose();
  });

  it("serves a chat completion through the server to the registered sim", async () => {
    try {
      const client = new OpenAI({ baseURL: `${serverBase}/v1`, apiKey: "unused", maxRetries: 0 });
      const res = await client.chat.completions.create({
        model: "e2e-model",
        messages: [{ role: "user", content: "hello" }],
        max_tokens: 5,
      });
      assert.equal(res.object, "chat.completion");
      assert.ok((res.usage?.completion_tokens ?? 0) > 0);
      const stream = await client.chat.completions.create({
        model: "e2e-model",
        messages: [{ role: "user", content: "stream please" }],
        max_tokens: 4,
        stream: true,
      });
      let chunks = 0;
      for await (const _ of stream) chunks++;
      assert.ok(chunks > 0);
    } catch (err) {
      throw new Error(`${(err as Error).message}${logs()}`);
    }
  });

  it("keeps serving through an etcd outage (degraded in /metrics), and the worker is registered again after", async () => {
    const client = new OpenAI({ baseURL: `${serverBase}/v1`, apiKey: "unused", maxRetries: 0 });
    await etcd.kill();
    await waitFor(
      async () => (await metric(serverBase, "infera_discovery_degraded")) === 1,
      5000,
      "degraded gauge",
    );
    // Past 2 x TTL: the launcher's lease is given up on the client side and must be re-granted.
    await new Promise((r) => setTimeout(r, 4500));
    const during = await client.completions.create({
      model: "e2e-model",
      prompt: "still there?",
      max_tokens: 3,
    });
    assert.equal(during.object, "text_completion");

    await etcd.restart();
    await waitFor(
      async () => (await metric(serverBase, "infera_discovery_degraded")) === 0,
      10_000,
      "restored",
    );
    // After the old lease's TTL has surely passed, the record is still (again) in etcd.
    await new Promise((r) => setTimeout(r, 3000));
    const raw = new Etcd3({ hosts: etcd.endpoint });
    try {
      const values = Object.values(await raw.getAll().prefix(`${prefix}/workers/`).strings());
      assert.equal(values.length, 1);
      assert.equal(
        (JSON.parse(values[0] as string) as { url: string }).url,
        `http://127.0.0.1:${enginePort}`,
      );
    } finally {
      raw.close();
    }
    const afterOutage = await client.completions.create({
      model: "e2e-model",
      prompt: "back",
      max_tokens: 3,
    });
    assert.equal(afterOutage.object, "text_completion");
  });

  it("SIGTERM to the launcher takes the worker out of the server's set at once", async () => {
    const t0 = Date.now();
    engine.proc.kill("SIGTERM");
    await waitFor(async () => !(await listsModel()), 1000, "the model to leave the server");
    assert.ok(Date.now() - t0 <= 1000);
    assert.equal(await engineExit, 0, logs());
  });
});
