/**
 * Names, labels and shared constants every manifest builder uses, so a Service's selector and
 * the pods it selects, or a NetworkPolicy and the pods it guards, come from one place.
 */
import type { IConfigMap } from "kubernetes-models/v1/ConfigMap";
import type { IPodSecurityContext } from "kubernetes-models/v1/PodSecurityContext";
import type { ISecurityContext } from "kubernetes-models/v1/SecurityContext";
import type { IVolume } from "kubernetes-models/v1/Volume";
import type { ClusterSpec, ModelSpec, PoolSpec } from "../spec.ts";

export type IObjectMeta = NonNullable<IConfigMap["metadata"]>;

export const SERVER_PORT = 8000;
export const ENGINE_PORT = 8000;
export const ETCD_PORT = 2379;
export const NATS_PORT = 4222;
export const NATS_MONITOR_PORT = 8222;
/** The server's MoRIIO registration socket (`discovery: moriio`), vLLM's proxy_ping_port. */
export const MORIIO_PROXY_PORT = 36367;
export const KVD_METRICS_PORT = 9400;
/** Where the init container puts the launcher in engine pods (single-executable build). */
export const LAUNCHER_DIR = "/infera/bin";
export const LAUNCHER_BIN = `${LAUNCHER_DIR}/infera`;
/**
 * The full program in the infera image (Node + node_modules: the server, kvd). The
 * single-executable copy above is only for engine images, which have no Node.
 */
export const IMAGE_BIN = "/usr/local/bin/infera";
export const KVD_SOCKET_DIR = "/run/infera";
export const MANAGED_BY = "infera";

export type Component = "etcd" | "nats" | "server" | "worker" | "kvd";

/** What the builders need besides the spec. */
export interface RenderContext {
  name: string;
  namespace: string;
  spec: ClusterSpec;
  /** Secret values: generated with this source, or only referenced (the user creates them). */
  secrets: "reference" | "generate";
  random: () => string;
}

export function componentLabels(ctx: RenderContext, component: Component): Record<string, string> {
  return {
    "app.kubernetes.io/name": "infera",
    "app.kubernetes.io/instance": ctx.name,
    "app.kubernetes.io/component": component,
  };
}

export function meta(
  ctx: RenderContext,
  component: Component,
  name: string,
  extra: Record<string, string> = {},
): IObjectMeta {
  return {
    name,
    namespace: ctx.namespace,
    labels: { ...componentLabels(ctx, component), "app.kubernetes.io/managed-by": MANAGED_BY, ...extra },
  };
}

export const poolName = (p: PoolSpec): string => p.name ?? p.role;
export const workerObjectName = (ctx: Pick<RenderContext, "name">, m: ModelSpec, p: PoolSpec): string =>
  `${ctx.name}-${m.name}-${poolName(p)}`;
export function workerLabels(ctx: RenderContext, m: ModelSpec, p: PoolSpec): Record<string, string> {
  return {
    ...componentLabels(ctx, "worker"),
    "infera.dev/model": m.name,
    "infera.dev/pool": poolName(p),
    "infera.dev/role": p.role,
  };
}

export const names = {
  etcd: (ctx: Pick<RenderContext, "name">) => `${ctx.name}-etcd`,
  nats: (ctx: Pick<RenderContext, "name">) => `${ctx.name}-nats`,
  natsConfig: (ctx: Pick<RenderContext, "name">) => `${ctx.name}-nats-config`,
  natsSecret: (ctx: RenderContext) => ctx.spec.auth.natsCredentialsSecret ?? `${ctx.name}-nats-credentials`,
  server: (ctx: Pick<RenderContext, "name">) => `${ctx.name}-server`,
  serverConfig: (ctx: Pick<RenderContext, "name">) => `${ctx.name}-server-config`,
  kvd: (ctx: Pick<RenderContext, "name">) => `${ctx.name}-kvd`,
  kvdToken: (ctx: RenderContext) => ctx.spec.kvd.tokenSecret ?? `${ctx.name}-kvd-token`,
  dashboard: (ctx: Pick<RenderContext, "name">) => `${ctx.name}-grafana-dashboard`,
  etcdTls: (ctx: RenderContext) => ctx.spec.tls.etcdSecret ?? `${ctx.name}-etcd-tls`,
  natsTls: (ctx: RenderContext) => ctx.spec.tls.natsSecret ?? `${ctx.name}-nats-tls`,
  clientTls: (ctx: RenderContext) => ctx.spec.tls.clientSecret ?? `${ctx.name}-client-tls`,
};

