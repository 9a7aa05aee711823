/**
 * TLS of the in-cluster planes, run for real from the rendered manifests of
 * deploy/examples/mixed.yaml (`tls.enabled`): etcd is started with the etcd StatefulSet's own
 * command line and nats-server with the NATS ConfigMap's own nats.conf, both on certificates
 * made here with openssl and laid out as the Secrets are (ca.crt, tls.crt, tls.key); then the
 * rendered server (its config file and env) and the rendered worker command (the launcher, with
 * `--sim` in place of vLLM) run against them. Only host names, ports and the Secrets' mount
 * paths are rewritten to this machine's.
 *
 * It checks that mutual TLS is really demanded (clients without a certificate are refused by
 * both), that the worker registers in etcd over TLS and the server discovers it, and that a
 * completion goes through the server over the NATS request plane over TLS.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { parse, stringify } from "yaml";
import { IMAGE_BIN, LAUNCHER_BIN } from "../../src/deploy/render/context.ts";
import { plain, renderCluster } from "../../src/deploy/render/index.ts";
import { parseClusterDocument } from "../../src/deploy/spec.ts";
import { createEtcdClient, etcdOptionsFromFlags } from "../../src/discovery/etcd-client.ts";
import { natsConnectFromCli } from "../../src/transport/nats/cli-options.ts";
import { connectNats } from "../../src/transport/nats/connection.ts";
import { kvSubject } from "../../src/transport/nats/subjects.ts";
import { stopChild } from "../../src/util/child-process.ts";
import { makeTlsFiles } from "../helpers/etcd.ts";
import { spawnInfera } from "../helpers/infera.ts";
import { engineListenArgs } from "../helpers/launcher.ts";
import { NATS_SERVER_BIN } from "../helpers/nats.ts";
import { freePort } from "../helpers/ports.ts";
import { containerEnv } from "../helpers/rendered.ts";
import { waitFor200 } from "../helpers/wait.ts";

// biome-ignore lint/suspicious/noExplicitAny: the test walks nested manifests
type Obj = Record<string, any>;

const ETCD_BIN = process.env.INFERA_ETCD_BIN ?? "/usr/bin/etcd";
const skip = [ETCD_BIN, NATS_SERVER_BIN].find((b) => !existsSync(b));

let n = 0;
const doc = parseClusterDocument(parse(readFileSync("deploy/examples/mixed.yaml", "utf8")));
const objs: Obj[] = renderCluster(doc, { secrets: "generate", random: () => `secret-${++n}` }).map(plain);
const find = (kind: string, name: string): Obj => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  assert.ok(o, `${kind} ${name} rendered`);
  return o;
};

const dir = mkdtempSync(join(tmpdir(), "infera-k8s-tls-"));
const procs: ChildProcess[] = [];
const outputs: (() => string)[] = [];
const ports = { etcd: 0, peer: 0, metrics: 0, nats: 0, monitor: 0, server: 0, engine: 0 };
/** The Secrets' mount paths → directories here, laid out as the Secrets are. */
const secretDirs = {
  etcd: join(dir, "etcd-tls"),
  nats: join(dir, "nats-tls"),
  client: join(dir, "client-tls"),
};

/** Cluster names, ports and mount paths → this machine's. */
function rewrite(s: string): string {
  return s
    .replaceAll("mixed-etcd-0.mixed-etcd.infera.svc", "localhost")
    .replaceAll("mixed-etcd.infera.svc:2379", `localhost:${ports.etcd}`)
    .replaceAll("mixed-nats.infera.svc:4222", `localhost:${ports.nats}`)
    .replaceAll("/etc/etcd/tls", secretDirs.etcd)
    .replaceAll("/etc/nats-tls", secretDirs.nats)
    .replaceAll("/etc/infera-tls", secretDirs.client)
    .replaceAll("/var/lib/etcd", join(dir, "etcd-data"));
}

function track(p: ChildProcess, out: () => string): void {
  procs.push(p);
  outputs.push(out);
}
function spawnLogged(bin: string, args: string[], env: Record<string, string> = {}): ChildProcess {
  const p = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  let out = "";
  const keep = (d: Buffer) => {
    out = (out + d.toString()).slice(-4000);
  };
  p.stdout?.on("data", keep);
  p.stderr?.on("data", keep);
  track(p, () => `${bin}: ${out}`);
  return p;
}

before(async () => {
  if (skip) return;
  for (const k of Object.keys(ports) as (keyof typeof ports)[]) ports[k] = await freePort();
  const made = makeTlsFiles(dir);
  const lay = (to: string, cert: string, key: string) => {
    mkdirSync(to, { recursive: true });
    copyFileSync(made.caFile, join(to, "ca.crt"));
    copyFileSync(cert, join(to, "tls.crt"));
    copyFileSync(key, join(to, "tls.key"));
  };
  lay(secretDirs.etcd, made.serverCert, made.serverKey);
  lay(secretDirs.nats, made.serverCert, made.serverKey);
  lay(secretDirs.client, made.clientCert, made.clientKey);
});

