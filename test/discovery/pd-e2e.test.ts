/**
 * PD through the launchers: for each connector, `infera engine sim --role prefill|decode
 * --connector K` registers both halves in etcd with the connector fields the router needs
 * (bootstrap host/ports), and `infera server --discovery etcd` serves a request through the
 * prefill/decode pair.
 */
import assert from "node:assert/strict";
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import * as zmq from "zeromq";
import { EtcdWatcher } from "../../src/discovery/etcd-watcher.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { serverArgs, spawnInfera } from "../helpers/infera.ts";
import { engineListenArgs } from "../helpers/launcher.ts";
import { freePort } from "../helpers/ports.ts";
import { waitFor200, waitUntil } from "../helpers/wait.ts";

const INFERA = fileURLToPath(new URL("../../bin/infera.js", import.meta.url));
const PREFIX = "/pd";

/** Polls every 25 ms. */
const waitFor = (cond: () => boolean | Promise<boolean>, timeoutMs: number, what: string) =>
  waitUntil(cond, timeoutMs, what, 25);

describe("PD pairs launched by infera engine sim, routed by infera server over etcd", () => {
  let etcd: EtcdHandle;
  let watcher: EtcdWatcher;
  let serverBase = "";
  const procs: ChildProcess[] = [];
  const pids: number[] = [];
  let serverLog = () => "";
  // MoRIIO workers ping a registration ROUTER (vLLM's `_ping`); this server finds them in
  // etcd, so the test owns one for their `--moriio-proxy` (vLLM needs proxy_ip/proxy_ping_port).
  const moriioProxy = new zmq.Router({ linger: 0 });
  let moriioProxyPort = 0;

  before(async () => {
    await moriioProxy.bind("tcp://127.0.0.1:*");
    const ep = moriioProxy.lastEndpoint ?? "";
    moriioProxyPort = Number(ep.slice(ep.lastIndexOf(":") + 1));
    void (async () => {
      try {
        for await (const _ of moriioProxy) {
          // registrations are not needed here
        }
      } catch {
        // closed
      }
    })();
    etcd = await startEtcd();
    watcher = new EtcdWatcher({ endpoints: [etcd.endpoint], prefix: PREFIX });
    await watcher.start();
    const port = await freePort();
    const { proc: server, output } = spawnInfera(
      [
        ...serverArgs(port),
        "--discovery",
        "etcd",
        "--etcd",
        etcd.endpoint,
        "--discovery-prefix",
        PREFIX,
        "--scrape-interval",
        "0",
      ],
      { logLevel: "warn", detached: true, stdout: true, keepChars: 6000 },
    );
    serverLog = output;
    procs.push(server);
    serverBase = `http://127.0.0.1:${port}`;
    // Listening before any test talks to it (a loaded machine can take seconds to start it).
    await waitFor200(`${serverBase}/health`, { timeoutMs: 30_000, what: "infera server /health", output });
  });

  after(async () => {
    for (const pid of [...procs.map((p) => -(p.pid as number)), ...pids]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    await watcher?.close();
    await etcd?.dispose();
    moriioProxy.close();
  });

  async function launch(kind: string, role: "prefill" | "decode", model: string): Promise<ChildProcess> {
    const proc = spawn(
      process.execPath,
      [
        INFERA,
        "engine",
        "sim",
        "--model",
        "sim-model",
        "--served-model-name",
        model,
        "--worker-id",
        `${model}-${role}`,
        "--role",
        role,
        "--connector",
        kind,
        ...(await engineListenArgs(await freePort())),
        "--bootstrap-port",
        String(await freePort()),
        "--side-channel-port",
        String(await freePort()),
        "--handshake-port",
        String(await freePort()),
        "--notify-port",
        String(await freePort()),
        "--etcd-endpoints",
        etcd.endpoint,
        "--etcd-prefix",
        PREFIX,
        "--lease-ttl",
        "3",
        ...(kind === "moriio" ? ["--moriio-proxy", `127.0.0.1:${moriioProxyPort}`] : []),
        "--",
        "--speed",
        "50",
      ],
      { detached: true, stdio: "ignore", env: { ...process.env, INFERA_LOG_LEVEL: "warn" } },
    );
    procs.push(proc);
    return proc;
  }

  for (const kind of ["nixl", "mooncake", "moriio", "sglang", "atom"]) {
    it(`${kind}: 1P1D registered with its connector, served through the server`, async () => {
      const model = `pd-${kind}`;
      const [p, d] = [await launch(kind, "prefill", model), await launch(kind, "decode", model)];
      const ids = [`${model}-prefill`, `${model}-decode`];
      await waitFor(
        () => ids.every((id) => watcher.workers().some((r) => r.id === id)),
        40_000,
        `${kind} pair`,
      );
      for (const pp of [p, d]) {
        const out = execFileSync("ps", ["-o", "pid=", "--ppid", String(pp.pid)])
          .toString()
          .trim();
        if (out !== "") pids.push(Number(out));
      }
      const recs = ids.map((id) => watcher.workers().find((r) => r.id === id));
      for (const r of recs) {
        assert.equal(r?.connector.kind, kind);
        assert.equal(r?.connector.bootstrapHost, "127.0.0.1");
      }
      assert.deepEqual(
        recs.map((r) => r?.role),
        ["prefill", "decode"],
      );
      // The server must see both halves before the request, or it routes the model mixed.
      await waitFor(
        async () => {
          const body = (await (await fetch(`${serverBase}/v1/workers`)).json()) as {
            data: Array<{ id: string }>;
          };
          return ids.every((id) => body.data.some((w) => w.id === id));
        },
        10_000,
        "server to see the pair",
      );
      const client = new OpenAI({ baseURL: `${serverBase}/v1`, apiKey: "x", maxRetries: 0 });
      try {
        const res = await client.chat.completions.create({
          model,
          messages: [
            {
              role: "user",
              content: `a prompt long enough to fill a few blocks for ${kind} ${"x ".repeat(60)}`,
            },
          ],
          max_tokens: 4,
        });
        assert.ok((res.usage?.completion_tokens ?? 0) > 0);
        // D imported the prompt's KV from P: the pair really ran as PD.
        const dMetrics = await (await fetch(`${recs[1]?.url}/metrics`)).text();
        const external = dMetrics
          .split("\n")
          .filter(
            (l) =>
              l.startsWith("vllm:prompt_tokens_by_source_total{") && l.includes('"external_kv_transfer"'),
          )
          .reduce((a, l) => a + Number(l.split(" ").pop()), 0);
        assert.ok(external > 0, `decode worker got KV from prefill (external tokens ${external})`);
      } catch (err) {
        throw new Error(`${(err as Error).message}\n--- server ---\n${serverLog()}`);
      }
      p.kill("SIGTERM");
      d.kill("SIGTERM");
      await waitFor(() => !ids.some((id) => watcher.workers().some((r) => r.id === id)), 2000, "pair gone");
    });
  }
});
