/**
 * What an InferaCluster may ask of the cluster, decided by whoever installs the operator (a
 * tenant with rights in one namespace must not get a host directory or an image of their choice
 * running on every GPU node: issue #30 item 2). The spec's own schema already refuses `/`, `..`
 * and non-canonical paths and malformed images (spec.ts); this adds the installer's allowlists.
 *
 *  - host paths: each spec host path must equal an allowed path or lie under it. None allowed
 *    by default.
 *  - images: each image must match an allowlist entry: a prefix (`registry.example/org/`, end it
 *    with `/` or `:` so `org` does not also admit `org-evil`), an exact `name@sha256:<hex>`, or a
 *    bare `sha256:<hex>` digest (any name pinned to it). The operator's own default images (its
 *    image and the etcd and NATS defaults) are always allowed; an empty list admits only those.
 */
import { KVD_SOCKET_DIR } from "./render/context.ts";
import { type ClusterSpec, DEFAULT_ETCD_IMAGE, DEFAULT_NATS_IMAGE, formatPath } from "./spec.ts";

/** The image this release is published as (deploy/operator.yaml runs it). */
export const OPERATOR_IMAGE = "ghcr.io/infera/infera:0.1.0";

export interface ClusterPolicy {
  allowedHostPaths: readonly string[];
  allowedImages: readonly string[];
  /** The operator's own image (the `infera` image it runs as), always allowed. */
  ownImage: string;
}

export interface PolicyIssue {
  path: string;
  message: string;
}

export function imageAllowed(image: string, p: ClusterPolicy): boolean {
  const defaults = [p.ownImage, DEFAULT_ETCD_IMAGE, DEFAULT_NATS_IMAGE];
  if (defaults.includes(image)) return true;
  return p.allowedImages.some((a) => {
    if (/^sha256:[a-f0-9]{64}$/.test(a)) return image.endsWith(`@${a}`);
    if (a.includes("@sha256:")) return image === a;
    return image.startsWith(a);
  });
}

export function hostPathAllowed(path: string, p: ClusterPolicy): boolean {
  return p.allowedHostPaths.some((a) => {
    const base = a.replace(/\/+$/, "");
    return path === base || path.startsWith(`${base}/`);
  });
}

/** Every refusal, with its key path (`spec.models[0].engine.image: ...`). */
export function policyIssues(spec: ClusterSpec, p: ClusterPolicy, prefix = "spec"): PolicyIssue[] {
  const out: PolicyIssue[] = [];
  const at = (...path: (string | number)[]) => formatPath([prefix, ...path]);
  const image = (v: string, ...path: (string | number)[]) => {
    if (!imageAllowed(v, p))
      out.push({
        path: at(...path),
        message:
          p.allowedImages.length === 0
            ? `image '${v}' refused: the operator allows only its default images (--allowed-image adds more)`
            : `image '${v}' refused: not in the operator's --allowed-image list`,
      });
  };
  const hostPath = (v: string, ...path: (string | number)[]) => {
    if (!hostPathAllowed(v, p))
      out.push({
        path: at(...path),
        message:
          p.allowedHostPaths.length === 0
            ? `host path '${v}' refused: the operator allows no host paths (--allowed-host-path)`
            : `host path '${v}' refused: not under the operator's --allowed-host-path list`,
      });
  };
  image(spec.image, "image");
  spec.models.forEach((m, i) => {
    image(m.engine.image, "models", i, "engine", "image");
    if (m.modelCacheHostPath) hostPath(m.modelCacheHostPath, "models", i, "modelCacheHostPath");
  });
  if (!spec.etcd.external) image(spec.etcd.image, "etcd", "image");
  if (spec.planes.kind === "nats") image(spec.planes.natsImage, "planes", "natsImage");
  // kvd shares its socket with the engines through the node's /run/infera (and chowns it): a
  // host path like any other, so the installer allows it (or not) by the same list.
  if (spec.kvd.enabled) hostPath(KVD_SOCKET_DIR, "kvd", "enabled");
  if (spec.kvd.enabled && spec.kvd.disk) hostPath(spec.kvd.disk.hostPath, "kvd", "disk", "hostPath");
  return out;
}
