/**
 * The kinds the operator creates for an InferaCluster, with their REST paths: used to list what
 * exists (observed) and by the API test double. Cluster-scoped kinds (Namespace) are not owned:
 * a namespaced custom resource cannot own them.
 */
export interface KindInfo {
  apiVersion: string;
  kind: string;
  plural: string;
  /**
   * The operator only creates these (POST; "already exists" is success) and never reads, lists,
   * patches or deletes them, so its RBAC needs just `create`: Secrets, whose `get`/`list` would
   * read every credential in scope (RBAC's resourceNames cannot limit `create` or `list`, and
   * label selectors limit nothing). Owner references still let the garbage collector delete them.
   */
  createOnly?: boolean;
}

export const OWNED_KINDS: readonly KindInfo[] = [
  { apiVersion: "v1", kind: "ConfigMap", plural: "configmaps" },
  { apiVersion: "v1", kind: "Secret", plural: "secrets", createOnly: true },
  { apiVersion: "v1", kind: "Service", plural: "services" },
  { apiVersion: "apps/v1", kind: "StatefulSet", plural: "statefulsets" },
  { apiVersion: "apps/v1", kind: "Deployment", plural: "deployments" },
  { apiVersion: "apps/v1", kind: "DaemonSet", plural: "daemonsets" },
  { apiVersion: "autoscaling/v2", kind: "HorizontalPodAutoscaler", plural: "horizontalpodautoscalers" },
  { apiVersion: "policy/v1", kind: "PodDisruptionBudget", plural: "poddisruptionbudgets" },
  { apiVersion: "networking.k8s.io/v1", kind: "NetworkPolicy", plural: "networkpolicies" },
  { apiVersion: "monitoring.coreos.com/v1", kind: "ServiceMonitor", plural: "servicemonitors" },
  { apiVersion: "monitoring.coreos.com/v1", kind: "PodMonitor", plural: "podmonitors" },
];

/** `/api/v1` or `/apis/<group>/<version>`. */
export function apiPrefix(apiVersion: string): string {
  return apiVersion.includes("/") ? `/apis/${apiVersion}` : `/api/${apiVersion}`;
}

export function namespacedPath(k: KindInfo, namespace: string, name?: string): string {
  const base = `${apiPrefix(k.apiVersion)}/namespaces/${encodeURIComponent(namespace)}/${k.plural}`;
  return name === undefined ? base : `${base}/${encodeURIComponent(name)}`;
}

export const kindKey = (apiVersion: string, kind: string, name: string): string =>
  `${apiVersion}/${kind}/${name}`;

export const isCreateOnly = (apiVersion: string, kind: string): boolean =>
  OWNED_KINDS.some((k) => k.createOnly === true && k.apiVersion === apiVersion && k.kind === kind);
