/**
 * Issue #30 items 3, 6, 7 (argv secrets) and 10 on the rendered manifests: the Pod Security
 * Standards over every example (psa.ts, written from the Kubernetes document), `$(VAR)` in spec
 * values kept literal through the kubelet's expansion (dry-run.ts kubeExpand, a port of
 * Kubernetes' own), refusal of metacharacters with the key path, and the rendered kvd DaemonSet
 * started as a real process (its init step, then kvd as uid 10001) that listens and takes its token.
 */
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { parse } from "yaml";
import { plain, renderCluster } from "../../src/deploy/render/index.ts";
import { ClusterSpecError, parseClusterDocument } from "../../src/deploy/spec.ts";
import { KvdClient } from "../../src/kvd/client.ts";
import { freePort } from "../helpers/ports.ts";
import { waitUntil } from "../helpers/wait.ts";
import { engineDryRuns, expand } from "./dry-run.ts";
import { podLevel, podTemplates, violations } from "./psa.ts";

// biome-ignore lint/suspicious/noExplicitAny: the test walks nested manifests
type Obj = Record<string, any>;

const DIR = "deploy/examples";
const examples = readdirSync(DIR).filter((f) => f.endsWith(".yaml"));
const doc = (file: string) => parse(readFileSync(join(DIR, file), "utf8")) as Obj;
const render = (d: Obj): Obj[] =>
  renderCluster(parseClusterDocument(d), { secrets: "generate", random: () => "s3cret" }).map(plain);

/**
 * The exceptions the docs name (docs/deploy-kubernetes.md "Security"): host paths the spec asks
 * for (model cache, kvd's socket and disk), kvd's chown init step (root, CAP_CHOWN only), and RDMA
 * pools (IPC_LOCK as the image's root user; hostNetwork in that mode). Anything else fails.
 */
function allowed(v: string, t: { labels: Obj; pod: Obj }, spec: Obj): boolean {
  const component = t.labels["app.kubernetes.io/component"];
  const role = t.labels["infera.dev/role"];
  if (/^(HostPath Volumes|Volume Types): volume (models|kvd|sock|disk)\b/.test(v)) return true;
  if (component === "kvd" && /container kvd-dirs\b/.test(v)) return /Non-root|runAsUser 0|adds CHOWN/.test(v);
  const rdmaPool = spec.rdma !== undefined && role !== undefined && role !== "mixed";
  if (rdmaPool && /container engine\b/.test(v) && /adds IPC_LOCK|Running as Non-root:/.test(v)) return true;
  if (rdmaPool && spec.rdma.mode === "hostNetwork" && v === "Host Namespaces: spec.hostNetwork") return true;
  return false;
}

test("Pod Security: every rendered pod passes 'restricted' but for the named exceptions", () => {
  let pods = 0;
  const levels: string[] = [];
  for (const file of examples) {
    const d = doc(file);
    for (const t of podTemplates(render(d))) {
      pods++;
      const bad = violations(t.pod, "restricted").filter((v) => !allowed(v, t, d.spec));
      assert.deepEqual(bad, [], `${file} ${t.kind} ${t.name}`);
      levels.push(`${file} ${t.name}: ${podLevel(t.pod)}`);
      // Every container drops ALL and runs under RuntimeDefault seccomp, exceptions included.
      for (const c of [...(t.pod.initContainers ?? []), ...t.pod.containers]) {
        assert.ok(c.securityContext?.capabilities?.drop?.includes("ALL"), `${file} ${t.name} ${c.name}`);
        assert.equal(c.securityContext.allowPrivilegeEscalation, false, `${file} ${t.name} ${c.name}`);
      }
    }
  }
  assert.ok(pods >= 20, `pods checked: ${pods}`);
  // The control planes and the server are 'restricted' outright.
  for (const l of levels.filter((x) => /-(server|etcd|nats): /.test(x))) assert.match(l, /restricted$/);
});

test("Pod Security: a pool without host paths or RDMA is 'restricted'; an RDMA pool fails only on IPC_LOCK, root and hostNetwork", () => {
  const d = doc("mixed.yaml");
  delete d.spec.models[0].modelCacheHostPath;
  const workers = podTemplates(render(d)).filter((t) => t.labels["app.kubernetes.io/component"] === "worker");
  assert.ok(workers.length > 0);
  for (const t of workers) assert.deepEqual(violations(t.pod, "restricted"), [], t.name);
  const s = doc("sglang-mooncake.yaml");
  delete s.spec.models[0].modelCacheHostPath;
  const rdma = podTemplates(render(s)).filter((t) => t.labels["app.kubernetes.io/component"] === "worker");
  for (const t of rdma)
    assert.deepEqual(violations(t.pod, "restricted").sort(), [
      "Capabilities: container engine adds IPC_LOCK",
      "Capabilities: container engine adds IPC_LOCK (restricted: NET_BIND_SERVICE only)",
      "Host Namespaces: spec.hostNetwork",
      "Running as Non-root: container engine",
    ]);
});

