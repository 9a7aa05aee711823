/**
 * NATS identities and permissions as rendered (issue #30 item 1), run on a real nats-server
 * with the NATS ConfigMap's own nats.conf and the NATS container's env from the generated
 * Secret. Before, the server and every engine pod shared one user with no permissions: an
 * anonymous client or any engine pod read every prompt on `infera.req.>`, joined another
 * worker's `infera-agent` queue group, and republished KV batches on another worker's subject.
 * The completion path with these identities runs end to end in tls.test.ts.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { parse } from "yaml";
import { plaintextWarning } from "../../src/deploy/cli-action.ts";
import { plain, renderCluster } from "../../src/deploy/render/index.ts";
import { parseClusterDocument } from "../../src/deploy/spec.ts";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { connectNats } from "../../src/transport/nats/connection.ts";
import { NatsKvIngest } from "../../src/transport/nats/kv-ingest.ts";
import { encodeKvMessage, seqFrame } from "../../src/transport/nats/kv-wire.ts";
import { kvSubject, requestSubject } from "../../src/transport/nats/subjects.ts";
import { stopChild } from "../../src/util/child-process.ts";
import { NATS_SERVER_BIN } from "../helpers/nats.ts";
import { freePort } from "../helpers/ports.ts";
import { containerEnv } from "../helpers/rendered.ts";
import { waitFor200, waitUntil } from "../helpers/wait.ts";

process.env.INFERA_LOG_LEVEL ??= "silent";
// biome-ignore lint/suspicious/noExplicitAny: the test walks nested manifests
type Obj = Record<string, any>;

const skip = existsSync(NATS_SERVER_BIN) ? undefined : `no ${NATS_SERVER_BIN}`;
const raw = parse(readFileSync("deploy/examples/mixed.yaml", "utf8")) as Obj;
// Plain NATS here (tls.test.ts runs the TLS variant); a second model is another pool's identity.
raw.spec.tls = { enabled: false };
raw.spec.models.push({
  ...raw.spec.models[0],
  name: "qwen",
  model: "/models/Qwen3-8B",
  servedModelName: "qwen3-8b",
  pools: [{ role: "mixed", replicas: 1 }],
});
let n = 0;
const objs: Obj[] = renderCluster(parseClusterDocument(raw), {
  secrets: "generate",
  random: () => `pw-${++n}`,
}).map(plain);
const find = (kind: string, name: string): Obj => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  assert.ok(o, `${kind} ${name} rendered`);
  return o;
};

const LLAMA = "/models/Llama-3.1-8B-Instruct";
const dir = mkdtempSync(join(tmpdir(), "infera-nats-auth-"));
let proc: ChildProcess | undefined;
let url = "";
const conns: NatsConnection[] = [];

/** The identity a pod of this workload gets: INFERA_NATS_USER and its password. */
function identityOf(kind: string, name: string): { user: string; password: string } {
  const env = containerEnv(find(kind, name).spec.template.spec.containers[0], objs);
  assert.ok(env.INFERA_NATS_USER && env.INFERA_NATS_PASSWORD, `${name} has a NATS identity`);
  return { user: env.INFERA_NATS_USER, password: env.INFERA_NATS_PASSWORD };
}

async function as(id: { user: string; password: string }): Promise<NatsConnection> {
  const nc = await connectNats({ url, ...id, maxReconnectAttempts: 0, connectTimeoutMs: 3000 });
  conns.push(nc);
  return nc;
}

/** Resolves with the subscription's error (a permission violation closes it with one). */
async function subscriptionError(sub: Subscription): Promise<string> {
  try {
    for await (const _ of sub) return "got a message";
    return "closed without error";
  } catch (err) {
    return (err as Error).message;
  }
}

let monitorPort = 0;