after(async () => {
  for (const p of procs.reverse()) await stopChild(p, 10_000);
  rmSync(dir, { recursive: true, force: true });
});

const dump = () => outputs.map((o) => o()).join("\n---\n");

test("etcd runs with the StatefulSet's TLS command line and refuses clients without a certificate", {
  skip,
}, async () => {
  const c = find("StatefulSet", "mixed-etcd").spec.template.spec.containers[0];
  assert.equal(c.command[0], "etcd");
  const args = (c.command.slice(1) as string[]).map((w) =>
    rewrite(w.replaceAll("$(POD_NAME)", "mixed-etcd-0"))
      .replace("0.0.0.0:2379", `127.0.0.1:${ports.etcd}`)
      .replace("0.0.0.0:2380", `127.0.0.1:${ports.peer}`)
      .replace("0.0.0.0:2381", `127.0.0.1:${ports.metrics}`)
      .replace("localhost:2380", `localhost:${ports.peer}`)
      .replace("localhost:2379", `localhost:${ports.etcd}`),
  );
  assert.ok(args.includes("--client-cert-auth") && args.includes("--peer-client-cert-auth"));
  spawnLogged(ETCD_BIN, args);
  // The probes' port: plain HTTP /health while clients need TLS.
  const probe = c.readinessProbe.httpGet;
  assert.equal(c.ports.find((p: Obj) => p.name === probe.port).containerPort, 2381);
  await waitFor200(`http://127.0.0.1:${ports.metrics}${probe.path}`, {
    timeoutMs: 20_000,
    what: "etcd /health on the metrics port",
    output: dump,
  });

  // The worker's flags, as rendered, reach etcd over mutual TLS.
  const w = find("StatefulSet", "mixed-llama-mixed").spec.template.spec.containers[0];
  const argv = (w.command as string[]).map(rewrite);
  const flag = (name: string) => argv[argv.indexOf(name) + 1];
  assert.match(flag("--etcd")!, /^https:\/\/localhost:\d+$/);
  const opts = etcdOptionsFromFlags({
    etcd: [flag("--etcd")!],
    etcdCa: flag("--etcd-ca"),
    etcdCert: flag("--etcd-cert"),
    etcdKey: flag("--etcd-key"),
  });
  const client = createEtcdClient(opts);
  await client.put("/tls-test").value("ok");
  assert.equal(await client.get("/tls-test").string(), "ok");
  client.close();

  // Without the client certificate: refused (the CA alone proves nothing about the client).
  const anon = createEtcdClient({ ...opts, certFile: undefined, keyFile: undefined, callTimeoutMs: 3000 });
  await assert.rejects(anon.get("/tls-test").string());
  anon.close();
  // Plain HTTP on the client port: refused too.
  const plainHttp = createEtcdClient({ endpoints: [`http://127.0.0.1:${ports.etcd}`], callTimeoutMs: 3000 });
  await assert.rejects(plainHttp.get("/tls-test").string());
  plainHttp.close();
});

