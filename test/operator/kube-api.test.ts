/**
 * The operator end to end against the API test double: @kubernetes/client-node talks HTTP to
 * it; the controller lists and watches the custom resource, server-side applies the objects
 * (content type application/apply-patch+yaml, fieldManager infera-operator, force), writes
 * status through the status subresource, follows spec changes, and deletes orphans.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { KubeConfig } from "@kubernetes/client-node";
import { parse, parseAllDocuments } from "yaml";
import { Controller } from "../../src/operator/controller.ts";
import { KubeClusterApi } from "../../src/operator/kube-api.ts";
import { HASH_ANNOTATION } from "../../src/operator/reconcile.ts";
import { createLogger } from "../../src/util/log.ts";
import { FakeApiServer } from "./fake-apiserver.ts";

// biome-ignore lint/suspicious/noExplicitAny: the test edits nested specs
type Obj = Record<string, any>;

/** `allowed(verb, resource)` from the rules of the Role/ClusterRole in an install manifest. */
export function rbacFrom(
  file: string,
  kind: "Role" | "ClusterRole",
): (verb: string, plural: string) => boolean {
  const role = parseAllDocuments(readFileSync(file, "utf8"))
    .map((d) => d.toJS() as Obj)
    .find((d) => d.kind === kind)!;
  return (verb, plural) =>
    role.rules.some(
      (r: Obj) => (r.resources.includes(plural) || r.resources.includes("*")) && r.verbs.includes(verb),
    );
}

const api = new FakeApiServer();
let controller: Controller;
let kubeApi: KubeClusterApi;

async function until(what: string, f: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!f()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

before(async () => {
  await api.start();
  // No Prometheus Operator in this "cluster": its kinds are 404 (skipped, the rest converges).
  api.missingGroups.add("monitoring.coreos.com/v1");
  // The operator's RBAC as deploy/operator.yaml grants it: a request outside it is a 403.
  api.allowed = rbacFrom("deploy/operator.yaml", "ClusterRole");
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: "fake", server: api.url, skipTLSVerify: true }],
    users: [{ name: "op", token: "t0ken" }],
    contexts: [{ name: "fake", cluster: "fake", user: "op" }],
    currentContext: "fake",
  });
  kubeApi = new KubeClusterApi(kc);
  controller = new Controller({
    api: kubeApi,
    logger: createLogger("operator-test"),
    resyncMs: 100,
    retryMs: 50,
  });
  await controller.start();
});

after(async () => {
  await controller.stop();
  await api.close();
});

const doc = parse(readFileSync("deploy/examples/kvd.yaml", "utf8")) as Obj;

test("a new InferaCluster is applied with SSA and gets a status", async () => {
  api.putCluster(doc);
  await until("server Deployment", () => api.get("Deployment", "infera", "kvd-server") !== undefined);
  await until("status", () => api.get("InferaCluster", "infera", "kvd")?.status !== undefined);
  const applies = api.requests.filter((r) => r.method === "PATCH" && !r.path.endsWith("/status"));
  assert.ok(applies.length > 10);
  for (const r of applies) {
    assert.equal(r.contentType, "application/apply-patch+yaml");
    assert.equal(r.query.fieldManager, "infera-operator");
    assert.equal(r.query.force, "true");
  }
  const sts = api.get("StatefulSet", "infera", "kvd-llama-mixed")!;
  assert.equal(sts.spec.replicas, 8);
  assert.equal(sts.metadata.ownerReferences[0].kind, "InferaCluster");
  assert.equal(sts.metadata.ownerReferences[0].uid, api.get("InferaCluster", "infera", "kvd")!.metadata.uid);
  assert.equal(sts.spec.template.spec.containers[0].command[0], "/infera/bin/infera");
  const statusPatch = api.requests.find((r) => r.path.endsWith("/inferaclusters/kvd/status"))!;
  assert.equal(statusPatch.method, "PATCH");
  assert.equal(statusPatch.contentType, "application/merge-patch+json");
  assert.equal(statusPatch.path, "/apis/infera.dev/v1alpha1/namespaces/infera/inferaclusters/kvd/status");
  assert.deepEqual([...kubeApi.skipped].sort(), [
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/ServiceMonitor",
  ]);
  assert.ok(api.get("ConfigMap", "infera", "kvd-grafana-dashboard"));
  const st = api.get("InferaCluster", "infera", "kvd")!.status;
  assert.equal(st.conditions.find((c: Obj) => c.type === "Ready").status, "False");
});

