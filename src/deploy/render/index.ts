/**
 * Renders a cluster spec to the Kubernetes objects of one Infera deployment. Every object is
 * built with a kubernetes-models class and validated against the API's OpenAPI schema before
 * it is returned, so what `infera deploy k8s` prints is what `kubectl apply -f` accepts.
 */
import { randomBytes } from "node:crypto";
import { Namespace } from "kubernetes-models/v1";
import { stringify } from "yaml";
import type { ClusterDocument } from "../spec.ts";
import type { RenderContext } from "./context.ts";
import { etcdObjects, natsObjects } from "./infra.ts";
import { kvdObjects } from "./kvd.ts";
import { monitoringObjects } from "./monitoring.ts";
import { policyObjects } from "./policies.ts";
import { serverObjects } from "./server.ts";
import { workerObjects } from "./workers.ts";

/** The common shape of a kubernetes-models object. */
export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata?: { name?: string; namespace?: string; labels?: Record<string, string> };
  validate(): void;
  toJSON(): Record<string, unknown>;
}

export interface RenderOptions {
  /** `generate`: emit Secrets with random values; `reference` (default): only reference them. */
  secrets?: "reference" | "generate";
  /** Source of secret values (tests pass a deterministic one). */
  random?: () => string;
  /** Emit a Namespace object first (default: when the namespace is not `default`). */
  namespace?: boolean;
}

export function renderCluster(doc: ClusterDocument, opts: RenderOptions = {}): KubeObject[] {
  const ctx: RenderContext = {
    name: doc.name,
    namespace: doc.namespace,
    spec: doc.spec,
    secrets: opts.secrets ?? "reference",
    random: opts.random ?? (() => randomBytes(24).toString("hex")),
  };
  const out: KubeObject[] = [];
  if (opts.namespace ?? doc.namespace !== "default") {
    out.push(new Namespace({ metadata: { name: doc.namespace } }));
  }
  out.push(...etcdObjects(ctx), ...natsObjects(ctx), ...serverObjects(ctx));
  for (const m of doc.spec.models) for (const p of m.pools) out.push(...workerObjects(ctx, m, p));
  out.push(...kvdObjects(ctx), ...policyObjects(ctx), ...monitoringObjects(ctx));
  for (const o of out) {
    try {
      o.validate();
    } catch (err) {
      throw new Error(
        `${o.kind} ${o.metadata?.name ?? ""}: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
  }
  return out;
}

/** Plain objects without undefined fields (what the API server and YAML see). */
export function plain(o: KubeObject): Record<string, unknown> {
  return JSON.parse(JSON.stringify(o.toJSON())) as Record<string, unknown>;
}

/** Multi-document YAML for `kubectl apply -f`. */
export function toYaml(objects: readonly KubeObject[]): string {
  return objects.map((o) => `---\n${stringify(plain(o), { lineWidth: 0 })}`).join("");
}

export { engineCommand } from "./workers.ts";