/** spec.tls.enabled, on unless explicitly false. */
export const tlsEnabled = (spec: Pick<RenderContext["spec"], "tls">): boolean => spec.tls.enabled !== false;
/** The in-cluster etcd serves TLS (spec.tls on, etcd not external). */
export const etcdTlsOn = (ctx: RenderContext): boolean => tlsEnabled(ctx.spec) && !ctx.spec.etcd.external;
/** The in-cluster NATS serves TLS. */
export const natsTlsOn = (ctx: RenderContext): boolean =>
  tlsEnabled(ctx.spec) && ctx.spec.planes.kind === "nats";

export function etcdEndpoints(ctx: RenderContext): string[] {
  const e = ctx.spec.etcd;
  if (e.external) return e.external;
  const scheme = etcdTlsOn(ctx) ? "https" : "http";
  return [`${scheme}://${names.etcd(ctx)}.${ctx.namespace}.svc:${ETCD_PORT}`];
}

/**
 * TLS Secrets are mounted beside /etc/infera, not in it: /etc/infera is the server's ConfigMap
 * volume, read-only, and the runtime cannot create a mount point inside it.
 */
export const ETCD_TLS_DIR = "/etc/infera-etcd-tls";
/** Where server and engine pods mount the client certificate (spec.tls): etcd and NATS both use it. */
export const CLIENT_TLS_DIR = "/etc/infera-tls";

export interface TlsFiles {
  caFile: string;
  certFile: string;
  keyFile: string;
}
export interface SecretMount {
  volume: IVolume;
  mount: { name: string; mountPath: string; readOnly: boolean };
}

const tlsFilesIn = (dir: string): TlsFiles => ({
  caFile: `${dir}/ca.crt`,
  certFile: `${dir}/tls.crt`,
  keyFile: `${dir}/tls.key`,
});

/** The client certificate Secret (spec.tls), mounted once however many clients use it. */
function clientTlsMount(ctx: RenderContext): SecretMount {
  return {
    volume: { name: "infera-tls", secret: { secretName: names.clientTls(ctx) } },
    mount: { name: "infera-tls", mountPath: CLIENT_TLS_DIR, readOnly: true },
  };
}

/** TLS files a NATS client passes as --nats-tls-ca/--nats-tls-cert/--nats-tls-key (or the config's nats.tls). */
export const natsClientTlsFiles = (ctx: RenderContext): TlsFiles | undefined =>
  natsTlsOn(ctx) ? tlsFilesIn(CLIENT_TLS_DIR) : undefined;

/** Every TLS Secret an etcd/NATS client pod mounts (external etcd's, and spec.tls's client one). */
export function clientTlsMounts(ctx: RenderContext): SecretMount[] {
  const out: SecretMount[] = [];
  const etcd = etcdClientAccess(ctx);
  if (etcd.volume && etcd.mount) out.push({ volume: etcd.volume, mount: etcd.mount });
  if (natsTlsOn(ctx) && !out.some((m) => m.volume.name === "infera-tls")) out.push(clientTlsMount(ctx));
  return out;
}

