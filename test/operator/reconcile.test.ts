/**
 * The reconcile core against an in-memory "cluster": actions are applied to a map the way the
 * API server would (apply stores, delete removes, status replaces), and each scenario checks the
 * exact actions the next pass emits.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { parse } from "yaml";
import { kindKey } from "../../src/operator/kinds.ts";
import {
  type Action,
  HASH_ANNOTATION,
  type InferaClusterResource,
  type ObjectLike,
  reconcile,
} from "../../src/operator/reconcile.ts";

// biome-ignore lint/suspicious/noExplicitAny: the test edits nested specs
type Obj = Record<string, any>;

const now = new Date("2026-01-01T00:00:00Z");
const later = new Date("2026-01-01T00:05:00Z");

function cr(file: string, uid = "uid-1"): InferaClusterResource {
  const doc = parse(readFileSync(`deploy/examples/${file}`, "utf8")) as Obj;
  return {
    apiVersion: "infera.dev/v1alpha1",
    kind: "InferaCluster",
    metadata: { name: doc.metadata.name, namespace: doc.metadata.namespace, uid, generation: 1 },
    spec: doc.spec,
  };
}

class FakeCluster {
  readonly objects = new Map<string, ObjectLike>();
  run(c: InferaClusterResource, actions: Action[]): void {
    for (const a of actions) {
      if (a.type === "apply")
        this.objects.set(
          kindKey(a.object.apiVersion, a.object.kind, a.object.metadata.name),
          structuredClone(a.object),
        );
      else if (a.type === "delete")
        assert.ok(this.objects.delete(kindKey(a.apiVersion, a.kind, a.name)), `delete ${a.name}`);
      else c.status = structuredClone(a.status) as never;
    }
  }
  list(): ObjectLike[] {
    return [...this.objects.values()];
  }
  /** What the StatefulSet / Deployment controllers would report once pods are up. */
  allReady(): void {
    for (const o of this.objects.values())
      if (o.kind === "StatefulSet" || o.kind === "Deployment")
        o.status = { readyReplicas: (o.spec?.replicas as number | undefined) ?? 2 };
  }
}

const kinds = (as: Action[]) =>
  as.map((a) =>
    a.type === "apply"
      ? `apply ${a.object.kind}/${a.object.metadata.name}`
      : a.type === "delete"
        ? `delete ${a.kind}/${a.name}`
        : "status",
  );

function converge(file: string) {
  const c = cr(file);
  const k = new FakeCluster();
  k.run(c, reconcile(c, k.list(), { now }));
  k.allReady();
  k.run(c, reconcile(c, k.list(), { now }));
  return { c, k };
}

test("first pass applies every object with an owner reference and a content hash", () => {
  const c = cr("1p1d.yaml");
  const actions = reconcile(c, [], { now });
  const applies = actions.filter((a) => a.type === "apply");
  assert.ok(applies.length > 15);
  for (const a of applies) {
    assert.equal(a.object.kind === "Namespace", false, "a namespaced CR cannot own a Namespace");
    assert.deepEqual(a.object.metadata.ownerReferences, [
      {
        apiVersion: "infera.dev/v1alpha1",
        kind: "InferaCluster",
        name: "pd",
        uid: "uid-1",
        controller: true,
        blockOwnerDeletion: true,
      },
    ]);
    assert.match(a.object.metadata.annotations![HASH_ANNOTATION]!, /^[0-9a-f]{16}$/);
  }
  const st = actions.at(-1)!;
  assert.equal(st.type, "status");
  if (st.type === "status") {
    assert.equal(st.status.conditions.find((x) => x.type === "Ready")?.status, "False");
    assert.equal(st.status.conditions.find((x) => x.type === "Progressing")?.status, "True");
  }
});

test("unchanged spec and ready objects → no-op (no apply, no delete, no status write)", () => {
  const { c, k } = converge("mixed.yaml");
  const st = c.status!;
  assert.equal(st.conditions.find((x) => x.type === "Ready")?.status, "True");
  assert.deepEqual(st.pools, [{ model: "llama", pool: "mixed", role: "mixed", ready: 4, desired: 4 }]);
  assert.deepEqual(reconcile(c, k.list(), { now: later }), []);
});

