/**
 * The cluster spec: one document that says what an Infera deployment is (models, engine pools,
 * connector, RDMA, kvd, planes, server, auth). `infera deploy k8s` renders it to manifests and
 * the `InferaCluster` custom resource carries it as its `spec`; the CRD's OpenAPI schema is
 * generated from this zod schema (./openapi.ts), so the two cannot drift.
 *
 * Defaults live here (zod `.default`), not in the renderer, so a spec read back from the API
 * server renders exactly like the file it came from.
 */
import { z } from "zod";
import { parseSize } from "../kvd/size.ts";
import { hostPath, imageRef, labelKey, labelValue, namespaceName, safeText } from "./spec-fields.ts";

const dns1123 = z
  .string()
  .min(1)
  .max(40)
  .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, "must be a DNS-1123 label (lowercase letters, digits, '-')");

/** The control planes' default images (the operator's own defaults, with its own image). */
export const DEFAULT_ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17";
export const DEFAULT_NATS_IMAGE = "nats:2.10-alpine";

/** A Kubernetes quantity such as `64Gi` or `500m`. */
const quantity = z
  .string()
  .regex(/^[0-9]+(\.[0-9]+)?([EPTGMK]i?|[mkMGTPE])?$/, "must be a quantity, e.g. 64Gi");

const resourcesSchema = z
  .object({
    cpu: quantity.optional(),
    memory: quantity.optional(),
  })
  .strict();

export const engineKinds = ["vllm", "sglang", "atom"] as const;
export const poolRoles = ["mixed", "prefill", "decode"] as const;
/** Connector names as `infera engine --connector` takes them. */
export const connectors = ["nixl", "mooncake", "moriio", "sglang", "atom"] as const;

const poolSchema = z
  .object({
    /** Suffix of the StatefulSet name; defaults to the role (must be unique within a model). */
    name: dns1123.optional(),
    role: z.enum(poolRoles),
    replicas: z.number().int().min(0).max(1024).default(1),
    tp: z.number().int().min(1).max(64).optional(),
    dp: z.number().int().min(1).max(64).optional(),
    quantization: safeText.optional(),
    kvCacheDtype: safeText.optional(),
    /** GPUs per pod (`amd.com/gpu`); default tp × dp. */
    gpus: z.number().int().min(0).max(64).optional(),
    /** Overrides the model's KV-events choice for this pool (e.g. ATOM with dp > 1). */
    kvEvents: z.boolean().optional(),
    resources: resourcesSchema.optional(),
    nodeSelector: z.record(labelKey, labelValue).optional(),
    /** Passed to the engine after `--`, untouched (a `$` stays literal: no env expansion). */
    engineArgs: z.array(safeText).default([]),
  })
  .strict();

const modelSchema = z
  .object({
    /** Short name used in object names. */
    name: dns1123,
    /** Model path or hub id the engine loads (`--model`). */
    model: safeText,
    /** Name clients use; default: `model`. */
    servedModelName: safeText.optional(),
    engine: z
      .object({
        kind: z.enum(engineKinds),
        image: imageRef,
        /**
         * Extra groups of the engine process, e.g. the nodes' `video` and `render` GIDs so a
         * non-root engine can open /dev/kfd and /dev/dri (ROCm).
         */
        supplementalGroups: z.array(z.number().int().min(1).max(2147483647)).optional(),
      })
      .strict(),
    /** KV transfer for prefill/decode pools; default the engine's PD default. */
    connector: z.enum(connectors).optional(),
    maxModelLen: z.number().int().min(1).optional(),
    blockSize: z.number().int().min(1).optional(),
    kvEvents: z.boolean().default(true),
    /** Host path with the weights, mounted read-only at the same path. */
    modelCacheHostPath: hostPath.optional(),
    /**
     * The weights on a PersistentVolumeClaim instead (e.g. a ReadOnlyMany NFS/CSI volume),
     * mounted read-only at `mountPath`: unlike a host path it keeps the pool at Pod Security
     * "restricted".
     */
    modelCacheClaim: z.object({ name: dns1123, mountPath: hostPath }).strict().optional(),
    pools: z.array(poolSchema).min(1),
  })
  .strict();