before(async () => {
  if (skip) return;
  const port = await freePort();
  const monitor = await freePort();
  monitorPort = monitor;
  const conf = (find("ConfigMap", "mixed-nats-config").data["nats.conf"] as string)
    .replace("port: 4222", `listen: "127.0.0.1:${port}"`)
    .replace(`http: "127.0.0.1:8222"`, `http: "127.0.0.1:${monitor}"`);
  const file = join(dir, "nats.conf");
  writeFileSync(file, conf);
  const env = containerEnv(find("StatefulSet", "mixed-nats").spec.template.spec.containers[0], objs);
  proc = spawn(NATS_SERVER_BIN, ["-c", file], {
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, ...env },
  });
  let out = "";
  proc.stderr?.on("data", (d: Buffer) => {
    out = (out + d.toString()).slice(-4000);
  });
  await waitFor200(`http://127.0.0.1:${monitor}/healthz`, {
    timeoutMs: 20_000,
    what: "nats /healthz",
    output: () => out,
  });
  url = `nats://127.0.0.1:${port}`;
});

after(async () => {
  for (const nc of conns) await nc.close().catch(() => {});
  if (proc) await stopChild(proc, 5000);
  rmSync(dir, { recursive: true, force: true });
});

test("the monitor port (no auth in nats-server) listens on loopback only; the probes reach it from inside", {
  skip,
}, async () => {
  const nats = find("StatefulSet", "mixed-nats").spec.template.spec.containers[0] as Obj;
  // nats-io/nats-server@1787eee035cf0253c201fa0f05afad92b6f296dc server/opts.go: `http` is
  // parseListen(v) → HTTPHost/HTTPPort ("host:port"); `http_port` alone binds every address.
  const conf = find("ConfigMap", "mixed-nats-config").data["nats.conf"] as string;
  assert.match(conf, /^http: "127\.0\.0\.1:8222"$/m);
  assert.doesNotMatch(conf, /^(http_port|monitor_port|https?_port):/m);
  assert.ok(!(nats.ports as Obj[]).some((p) => p.containerPort === 8222), "no pod-IP monitor port");
  // The kubelet's httpGet would dial the pod IP: the probes run in the container instead.
  for (const probe of [nats.readinessProbe, nats.livenessProbe] as Obj[]) {
    assert.equal(probe.httpGet, undefined);
    const [cmd, ...args] = (probe.exec.command as string[]).map((w) =>
      w.replace("127.0.0.1:8222", `127.0.0.1:${monitorPort}`),
    );
    const r = spawnSync(cmd!, args, { timeout: 10_000 });
    assert.equal(r.status, 0, `probe ${probe.exec.command.join(" ")}: ${r.stderr}`);
  }
  // nats-server with the rendered line (port aside) answers on loopback, not on the host's address.
  const ext = Object.values(networkInterfaces())
    .flat()
    .find((a) => a && a.family === "IPv4" && !a.internal)?.address;
  if (ext) {
    const err = await fetch(`http://${ext}:${monitorPort}/healthz`).then(
      (r) => `answered ${r.status}`,
      (e: Error) => String((e.cause as Error | undefined)?.message ?? e.message),
    );
    assert.match(err, /ECONNREFUSED/);
  }
  // And the NetworkPolicy no longer admits anyone to it.
  const pol = find("NetworkPolicy", "mixed-nats-clients");
  assert.ok(!JSON.stringify(pol.spec.ingress).includes("8222"), JSON.stringify(pol.spec.ingress));
});