test("scale change → the pool's StatefulSet with the new replica count, and NATS with the pool's new subjects", () => {
  const { c, k } = converge("1p1d.yaml");
  (c.spec as Obj).models[0].pools[1].replicas = 3;
  c.metadata.generation = 2;
  const actions = reconcile(c, k.list(), { now: later });
  // The pool's NATS user lists each pod's subjects (src/deploy/render/nats-auth.ts): the config
  // changes, and its hash on the NATS pod template rolls nats-server onto it.
  assert.deepEqual(kinds(actions), [
    "apply ConfigMap/pd-nats-config",
    "apply StatefulSet/pd-nats",
    "apply StatefulSet/pd-dsr1-decode",
    "status",
  ]);
  const conf = (actions[0] as { object: Obj }).object.data["nats.conf"] as string;
  assert.match(conf, /pd-dsr1-decode-2/);
  const sts = (actions[2] as { object: Obj }).object;
  assert.equal(sts.spec.replicas, 3);
  const st = (actions[3] as { status: Obj }).status;
  assert.equal(st.observedGeneration, 2);
  assert.equal(st.conditions.find((x: Obj) => x.type === "Ready").status, "False");
  // The Ready transition time moves; SpecValid's (still True) is kept.
  assert.equal(st.conditions.find((x: Obj) => x.type === "SpecValid").lastTransitionTime, now.toISOString());
  assert.equal(st.conditions.find((x: Obj) => x.type === "Ready").lastTransitionTime, later.toISOString());
});

test("engine image change → the model's StatefulSets get a new pod template (rolling update)", () => {
  const { c, k } = converge("sglang-mooncake.yaml");
  const before = k.list().filter((o) => o.kind === "StatefulSet" && o.metadata.name.startsWith("sgl-qwen"));
  (c.spec as Obj).models[0].engine.image = "lmsysorg/sglang:v0.5.0-rocm";
  const actions = reconcile(c, k.list(), { now: later });
  assert.deepEqual(kinds(actions), [
    "apply StatefulSet/sgl-qwen-prefill",
    "apply StatefulSet/sgl-qwen-decode",
    "status",
  ]);
  for (const a of actions.slice(0, 2) as { object: Obj }[]) {
    assert.equal(a.object.spec.template.spec.containers[0].image, "lmsysorg/sglang:v0.5.0-rocm");
    assert.equal(a.object.spec.updateStrategy.type, "RollingUpdate");
    const old = before.find((b) => b.metadata.name === a.object.metadata.name)!;
    assert.notEqual(
      a.object.metadata.annotations[HASH_ANNOTATION],
      old.metadata.annotations![HASH_ANNOTATION],
    );
  }
});

test("server policy change → the config and the Deployment (config hash in its pod template) are applied", () => {
  const { c, k } = converge("mixed.yaml");
  (c.spec as Obj).server.policy = "round-robin";
  const actions = reconcile(c, k.list(), { now: later });
  assert.deepEqual(
    kinds(actions).filter((s) => s !== "status"),
    ["apply ConfigMap/mixed-server-config", "apply Deployment/mixed-server"],
  );
});

test("removed features → owned objects no longer desired are deleted; others' objects are not", () => {
  const { c, k } = converge("kvd.yaml");
  // An object with the same labels but another owner must survive.
  k.objects.set("x", {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: {
      name: "foreign",
      labels: { "app.kubernetes.io/managed-by": "infera" },
      ownerReferences: [{ apiVersion: "v1", kind: "X", name: "x", uid: "other" }],
    },
  });
  (c.spec as Obj).kvd.enabled = false;
  (c.spec as Obj).monitoring = { serviceMonitor: false, dashboard: true };
  const actions = reconcile(c, k.list(), { now: later });
  assert.deepEqual(
    kinds(actions)
      .filter((s) => s.startsWith("delete"))
      .sort(),
    [
      "delete DaemonSet/kvd-kvd",
      "delete NetworkPolicy/kvd-kvd-from-workers",
      "delete PodMonitor/kvd-kvd",
      "delete ServiceMonitor/kvd",
    ],
  );
  // Workers lose the kvd socket mount: applied again.
  assert.ok(kinds(actions).includes("apply StatefulSet/kvd-llama-mixed"));
  k.run(c, actions);
  assert.ok(k.objects.has("x"));
});

test("deletion → nothing to do (owner references let the garbage collector remove children)", () => {
  const { c, k } = converge("mixed.yaml");
  c.metadata.deletionTimestamp = later.toISOString();
  assert.deepEqual(reconcile(c, k.list(), { now: later }), []);
});