const rdmaSchema = z
  .object({
    /** `hostNetwork`: pods use the node's RoCE NICs directly; `attachment`: a Multus network. */
    mode: z.enum(["hostNetwork", "attachment"]),
    /** `k8s.v1.cni.cncf.io/networks` value, e.g. `infera/roce-net` (attachment mode). */
    networks: z
      .string()
      .regex(/^[a-z0-9][a-z0-9@/,._-]*$/, "must be a Multus network list (ns/name[@iface],…)")
      .optional(),
    /** RDMA device (SGLang --disaggregation-ib-device, show_gids filter), e.g. `rdma0`. */
    device: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/, "must be a device name such as rdma0")
      .optional(),
    /** RoCEv2 GID index, or `auto` (the launcher runs show_gids). */
    gidIndex: z.union([z.number().int().min(0).max(255), z.literal("auto")]).optional(),
    /** Extended resource the RDMA device plugin exposes, e.g. `rdma/hca_shared_devices_a`. */
    resourceName: z
      .string()
      .regex(/^[a-z0-9][a-z0-9./_-]*$/, "must be an extended resource name such as rdma/hca")
      .optional(),
    /**
     * hostNetwork mode: the nodes' address ranges (CIDRs). Traffic from host-network pods carries
     * the node's IP, which no podSelector matches, so the NetworkPolicies admit the workers'
     * traffic to etcd, NATS, kvd, the server and their peers by these ranges instead.
     */
    nodeCidrs: z
      .array(z.string().regex(/^[0-9a-fA-F:.]+\/[0-9]{1,3}$/, "must be a CIDR such as 10.0.0.0/16"))
      .min(1)
      .optional(),
  })
  .strict()
  .refine((r) => r.mode !== "attachment" || r.networks !== undefined, {
    message: "rdma.mode attachment needs rdma.networks",
    path: ["networks"],
  });

/** A byte size as `infera kvd` takes it (`8GiB`, `512MiB`, `4096`). */
const byteSize = z.string().refine(
  (v) => {
    try {
      return parseSize(v) > 0;
    } catch {
      return false;
    }
  },
  { message: "must be a byte size such as 8GiB, 512MiB or 4096" },
);

const secretRef = z
  .object({ name: dns1123, key: z.string().regex(/^[-._a-zA-Z0-9]+$/, "must be a Secret key") })
  .strict();