test("every role has its own user; pods of a pool get only that pool's password", { skip }, () => {
  const server = identityOf("Deployment", "mixed-server");
  const llama = identityOf("StatefulSet", "mixed-llama-mixed");
  const qwen = identityOf("StatefulSet", "mixed-qwen-mixed");
  assert.deepEqual(
    [server.user, llama.user, qwen.user],
    ["server", "engine-llama-mixed", "engine-qwen-mixed"],
  );
  assert.equal(new Set([server.password, llama.password, qwen.password]).size, 3);
  // The password comes from the user's own key of the Secret, never another's, never argv.
  for (const [kind, name, user] of [
    ["Deployment", "mixed-server", "server"],
    ["StatefulSet", "mixed-llama-mixed", "engine-llama-mixed"],
  ] as const) {
    const c = find(kind, name).spec.template.spec.containers[0];
    const ref = (c.env as Obj[]).find((e) => e.name === "INFERA_NATS_PASSWORD")?.valueFrom.secretKeyRef;
    assert.equal(ref.key, user);
    assert.match(ref.name, /^mixed-nats-credentials-[0-9a-f]{10}$/);
    assert.ok(!JSON.stringify(c.command ?? []).includes(server.password));
  }
});

test("an anonymous client, or a wrong password, is refused", { skip }, async () => {
  await assert.rejects(connectNats({ url, maxReconnectAttempts: 0, connectTimeoutMs: 3000 }), /auth/i);
  await assert.rejects(
    connectNats({ url, user: "server", password: "guess", maxReconnectAttempts: 0, connectTimeoutMs: 3000 }),
    /auth/i,
  );
});

test("an engine identity cannot read requests or answers, nor join another worker's queue group", {
  skip,
}, async () => {
  const engine = await as(identityOf("StatefulSet", "mixed-llama-mixed"));
  assert.match(await subscriptionError(engine.subscribe("infera.req.>")), /Permissions Violation/);
  assert.match(await subscriptionError(engine.subscribe("_INBOX.>")), /Permissions Violation/);
  // The queue-group attack of the issue, on another model's worker.
  const other = requestSubject("/models/Qwen3-8B", "mixed-qwen-mixed-0");
  assert.match(
    await subscriptionError(engine.subscribe(other, { queue: "infera-agent" })),
    /Permissions Violation/,
  );
  // Its own pods' request subjects it may take.
  const own = engine.subscribe(requestSubject(LLAMA, "mixed-llama-mixed-3"), { queue: "infera-agent" });
  await engine.flush();
  const server = await as(identityOf("Deployment", "mixed-server"));
  server.publish(requestSubject(LLAMA, "mixed-llama-mixed-3"), "req");
  for await (const m of own) {
    assert.equal(m.string(), "req");
    break;
  }
});

test("an engine identity cannot publish another worker's KV subject; a forged restart on its own is refused", {
  skip,
}, async () => {
  const server = await as(identityOf("Deployment", "mixed-server"));
  const seen: string[] = [];
  const spy = server.subscribe("infera.kv.>", {
    callback: (_e, m) => {
      seen.push(m.subject);
    },
  });
  await server.flush();
  const engine = await as(identityOf("StatefulSet", "mixed-qwen-mixed"));
  const errors: string[] = [];
  void (async () => {
    for await (const s of engine.status()) if (s.type === "error") errors.push(String(s.error));
  })();
  const foreign = kvSubject(LLAMA, "mixed-llama-mixed-0");
  const own = kvSubject("/models/Qwen3-8B", "mixed-qwen-mixed-0");
  engine.publish(foreign, "forged");
  engine.publish(own, "mine");
  await engine.flush();
  await waitUntil(() => seen.includes(own), 3000, "own KV publish delivered");
  await waitUntil(() => errors.some((e) => /Permissions Violation for Publish/.test(e)), 3000, "violation");
  assert.ok(!seen.includes(foreign), "the foreign KV subject got nothing");
  spy.unsubscribe();

  // On its own subject, a seq-0 "restart" without the record's epoch changes nothing.
  const disc = new MemoryDiscovery();
  const ingest = new NatsKvIngest({ nc: server, watcher: disc, replayTimeoutMs: 300 });
  ingest.start();
  disc.put({
    id: "mixed-qwen-mixed-0",
    model: "/models/Qwen3-8B",
    servedModelNames: ["qwen3-8b"],
    engine: "vllm",
    role: "mixed",
    url: "http://127.0.0.1:1",
    connector: { kind: "none" },
    blockSize: 4,
    kvEvents: { endpoint: "tcp://127.0.0.1:1", topic: "", framing: "seq" },
    dpSize: 1,
    tpSize: 1,
    maxModelLen: 4096,
    startedAt: new Date().toISOString(),
    natsKvEpoch: "0123456789abcdef",
  });
  await ingest.synced();
  engine.publish(own, encodeKvMessage(seqFrame(0), Buffer.from([0x93, 0, 0x90, 0])));
  await engine.flush();
  const sub = ingest.subscriber("mixed-qwen-mixed-0")!;
  await waitUntil(() => sub.stats.refused === 1, 3000, "refused");
  assert.equal(sub.stats.delivered, 0);
  const refused = (await ingest.metrics.refused.get()).values;
  assert.deepEqual(
    refused.map((v) => [v.labels.reason, v.value]),
    [["epoch", 1]],
  );
  await ingest.close();
});

