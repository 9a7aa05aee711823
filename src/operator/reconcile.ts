/**
 * The operator's core, a pure function: (InferaCluster, objects that exist) → actions. Desired
 * objects are the renderer's output with an owner reference to the cluster and a hash of their
 * content; one whose live copy carries the same hash is left alone (so an unchanged spec is a
 * no-op), any other is server-side applied (a changed pod template rolls the StatefulSet or
 * Deployment). Owned objects no longer desired are deleted. Deletion of the cluster itself is
 * left to Kubernetes' garbage collector through the owner references. Status: ready/desired per
 * pool and for the server, and Ready/Progressing/SpecValid conditions.
 */
import { createHash } from "node:crypto";
import { CRD_GROUP, CRD_KIND, CRD_VERSION } from "../deploy/crd.ts";
import { type ClusterPolicy, policyIssues } from "../deploy/policy.ts";
import { MANAGED_BY, names, poolName, workerObjectName } from "../deploy/render/context.ts";
import { plain, renderCluster } from "../deploy/render/index.ts";
import { type ClusterSpec, ClusterSpecError, parseClusterSpec } from "../deploy/spec.ts";
import { isCreateOnly, kindKey } from "./kinds.ts";

export const HASH_ANNOTATION = "infera.dev/applied-hash";
export const FIELD_MANAGER = "infera-operator";

export interface ObjectMetaLike {
  name: string;
  namespace?: string;
  uid?: string;
  generation?: number;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: { apiVersion: string; kind: string; name: string; uid: string; controller?: boolean }[];
}

export interface ObjectLike {
  apiVersion: string;
  kind: string;
  metadata: ObjectMetaLike;
  spec?: Record<string, unknown>;
  status?: Record<string, unknown>;
  [k: string]: unknown;
}

export interface Condition {
  type: "Ready" | "Progressing" | "SpecValid";
  status: "True" | "False" | "Unknown";
  reason: string;
  message: string;
  lastTransitionTime: string;
  observedGeneration?: number;
}

export interface PoolStatus {
  model: string;
  pool: string;
  role: string;
  ready: number;
  desired: number;
}

export interface ClusterStatus {
  observedGeneration?: number;
  server?: { ready: number; desired: number };
  pools?: PoolStatus[];
  conditions: Condition[];
}

export interface InferaClusterResource {
  apiVersion: string;
  kind: string;
  metadata: ObjectMetaLike;
  /** Unvalidated: reconcile parses it. */
  spec?: unknown;
  status?: ClusterStatus;
}

export type Action =
  | { type: "apply"; object: ObjectLike }
  | { type: "delete"; apiVersion: string; kind: string; namespace: string; name: string }
  | { type: "status"; status: ClusterStatus };

/** sha256 of the object's content in a key-order-independent form. */
export function contentHash(o: unknown): string {
  const canon = (v: unknown): unknown =>
    Array.isArray(v)
      ? v.map(canon)
      : v !== null && typeof v === "object"
        ? Object.fromEntries(
            Object.keys(v as object)
              .sort()
              .map((k) => [k, canon((v as Record<string, unknown>)[k])]),
          )
        : v;
  return createHash("sha256")
    .update(JSON.stringify(canon(o)))
    .digest("hex")
    .slice(0, 16);
}

export interface ReconcileOptions {
  now: Date;
  /** Source of generated secret values. */
  random?: () => string;
  /** `apiVersion/kind` the cluster does not serve (e.g. no Prometheus Operator): not desired. */
  unserved?: ReadonlySet<string>;
  /** The installer's allowlists (host paths, images); a spec outside them is refused, not applied. */
  policy?: ClusterPolicy;
}

