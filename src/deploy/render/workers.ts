/**
 * Engine pools. Each pool is a StatefulSet (stable pod names become worker ids) whose container
 * is the engine's own image running `infera engine <kind> ...`: the launcher builds the engine's
 * real command line, waits for health and registers the worker. Engine images have no Node, so
 * an init container copies the single-executable launcher from the infera image into a shared
 * emptyDir mounted at /infera/bin.
 */

import { StatefulSet } from "kubernetes-models/apps/v1";
import { Service } from "kubernetes-models/v1";
import type { IVolume } from "kubernetes-models/v1/Volume";
import type { ModelSpec, PoolSpec } from "../spec.ts";
import {
  clientTlsMounts,
  commandWords,
  ENGINE_PORT,
  type EnvRef,
  envRef,
  etcdClientAccess,
  etcdEndpoints,
  gpusOf,
  IMAGE_UID,
  KVD_SOCKET_DIR,
  LAUNCHER_BIN,
  LAUNCHER_DIR,
  MORIIO_PROXY_PORT,
  meta,
  names,
  natsClientTlsFiles,
  type RenderContext,
  restrictedContainer,
  restrictedPod,
  usesMoriioProxy,
  workerLabels,
  workerObjectName,
} from "./context.ts";
import { natsClientEnv } from "./infra.ts";
import { engineNatsUser } from "./nats-auth.ts";

/** The engine's HOME (an emptyDir): caches of vLLM/SGLang/Hugging Face land here. */
const ENGINE_HOME = "/home/infera";

/** The container's command: the launcher and its flags (`infera engine --help`). */
export function engineCommand(ctx: RenderContext, m: ModelSpec, p: PoolSpec): string[] {
  const argv: (string | EnvRef)[] = [LAUNCHER_BIN, "engine", m.engine.kind, "--model", m.model];
  const add = (flag: string, v: string | number | undefined) => {
    if (v !== undefined) argv.push(flag, String(v));
  };
  add("--served-model-name", m.servedModelName);
  // $(VAR) is expanded by the kubelet from the container's env (downward API below); every
  // other word is made literal (kubeLiteral), spec values included.
  argv.push(
    "--port",
    String(ENGINE_PORT),
    "--advertise-host",
    envRef("POD_IP"),
    "--worker-id",
    envRef("POD_NAME"),
  );
  argv.push("--role", p.role);
  if (p.role !== "mixed") add("--connector", m.connector);
  add("--tp", p.tp);
  add("--dp", p.dp);
  add("--quantization", p.quantization);
  add("--kv-cache-dtype", p.kvCacheDtype);
  add("--block-size", m.blockSize);
  add("--max-model-len", m.maxModelLen);
  if (!(p.kvEvents ?? m.kvEvents)) argv.push("--no-kv-events");
  const rdma = ctx.spec.rdma;
  if (rdma && p.role !== "mixed") {
    add("--ib-device", rdma.device);
    add("--gid-index", rdma.gidIndex);
  }
  if (usesMoriioProxy(m) && p.role !== "mixed") {
    add("--moriio-proxy", `${names.server(ctx)}-moriio.${ctx.namespace}.svc:${MORIIO_PROXY_PORT}`);
  }
  argv.push("--discovery", "etcd");
  for (const e of etcdEndpoints(ctx)) argv.push("--etcd", e);
  // Credentials come from INFERA_ETCD_USER / INFERA_ETCD_PASSWORD (env), never argv.
  const tls = etcdClientAccess(ctx).tlsFiles;
  if (tls) argv.push("--etcd-ca", tls.caFile, "--etcd-cert", tls.certFile, "--etcd-key", tls.keyFile);
  const natsTls = natsClientTlsFiles(ctx);
  if (natsTls)
    argv.push(
      "--nats-tls-ca",
      natsTls.caFile,
      "--nats-tls-cert",
      natsTls.certFile,
      "--nats-tls-key",
      natsTls.keyFile,
    );
  // Stop the engine well within the pod's grace period.
  argv.push("--stop-timeout", "60");
  if (p.engineArgs.length > 0) argv.push("--", ...p.engineArgs);
  return commandWords(argv);
}