test("invalid spec → only a status naming the key path; nothing applied or deleted", () => {
  const { c, k } = converge("mixed.yaml");
  (c.spec as Obj).models[0].pools[0].replicas = -2;
  const actions = reconcile(c, k.list(), { now: later });
  assert.deepEqual(kinds(actions), ["status"]);
  const st = (actions[0] as { status: Obj }).status;
  const valid = st.conditions.find((x: Obj) => x.type === "SpecValid");
  assert.equal(valid.status, "False");
  assert.match(valid.message, /spec\.models\[0\]\.pools\[0\]\.replicas/);
});

const natsSecrets = (os: ObjectLike[]) =>
  os.filter((o) => o.kind === "Secret" && o.metadata.name.startsWith("mixed-nats-credentials"));

test("generated secrets are created once, never re-applied (no rotation under running pods)", () => {
  const { c, k } = converge("mixed.yaml");
  const [secret] = natsSecrets(k.list());
  assert.ok(secret);
  // A different random source must not matter on later passes.
  const actions = reconcile(c, k.list(), { now: later, random: () => "rotated" });
  assert.deepEqual(actions, []);
  k.objects.delete(kindKey("v1", "Secret", secret.metadata.name));
  const again = reconcile(c, k.list(), { now: later, random: () => "fresh" });
  assert.deepEqual(
    kinds(again).filter((s) => s !== "status"),
    [`apply Secret/${secret.metadata.name}`],
  );
  k.run(c, again);
  // Scaling a pool keeps the users, so the Secret (and every password) stays.
  (c.spec as Obj).models[0].pools[0].replicas += 1;
  assert.ok(!kinds(reconcile(c, k.list(), { now: later })).some((a) => a.startsWith("apply Secret/")));
});

test("a pool added later gets its key: a new complete credentials Secret, every NATS user moves to it", () => {
  const { c, k } = converge("mixed.yaml");
  const [before] = natsSecrets(k.list());
  const models = (c.spec as Obj).models as Obj[];
  models.push({ ...structuredClone(models[0]), name: "qwen", model: "Qwen/Qwen3-8B" });
  const actions = reconcile(c, k.list(), { now: later, random: () => "pw" });
  k.run(c, actions);
  // The operator may only create Secrets (deploy/operator.yaml): a Secret it wrote once can never
  // gain the new pool's key, so the new key set needs a new Secret, holding every user.
  const created = actions.flatMap((a) =>
    a.type === "apply" && a.object.kind === "Secret" ? [a.object] : [],
  );
  assert.equal(created.length, 1);
  const next = created[0]!;
  assert.notEqual(next.metadata.name, before!.metadata.name);
  assert.deepEqual(Object.keys(next.stringData as Obj).sort(), [
    "engine-llama-mixed",
    "engine-qwen-mixed",
    "server",
  ]);
  // nats-server and every client read the new Secret, each its own key: no pod references a key
  // its Secret lacks.
  const keysOf = new Map(
    natsSecrets(k.list()).map((s) => [s.metadata.name, Object.keys(s.stringData as Obj)]),
  );
  let refs = 0;
  for (const o of k.list()) {
    const pod = (o.spec as Obj | undefined)?.template?.spec as Obj | undefined;
    for (const ctr of (pod?.containers ?? []) as Obj[])
      for (const e of (ctr.env ?? []) as Obj[]) {
        const ref = e.valueFrom?.secretKeyRef;
        if (!ref?.name.startsWith("mixed-nats-credentials")) continue;
        refs++;
        assert.equal(ref.name, next.metadata.name, `${o.metadata.name} ${e.name}`);
        assert.ok(keysOf.get(ref.name)?.includes(ref.key), `${o.metadata.name}: key ${ref.key}`);
      }
  }
  assert.ok(refs >= 6, `${refs}`);
});

test("status counts ready workers per pool and the server", () => {
  const c = cr("sglang-mooncake.yaml");
  const k = new FakeCluster();
  k.run(c, reconcile(c, [], { now }));
  const sts = k.list().find((o) => o.kind === "StatefulSet" && o.metadata.name === "sgl-qwen-decode")!;
  sts.status = { readyReplicas: 1 };
  k.run(c, reconcile(c, k.list(), { now }));
  assert.deepEqual(c.status!.pools, [
    { model: "qwen", pool: "prefill", role: "prefill", ready: 0, desired: 1 },
    { model: "qwen", pool: "decode", role: "decode", ready: 1, desired: 2 },
  ]);
  assert.deepEqual(c.status!.server, { ready: 0, desired: 2 });
  assert.match(
    c.status!.conditions.find((x) => x.type === "Ready")!.message,
    /server 0\/2, qwen\/prefill 0\/1, qwen\/decode 1\/2/,
  );
});