test("nats-server runs the ConfigMap's nats.conf with TLS and demands client certificates", {
  skip,
}, async () => {
  const conf = rewrite(find("ConfigMap", "mixed-nats-config").data["nats.conf"] as string)
    .replace("port: 4222", `port: ${ports.nats}`)
    .replace(`http: "127.0.0.1:8222"`, `http: "127.0.0.1:${ports.monitor}"`);
  assert.match(conf, /verify: true/);
  const file = join(dir, "nats.conf");
  writeFileSync(file, conf);
  // The NATS container's env: every user's password from the generated Secret.
  const natsContainer = find("StatefulSet", "mixed-nats").spec.template.spec.containers[0];
  spawnLogged(NATS_SERVER_BIN, ["-c", file], containerEnv(natsContainer, objs));
  await waitFor200(`http://127.0.0.1:${ports.monitor}/healthz`, {
    timeoutMs: 20_000,
    what: "nats /healthz",
    output: dump,
  });

  const w = find("StatefulSet", "mixed-llama-mixed").spec.template.spec.containers[0];
  // The pool's own NATS identity, as the pod gets it.
  const env = containerEnv(w, objs, { rewrite });
  assert.match(env.INFERA_NATS_URL!, /^tls:\/\//);
  const argv = (w.command as string[]).map(rewrite);
  const flag = (name: string) => argv[argv.indexOf(name) + 1];
  const opts = natsConnectFromCli({
    natsUrl: env.INFERA_NATS_URL,
    natsUser: env.INFERA_NATS_USER,
    natsPassword: env.INFERA_NATS_PASSWORD,
    natsTlsCa: flag("--nats-tls-ca"),
    natsTlsCert: flag("--nats-tls-cert"),
    natsTlsKey: flag("--nats-tls-key"),
  })!;
  const nc = await connectNats({ ...opts, maxReconnectAttempts: 0 });
  // The engine identity may publish its own pod's KV subject and subscribe to its replay.
  const own = kvSubject("/models/Llama-3.1-8B-Instruct", "mixed-llama-mixed-0");
  const sub = nc.subscribe(`${own}.replay`, { max: 1 });
  await nc.flush();
  nc.publish(`${own}.replay`, "hello");
  for await (const m of sub) assert.equal(m.string(), "hello");
  await nc.close();

  // No client certificate: the handshake is refused.
  await assert.rejects(
    connectNats({
      ...opts,
      tls: { caFile: opts.tls!.caFile },
      maxReconnectAttempts: 0,
      connectTimeoutMs: 3000,
    }),
  );
});

const apiKeyOf = () => find("Secret", "infera-api-keys").stringData.keys as string;
let serverUp = false;

test("the rendered server and worker run over both: the server discovers the worker over etcd TLS", {
  skip,
}, async () => {
  const apiKey = apiKeyOf();
  // Each pod's env as the kubelet fills it: its own NATS identity from the generated Secret,
  // the API keys (a Secret the user makes) given here.
  const envOf = (c: Obj, vars: Record<string, string> = {}): Record<string, string> => ({
    ...containerEnv(c, objs, { rewrite, vars }),
    ...((c.env as Obj[]).some((e) => e.name === "INFERA_API_KEYS") ? { INFERA_API_KEYS: apiKey } : {}),
  });

  // The server: the Deployment's command with the ConfigMap's config file.
  const sc = find("Deployment", "mixed-server").spec.template.spec.containers[0];
  assert.equal(sc.command[0], IMAGE_BIN);
  const cfg = parse(rewrite(find("ConfigMap", "mixed-server-config").data["server.yaml"])) as Obj;
  cfg.host = "127.0.0.1";
  cfg.port = ports.server;
  const cfgFile = join(dir, "server.yaml");
  writeFileSync(cfgFile, stringify(cfg));
  const serverArgs = (sc.command.slice(1) as string[]).map((w) =>
    w === "/etc/infera/server.yaml" ? cfgFile : w,
  );
  const server = spawnInfera(serverArgs, { logLevel: "warn", env: envOf(sc), keepChars: 4000, stdout: true });
  track(server.proc, server.output);

  // The worker: the launcher's command as rendered, the simulator in vLLM's place.
  const wc = find("StatefulSet", "mixed-llama-mixed").spec.template.spec.containers[0];
  const vars = { POD_NAME: "mixed-llama-mixed-0", POD_IP: "127.0.0.1" };
  const words = (wc.command as string[]).map((w) =>
    rewrite(w.replace(/\$\((\w+)\)/g, (m, k: string) => vars[k as keyof typeof vars] ?? m)),
  );
  assert.equal(words[0], LAUNCHER_BIN);
  const listen = await engineListenArgs(ports.engine);
  const worker = spawnInfera([...words.slice(1), "--sim", ...listen], {
    logLevel: "warn",
    env: envOf(wc, vars),
    keepChars: 4000,
    stdout: true,
  });
  track(worker.proc, worker.output);

  // /ready: the server found the worker in etcd (over TLS) and put it in rotation.
  await waitFor200(`http://127.0.0.1:${ports.server}/ready`, {
    timeoutMs: 60_000,
    what: "server /ready",
    stepMs: 200,
    output: dump,
  });
  serverUp = true;
});

// Over TLS the NATS client hands the answer's bytes over as plain Uint8Arrays (not Buffers); a
// lone chunk's toString("utf8") in the server's whole-answer relay gave "123,34,…" and a 502
// (fixed in src/server/relay-whole.ts).
test("a completion through the rendered server over the NATS request plane over TLS", {
  skip,
}, async () => {
  assert.ok(serverUp, "the previous test started server and worker");
  const apiKey = apiKeyOf();
  const openai = new OpenAI({ baseURL: `http://127.0.0.1:${ports.server}/v1`, apiKey, maxRetries: 0 });
  const res = await openai.chat.completions
    .create({
      model: "llama-3.1-8b",
      messages: [{ role: "user", content: "hello over TLS" }],
      max_tokens: 4,
    })
    .catch((e: Error) => {
      throw new Error(`${e.message}\n${dump()}`);
    });
  assert.ok((res.choices[0]?.message.content ?? "").length > 0);
  // The request plane was NATS, over TLS: nats-server's own connection list (monitoring
  // /connz) shows the server's and the worker agent's connections, each with a TLS version,
  // and messages in both directions.
  const connz = (await (await fetch(`http://127.0.0.1:${ports.monitor}/connz`)).json()) as {
    connections: { name?: string; tls_version?: string; in_msgs: number; out_msgs: number }[];
  };
  assert.ok(connz.connections.length >= 2, JSON.stringify(connz));
  for (const c of connz.connections) assert.ok(c.tls_version, `${c.name}: TLS`);
  assert.ok(
    connz.connections.every((c) => c.in_msgs > 0 && c.out_msgs > 0),
    JSON.stringify(connz.connections),
  );
});