/** Mount, env and flags for a client of an etcd with TLS and/or credentials. */
export function etcdClientAccess(ctx: RenderContext): {
  volume?: IVolume;
  mount?: { name: string; mountPath: string; readOnly: boolean };
  env: { name: string; valueFrom: object }[];
  tlsFiles?: TlsFiles;
} {
  const e = ctx.spec.etcd;
  if (etcdTlsOn(ctx)) return { ...clientTlsMount(ctx), env: [], tlsFiles: tlsFilesIn(CLIENT_TLS_DIR) };
  const env = e.credentialsSecret
    ? [
        {
          name: "INFERA_ETCD_USER",
          valueFrom: { secretKeyRef: { name: e.credentialsSecret, key: "username" } },
        },
        {
          name: "INFERA_ETCD_PASSWORD",
          valueFrom: { secretKeyRef: { name: e.credentialsSecret, key: "password" } },
        },
      ]
    : [];
  if (!e.tlsSecret) return { env };
  return {
    volume: { name: "etcd-tls", secret: { secretName: e.tlsSecret } },
    mount: { name: "etcd-tls", mountPath: ETCD_TLS_DIR, readOnly: true },
    env,
    tlsFiles: tlsFilesIn(ETCD_TLS_DIR),
  };
}

/** `tls://` makes the client insist on TLS (nats.js), as the server requires it. */
export const natsUrl = (ctx: RenderContext): string | undefined =>
  ctx.spec.planes.kind === "nats"
    ? `${natsTlsOn(ctx) ? "tls" : "nats"}://${names.nats(ctx)}.${ctx.namespace}.svc:${NATS_PORT}`
    : undefined;

/** vLLM's MoRIIO connector needs the server's registration socket; the server then discovers through it. */
export const usesMoriioProxy = (m: ModelSpec): boolean =>
  m.engine.kind === "vllm" && m.connector === "moriio" && m.pools.some((p) => p.role !== "mixed");

export const gpusOf = (p: PoolSpec): number => p.gpus ?? (p.tp ?? 1) * (p.dp ?? 1);

/**
 * Makes a spec value literal in a container's command/args. The kubelet expands `$(NAME)` there
 * from the container's env and reduces `$$` to `$` (kubernetes/kubernetes
 * third_party/forked/golang/expansion/expand.go @ fde22c3f9aacfd260225a9741de123a41157b7c0:
 * tryReadVariableName returns one `$` for `$$`; the EnvVar API doc: "$$(VAR_NAME) will produce
 * the string literal $(VAR_NAME)"). Doubling every `$` keeps any value literal, so a served model
 * name of `$(INFERA_NATS_PASSWORD)` can never pull the password into argv.
 */
export const kubeLiteral = (v: string): string => v.replaceAll("$", "$$$$");

/** A `$(NAME)` reference the kubelet is meant to expand (downward API / env), never escaped. */
export interface EnvRef {
  ref: string;
}
export const envRef = (name: string): EnvRef => ({ ref: name });

/** command/args words: spec values made literal, env references left for the kubelet. */
export const commandWords = (words: readonly (string | EnvRef)[]): string[] =>
  words.map((w) => (typeof w === "string" ? kubeLiteral(w) : `$(${w.ref})`));

/** The uid/gid of the infera image (deploy/Containerfile `USER 10001:10001`). */
export const IMAGE_UID = 10001;

/**
 * Pod-level settings of the Pod Security "restricted" profile (runAsNonRoot, a non-zero user,
 * seccomp RuntimeDefault); fsGroup makes Secret/emptyDir volumes readable by that group.
 */
export function restrictedPod(
  uid: number,
  extra: Omit<IPodSecurityContext, "seccompProfile"> = {},
): IPodSecurityContext {
  return {
    runAsNonRoot: true,
    runAsUser: uid,
    runAsGroup: uid,
    fsGroup: uid,
    seccompProfile: { type: "RuntimeDefault" as const },
    ...extra,
  };
}

/** Container-level settings of the "restricted" profile: no privilege escalation, every capability dropped. */
export function restrictedContainer(readOnlyRootFilesystem = true, add: string[] = []): ISecurityContext {
  return {
    allowPrivilegeEscalation: false,
    ...(readOnlyRootFilesystem ? { readOnlyRootFilesystem: true } : {}),
    runAsNonRoot: true,
    capabilities: { drop: ["ALL"], ...(add.length > 0 ? { add } : {}) },
    seccompProfile: { type: "RuntimeDefault" as const },
  };
}
