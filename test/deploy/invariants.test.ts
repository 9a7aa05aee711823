/**
 * Invariants of the rendered manifests that goldens cannot show: schema validity (the
 * kubernetes-models validators, again on the YAML read back), each worker's command accepted
 * by the real `infera engine` parser in dry run with the engine's flags in its argv, selectors,
 * NetworkPolicy peers, and dashboard queries naming only metrics the code exports.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { chmodSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { StatefulSet } from "kubernetes-models/apps/v1";
import { pack } from "msgpackr";
import { parse } from "yaml";
import * as zmq from "zeromq";
import { type KubeObject, plain, renderCluster } from "../../src/deploy/render/index.ts";
import { DASHBOARD_PANELS } from "../../src/deploy/render/monitoring.ts";
import { ClusterSpecError, parseClusterDocument } from "../../src/deploy/spec.ts";
import { freePort } from "../helpers/ports.ts";
import { waitUntil } from "../helpers/wait.ts";
import { engineDryRuns } from "./dry-run.ts";

// biome-ignore lint/suspicious/noExplicitAny: the test walks nested manifests
type Obj = Record<string, any>;

const DIR = "deploy/examples";
const load = (file: string) => parseClusterDocument(parse(readFileSync(join(DIR, file), "utf8")));
const objs = (file: string): Obj[] => renderCluster(load(file), { secrets: "generate" }).map(plain);
const examples = readdirSync(DIR).filter((f) => f.endsWith(".yaml"));

// A show_gids stand-in for --gid-index auto (format: Mellanox/ROCm show_gids: DEV PORT INDEX GID IPv4 VER DEV).
const gidsDir = mkdtempSync(join(tmpdir(), "infera-gids-"));
const gidsFile = join(gidsDir, "show_gids.txt");
writeFileSync(
  gidsFile,
  "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4\t\tVER\tDEV\n" +
    "rdma0\t1\t2\tfe80:0000:0000:0000:0000:0000:0000:0001\t\t\tv2\teth1\n" +
    "rdma0\t1\t3\t0000:0000:0000:0000:0000:ffff:0a00:0005\t10.0.0.5\tv2\teth1\n",
);
chmodSync(gidsFile, 0o644);
const VARS = { POD_IP: "10.0.0.5", POD_NAME: "w-0", INFERA_SHOW_GIDS_CMD: `cat ${gidsFile}` };

const workers = (o: Obj[]) =>
  o.filter((x) => x.kind === "StatefulSet" && x.metadata.labels["app.kubernetes.io/component"] === "worker");
const engineContainer = (sts: Obj) => sts.spec.template.spec.containers.find((c: Obj) => c.name === "engine");

test("every rendered object re-validates after a YAML round trip", () => {
  for (const file of examples) {
    for (const o of renderCluster(load(file))) {
      const back = parse(JSON.stringify(plain(o))) as Obj;
      if (back.kind === "StatefulSet") new StatefulSet(back as never).validate();
      (o as KubeObject).validate();
    }
  }
});

test("no volume is mounted inside a ConfigMap or Secret mount (the runtime cannot create its mount point there)", () => {
  // ConfigMap and Secret volumes are read-only in the container (Kubernetes >= 1.10), so a
  // nested mount point such as /etc/infera/tls under the /etc/infera ConfigMap fails the pod.
  let checked = 0;
  for (const file of examples) {
    for (const o of objs(file)) {
      const pod = o.spec?.template?.spec ?? (o.kind === "Pod" ? o.spec : undefined);
      if (!pod) continue;
      const readOnlyKinds = new Map<string, boolean>(
        (pod.volumes ?? []).map((v: Obj) => [v.name, Boolean(v.configMap || v.secret || v.projected)]),
      );
      for (const c of [...(pod.initContainers ?? []), ...pod.containers]) {
        const mounts: Obj[] = c.volumeMounts ?? [];
        for (const outer of mounts) {
          if (!readOnlyKinds.get(outer.name)) continue;
          for (const inner of mounts) {
            checked++;
            assert.ok(
              !inner.mountPath.startsWith(`${outer.mountPath.replace(/\/$/, "")}/`),
              `${file} ${o.kind} ${o.metadata.name} ${c.name}: ${inner.mountPath} inside ${outer.name} at ${outer.mountPath}`,
            );
          }
        }
      }
    }
  }
  assert.ok(checked > 0);
});

test("every worker command is accepted by `infera engine --dry-run` and reaches the engine", async () => {
  const cases = examples.flatMap((file) => workers(objs(file)).map((sts) => ({ file, sts })));
  assert.equal(cases.length, 9, "pools across the six examples");
  const outs = await engineDryRuns(
    cases.map((c) => engineContainer(c.sts)),
    VARS,
  );
  cases.forEach(({ file, sts }, i) => {
    const out = outs[i]!;
    const model = load(file).spec.models.find((m) => m.name === sts.metadata.labels["infera.dev/model"])!;
    const role = sts.spec.template.metadata.labels["infera.dev/role"];
    assert.equal(out.record.role, role, `${file} ${sts.metadata.name}`);
    assert.equal(out.record.id, "w-0", "worker id from the pod name");
    assert.match(String(out.record.url), /^http:\/\/10\.0\.0\.5:8000/, "advertised at the pod IP");
    // The launcher turned it into the engine's own command line.
    const a = out.argv.join(" ");
    if (model.engine.kind === "vllm") assert.match(a, /vllm serve|vllm\.entrypoints/);
    if (model.engine.kind === "sglang") assert.match(a, /sglang/);
    if (model.engine.kind === "atom") assert.match(a, /atom\.entrypoints/);
    if (role !== "mixed")
      assert.ok(a.toLowerCase().includes(model.connector ?? "-"), `${file}: connector in ${a}`);
  });
});

test("1p1d: RDMA attachment, GID auto resolved by show_gids, GPUs and IPC_LOCK", async () => {
  const o = objs("1p1d.yaml");
  for (const sts of workers(o)) {
    const pod = sts.spec.template;
    assert.equal(pod.metadata.annotations["k8s.v1.cni.cncf.io/networks"], "infera/roce-net");
    assert.equal(pod.spec.hostNetwork, undefined);
    const c = engineContainer(sts);
    assert.equal(c.resources.limits["amd.com/gpu"], "8");
    assert.equal(c.resources.limits["rdma/hca_shared_devices_a"], "1");
    assert.deepEqual(c.securityContext.capabilities.add, ["IPC_LOCK"]);
    const [out] = await engineDryRuns([c], VARS);
    assert.ok(out);
    // gid index 3 = the RoCEv2 entry with an IPv4 in the stand-in's output.
    assert.equal(out.env.NCCL_IB_GID_INDEX, "3");
    assert.ok(out.argv.includes("--kv-transfer-config"));
  }
});

// vLLM's MoRIIOConnector reads proxy_ip / proxy_ping_port from kv_connector_extra_config with no
// default (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_common.py
// @ 028a39c286ca87e0d302e66eda00bdb1a00b8c03, MoRIIOConfig.from_vllm_config); 36367 is the
// proxy ping port vLLM's MoRIIO examples use. Its heartbeat is one DEALER socket connected once,
// re-sending a msgpack map, with SNDTIMEO 1000 ms (moriio_heartbeat.py
// @ 1c3d6462281cdb320c80a4e11fa29acdec6deca0): through a Service it reaches one server pod only.
test("2p2d-moriio: servers discover in etcd, so several replicas; a sidecar takes vLLM's heartbeats", async () => {
  const o = objs("2p2d-moriio.yaml");
  const cfg = parse(o.find((x) => x.metadata.name === "moriio-server-config")!.data["server.yaml"]) as Obj;
  assert.equal(cfg.discovery.kind, "etcd");
  const dep = o.find((x) => x.kind === "Deployment" && x.metadata.name === "moriio-server")!;
  assert.equal(dep.spec.replicas, 2);
  const sink = dep.spec.template.spec.containers.find((c: Obj) => c.name === "moriio-heartbeats");
  const svc = o.find((x) => x.kind === "Service" && x.metadata.name === "moriio-server-moriio")!;
  assert.equal(svc.spec.ports[0].port, 36367);
  assert.equal(sink.ports.find((p: Obj) => p.name === svc.spec.ports[0].targetPort).containerPort, 36367);
  const ws = workers(o);
  const outs = await engineDryRuns(ws.map(engineContainer), VARS);
  for (const [i, sts] of ws.entries()) {
    assert.equal(sts.spec.replicas, 2);
    assert.equal(sts.spec.template.spec.hostNetwork, true);
    const out = outs[i]!;
    const at = out.argv.indexOf("--kv-transfer-config");
    const ktc = JSON.parse(out.argv[at + 1]!) as Obj;
    assert.equal(ktc.kv_connector, "MoRIIOConnector");
    assert.equal(ktc.kv_connector_extra_config.proxy_ip, "moriio-server-moriio.infera.svc");
    assert.equal(ktc.kv_connector_extra_config.proxy_ping_port, 36367);
    // The launcher registers the worker in etcd with what the router needs for MoRIIO.
    const rec = out.record as Obj;
    assert.equal(rec.connector.kind, "moriio");
    assert.equal(rec.connector.transferMode, "READ");
    assert.ok(rec.connector.handshakePort > 0 && rec.connector.notifyPort > 0);
  }

  // The sidecar's own command, run here (its cwd has node_modules with zeromq and msgpackr, as
  // /app has in the image): heartbeats sent as vLLM's are accepted and the first one is logged.
  assert.equal(sink.command[0], "node");
  assert.equal(sink.workingDir, "/app");
  const port = await freePort();
  const args = [...sink.command.slice(1, -1), String(port)];
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const dealer = new zmq.Dealer({ linger: 0, sendTimeout: 1000 });
  try {
    await waitUntil(() => out.includes("listening"), 10_000, "the sink to listen");
    dealer.connect(`tcp://127.0.0.1:${port}`);
    const reg = {
      type: "P",
      http_address: "10.0.0.5:8000",
      zmq_address: "10.0.0.5,handshake:6301,notify:61005",
      dp_size: 1,
      tp_size: 4,
      transfer_mode: "READ",
    };
    for (let k = 0; k < 3; k++) await dealer.send(pack(reg));
    await waitUntil(() => out.includes("10.0.0.5:8000"), 10_000, `the heartbeat logged: ${out}`);
    assert.equal(out.match(/moriio worker heartbeat/g)?.length, 1, out);
  } finally {
    dealer.close();
    child.kill("SIGKILL");
  }
});

test("external etcd: TLS files and credentials reach the server and every launcher, secrets not in argv", async () => {
  const o = objs("sglang-mooncake.yaml");
  assert.equal(o.filter((x) => x.metadata.name.includes("-etcd")).length, 0, "no in-cluster etcd");
  const cfg = parse(o.find((x) => x.metadata.name === "sgl-server-config")!.data["server.yaml"]) as Obj;
  assert.deepEqual(cfg.discovery.etcdEndpoints, [
    "https://etcd-0.platform.svc:2379",
    "https://etcd-1.platform.svc:2379",
  ]);
  assert.equal(cfg.discovery.options.caFile, "/etc/infera-etcd-tls/ca.crt");
  const server = o.find((x) => x.kind === "Deployment")!.spec.template.spec.containers[0];
  // Credentials reach the server through its env (INFERA_ETCD_USER/PASSWORD), not argv.
  assert.deepEqual(server.command.slice(4), []);
  assert.equal(
    server.env.find((e: Obj) => e.name === "INFERA_ETCD_PASSWORD").valueFrom.secretKeyRef.name,
    "etcd-infera-user",
  );
  const ws = workers(o);
  for (const sts of ws) {
    const c = engineContainer(sts);
    assert.ok(!c.command.some((w: string) => w.includes("PASSWORD")), "password stays in env");
    assert.equal(
      c.env.find((e: Obj) => e.name === "INFERA_ETCD_PASSWORD").valueFrom.secretKeyRef.name,
      "etcd-infera-user",
    );
    assert.ok(c.volumeMounts.some((m: Obj) => m.mountPath === "/etc/infera-etcd-tls"));
  }
  // The launcher accepts the TLS flags (dry run: files are read only when connecting).
  const outs = await engineDryRuns(ws.map(engineContainer), VARS);
  assert.equal(outs.length, 2);
});

test("server: probes on /health and /ready, HPA or fixed replicas, PDB, config file", () => {
  for (const file of examples) {
    const o = objs(file);
    const dep = o.find((x) => x.kind === "Deployment")!;
    const c = dep.spec.template.spec.containers[0];
    assert.equal(c.readinessProbe.httpGet.path, "/ready");
    assert.equal(c.livenessProbe.httpGet.path, "/health");
    assert.deepEqual(c.command.slice(1, 4), ["server", "--config", "/etc/infera/server.yaml"]);
    const hpa = o.find((x) => x.kind === "HorizontalPodAutoscaler");
    assert.equal(dep.spec.replicas === undefined, hpa !== undefined, `${file}: replicas xor HPA`);
    const spec = load(file).spec;
    const min = spec.server.autoscaling?.minReplicas ?? spec.server.replicas;
    assert.equal(
      o.some((x) => x.kind === "PodDisruptionBudget"),
      min > 1,
      file,
    );
  }
});

test("selectors select: each Service, workload and policy matches pods the output creates", () => {
  for (const file of examples) {
    const o = objs(file);
    const podLabels = o
      .filter((x) => ["StatefulSet", "Deployment", "DaemonSet"].includes(x.kind))
      .map((x) => {
        const sel = x.spec.selector.matchLabels as Record<string, string>;
        const labels = x.spec.template.metadata.labels as Record<string, string>;
        for (const [k, v] of Object.entries(sel)) assert.equal(labels[k], v, `${x.metadata.name} selector`);
        return labels;
      });
    const matches = (sel: Record<string, string>) =>
      podLabels.some((l) => Object.entries(sel).every(([k, v]) => l[k] === v));
    for (const s of o.filter((x) => x.kind === "Service"))
      assert.ok(matches(s.spec.selector), s.metadata.name);
    for (const p of o.filter((x) => x.kind === "NetworkPolicy"))
      assert.ok(matches(p.spec.podSelector.matchLabels), p.metadata.name);
  }
});

test("NetworkPolicies: only server and workers reach workers; only workers reach kvd", () => {
  const o = objs("kvd.yaml");
  const pol = (n: string) => o.find((x) => x.kind === "NetworkPolicy" && x.metadata.name === n)!;
  const peers = (p: Obj) =>
    p.spec.ingress.flatMap((r: Obj) =>
      r.from.map((f: Obj) => f.podSelector?.matchLabels["app.kubernetes.io/component"] ?? "prometheus-ns"),
    );
  assert.deepEqual(peers(pol("kvd-workers-from-server")).sort(), ["prometheus-ns", "server", "worker"]);
  assert.deepEqual(peers(pol("kvd-kvd-from-workers")).sort(), ["prometheus-ns", "worker"]);
  const kvdRule = pol("kvd-kvd-from-workers").spec.ingress[0];
  assert.deepEqual(kvdRule.ports, [{ port: 7070, protocol: "TCP" }]);
  // No policy admits everyone (no or an empty `from`) but the server's API port.
  for (const p of o.filter((x) => x.kind === "NetworkPolicy"))
    for (const r of p.spec.ingress ?? []) {
      if (p.metadata.name === "kvd-server-api" && r.ports?.[0]?.port === "http") continue;
      assert.ok(r.from?.length > 0, p.metadata.name);
    }
});

test("kvd: DaemonSet with the socket hostPath shared with workers; workers get INFERA_KVD_SOCKET", () => {
  const o = objs("kvd.yaml");
  const ds = o.find((x) => x.kind === "DaemonSet")!;
  const cmd = ds.spec.template.spec.containers[0].command as string[];
  assert.deepEqual(cmd.slice(0, 4), ["/usr/local/bin/infera", "kvd", "--socket", "/run/infera/kvd.sock"]);
  assert.ok(cmd.includes("--disk-dir"));
  // The L4 URL rides in the env, never in argv (public on the node; kvd refuses a password there).
  assert.ok(!cmd.some((w) => w.startsWith("--remote")), cmd.join(" "));
  const kvdEnv = ds.spec.template.spec.containers[0].env as Obj[];
  assert.deepEqual(kvdEnv, [{ name: "INFERA_KVD_REMOTE_URL", value: "redis://redis.infera.svc:6379/0" }]);
  for (const sts of workers(o)) {
    const env = engineContainer(sts).env as Obj[];
    assert.equal(env.find((e) => e.name === "INFERA_KVD_SOCKET")?.value, "/run/infera/kvd.sock");
  }
  assert.equal(objs("mixed.yaml").filter((x) => x.kind === "DaemonSet").length, 0);
});

test("kvd: a remote URL with a password comes from remoteSecret, by Secret env; never in the spec", () => {
  const d = parse(readFileSync(join(DIR, "kvd.yaml"), "utf8"));
  d.spec.kvd.remote = "redis://default:s3cret@redis.infera.svc:6379/0";
  assert.throws(() => parseClusterDocument(d), /spec\.kvd\.remote: carries a password: .*remoteSecret/);
  d.spec.kvd.remote = "redis://redis.infera.svc:6379/0";
  d.spec.kvd.remoteSecret = { name: "kvd-redis", key: "url" };
  assert.throws(() => parseClusterDocument(d), /remote and remoteSecret are exclusive/);
  delete d.spec.kvd.remote;
  const o: Obj[] = renderCluster(parseClusterDocument(d), { secrets: "generate" }).map(plain);
  const c = o.find((x) => x.kind === "DaemonSet")!.spec.template.spec.containers[0];
  assert.ok(!(c.command as string[]).some((w) => w.startsWith("--remote")));
  assert.deepEqual(c.env, [
    { name: "INFERA_KVD_REMOTE_URL", valueFrom: { secretKeyRef: { name: "kvd-redis", key: "url" } } },
  ]);
  assert.ok(!JSON.stringify(o).includes("s3cret"));
});

test("NATS planes: StatefulSet with one user per role from a Secret; each pod gets its own", () => {
  const o = objs("mixed.yaml");
  const conf = o.find((x) => x.metadata.name === "mixed-nats-config")!.data["nats.conf"] as string;
  assert.match(conf, /user: "server"\n {6}password: \$NATS_PW_SERVER\n/);
  assert.match(conf, /user: "engine-llama-mixed"\n {6}password: \$NATS_PW_ENGINE_LLAMA_MIXED\n/);
  const secret = o.find((x) => x.kind === "Secret" && x.metadata.name.startsWith("mixed-nats-credentials"))!;
  assert.deepEqual(Object.keys(secret.stringData).sort(), ["engine-llama-mixed", "server"]);
  for (const v of Object.values(secret.stringData) as string[]) assert.ok(v.length >= 32);
  for (const w of [...workers(o), o.find((x) => x.kind === "Deployment")!]) {
    const env = w.spec.template.spec.containers[0].env as Obj[];
    const user = env.find((e) => e.name === "INFERA_NATS_USER")?.value;
    assert.deepEqual(env.find((e) => e.name === "INFERA_NATS_PASSWORD")?.valueFrom.secretKeyRef, {
      name: secret.metadata.name,
      key: user,
    });
  }
  // Direct planes: no NATS at all.
  assert.equal(objs("atom-dp.yaml").filter((x) => x.metadata.name.includes("nats")).length, 0);
});

test("dashboard queries name only metrics the code exports", () => {
  const src = (dir: string): string =>
    readdirSync(dir, { withFileTypes: true })
      .map((d) =>
        d.isDirectory()
          ? src(join(dir, d.name))
          : d.name.endsWith(".ts")
            ? readFileSync(join(dir, d.name), "utf8")
            : "",
      )
      .join("\n");
  const code = [src("src/server"), src("src/kv"), src("src/kvd")].join("\n");
  const names = new Set<string>();
  for (const p of DASHBOARD_PANELS)
    for (const e of p.exprs)
      for (const m of e.matchAll(/\b((?:infera|kvd|vllm|sglang|atom)[a-z_:]*)/g)) names.add(m[1]!);
  for (const n of names) {
    const base = n.replace(/_(bucket|sum|count)$/, "");
    assert.ok(code.includes(`"${base}"`), `metric ${base} is not exported by src/`);
  }
  assert.ok(names.has("infera_time_to_first_token_seconds_bucket") && names.has("infera_worker_in_flight"));
});

test("spec errors name the key path", () => {
  const bad = (mutate: (s: Obj) => void): string => {
    const doc = parse(readFileSync(join(DIR, "1p1d.yaml"), "utf8")) as Obj;
    mutate(doc.spec);
    try {
      parseClusterDocument(doc);
    } catch (e) {
      assert.ok(e instanceof ClusterSpecError);
      return e.message;
    }
    assert.fail("accepted");
  };
  assert.match(
    bad((s) => (s.models[0].pools[1].replicas = -1)),
    /^spec\.models\[0\]\.pools\[1\]\.replicas: /,
  );
  assert.match(
    bad((s) => (s.models[0].engine.kind = "tgi")),
    /^spec\.models\[0\]\.engine\.kind: /,
  );
  assert.match(
    bad((s) => (s.rdma.gidIndex = "first")),
    /^spec\.rdma\.gidIndex: /,
  );
  assert.match(
    bad((s) => s.models[0].pools.pop()),
    /spec\.models\[0\]\.pools: a disaggregated model needs both/,
  );
  assert.match(
    bad((s) => (s.kvd = { enabled: true, ramBytes: "lots" })),
    /^spec\.kvd\.ramBytes: must be a byte size/,
  );
  assert.match(
    bad((s) => (s.bogus = 1)),
    /^spec: Unrecognized key\(s\) in object: 'bogus'/,
  );
});