export function reconcile(
  cr: InferaClusterResource,
  observed: readonly ObjectLike[],
  opts: ReconcileOptions,
): Action[] {
  const { name, namespace = "default", uid, generation } = cr.metadata;
  // Being deleted: the garbage collector removes what we own.
  if (cr.metadata.deletionTimestamp) return [];
  const owned = observed.filter((o) => (o.metadata.ownerReferences ?? []).some((r) => r.uid === uid));
  let spec: ClusterSpec;
  try {
    spec = parseClusterSpec(cr.spec);
  } catch (err) {
    const message = err instanceof ClusterSpecError ? err.message : String(err);
    return statusAction(cr, opts.now, {
      observedGeneration: generation,
      conditions: [
        cond("SpecValid", "False", "InvalidSpec", message),
        cond("Ready", "False", "InvalidSpec", "the spec does not validate; nothing was changed"),
      ],
    });
  }
  const refused = opts.policy ? policyIssues(spec, opts.policy) : [];
  if (refused.length > 0) {
    // A confused deputy no more: the reason for each refusal is in status, nothing is changed.
    const message = refused.map((i) => `${i.path}: ${i.message}`).join("\n");
    return statusAction(cr, opts.now, {
      observedGeneration: generation,
      conditions: [
        cond("SpecValid", "False", "PolicyRefused", message),
        cond(
          "Ready",
          "False",
          "PolicyRefused",
          "the spec asks for what the operator does not allow; nothing was changed",
        ),
      ],
    });
  }
  let desired: ObjectLike[];
  try {
    desired = renderCluster(
      { name, namespace, spec },
      { secrets: "generate", random: opts.random, namespace: false },
    ).map((o) => plain(o) as ObjectLike);
  } catch (err) {
    return statusAction(cr, opts.now, {
      observedGeneration: generation,
      conditions: [
        cond("SpecValid", "False", "RenderFailed", String(err)),
        cond("Ready", "False", "RenderFailed", ""),
      ],
    });
  }
  const live = new Map(owned.map((o) => [kindKey(o.apiVersion, o.kind, o.metadata.name), o]));
  const existing = new Map(observed.map((o) => [kindKey(o.apiVersion, o.kind, o.metadata.name), o]));
  const actions: Action[] = [];
  const keep = new Set<string>();
  for (const d of desired) {
    if (opts.unserved?.has(`${d.apiVersion}/${d.kind}`)) continue;
    const key = kindKey(d.apiVersion, d.kind, d.metadata.name);
    keep.add(key);
    // Generated secrets are written once: re-applying would rotate them under running pods.
    if (d.kind === "Secret" && existing.has(key)) continue;
    const hash = contentHash(d);
    if (live.get(key)?.metadata.annotations?.[HASH_ANNOTATION] === hash) continue;
    d.metadata.annotations = { ...d.metadata.annotations, [HASH_ANNOTATION]: hash };
    d.metadata.ownerReferences = [
      {
        apiVersion: `${CRD_GROUP}/${CRD_VERSION}`,
        kind: CRD_KIND,
        name,
        uid: uid ?? "",
        controller: true,
        blockOwnerDeletion: true,
      } as NonNullable<ObjectMetaLike["ownerReferences"]>[number],
    ];
    actions.push({ type: "apply", object: d });
  }
  for (const [key, o] of live) {
    if (keep.has(key) || o.metadata.labels?.["app.kubernetes.io/managed-by"] !== MANAGED_BY) continue;
    // Create-only kinds (Secrets) are never deleted here: the operator has no such right; the
    // garbage collector removes them with the cluster (owner reference).
    if (isCreateOnly(o.apiVersion, o.kind)) continue;
    actions.push({
      type: "delete",
      apiVersion: o.apiVersion,
      kind: o.kind,
      namespace,
      name: o.metadata.name,
    });
  }
  // A create-only object (a generated Secret) cannot be observed, so it is asked for on every
  // pass: that alone is no change in progress.
  const changing = actions.some(
    (a) => a.type !== "apply" || !isCreateOnly(a.object.apiVersion, a.object.kind),
  );
  const status = observeStatus(cr, spec, owned, changing);
  return [...actions, ...statusAction(cr, opts.now, status)];
}

function cond(
  type: Condition["type"],
  status: Condition["status"],
  reason: string,
  message: string,
): Condition {
  return { type, status, reason, message, lastTransitionTime: "" };
}

const num = (v: unknown): number => (typeof v === "number" ? v : 0);

function observeStatus(
  cr: InferaClusterResource,
  spec: ClusterSpec,
  owned: readonly ObjectLike[],
  changing: boolean,
): ClusterStatus {
  const ctx = { name: cr.metadata.name };
  const find = (kind: string, n: string) => owned.find((o) => o.kind === kind && o.metadata.name === n);
  const pools: PoolStatus[] = [];
  for (const m of spec.models) {
    for (const p of m.pools) {
      const sts = find("StatefulSet", workerObjectName(ctx, m, p));
      pools.push({
        model: m.name,
        pool: poolName(p),
        role: p.role,
        ready: num(sts?.status?.readyReplicas),
        desired: p.replicas,
      });
    }
  }
  const dep = find("Deployment", names.server(ctx));
  const serverDesired = spec.server.autoscaling
    ? num(dep?.spec?.replicas) || spec.server.autoscaling.minReplicas
    : spec.server.replicas;
  const server = { ready: num(dep?.status?.readyReplicas), desired: serverDesired };
  const notReady = pools
    .filter((p) => p.ready < p.desired)
    .map((p) => `${p.model}/${p.pool} ${p.ready}/${p.desired}`);
  if (server.ready < Math.max(1, server.desired))
    notReady.unshift(`server ${server.ready}/${server.desired}`);
  const ready = notReady.length === 0 && !changing;
  return {
    observedGeneration: cr.metadata.generation,
    server,
    pools,
    conditions: [
      cond("SpecValid", "True", "Valid", ""),
      cond(
        "Ready",
        ready ? "True" : "False",
        ready ? "AllReady" : changing ? "Applying" : "NotReady",
        ready ? "" : notReady.join(", "),
      ),
      cond("Progressing", changing ? "True" : "False", changing ? "Applying" : "Stable", ""),
    ],
  };
}

/** A status action only when something changed; transition times carry over unchanged conditions. */
function statusAction(cr: InferaClusterResource, now: Date, next: ClusterStatus): Action[] {
  const prev = cr.status;
  for (const c of next.conditions) {
    const old = prev?.conditions?.find((p) => p.type === c.type);
    c.lastTransitionTime = old && old.status === c.status ? old.lastTransitionTime : now.toISOString();
    c.observedGeneration = cr.metadata.generation;
  }
  if (prev && contentHash(prev) === contentHash({ ...prev, ...next })) return [];
  return [{ type: "status", status: next }];
}