test("TLS is on by default; plaintext only when asked for, with a warning", () => {
  const base = parse(readFileSync("deploy/examples/mixed.yaml", "utf8")) as Obj;
  delete base.spec.tls;
  const doc = parseClusterDocument(base);
  const out: Obj[] = renderCluster(doc, { secrets: "generate" }).map(plain);
  const env = (out.find((o) => o.kind === "Deployment")!.spec.template.spec.containers[0].env as Obj[]).find(
    (e) => e.name === "INFERA_NATS_URL",
  );
  assert.match(env?.value, /^tls:\/\//);
  const conf = out.find((o) => o.metadata.name === "mixed-nats-config")!.data["nats.conf"] as string;
  assert.match(conf, /verify: true/);
  assert.equal(plaintextWarning(doc.spec), undefined);
  // Explicitly off: plaintext, and `infera deploy k8s` says so.
  base.spec.tls = { enabled: false };
  const off = parseClusterDocument(base);
  assert.match(plaintextWarning(off.spec) ?? "", /etcd and NATS .* plaintext/);
  const offObjs: Obj[] = renderCluster(off).map(plain);
  const offDep = offObjs.find((o) => o.kind === "Deployment")!;
  const offEnv = (offDep.spec.template.spec.containers[0].env as Obj[]).find(
    (e) => e.name === "INFERA_NATS_URL",
  );
  assert.match(offEnv?.value, /^nats:\/\//);
});

// nats-server parses a `$VAR` password's value as a config value (nats-io/nats-server
// conf/parse.go, lookupVariable): a generated hex secret that reads as a float (`2e51…`) made
// the rendered server exit at start, which failed test/reliability/nats-security.test.ts now
// and then (the secrets are random). Each generated password must pass `nats-server -t`.
test("generated NATS passwords that look like numbers still parse", { skip }, () => {
  const tricky = ["2e51abc0", "12345678", "1e9"];
  let i = 0;
  const rendered: Obj[] = renderCluster(parseClusterDocument(raw), {
    secrets: "generate",
    random: () => tricky[i++ % tricky.length],
  }).map(plain);
  const conf = (
    rendered.find((o) => o.kind === "ConfigMap" && o.metadata.name === "mixed-nats-config")!.data[
      "nats.conf"
    ] as string
  ).replace("port: 4222", 'listen: "127.0.0.1:4222"');
  const file = join(dir, "tricky.conf");
  writeFileSync(file, conf);
  const natsPod = rendered.find((o) => o.kind === "StatefulSet" && o.metadata.name === "mixed-nats")!;
  const env = containerEnv(natsPod.spec.template.spec.containers[0], rendered);
  const check = spawnSync(NATS_SERVER_BIN, ["-c", file, "-t"], {
    env: { ...process.env, ...env },
    encoding: "utf8",
  });
  assert.equal(check.status, 0, check.stderr);
});
