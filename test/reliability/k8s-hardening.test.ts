/**
 * Issue #30 items 2, 3, 6, 7 (argv secrets) and 10 as reliability rows: the rendered manifests
 * and the operator's decisions measured over every example (the detailed tests are
 * test/deploy/security.test.ts, test/operator/reconcile.test.ts, test/deploy/crd.test.ts).
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { parse, parseAllDocuments } from "yaml";
import { plain, renderCluster } from "../../src/deploy/render/index.ts";
import { parseClusterDocument } from "../../src/deploy/spec.ts";
import { KvdClient } from "../../src/kvd/client.ts";
import { reconcile } from "../../src/operator/reconcile.ts";
import { expand } from "../deploy/dry-run.ts";
import { podTemplates, violations } from "../deploy/psa.ts";
import { freePort } from "../helpers/ports.ts";
import { waitUntil } from "../helpers/wait.ts";
import { fileDone, fileStarted, record } from "./summary.ts";

// biome-ignore lint/suspicious/noExplicitAny: walks untyped manifests
type Obj = Record<string, any>;

fileStarted(import.meta.url);
after(() => fileDone(import.meta.url));

const DIR = "deploy/examples";
const examples = readdirSync(DIR).filter((f) => f.endsWith(".yaml"));
const doc = (f: string) => parse(readFileSync(join(DIR, f), "utf8")) as Obj;
const render = (d: Obj): Obj[] =>
  renderCluster(parseClusterDocument(d), { secrets: "generate", random: () => "s3cret" }).map(plain);

test("operator as a confused deputy (item 2)", () => {
  const d = doc("kvd.yaml");
  d.spec.image = "evil.example/t/infera:1";
  d.spec.models[0].engine.image = "evil.example/t/vllm:1";
  d.spec.models[0].modelCacheHostPath = "/etc";
  const cr = {
    apiVersion: "infera.dev/v1alpha1",
    kind: "InferaCluster",
    metadata: { ...d.metadata, uid: "u", generation: 1 },
    spec: d.spec,
  };
  const actions = reconcile(cr, [], {
    now: new Date(),
    policy: { allowedHostPaths: ["/models"], allowedImages: [], ownImage: "ghcr.io/infera/infera:0.1.0" },
  });
  const applied = actions.filter((a) => a.type === "apply").length;
  const msg = actions.find((a) => a.type === "status")?.status.conditions[0]?.message ?? "";
  const refused = msg.split("\n").filter(Boolean).length;
  const role = parseAllDocuments(readFileSync("deploy/operator.yaml", "utf8"))
    .map((x) => x.toJS() as Obj)
    .find((x) => x.kind === "ClusterRole")!;
  const secretVerbs = role.rules
    .filter((r: Obj) => r.resources.includes("secrets"))
    .flatMap((r: Obj) => r.verbs);
  const pass = applied === 0 && refused === 5 && secretVerbs.join() === "create";
  record(
    import.meta.url,
    "operator allowlists + RBAC",
    `hostile spec: ${refused}/5 keys refused in status, ${applied} objects applied; ClusterRole secrets verbs [${secretVerbs}]`,
    "all refused, 0 applied, Secrets create-only",
    pass,
  );
  assert.ok(pass, msg);
});

test("rendered kvd DaemonSet starts (item 3)", async () => {
  const d = doc("kvd.yaml");
  d.spec.kvd.ramBytes = "64MiB";
  d.spec.kvd.disk.bytes = "64MiB";
  delete d.spec.kvd.remote;
  const o = render(d);
  const pod = o.find((x) => x.kind === "DaemonSet")!.spec.template.spec;
  const token = o.find((x) => x.kind === "Secret" && x.metadata.name === "kvd-kvd-token")!.stringData.token;
  const root = mkdtempSync(join(tmpdir(), "infera-rel-kvd-"));
  const dirs = new Map<string, string>();
  for (const v of pod.volumes) {
    dirs.set(v.name, join(root, v.name));
    mkdirSync(join(root, v.name));
    if (v.secret) writeFileSync(join(root, v.name, "token"), token);
  }
  const c = pod.containers[0];
  const port = await freePort();
  const argv = expand(c.command, {})
    .map((w) => {
      for (const m of c.volumeMounts)
        if (w.startsWith(m.mountPath)) return dirs.get(m.name)! + w.slice(m.mountPath.length);
      return w;
    })
    .map((w) =>
      /^0\.0\.0\.0:\d+$/.test(w)
        ? `127.0.0.1:${port}`
        : w === "0.0.0.0"
          ? "127.0.0.1"
          : w === "9400"
            ? "0"
            : w,
    )
    // The test runs as whoever runs it: the socket group is its own.
    .map((w, i, a) => (a[i - 1] === "--socket-group" ? String(process.getgid?.() ?? 0) : w));
  const child = spawn(process.execPath, ["bin/infera.js", ...argv.slice(1)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  child.stdout.on("data", (b) => (log += b));
  child.stderr.on("data", (b) => (log += b));
  let ok = false;
  let refused = false;
  try {
    await waitUntil(() => log.includes("kvd ready") || child.exitCode !== null, 20_000, log);
    const cl = await KvdClient.connect({ tcp: { host: "127.0.0.1", port }, token });
    ok = (await cl.stats()) !== undefined;
    cl.close();
    try {
      const bad = await KvdClient.connect({ tcp: { host: "127.0.0.1", port }, token: "wrong" });
      await bad.stats();
    } catch {
      refused = true;
    }
  } finally {
    child.kill("SIGKILL");
    rmSync(root, { recursive: true, force: true });
  }
  const pass = ok && refused;
  record(
    import.meta.url,
    "kvd DaemonSet (rendered command + token)",
    `listening ${ok ? "yes" : "no"}; token accepted ${ok ? "yes" : "no"}; wrong token refused ${refused ? "yes" : "no"}`,
    "starts, listens, token enforced",
    pass,
  );
  assert.ok(pass, log);
});

test("$(VAR) and secrets on rendered command lines (items 6, 7)", () => {
  const vars = {
    POD_IP: "10.0.0.5",
    POD_NAME: "w-0",
    INFERA_NATS_PASSWORD: "hunter2",
    INFERA_ETCD_PASSWORD: "hunter3",
  };
  let leaks = 0;
  let words = 0;
  let secretRefs = 0;
  for (const file of examples) {
    const d = doc(file);
    d.spec.models[0].servedModelName = "$(INFERA_NATS_PASSWORD)";
    d.spec.models[0].pools[0].engineArgs = ["$(INFERA_ETCD_PASSWORD)"];
    for (const t of podTemplates(render(d)))
      for (const c of [...(t.pod.initContainers ?? []), ...t.pod.containers]) {
        const raw = [...(c.command ?? []), ...(c.args ?? [])];
        words += raw.length;
        secretRefs += raw.filter((w) =>
          /\$\((INFERA_)?\w*(PASSWORD|TOKEN|USER)\)/.test(w.replaceAll("$$", "")),
        ).length;
        leaks += expand(raw, vars).filter((w) => w.includes("hunter")).length;
      }
  }
  const pass = leaks === 0 && secretRefs === 0;
  record(
    import.meta.url,
    "$(VAR) escaping, argv secrets",
    `${words} command words over ${examples.length} examples with '$(…PASSWORD)' in names/args: ${leaks} expanded to a secret; ${secretRefs} secret references rendered`,
    "0 and 0",
    pass,
  );
  assert.ok(pass);
});

test("pod hardening (item 10)", () => {
  let containers = 0;
  let dropAll = 0;
  let pods = 0;
  let restricted = 0;
  for (const file of examples)
    for (const t of podTemplates(render(doc(file)))) {
      pods++;
      if (violations(t.pod, "restricted").length === 0) restricted++;
      for (const c of [...(t.pod.initContainers ?? []), ...t.pod.containers]) {
        containers++;
        const sc = c.securityContext ?? {};
        const seccomp = sc.seccompProfile?.type ?? t.pod.securityContext?.seccompProfile?.type;
        if (
          sc.capabilities?.drop?.includes("ALL") &&
          seccomp === "RuntimeDefault" &&
          sc.allowPrivilegeEscalation === false
        )
          dropAll++;
      }
    }
  const pass = dropAll === containers;
  record(
    import.meta.url,
    "pod hardening (PSA)",
    `${dropAll}/${containers} containers drop ALL + seccomp RuntimeDefault + no escalation; ${restricted}/${pods} pods 'restricted' (the rest: host paths, RDMA IPC_LOCK/hostNetwork, kvd's chown step — docs "Security")`,
    "every container hardened; exceptions only as documented (test/deploy/security.test.ts)",
    pass,
  );
  assert.ok(pass);
});