// Issue #30 item 2: the operator as a confused deputy. A tenant's InferaCluster asking for the
// host's root or an image of its choice is refused in status, and nothing is applied.
const strict = { allowedHostPaths: [], allowedImages: [], ownImage: "ghcr.io/infera/infera:0.1.0" };

test("policy: host / and a tenant's images are refused with a reason per key; nothing is applied", () => {
  const c = cr("kvd.yaml");
  const spec = c.spec as Obj;
  spec.image = "evil.example/tenant/infera:1";
  spec.models[0].engine.image = "evil.example/tenant/vllm:1";
  spec.models[0].modelCacheHostPath = "/";
  // `/` itself is refused by the spec's shape before any policy.
  let actions = reconcile(c, [], { now, policy: strict });
  assert.deepEqual(kinds(actions), ["status"]);
  let valid = (actions[0] as { status: Obj }).status.conditions.find((x: Obj) => x.type === "SpecValid");
  assert.equal(valid.reason, "InvalidSpec");
  assert.match(valid.message, /spec\.models\[0\]\.modelCacheHostPath: must not be \//);
  // A canonical path outside the allowlist, and images outside it: PolicyRefused, each named.
  spec.models[0].modelCacheHostPath = "/etc";
  actions = reconcile(c, [], { now, policy: { ...strict, allowedHostPaths: ["/models"] } });
  assert.deepEqual(kinds(actions), ["status"]);
  const st = (actions[0] as { status: Obj }).status;
  valid = st.conditions.find((x: Obj) => x.type === "SpecValid");
  assert.equal(valid.status, "False");
  assert.equal(valid.reason, "PolicyRefused");
  for (const key of [
    "spec.image: image 'evil.example/tenant/infera:1'",
    "spec.models[0].engine.image: image 'evil.example/tenant/vllm:1'",
    "spec.models[0].modelCacheHostPath: host path '/etc'",
    "spec.kvd.disk.hostPath: host path '/mnt/nvme/infera-kvd'",
    "spec.kvd.enabled: host path '/run/infera'",
  ])
    assert.ok(valid.message.includes(key), `${key} in ${valid.message}`);
  assert.equal(st.conditions.find((x: Obj) => x.type === "Ready").status, "False");
});

test("policy: allowed prefixes, digests and host paths let the example through; a prefix is not a name prefix", () => {
  const c = cr("kvd.yaml");
  const policy = {
    ...strict,
    allowedHostPaths: ["/models", "/mnt/nvme/", "/run/infera"],
    allowedImages: ["rocm/vllm:"],
  };
  const actions = reconcile(c, [], { now, policy });
  assert.ok(kinds(actions).includes("apply DaemonSet/kvd-kvd"), kinds(actions).join(" "));
  // `/models` admits /models and below, not /models-other; `rocm/vllm:` not `rocm/vllm-evil`.
  (c.spec as Obj).models[0].modelCacheHostPath = "/models-other";
  (c.spec as Obj).models[0].engine.image = "rocm/vllm-evil:latest";
  const refused = reconcile(c, [], { now, policy });
  const msg = (refused[0] as { status: Obj }).status.conditions[0].message as string;
  assert.match(msg, /modelCacheHostPath: host path '\/models-other' refused/);
  assert.match(msg, /engine\.image: image 'rocm\/vllm-evil:latest' refused/);
  // A digest entry admits any name pinned to it, and only that digest.
  const digest = `sha256:${"a".repeat(64)}`;
  (c.spec as Obj).models[0].modelCacheHostPath = "/models";
  (c.spec as Obj).models[0].engine.image = `registry.example/vllm@${digest}`;
  const pinned = reconcile(c, [], { now, policy: { ...policy, allowedImages: [digest] } });
  assert.ok(kinds(pinned).some((k) => k.startsWith("apply")));
});

test("policy: with an empty image list only the operator's defaults run (etcd, NATS, its own image)", () => {
  const c = cr("mixed.yaml");
  delete (c.spec as Obj).models[0].modelCacheHostPath;
  const actions = reconcile(c, [], { now, policy: strict });
  const msg = (actions.at(-1) as { status: Obj }).status.conditions[0].message as string;
  // Only the engine image (no default exists for it) is refused.
  assert.equal(msg.split("\n").length, 1, msg);
  assert.match(msg, /^spec\.models\[0\]\.engine\.image: .*only its default images/);
});
