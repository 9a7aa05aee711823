/**
 * etcd down when the server starts: the server comes up anyway (health 200, ready 503, the
 * degraded gauge at 1), keeps retrying, and serves the workers once etcd is back. With
 * `startDegraded` a watcher still refuses bad credentials at start (misconfiguration is not
 * an outage).
 */
import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { after, describe, it } from "node:test";
import { EtcdRegistrar } from "../../src/discovery/etcd-registrar.ts";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import { type EtcdHandle, etcdctl, startEtcd } from "../helpers/etcd.ts";
import { serverArgs, spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { mixedRecord } from "../helpers/records.ts";
import { startSim } from "../helpers/sim.ts";
import { waitUntil } from "../helpers/wait.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";

async function get(url: string): Promise<{ status: number; text: string }> {
  try {
    const res = await fetch(url);
    return { status: res.status, text: await res.text() };
  } catch {
    return { status: 0, text: "" };
  }
}

describe("etcd unreachable at start-up", () => {
  const cleanups: Array<() => Promise<void> | void> = [];
  after(async () => {
    for (const c of cleanups.reverse()) await c();
  });

  it("the server starts degraded, not ready, and serves once etcd comes up", async () => {
    const etcd: EtcdHandle = await startEtcd();
    cleanups.push(() => etcd.dispose());
    await etcd.stop();

    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    const { proc, output } = spawnInfera(
      [
        ...serverArgs(port),
        "--discovery",
        "etcd",
        "--etcd",
        etcd.endpoint,
        "--discovery-prefix",
        "/degraded-start",
      ],
      { logLevel: "warn", stdout: true, keepChars: 8000 },
    );
    const server: ChildProcess = proc;
    cleanups.push(() => {
      server.kill("SIGKILL");
    });

    await waitUntil(async () => (await get(`${base}/health`)).status === 200, 20_000, "server /health");
    assert.equal((await get(`${base}/ready`)).status, 503, output());
    const metrics = await get(`${base}/metrics`);
    assert.match(metrics.text, /^infera_discovery_degraded 1$/m);
    assert.match(output(), /etcd unreachable at start/);

    const sim = await startSim({ model: "deg-model" });
    cleanups.push(() => sim.stop());
    await etcd.restart();
    const reg = new EtcdRegistrar({
      endpoints: [etcd.endpoint],
      prefix: "/degraded-start",
      leaseTtlSeconds: 5,
    });
    cleanups.push(() => reg.close());
    await reg.register(mixedRecord({ id: "w1", model: "deg-model", url: sim.url }));

    await waitUntil(async () => (await get(`${base}/ready`)).status === 200, 20_000, "server ready");
    // The listed workers are served as soon as the list returns; the gauge clears once the
    // watch from the list's revision is connected too (etcd-watcher.ts listAndWatch), a moment
    // later on a busy machine.
    await waitUntil(
      async () => /^infera_discovery_degraded 0$/m.test((await get(`${base}/metrics`)).text),
      10_000,
      "infera_discovery_degraded back to 0",
    );
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "deg-model", prompt: "hello", max_tokens: 3 }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    const body = (await res.json()) as { usage: { completion_tokens: number } };
    assert.equal(body.usage.completion_tokens, 3);
  });

  it("startDegraded still rejects bad credentials", async () => {
    const etcd = await startEtcd();
    cleanups.push(() => etcd.dispose());
    etcdctl(etcd.endpoint, ["user", "add", "root", "--new-user-password=rootpw"]);
    etcdctl(etcd.endpoint, ["role", "add", "root"]);
    etcdctl(etcd.endpoint, ["user", "grant-role", "root", "root"]);
    etcdctl(etcd.endpoint, ["auth", "enable"]);
    const wrong = new EtcdWatcher({
      endpoints: [etcd.endpoint],
      prefix: "/auth",
      username: "root",
      password: "nope",
      startDegraded: true,
      startTimeoutMs: 500,
    });
    cleanups.push(() => wrong.close());
    await assert.rejects(wrong.start(), /could not list/);
    assert.equal(wrong.isDegraded(), false);
  });
});