test("the PSA checker itself: a default pod is baseline, host namespaces and hostPath are privileged", () => {
  const c = { name: "c", image: "x" };
  assert.equal(podLevel({ containers: [c] }), "baseline");
  assert.equal(podLevel({ hostNetwork: true, containers: [c] }), "privileged");
  assert.equal(
    podLevel({ containers: [c], volumes: [{ name: "h", hostPath: { path: "/" } }] }),
    "privileged",
  );
  const sc = {
    allowPrivilegeEscalation: false,
    runAsNonRoot: true,
    capabilities: { drop: ["ALL"] },
    seccompProfile: { type: "RuntimeDefault" },
  };
  assert.equal(podLevel({ containers: [{ ...c, securityContext: sc }] }), "restricted");
  const withCap = { ...sc, capabilities: { drop: ["ALL"], add: ["CHOWN"] } };
  assert.equal(podLevel({ containers: [{ ...c, securityContext: withCap }] }), "baseline");
});

test("$(VAR) in a served model name or engine argument stays literal after the kubelet's expansion", async () => {
  const d = doc("mixed.yaml");
  d.spec.models[0].servedModelName = "m-$(INFERA_NATS_PASSWORD)";
  d.spec.models[0].pools[0].engineArgs = ["--foo", "$(INFERA_NATS_PASSWORD)", "$$(X)", "cost$"];
  const o = render(d);
  const sts = o.find(
    (x) => x.kind === "StatefulSet" && x.metadata.labels["app.kubernetes.io/component"] === "worker",
  )!;
  const c = sts.spec.template.spec.containers.find((x: Obj) => x.name === "engine");
  const vars = { POD_IP: "10.0.0.5", POD_NAME: "w-0", INFERA_NATS_PASSWORD: "hunter2", X: "x" };
  const argv = expand(c.command, vars);
  assert.ok(!argv.join(" ").includes("hunter2"), argv.join(" "));
  assert.ok(argv.includes("m-$(INFERA_NATS_PASSWORD)"));
  assert.deepEqual(argv.slice(argv.indexOf("--foo")), ["--foo", "$(INFERA_NATS_PASSWORD)", "$$(X)", "cost$"]);
  // The downward-API references are still expanded.
  assert.ok(argv.includes("10.0.0.5") && argv.includes("w-0"));
  // The launcher registers the literal name (what /v1/models would list).
  const [out] = await engineDryRuns([{ ...c, command: c.command }], vars);
  const a = out!.argv;
  assert.equal(a[a.indexOf("--served-model-name") + 1], "m-$(INFERA_NATS_PASSWORD)", a.join(" "));
});

test("no rendered command line carries a secret reference (etcd credentials come from env)", () => {
  for (const file of examples) {
    for (const t of podTemplates(render(doc(file))))
      for (const c of [...(t.pod.initContainers ?? []), ...t.pod.containers])
        for (const w of [...(c.command ?? []), ...(c.args ?? [])])
          assert.ok(
            !/\$\((INFERA_)?(ETCD|NATS|KVD)_[A-Z_]*\)|PASSWORD|TOKEN\)/.test(w),
            `${file} ${c.name}: ${w}`,
          );
  }
});

