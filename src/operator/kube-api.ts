/**
 * The operator's thin API layer over @kubernetes/client-node: list/watch InferaClusters, list
 * the objects one owns, server-side apply (application/apply-patch+yaml with a fieldManager),
 * DELETE, and merge-patch of the status subresource. Nothing here decides anything.
 */
import {
  CustomObjectsApi,
  type KubeConfig,
  KubernetesObjectApi,
  PatchStrategy,
  setHeaderOptions,
  Watch,
} from "@kubernetes/client-node";
import { CRD_GROUP, CRD_PLURAL, CRD_VERSION } from "../deploy/crd.ts";
import { isCreateOnly, OWNED_KINDS } from "./kinds.ts";
import {
  type ClusterStatus,
  FIELD_MANAGER,
  type InferaClusterResource,
  type ObjectLike,
} from "./reconcile.ts";

export type ApplyResult = "applied" | "created" | "exists" | "skipped";

export type WatchPhase = "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR";

export interface ClusterApi {
  listClusters(namespace?: string): Promise<{ items: InferaClusterResource[]; resourceVersion: string }>;
  /** Resolves once the watch is open; `done` fires when it ends (error or server close). */
  watchClusters(
    namespace: string | undefined,
    resourceVersion: string,
    onEvent: (phase: WatchPhase, obj: InferaClusterResource) => void,
    done: (err: unknown) => void,
  ): Promise<{ abort(): void }>;
  /** What exists of a cluster's objects; create-only kinds (Secrets) cannot be listed: absent. */
  listOwned(namespace: string, instance: string): Promise<ObjectLike[]>;
  /**
   * Server-side apply; a create-only kind is POSTed: `created`, or `exists` when the API answers
   * 409 (so a deleted one is made again on the next pass, without reading any).
   */
  apply(obj: ObjectLike): Promise<ApplyResult>;
  delete(ref: { apiVersion: string; kind: string; namespace: string; name: string }): Promise<void>;
  patchStatus(namespace: string, name: string, status: ClusterStatus): Promise<void>;
  /** `apiVersion/kind` of optional kinds this cluster does not serve (found by a failed apply). */
  readonly skipped: ReadonlySet<string>;
}

const statusCode = (err: unknown): number | undefined => {
  const e = err as { code?: unknown; statusCode?: unknown };
  return typeof e?.code === "number" ? e.code : typeof e?.statusCode === "number" ? e.statusCode : undefined;
};

const notServed = (err: unknown): boolean =>
  statusCode(err) === 404 ||
  /Unrecognized API version and kind|Failed to fetch resource metadata/.test(String(err));

export class KubeClusterApi implements ClusterApi {
  private readonly kc: KubeConfig;
  private readonly objects: KubernetesObjectApi;
  private readonly custom: CustomObjectsApi;

  constructor(kc: KubeConfig) {
    this.kc = kc;
    this.objects = KubernetesObjectApi.makeApiClient(kc);
    this.custom = kc.makeApiClient(CustomObjectsApi);
  }

  async listClusters(namespace?: string) {
    const base = { group: CRD_GROUP, version: CRD_VERSION, plural: CRD_PLURAL };
    const res = (
      namespace
        ? await this.custom.listNamespacedCustomObject({ ...base, namespace })
        : await this.custom.listClusterCustomObject(base)
    ) as { items?: InferaClusterResource[]; metadata?: { resourceVersion?: string } };
    return { items: res.items ?? [], resourceVersion: res.metadata?.resourceVersion ?? "" };
  }

  async watchClusters(
    namespace: string | undefined,
    resourceVersion: string,
    onEvent: (phase: WatchPhase, obj: InferaClusterResource) => void,
    done: (err: unknown) => void,
  ) {
    const path = namespace
      ? `/apis/${CRD_GROUP}/${CRD_VERSION}/namespaces/${namespace}/${CRD_PLURAL}`
      : `/apis/${CRD_GROUP}/${CRD_VERSION}/${CRD_PLURAL}`;
    return new Watch(this.kc).watch(
      path,
      { resourceVersion, allowWatchBookmarks: true },
      (phase: string, obj: InferaClusterResource) => onEvent(phase as WatchPhase, obj),
      done,
    );
  }

  async listOwned(namespace: string, instance: string): Promise<ObjectLike[]> {
    const selector = `app.kubernetes.io/instance=${instance},app.kubernetes.io/managed-by=infera`;
    const out: ObjectLike[] = [];
    for (const k of OWNED_KINDS) {
      // Not listable with create-only RBAC: reconcile asks for them on every pass, and a POST
      // answered 409 says it exists (apply), one answered 201 put back a deleted one.
      if (k.createOnly) continue;
      try {
        const list = await this.objects.list(
          k.apiVersion,
          k.kind,
          namespace,
          undefined,
          undefined,
          undefined,
          undefined,
          selector,
        );
        // List items carry no apiVersion/kind.
        for (const item of list.items)
          out.push({ ...(item as unknown as ObjectLike), apiVersion: k.apiVersion, kind: k.kind });
      } catch (err) {
        // A kind the cluster does not serve (no Prometheus Operator): nothing of it exists.
        if (notServed(err)) continue;
        throw err;
      }
    }
    return out;
  }

  /** Kinds skipped because the cluster does not serve them (optional add-ons), for logs and tests. */
  readonly skipped = new Set<string>();

  async apply(obj: ObjectLike): Promise<ApplyResult> {
    if (isCreateOnly(obj.apiVersion, obj.kind)) {
      try {
        await this.objects.create(obj as never, undefined, undefined, FIELD_MANAGER);
        return "created";
      } catch (err) {
        // Written once (a generated credential is never rotated under running pods).
        if (statusCode(err) !== 409) throw err;
        return "exists";
      }
    }
    try {
      await this.objects.patch(
        obj as never,
        undefined,
        undefined,
        FIELD_MANAGER,
        true,
        PatchStrategy.ServerSideApply,
      );
    } catch (err) {
      // ServiceMonitor/PodMonitor need the Prometheus Operator's CRDs; without them the rest of
      // the cluster must still converge.
      if (obj.apiVersion.startsWith("monitoring.coreos.com/") && notServed(err)) {
        this.skipped.add(`${obj.apiVersion}/${obj.kind}`);
        return "skipped";
      }
      throw err;
    }
    return "applied";
  }

  async delete(ref: { apiVersion: string; kind: string; namespace: string; name: string }): Promise<void> {
    try {
      await this.objects.delete(
        {
          apiVersion: ref.apiVersion,
          kind: ref.kind,
          metadata: { name: ref.name, namespace: ref.namespace },
        },
        undefined,
        undefined,
        undefined,
        undefined,
        "Background",
      );
    } catch (err) {
      if (statusCode(err) !== 404) throw err;
    }
  }

  async patchStatus(namespace: string, name: string, status: ClusterStatus): Promise<void> {
    await this.custom.patchNamespacedCustomObjectStatus(
      { group: CRD_GROUP, version: CRD_VERSION, plural: CRD_PLURAL, namespace, name, body: { status } },
      setHeaderOptions("Content-Type", PatchStrategy.MergePatch),
    );
  }
}