const kvdSchema = z
  .object({
    enabled: z.boolean().default(false),
    ramBytes: byteSize.default("8GiB"),
    disk: z
      .object({
        hostPath: hostPath,
        bytes: byteSize.default("100GiB"),
      })
      .strict()
      .optional(),
    /**
     * L4 store, e.g. `redis://redis:6379/0`. Rendered into the pod's env, not its args; one with a
     * password belongs in `remoteSecret` (a spec is readable by whoever can read the CR).
     */
    remote: z
      .string()
      .url()
      .regex(/^[^\s"'`$;|&<>\\]+$/, "must be a URL without spaces or shell metacharacters")
      .refine((u) => {
        try {
          return new URL(u).password === "";
        } catch {
          return true;
        }
      }, "carries a password: put the URL in a Secret and name it in kvd.remoteSecret")
      .optional(),
    /** Secret key holding the L4 store URL (one with a password), passed as INFERA_KVD_REMOTE_URL. */
    remoteSecret: secretRef.optional(),
    port: z.number().int().min(1).max(65535).default(7070),
    /**
     * Secret with key `token`: the shared secret TCP clients send in HELLO (kvd refuses a
     * non-loopback listener without one). Default `<name>-kvd-token`, generated by the operator
     * and `infera deploy k8s --generate-secrets` when absent.
     */
    tokenSecret: dns1123.optional(),
  })
  .strict()
  .refine((k) => !(k.remote && k.remoteSecret), {
    message: "remote and remoteSecret are exclusive",
    path: ["remoteSecret"],
  });

const serverSchema = z
  .object({
    replicas: z.number().int().min(1).max(1000).default(2),
    policy: z.enum(["round-robin", "kv-aware", "kv-aware-classic", "approx-prefix"]).default("kv-aware"),
    router: z.enum(["auto", "mixed", "disagg"]).default("auto"),
    autoscaling: z
      .object({
        minReplicas: z.number().int().min(1).default(2),
        maxReplicas: z.number().int().min(1).default(8),
        targetCPUUtilization: z.number().int().min(1).max(100).default(70),
      })
      .strict()
      .refine((a) => a.maxReplicas >= a.minReplicas, {
        message: "maxReplicas must be >= minReplicas",
        path: ["maxReplicas"],
      })
      .optional(),
    resources: resourcesSchema.optional(),
    serviceType: z.enum(["ClusterIP", "LoadBalancer", "NodePort"]).default("ClusterIP"),
  })
  .strict();

export const clusterSpecSchema = z
  .object({
    /** The infera image (server, kvd, and the launcher binary copied into engine pods). */
    image: imageRef,
    models: z.array(modelSchema).min(1),
    server: serverSchema.default({}),
    etcd: z
      .object({
        /** Use these endpoints instead of deploying etcd. */
        external: z.array(z.string().url()).min(1).optional(),
        replicas: z.number().int().min(1).max(7).default(1),
        storage: quantity.default("2Gi"),
        image: imageRef.default(DEFAULT_ETCD_IMAGE),
        /** External etcd: Secret with `ca.crt` (and `tls.crt`/`tls.key` for mutual TLS), mounted into server and workers. */
        tlsSecret: dns1123.optional(),
        /** External etcd: Secret with `username` and `password`. */
        credentialsSecret: dns1123.optional(),
      })
      .strict()
      .default({}),
    planes: z
      .object({
        /** `nats` (default): requests and KV events over NATS; `direct`: HTTP + each engine's ZMQ socket. */
        kind: z.enum(["nats", "direct"]).default("nats"),
        natsReplicas: z.number().int().min(1).max(5).default(1),
        natsImage: imageRef.default(DEFAULT_NATS_IMAGE),
      })
      .strict()
      .default({}),
    auth: z
      .object({
        /** Secret holding the API keys (comma-separated) the server accepts; none = open. */
        apiKeys: secretRef.optional(),
        /**
         * Secret with one key per NATS user (`server`, `engine-<model>-<pool>`, `route` with
         * natsReplicas > 1), each the user's password (src/deploy/render/nats-auth.ts); default
         * `<name>-nats-credentials`, generated by `--generate-secrets` and the operator.
         */
        natsCredentialsSecret: dns1123.optional(),
      })
      .strict()
      .default({}),
    /**
     * TLS for the in-cluster etcd (client and peer) and NATS (clients and routes), with mutual
     * TLS for their clients (server, launchers). The certificates come from Secrets in the
     * `kubernetes.io/tls` layout with the CA beside them (`ca.crt`, `tls.crt`, `tls.key`, what
     * cert-manager writes); the generator references them and never writes them.
     */
    tls: z
      .object({
        /**
         * Default: on (issue #30: TLS on by default). Plaintext only with an explicit `false`,
         * which `infera deploy k8s` warns about; on, the certificate Secrets below must exist.
         */
        enabled: z.boolean().optional(),
        /** etcd's serving and peer certificate (SANs `*.<name>-etcd.<ns>.svc`, `<name>-etcd.<ns>.svc`); default `<name>-etcd-tls`. */
        etcdSecret: dns1123.optional(),
        /** NATS' serving and route certificate (SANs `<name>-nats.<ns>.svc`, `*.<name>-nats-cluster.<ns>.svc`); default `<name>-nats-tls`. */
        natsSecret: dns1123.optional(),
        /** The client certificate server and launchers present to etcd and NATS; default `<name>-client-tls`. */
        clientSecret: dns1123.optional(),
      })
      .strict()
      .default({}),
    rdma: rdmaSchema.optional(),
    kvd: kvdSchema.default({}),
    monitoring: z
      .object({
        serviceMonitor: z.boolean().default(true),
        dashboard: z.boolean().default(true),
        /** Namespace Prometheus runs in (allowed through the NetworkPolicies). */
        prometheusNamespace: namespaceName.default("monitoring"),
      })
      .strict()
      .default({}),
    networkPolicies: z.boolean().default(true),
  })
  .strict()
  .superRefine((s, ctx) => {
    if ((s.etcd.tlsSecret || s.etcd.credentialsSecret) && !s.etcd.external) {
      ctx.addIssue({
        code: "custom",
        path: ["etcd", s.etcd.tlsSecret ? "tlsSecret" : "credentialsSecret"],
        message:
          "etcd TLS/credentials are for etcd.external (the in-cluster etcd is reached only through NetworkPolicy)",
      });
    }
    if (s.rdma?.mode === "hostNetwork" && s.networkPolicies && !s.rdma.nodeCidrs) {
      ctx.addIssue({
        code: "custom",
        path: ["rdma", "nodeCidrs"],
        message:
          "rdma.mode hostNetwork with networkPolicies needs rdma.nodeCidrs (host-network traffic matches no podSelector)",
      });
    }
    if ((s.tls.etcdSecret || s.tls.natsSecret || s.tls.clientSecret) && s.tls.enabled === false) {
      ctx.addIssue({
        code: "custom",
        path: ["tls", "enabled"],
        message: "TLS secrets are named but tls.enabled is false",
      });
    }
    if (s.tls.enabled === true && s.etcd.external && s.planes.kind !== "nats") {
      ctx.addIssue({
        code: "custom",
        path: ["tls", "enabled"],
        message: "tls is for the in-cluster etcd and NATS; with etcd.external and no NATS use etcd.tlsSecret",
      });
    }
    const names = new Set<string>();
    s.models.forEach((m, i) => {
      if (names.has(m.name))
        ctx.addIssue({ code: "custom", path: ["models", i, "name"], message: `duplicate model '${m.name}'` });
      names.add(m.name);
      const pools = new Set<string>();
      m.pools.forEach((p, j) => {
        const n = p.name ?? p.role;
        if (pools.has(n))
          ctx.addIssue({
            code: "custom",
            path: ["models", i, "pools", j, "name"],
            message: `duplicate pool '${n}' (give pools of one role a name)`,
          });
        pools.add(n);
      });
      if (m.modelCacheHostPath && m.modelCacheClaim)
        ctx.addIssue({
          code: "custom",
          path: ["models", i, "modelCacheClaim"],
          message: "give modelCacheHostPath or modelCacheClaim, not both",
        });
      const roles = new Set(m.pools.map((p) => p.role));
      if (roles.has("prefill") !== roles.has("decode")) {
        ctx.addIssue({
          code: "custom",
          path: ["models", i, "pools"],
          message: "a disaggregated model needs both a prefill and a decode pool",
        });
      }
    });
  });

/** The spec as written (defaults optional). */
export type ClusterSpecInput = z.input<typeof clusterSpecSchema>;
/** The spec with defaults applied. */
export type ClusterSpec = z.output<typeof clusterSpecSchema>;
export type ModelSpec = ClusterSpec["models"][number];
export type PoolSpec = ModelSpec["pools"][number];

/** The file form: an `InferaCluster` document (or a bare spec with a `name`). */
export interface ClusterDocument {
  name: string;
  namespace: string;
  spec: ClusterSpec;
}

export class ClusterSpecError extends Error {
  readonly issues: readonly { path: string; message: string }[];
  constructor(issues: readonly { path: string; message: string }[]) {
    super(issues.map((i) => `${i.path || "(root)"}: ${i.message}`).join("\n"));
    this.issues = issues;
    this.name = "ClusterSpecError";
  }
}

/** Validates a spec; errors name the key path (`spec.models[0].pools[1].replicas: ...`). */
export function parseClusterSpec(input: unknown, pathPrefix = "spec"): ClusterSpec {
  const r = clusterSpecSchema.safeParse(input);
  if (r.success) return r.data;
  throw new ClusterSpecError(
    r.error.issues.map((i) => ({ path: formatPath([pathPrefix, ...i.path]), message: i.message })),
  );
}

export function formatPath(path: readonly (string | number)[]): string {
  let out = "";
  for (const p of path) {
    if (p === "") continue;
    out += typeof p === "number" ? `[${p}]` : out === "" ? p : `.${p}`;
  }
  return out;
}

/** Reads an `InferaCluster` document (apiVersion/kind/metadata/spec). */
export function parseClusterDocument(doc: unknown): ClusterDocument {
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    throw new ClusterSpecError([{ path: "", message: "expected an InferaCluster mapping" }]);
  }
  const d = doc as Record<string, unknown>;
  if (d.kind !== undefined && d.kind !== "InferaCluster") {
    throw new ClusterSpecError([
      { path: "kind", message: `expected InferaCluster, got '${String(d.kind)}'` },
    ]);
  }
  const meta = (d.metadata ?? {}) as Record<string, unknown>;
  const name = dns1123.safeParse(meta.name);
  if (!name.success) {
    throw new ClusterSpecError([{ path: "metadata.name", message: name.error.issues[0]!.message }]);
  }
  const ns = namespaceName.safeParse(meta.namespace ?? "default");
  if (!ns.success) {
    throw new ClusterSpecError([{ path: "metadata.namespace", message: ns.error.issues[0]!.message }]);
  }
  return { name: name.data, namespace: ns.data, spec: parseClusterSpec(d.spec) };
}