test("ready children → Ready=True, then steady state sends no writes", async () => {
  api.setReady("StatefulSet", "infera", "kvd-llama-mixed", 8);
  api.setReady("Deployment", "infera", "kvd-server", 3);
  await until("Ready=True", () =>
    api
      .get("InferaCluster", "infera", "kvd")
      ?.status?.conditions?.some((c: Obj) => c.type === "Ready" && c.status === "True"),
  );
  const passes = controller.passes;
  // The generated Secrets are POSTed on every pass (answered 409 while they exist): the operator
  // may not read Secrets, so asking to create one is how it learns one was deleted.
  const writes = () => api.requests.filter((r) => r.method !== "GET" && !/\/secrets$/.test(r.path));
  const before = writes().length;
  const secretPosts = api.requests.filter((r) => /\/secrets$/.test(r.path)).length;
  await until("three more resync passes", () => controller.passes >= passes + 3);
  assert.deepEqual(
    writes()
      .slice(before)
      .map((r) => `${r.method} ${r.path} ${JSON.stringify(r.body)}`),
    [],
    "no-op passes write nothing",
  );
  assert.ok(api.requests.filter((r) => /\/secrets$/.test(r.path)).length > secretPosts);
  const st = api.get("InferaCluster", "infera", "kvd")!.status;
  assert.equal(st.conditions.find((c: Obj) => c.type === "Progressing").status, "False");
});

test("a generated Secret deleted by hand is created again on the next pass (no restart)", async () => {
  const secrets = [...api.store.keys()].filter((k) => k.startsWith("secrets/infera/"));
  assert.ok(secrets.length > 0);
  const victim = secrets.find((k) => k.includes("nats-credentials")) ?? secrets[0];
  const old = api.store.get(victim)!;
  api.store.delete(victim); // kubectl delete secret
  await until("Secret recreated", () => api.store.has(victim));
  const again = api.store.get(victim)!;
  assert.notEqual(again.metadata.uid, old.metadata.uid, "a new object");
  assert.deepEqual(
    Object.keys(again.data ?? again.stringData).sort(),
    Object.keys(old.data ?? old.stringData).sort(),
  );
  assert.equal(again.metadata.ownerReferences?.[0]?.kind, "InferaCluster");
});

test("scale change in the custom resource → the StatefulSet is re-applied with the new replicas", async () => {
  const next = structuredClone(doc);
  next.spec.models[0].pools[0].replicas = 10;
  const before = api.get("StatefulSet", "infera", "kvd-llama-mixed")!.metadata.annotations[HASH_ANNOTATION];
  api.putCluster(next);
  await until("replicas 10", () => api.get("StatefulSet", "infera", "kvd-llama-mixed")?.spec.replicas === 10);
  assert.notEqual(
    api.get("StatefulSet", "infera", "kvd-llama-mixed")!.metadata.annotations[HASH_ANNOTATION],
    before,
  );
  await until(
    "observedGeneration 2",
    () => api.get("InferaCluster", "infera", "kvd")?.status?.observedGeneration === 2,
  );
});

test("kvd turned off → its DaemonSet and NetworkPolicy are deleted through DELETE", async () => {
  const next = structuredClone(doc);
  next.spec.models[0].pools[0].replicas = 10;
  next.spec.kvd.enabled = false;
  api.putCluster(next);
  await until("DaemonSet gone", () => api.get("DaemonSet", "infera", "kvd-kvd") === undefined);
  await until("policy gone", () => api.get("NetworkPolicy", "infera", "kvd-kvd-from-workers") === undefined);
  const del = api.requests.filter((r) => r.method === "DELETE").map((r) => r.path);
  assert.ok(del.includes("/apis/apps/v1/namespaces/infera/daemonsets/kvd-kvd"), del.join("\n"));
  assert.equal(api.requests.find((r) => r.method === "DELETE")?.query.propagationPolicy, "Background");
});

test("an invalid spec is reported in status and changes nothing", async () => {
  const writes = api.requests.filter((r) => r.method === "PATCH" && !r.path.endsWith("/status")).length;
  const bad = structuredClone(doc);
  bad.spec.models[0].engine.kind = "tgi";
  api.putCluster(bad);
  await until("SpecValid=False", () =>
    api
      .get("InferaCluster", "infera", "kvd")
      ?.status?.conditions?.some((c: Obj) => c.type === "SpecValid" && c.status === "False"),
  );
  const msg = api
    .get("InferaCluster", "infera", "kvd")!
    .status.conditions.find((c: Obj) => c.type === "SpecValid").message;
  assert.match(msg, /spec\.models\[0\]\.engine\.kind/);
  assert.equal(
    api.requests.filter((r) => r.method === "PATCH" && !r.path.endsWith("/status")).length,
    writes,
  );
});

test("under deploy/operator.yaml's RBAC the operator only ever POSTs Secrets (never reads one)", async () => {
  const onSecrets = api.requests.filter((r) => /\/secrets(\/|$)/.test(r.path));
  assert.ok(onSecrets.length > 0, "the generated Secrets were created");
  assert.deepEqual([...new Set(onSecrets.map((r) => r.method))], ["POST"]);
  // And a read would have been refused: the role has no get/list on secrets.
  const allowed = rbacFrom("deploy/operator.yaml", "ClusterRole");
  assert.equal(allowed("get", "secrets") || allowed("list", "secrets") || allowed("watch", "secrets"), false);
  assert.equal(allowed("create", "secrets"), true);
});