test("spec values with newlines or metacharacters are refused with the key path", () => {
  const cases: [string, (s: Obj) => void, string][] = [
    [
      "namespace",
      (d) => {
        d.metadata.namespace = "infera\nx";
      },
      "metadata.namespace",
    ],
    [
      "image",
      (d) => {
        d.spec.image = "ghcr.io/x/y:1; rm -rf /";
      },
      "spec.image",
    ],
    [
      "engine image",
      (d) => {
        d.spec.models[0].engine.image = "a b";
      },
      "spec.models[0].engine.image",
    ],
    [
      "label value",
      (d) => {
        d.spec.models[0].pools[0].nodeSelector = { "k8s.io/x": "a$(B)" };
      },
      "spec.models[0].pools[0].nodeSelector.k8s.io/x",
    ],
    [
      "host path /",
      (d) => {
        d.spec.models[0].modelCacheHostPath = "/";
      },
      "spec.models[0].modelCacheHostPath",
    ],
    [
      "host path ..",
      (d) => {
        d.spec.models[0].modelCacheHostPath = "/models/../etc";
      },
      "spec.models[0].modelCacheHostPath",
    ],
    [
      "host path //",
      (d) => {
        d.spec.models[0].modelCacheHostPath = "/models//x";
      },
      "spec.models[0].modelCacheHostPath",
    ],
    [
      "served name newline",
      (d) => {
        d.spec.models[0].servedModelName = "a\nb";
      },
      "spec.models[0].servedModelName",
    ],
    [
      "engine arg newline",
      (d) => {
        d.spec.models[0].pools[0].engineArgs = ["x\ny"];
      },
      "spec.models[0].pools[0].engineArgs[0]",
    ],
    [
      "prometheus namespace",
      (d) => {
        d.spec.monitoring = { prometheusNamespace: "a b" };
      },
      "spec.monitoring.prometheusNamespace",
    ],
  ];
  for (const [what, mutate, path] of cases) {
    const d = doc("mixed.yaml");
    mutate(d);
    assert.throws(
      () => parseClusterDocument(d),
      (e: unknown) => e instanceof ClusterSpecError && e.issues.some((i) => i.path === path),
      what,
    );
  }
  // kvd's disk directory too.
  const k = doc("kvd.yaml");
  k.spec.kvd.disk.hostPath = "/";
  assert.throws(() => parseClusterDocument(k), /spec\.kvd\.disk\.hostPath: must not be \//);
});

test("kvd: the rendered init step and command line start kvd as uid 10001; it listens and takes the token", async (t) => {
  if (process.getuid?.() !== 0) return t.skip("needs root to run the init step's chown and kvd as uid 10001");
  const d = doc("kvd.yaml");
  // The example's 64 GiB arena and Redis are not what this box has; the rest is as rendered.
  d.spec.kvd.ramBytes = "64MiB";
  d.spec.kvd.disk.bytes = "64MiB";
  delete d.spec.kvd.remote;
  const o = render(d);
  const ds = o.find((x) => x.kind === "DaemonSet")!;
  const pod = ds.spec.template.spec;
  const secret = o.find((x) => x.kind === "Secret" && x.metadata.name === "kvd-kvd-token")!;
  const root = mkdtempSync(join(tmpdir(), "infera-kvd-ds-"));
  chmodSync(root, 0o755);
  // Volumes → directories under root: hostPaths as the kubelet creates them (root, 0755), the Secret as a file.
  const mounts = new Map<string, string>();
  const hostDirs: string[] = [];
  for (const v of pod.volumes) {
    const dir = join(root, v.name);
    mkdirSync(dir, { mode: 0o755 });
    if (v.secret) {
      writeFileSync(join(dir, "token"), secret.stringData.token);
      execFileSync("chown", ["-R", `0:${pod.securityContext.fsGroup}`, dir]); // fsGroup
      chmodSync(join(dir, "token"), v.secret.defaultMode);
    } else hostDirs.push(dir);
    mounts.set(v.name, dir);
  }
  const c = pod.containers[0];
  const remap = (w: string, ms: Obj[]) => {
    for (const m of ms)
      if (w.startsWith(m.mountPath)) return mounts.get(m.name)! + w.slice(m.mountPath.length);
    return w;
  };
  const port = await freePort();
  const metrics = await freePort();
  const argv = expand(c.command, {})
    .map((w) => remap(w, c.volumeMounts))
    .map((w) => (/^0\.0\.0\.0:\d+$/.test(w) ? `127.0.0.1:${port}` : w === "9400" ? String(metrics) : w))
    // Listeners on loopback and free ports (a shared box); kvd still reads the rendered
    // --tcp-token-file and requires the token whatever the address.
    .map((w) => (w === "0.0.0.0" ? "127.0.0.1" : w));
  assert.ok(argv.includes("--tcp-token-file"));
  assert.equal(argv[0], "/usr/local/bin/infera");
  const run = (uid: number) =>
    spawn(process.execPath, ["bin/infera.js", ...argv.slice(1)], {
      uid,
      gid: uid,
      stdio: ["ignore", "pipe", "pipe"],
      env: { PATH: process.env.PATH, HOME: root },
    });
  let child: ReturnType<typeof spawn> | undefined;
  try {
    // Without the init step kvd cannot bind its socket in the root-owned directory (the defect).
    const before = run(pod.securityContext.runAsUser);
    let err = "";
    before.stderr!.on("data", (b) => (err += b));
    before.stdout!.on("data", (b) => (err += b));
    const exited = new Promise<number | null>((r) => before.on("exit", r));
    // kvd logs the EACCES and exits 1; once (in a fresh-clone CI run) a process that had logged
    // it never exited (blocked in a futex), which hung the whole suite: a deadline kills it.
    const code = await Promise.race([
      exited,
      new Promise<number | null>((r) => setTimeout(r, 15_000, -1).unref()),
    ]);
    if (code === -1) before.kill("SIGKILL");
    assert.notEqual(code, 0);
    assert.match(err, /EACCES|permission denied/i);
    // The init container's command, on the same directories (its mounts remapped).
    const init = pod.initContainers[0];
    assert.equal(init.securityContext.runAsUser, 0);
    assert.deepEqual(init.securityContext.capabilities, { drop: ["ALL"], add: ["CHOWN"] });
    execFileSync(
      init.command[0],
      init.command.slice(1).map((w: string) => remap(w, init.volumeMounts)),
    );
    for (const dir of hostDirs) assert.equal(statSync(dir).uid, 10001, dir);
    child = run(pod.securityContext.runAsUser);
    let log = "";
    child.stdout!.on("data", (b) => (log += b));
    child.stderr!.on("data", (b) => (log += b));
    await waitUntil(
      () => log.includes("kvd ready") || log.includes('"level":60') || child!.exitCode !== null,
      20_000,
      log,
    );
    assert.equal(child.exitCode, null, log);
    const sock = argv[argv.indexOf("--socket") + 1]!;
    assert.equal(statSync(sock).mode & 0o777, 0o660, "socket 0660 for the engines' group");
    assert.equal(statSync(sock).gid, 10001);
    const good = await KvdClient.connect({
      tcp: { host: "127.0.0.1", port },
      token: secret.stringData.token,
    });
    assert.ok(await good.stats());
    good.close();
    await assert.rejects(async () => {
      const bad = await KvdClient.connect({ tcp: { host: "127.0.0.1", port }, token: "wrong" });
      await bad.stats();
    });
  } finally {
    child?.kill("SIGKILL");
    rmSync(root, { recursive: true, force: true });
  }
});

test("deploy k8s with --allowed-host-path/--allowed-image applies the operator's allowlists", async () => {
  const { renderFile } = await import("../../src/deploy/cli-action.ts");
  const policy = {
    allowedHostPaths: ["/models"],
    allowedImages: ["rocm/vllm:"],
    ownImage: "ghcr.io/infera/infera:0.1.0",
  };
  // Without a policy the admin's CLI renders what it rendered before.
  assert.ok(renderFile(join(DIR, "kvd.yaml")).length > 0);
  assert.throws(
    () => renderFile(join(DIR, "kvd.yaml"), {}, policy),
    (e: unknown) =>
      e instanceof ClusterSpecError &&
      e.issues.map((i) => i.path).join() === "spec.kvd.enabled,spec.kvd.disk.hostPath",
  );
  assert.ok(
    renderFile(
      join(DIR, "kvd.yaml"),
      {},
      { ...policy, allowedHostPaths: ["/models", "/mnt/nvme", "/run/infera"] },
    ).length > 0,
  );
});

test("modelCacheClaim: the weights on a PVC keep an engine pool 'restricted' (a host path cannot)", () => {
  const d = doc("mixed.yaml");
  delete d.spec.models[0].modelCacheHostPath;
  d.spec.models[0].modelCacheClaim = { name: "llama-weights", mountPath: "/models" };
  const w = podTemplates(render(d)).filter((t) => t.labels["app.kubernetes.io/component"] === "worker");
  assert.ok(w.length > 0);
  for (const t of w) {
    assert.deepEqual(violations(t.pod, "restricted"), [], t.name);
    const v = t.pod.volumes.find((x: Obj) => x.name === "models");
    assert.deepEqual(v.persistentVolumeClaim, { claimName: "llama-weights", readOnly: true });
    const m = t.pod.containers[0].volumeMounts.find((x: Obj) => x.name === "models");
    assert.deepEqual(m, { name: "models", mountPath: "/models", readOnly: true });
  }
  d.spec.models[0].modelCacheHostPath = "/models";
  assert.throws(
    () => parseClusterDocument(d),
    /spec\.models\[0\]\.modelCacheClaim: give modelCacheHostPath or modelCacheClaim/,
  );
});