// long: the manifests as one literal, in the shape kubectl shows them; pieces would hide the object.
export function workerObjects(ctx: RenderContext, m: ModelSpec, p: PoolSpec): (StatefulSet | Service)[] {
  const name = workerObjectName(ctx, m, p);
  const labels = workerLabels(ctx, m, p);
  const rdma = ctx.spec.rdma;
  const rdmaPool = rdma !== undefined && p.role !== "mixed";
  const gpus = gpusOf(p);
  const limits: Record<string, string> = {};
  if (gpus > 0) limits["amd.com/gpu"] = String(gpus);
  if (rdmaPool && rdma.resourceName) limits[rdma.resourceName] = "1";
  if (p.resources?.memory) limits.memory = p.resources.memory;
  const requests: Record<string, string> = { ...limits };
  if (p.resources?.cpu) requests.cpu = p.resources.cpu;
  const env: { name: string; value?: string; valueFrom?: object }[] = [
    { name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } },
    { name: "POD_IP", valueFrom: { fieldRef: { fieldPath: "status.podIP" } } },
    ...natsClientEnv(ctx, engineNatsUser(m, p)),
    ...etcdClientAccess(ctx).env,
  ];
  // A writable HOME for the engine (caches), as it runs as a uid the image may not know.
  env.push({ name: "HOME", value: ENGINE_HOME });
  const volumeMounts: { name: string; mountPath: string; readOnly?: boolean }[] = [
    { name: "infera-bin", mountPath: LAUNCHER_DIR, readOnly: true },
    { name: "home", mountPath: ENGINE_HOME },
    // ROCm/RCCL and the engines' IPC use /dev/shm well past the 64 MiB default.
    { name: "dshm", mountPath: "/dev/shm" },
  ];
  const volumes: IVolume[] = [
    { name: "infera-bin", emptyDir: {} },
    { name: "home", emptyDir: {} },
    { name: "dshm", emptyDir: { medium: "Memory" } },
  ];
  for (const t of clientTlsMounts(ctx)) {
    volumeMounts.push(t.mount);
    volumes.push(t.volume);
  }
  if (m.modelCacheHostPath) {
    volumeMounts.push({ name: "models", mountPath: m.modelCacheHostPath, readOnly: true });
    volumes.push({ name: "models", hostPath: { path: m.modelCacheHostPath, type: "Directory" } });
  }
  if (m.modelCacheClaim) {
    volumeMounts.push({ name: "models", mountPath: m.modelCacheClaim.mountPath, readOnly: true });
    volumes.push({
      name: "models",
      persistentVolumeClaim: { claimName: m.modelCacheClaim.name, readOnly: true },
    });
  }
  if (ctx.spec.kvd.enabled) {
    env.push({ name: "INFERA_KVD_SOCKET", value: `${KVD_SOCKET_DIR}/kvd.sock` });
    volumeMounts.push({ name: "kvd", mountPath: KVD_SOCKET_DIR });
    volumes.push({ name: "kvd", hostPath: { path: KVD_SOCKET_DIR, type: "DirectoryOrCreate" } });
  }
  const annotations: Record<string, string> = {};
  if (rdmaPool && rdma.mode === "attachment") annotations["k8s.v1.cni.cncf.io/networks"] = rdma.networks!;
  const hostNetwork = rdmaPool && rdma.mode === "hostNetwork";
  // kvd's socket is 0660, group IMAGE_UID (kvd.ts --socket-group): engines join that group.
  const groups = [IMAGE_UID, ...(m.engine.supplementalGroups ?? [])];
  // Pod Security "restricted" for every pool but RDMA ones. Those add IPC_LOCK (ibv_reg_mr pins
  // the KV cache beyond RLIMIT_MEMLOCK), which Kubernetes grants only to a root process: an added
  // capability reaches a non-root process only through ambient capabilities, which the CRI
  // does not set (kubernetes/enhancements#2757, open). They run as the image's user with every
  // other capability dropped; docs/deploy-kubernetes.md "Security" lists each pod's level.
  const podSecurity = rdmaPool
    ? { seccompProfile: { type: "RuntimeDefault" as const }, supplementalGroups: groups }
    : restrictedPod(IMAGE_UID, { supplementalGroups: groups });
  const engineSecurity = rdmaPool
    ? {
        allowPrivilegeEscalation: false,
        capabilities: { drop: ["ALL"], add: ["IPC_LOCK"] },
        seccompProfile: { type: "RuntimeDefault" as const },
      }
    : restrictedContainer(false);
  const svc = new Service({
    metadata: meta(ctx, "worker", name, { "infera.dev/model": m.name, "infera.dev/pool": p.name ?? p.role }),
    spec: {
      clusterIP: "None",
      selector: labels,
      ports: [{ name: "http", port: ENGINE_PORT, targetPort: "http" }],
    },
  });
  const sts = new StatefulSet({
    metadata: meta(ctx, "worker", name, { "infera.dev/model": m.name, "infera.dev/pool": p.name ?? p.role }),
    spec: {
      serviceName: name,
      replicas: p.replicas,
      // Workers are independent: start and replace them in parallel.
      podManagementPolicy: "Parallel",
      updateStrategy: { type: "RollingUpdate", rollingUpdate: { partition: 0 } },
      selector: { matchLabels: labels },
      template: {
        metadata: { labels, ...(Object.keys(annotations).length > 0 ? { annotations } : {}) },
        spec: {
          ...(hostNetwork ? { hostNetwork: true, dnsPolicy: "ClusterFirstWithHostNet" } : {}),
          ...(p.nodeSelector ? { nodeSelector: p.nodeSelector } : {}),
          terminationGracePeriodSeconds: 90,
          securityContext: podSecurity,
          initContainers: [
            {
              name: "infera-launcher",
              image: ctx.spec.image,
              // The executable and the native addons it loads from node_modules/ beside it.
              // Not `cp -a`: as uid 10001 it cannot set the times of /shared itself (the
              // emptyDir is root's) and exits 1, so the pod never starts; -R keeps the modes.
              command: ["cp", "-R", `${LAUNCHER_DIR}/.`, "/shared/"],
              volumeMounts: [{ name: "infera-bin", mountPath: "/shared" }],
              securityContext: { ...restrictedContainer(), runAsUser: IMAGE_UID, runAsGroup: IMAGE_UID },
            },
          ],
          containers: [
            {
              name: "engine",
              image: m.engine.image,
              command: engineCommand(ctx, m, p),
              env,
              ports: [
                { name: "http", containerPort: ENGINE_PORT },
                { name: "kv-events", containerPort: 5557 },
              ],
              // The launcher exits when the engine dies; readiness is the engine's /health.
              readinessProbe: { httpGet: { path: "/health", port: "http" }, periodSeconds: 10 },
              startupProbe: {
                httpGet: { path: "/health", port: "http" },
                periodSeconds: 10,
                // Weights load for up to 30 minutes (the launcher's --health-timeout).
                failureThreshold: 180,
              },
              livenessProbe: {
                httpGet: { path: "/health", port: "http" },
                periodSeconds: 15,
                failureThreshold: 4,
              },
              resources: { limits, requests },
              securityContext: engineSecurity,
              volumeMounts,
            },
          ],
          volumes,
        },
      },
    },
  });
  return [svc, sts];
}
