/**
 * deploy/examples/2p2d-moriio.yaml run from its rendered objects: two servers (the Deployment's
 * command and the ConfigMap's config, etcd discovery), the `moriio-heartbeats` sidecar's
 * command, and one prefill and one decode worker from the StatefulSets' launcher commands with
 * the simulator in vLLM's place (`--sim`: vLLM's arguments, its MoRIIO kv-transfer config with
 * proxy_ip/proxy_ping_port, and its heartbeats). Only host names and ports are rewritten.
 *
 * Each server must serve a PD completion on its own: both found both workers in etcd. Had they
 * discovered through the MoRIIO socket, only the server holding a worker's one heartbeat
 * connection would know it (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/
 * moriio/moriio_heartbeat.py @ 1c3d6462281cdb320c80a4e11fa29acdec6deca0: one DEALER,
 * connected once).
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import OpenAI from "openai";
import { parse, stringify } from "yaml";
import { LAUNCHER_BIN } from "../../src/deploy/render/context.ts";
import { plain, renderCluster } from "../../src/deploy/render/index.ts";
import { parseClusterDocument } from "../../src/deploy/spec.ts";
import { stopChild } from "../../src/util/child-process.ts";
import { type EtcdHandle, startEtcd } from "../helpers/etcd.ts";
import { spawnInfera } from "../helpers/infera.ts";
import { engineListenArgs } from "../helpers/launcher.ts";
import { authorizationBlock, type NatsServerHandle, startNats } from "../helpers/nats.ts";
import { freePort } from "../helpers/ports.ts";
import { containerEnv } from "../helpers/rendered.ts";
import { waitFor200, waitUntil } from "../helpers/wait.ts";

// biome-ignore lint/suspicious/noExplicitAny: the test walks nested manifests
type Obj = Record<string, any>;

let n = 0;
const doc = parseClusterDocument(parse(readFileSync("deploy/examples/2p2d-moriio.yaml", "utf8")));
const objs: Obj[] = renderCluster(doc, { secrets: "generate", random: () => `secret-${++n}` }).map(plain);
const find = (kind: string, name: string): Obj => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  assert.ok(o, `${kind} ${name} rendered`);
  return o;
};

const dir = mkdtempSync(join(tmpdir(), "infera-k8s-moriio-"));
const procs: { proc: ChildProcess; output: () => string }[] = [];
let etcd: EtcdHandle | undefined;
let nats: NatsServerHandle | undefined;

after(async () => {
  for (const { proc } of procs.reverse()) await stopChild(proc, 10_000);
  await etcd?.dispose();
  await nats?.close();
  rmSync(dir, { recursive: true, force: true });
});
const dump = () => procs.map((p) => p.output()).join("\n---\n");

test("2p2d-moriio as rendered: two servers each serve PD completions, vLLM's heartbeats reach the sidecar", async () => {
  etcd = await startEtcd();
  // The rendered users and permissions, each pod with its own identity (nats-auth.ts).
  nats = await startNats({
    authorization: authorizationBlock(find("ConfigMap", "moriio-nats-config").data["nats.conf"]),
    env: containerEnv(find("StatefulSet", "moriio-nats").spec.template.spec.containers[0], objs),
  });
  const sinkPort = await freePort();
  const rewrite = (s: string) =>
    s
      .replaceAll("http://moriio-etcd.infera.svc:2379", etcd!.endpoint)
      .replaceAll("moriio-nats.infera.svc:4222", `127.0.0.1:${nats!.port}`)
      .replaceAll("moriio-server-moriio.infera.svc:36367", `127.0.0.1:${sinkPort}`);
  const envOf = (c: Obj, vars: Record<string, string> = {}): Record<string, string> =>
    containerEnv(c, objs, { rewrite, vars });
  const logged = (p: { proc: ChildProcess; output: () => string }) => {
    procs.push(p);
    return p;
  };

  // The heartbeat sidecar, from the server pod.
  const dep = find("Deployment", "moriio-server");
  assert.equal(dep.spec.replicas, 2);
  const sinkC = dep.spec.template.spec.containers.find((c: Obj) => c.name === "moriio-heartbeats");
  const sinkProc = spawn(process.execPath, [...sinkC.command.slice(1, -1), String(sinkPort)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let sinkOut = "";
  sinkProc.stdout.on("data", (d: Buffer) => (sinkOut += d.toString()));
  sinkProc.stderr.on("data", (d: Buffer) => (sinkOut += d.toString()));
  logged({ proc: sinkProc, output: () => `sink: ${sinkOut}` });

  // Two server replicas: the Deployment's command, the ConfigMap's config, each on its port.
  const sc = dep.spec.template.spec.containers.find((c: Obj) => c.name === "server");
  const cfgText = rewrite(find("ConfigMap", "moriio-server-config").data["server.yaml"]);
  assert.equal((parse(cfgText) as Obj).discovery.kind, "etcd");
  const serverPorts = [await freePort(), await freePort()];
  for (const [i, port] of serverPorts.entries()) {
    const cfg = parse(cfgText) as Obj;
    cfg.host = "127.0.0.1";
    cfg.port = port;
    const file = join(dir, `server-${i}.yaml`);
    writeFileSync(file, stringify(cfg));
    const args = (sc.command.slice(1) as string[]).map((w) => (w === "/etc/infera/server.yaml" ? file : w));
    logged(spawnInfera(args, { logLevel: "warn", env: envOf(sc), keepChars: 4000 }));
  }

  // One prefill and one decode worker: the StatefulSets' commands, `--sim`, ports of this host.
  const enginePorts: Record<string, number> = {};
  for (const pool of ["prefill", "decode"]) {
    enginePorts[pool] = await freePort();
    const c = find("StatefulSet", `moriio-llama70b-${pool}`).spec.template.spec.containers.find(
      (x: Obj) => x.name === "engine",
    );
    const vars = { POD_NAME: `moriio-llama70b-${pool}-0`, POD_IP: "127.0.0.1" };
    const words = (c.command as string[]).map((w) =>
      rewrite(w.replace(/\$\((\w+)\)/g, (m, k: string) => vars[k as keyof typeof vars] ?? m)),
    );
    assert.equal(words[0], LAUNCHER_BIN);
    const sep = words.indexOf("--");
    const flags = sep < 0 ? words.slice(1) : words.slice(1, sep);
    const rest = sep < 0 ? [] : words.slice(sep);
    const local = [
      "--sim",
      ...(await engineListenArgs(enginePorts[pool]!)),
      "--handshake-port",
      String(await freePort()),
      "--notify-port",
      String(await freePort()),
      "--lease-ttl",
      "3",
    ];
    logged(
      spawnInfera([...flags, ...local, ...(rest.length > 0 ? rest : ["--"]), "--speed", "50"], {
        logLevel: "warn",
        env: envOf(c, vars),
        keepChars: 4000,
      }),
    );
  }

  for (const port of serverPorts) {
    await waitFor200(`http://127.0.0.1:${port}/ready`, {
      timeoutMs: 90_000,
      what: `server on ${port} ready`,
      stepMs: 250,
      output: dump,
    });
  }
  for (const port of serverPorts) {
    const openai = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", maxRetries: 0 });
    // /ready means one worker in rotation; a PD pair needs the other role too: retry a 503
    // (no_worker_available) until the server has found both in etcd.
    let text = "";
    await waitUntil(
      async () => {
        try {
          const res = await openai.completions.create({
            model: "/models/Llama-3.3-70B-Instruct",
            prompt: `a PD completion through server ${port}`,
            max_tokens: 4,
          });
          text = res.choices[0]?.text ?? "";
          return true;
        } catch (e) {
          if ((e as { status?: number }).status === 503) return false;
          throw e;
        }
      },
      60_000,
      `a completion through server ${port}: ${dump()}`,
      250,
    );
    assert.ok(text.length > 0);
  }
  // D imported the prompts' KV (vLLM's prompt_tokens_by_source_total{source=
  // "external_kv_transfer"}, vllm-project/vllm vllm/v1/metrics/loggers.py): PD, not D alone.
  const dMetrics = await (await fetch(`http://127.0.0.1:${enginePorts.decode}/metrics`)).text();
  const external = dMetrics
    .split("\n")
    .find(
      (l) =>
        l.startsWith("vllm:prompt_tokens_by_source_total") && l.includes('source="external_kv_transfer"'),
    );
  assert.ok(external && Number(external.split(" ").pop()) > 0, external ?? dMetrics.slice(0, 2000));
  // Both workers' heartbeats were accepted (vLLM's registration: type P / D).
  await waitUntil(
    () => (sinkOut.match(/moriio worker heartbeat/g)?.length ?? 0) >= 2,
    20_000,
    `heartbeats: ${sinkOut}`,
  );
  assert.match(sinkOut, /"type":"P"/);
  assert.match(sinkOut, /"type":"D"/);
});
