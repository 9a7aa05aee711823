/**
 * Credentials inside URLs never leave the server (issue #30 item 7): a worker URL with userinfo
 * (a static file or an etcd record may carry one) was echoed by /v1/workers, /dashboard/state
 * and the logs; `--print-config` printed `nats://user:pass@…`; etcd endpoints with userinfo
 * were logged. A real sim, a real server process, its stdout at info level.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { stopChild } from "../../src/util/child-process.ts";
import { type EtcdHandle, etcdctl, startEtcd } from "../helpers/etcd.ts";
import { serverArgs, spawnInfera } from "../helpers/infera.ts";
import { freePort } from "../helpers/ports.ts";
import { mixedRecord } from "../helpers/records.ts";
import { type SimProcess, startSim } from "../helpers/sim.ts";
import { waitFor200 } from "../helpers/wait.ts";

const SECRETS = ["rec-secret", "etcd-secret", "nats-secret"];
let sim: SimProcess;
let etcd: EtcdHandle;
before(async () => {
  sim = await startSim({ args: ["--speed", "100"], timeoutMs: 60_000 });
  etcd = await startEtcd();
});
after(async () => {
  await sim?.stop();
  await etcd?.dispose();
});

test("--print-config masks the password inside every URL", async () => {
  const { proc, output } = spawnInfera(["server", "--print-config", "--discovery", "etcd"], {
    logLevel: "silent",
    stdout: true,
    // From the environment: on argv such URLs are refused (test/cli/argv-secrets.test.ts).
    env: {
      INFERA_ETCD: "http://root:etcd-secret@127.0.0.1:2379",
      INFERA_NATS_URL: "nats://infera:nats-secret@127.0.0.1:4222",
    },
  });
  const code = await new Promise<number | null>((r) => proc.on("exit", r));
  assert.equal(code, 0, output());
  for (const s of SECRETS) assert.ok(!output().includes(s), `${s} printed:\n${output()}`);
  assert.match(output(), /http:\/\/root:\*\*\*@127\.0\.0\.1:2379/);
  assert.match(output(), /nats:\/\/infera:\*\*\*@127\.0\.0\.1:4222/);
});

test("an etcd record whose URL has userinfo: served, but masked in /v1/workers, /dashboard/state and the logs", async () => {
  const port = await freePort();
  // A record as a hand-written or foreign registrar might put it (the static path drops userinfo).
  const rec = mixedRecord({
    id: "w0",
    model: sim.model,
    url: sim.url.replace("http://", "http://ops:rec-secret@"),
  });
  etcdctl(etcd.endpoint, ["put", "/infera/workers/w0", JSON.stringify(rec)]);
  const server = spawnInfera(
    serverArgs(port, "--discovery", "etcd", "--etcd", etcd.endpoint, "--scrape-interval", "0"),
    { logLevel: "info", stdout: true },
  );
  try {
    const base = `http://127.0.0.1:${port}`;
    await waitFor200(`${base}/ready`, { timeoutMs: 30_000, what: "server /ready", output: server.output });
    const workers = await (await fetch(`${base}/v1/workers`)).text();
    assert.ok(!workers.includes("rec-secret"), workers);
    assert.ok(workers.includes("ops:***@"), workers);
    const dash = await (await fetch(`${base}/dashboard/state`)).text();
    assert.ok(!dash.includes("rec-secret"), dash);
    // Still served: the masking is only in what is shown.
    const r = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: sim.model, prompt: "hi", max_tokens: 2 }),
    });
    assert.equal(r.status, 200, await r.text());
  } finally {
    await stopChild(server.proc, 5000);
  }
  assert.ok(server.output().includes("ops:***@"), "the record's URL was logged, masked");
  assert.ok(!server.output().includes("rec-secret"), server.output());
});
