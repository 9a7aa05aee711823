/**
 * The tiered KV-cache daemon, one per GPU node (DaemonSet). Engines on the node reach it through
 * the Unix socket in the hostPath /run/infera (INFERA_KVD_SOCKET), which passes the RAM arena's
 * fd; the TCP port is the copy path for clients that cannot use the socket.
 *
 * What it needs to start (issue #30 item 3):
 *  - a TCP token: kvd refuses a non-loopback listener without one. It comes from a Secret
 *    (`kvd.tokenSecret`, else `<name>-kvd-token`, generated when absent), mounted as a file and
 *    read with --tcp-token-file, so it is never in argv or env.
 *  - writable host directories: the kubelet creates DirectoryOrCreate hostPaths root-owned 0755
 *    and fsGroup does not apply to hostPath volumes, so kvd (uid 10001) could not bind its socket
 *    (EACCES). An init container chowns the two directories (not recursively) to 10001 with
 *    CAP_CHOWN only; everything else runs non-root with every capability dropped.
 *  - the L4 store URL (`kvd.remote`, or `kvd.remoteSecret` for one with a password) in the env
 *    INFERA_KVD_REMOTE_URL, never in args.
 */

import { DaemonSet } from "kubernetes-models/apps/v1";
import { Secret } from "kubernetes-models/v1";
import type { IEnvVar } from "kubernetes-models/v1/EnvVar";
import type { IVolume } from "kubernetes-models/v1/Volume";
import { parseSize } from "../../kvd/size.ts";
import {
  commandWords,
  componentLabels,
  IMAGE_BIN,
  IMAGE_UID,
  KVD_METRICS_PORT,
  KVD_SOCKET_DIR,
  meta,
  names,
  type RenderContext,
  restrictedContainer,
  restrictedPod,
} from "./context.ts";

/** Where kvd's L3 hostPath is mounted. */
export const KVD_DISK_DIR = "/var/lib/infera-kvd";
/** Where the token Secret is mounted (key `token`). */
export const KVD_TOKEN_DIR = "/etc/infera-kvd";

/**
 * The L4 URL goes in the env, never in args (argv is public on the node; kvd refuses a URL with a
 * password there): a plain one as a value, one with a password from its Secret.
 */
function remoteEnv(k: RenderContext["spec"]["kvd"]): { env?: IEnvVar[] } {
  if (k.remote) return { env: [{ name: "INFERA_KVD_REMOTE_URL", value: k.remote }] };
  if (!k.remoteSecret) return {};
  const { name, key } = k.remoteSecret;
  return { env: [{ name: "INFERA_KVD_REMOTE_URL", valueFrom: { secretKeyRef: { name, key } } }] };
}

export function kvdObjects(ctx: RenderContext): (DaemonSet | Secret)[] {
  const k = ctx.spec.kvd;
  if (!k.enabled) return [];
  const labels = componentLabels(ctx, "kvd");
  const command = [
    IMAGE_BIN,
    "kvd",
    "--socket",
    `${KVD_SOCKET_DIR}/kvd.sock`,
    // 0660, group 10001: engine pods run with that supplemental group (workers.ts).
    "--socket-group",
    String(IMAGE_UID),
    "--tcp",
    `0.0.0.0:${k.port}`,
    "--tcp-token-file",
    `${KVD_TOKEN_DIR}/token`,
    "--ram-bytes",
    k.ramBytes,
    "--metrics-port",
    String(KVD_METRICS_PORT),
    "--metrics-host",
    "0.0.0.0",
  ];
  const volumeMounts = [
    { name: "sock", mountPath: KVD_SOCKET_DIR },
    { name: "token", mountPath: KVD_TOKEN_DIR, readOnly: true },
  ];
  const volumes: IVolume[] = [
    { name: "sock", hostPath: { path: KVD_SOCKET_DIR, type: "DirectoryOrCreate" } },
    // 0440 + fsGroup 10001: readable by kvd's group only.
    { name: "token", secret: { secretName: names.kvdToken(ctx), defaultMode: 0o440 } },
  ];
  const chownDirs = [KVD_SOCKET_DIR];
  if (k.disk) {
    command.push("--disk-dir", KVD_DISK_DIR, "--disk-bytes", k.disk.bytes);
    volumeMounts.push({ name: "disk", mountPath: KVD_DISK_DIR });
    volumes.push({ name: "disk", hostPath: { path: k.disk.hostPath, type: "DirectoryOrCreate" } });
    chownDirs.push(KVD_DISK_DIR);
  }
  const out: (DaemonSet | Secret)[] = [
    new DaemonSet({
      metadata: meta(ctx, "kvd", names.kvd(ctx)),
      spec: {
        selector: { matchLabels: labels },
        updateStrategy: { type: "RollingUpdate", rollingUpdate: { maxUnavailable: 1 } },
        template: {
          metadata: { labels },
          spec: {
            // The GPU nodes: label them infera.dev/kvd=true.
            nodeSelector: { "infera.dev/kvd": "true" },
            securityContext: restrictedPod(IMAGE_UID),
            initContainers: [
              {
                name: "kvd-dirs",
                image: ctx.spec.image,
                // The directories themselves, not their content (an L3 directory may hold a TiB).
                command: ["chown", `${IMAGE_UID}:${IMAGE_UID}`, ...chownDirs],
                securityContext: {
                  ...restrictedContainer(true, ["CHOWN"]),
                  runAsNonRoot: false,
                  runAsUser: 0,
                },
                volumeMounts: volumeMounts.filter((m) => m.name !== "token"),
              },
            ],
            containers: [
              {
                name: "kvd",
                image: ctx.spec.image,
                command: commandWords(command),
                ...remoteEnv(k),
                ports: [
                  { name: "kvd", containerPort: k.port },
                  { name: "metrics", containerPort: KVD_METRICS_PORT },
                ],
                readinessProbe: { tcpSocket: { port: "kvd" }, periodSeconds: 5 },
                livenessProbe: { httpGet: { path: "/metrics", port: "metrics" }, periodSeconds: 15 },
                // The arena is allocated up front: request it (plus headroom for the process).
                resources: { requests: { memory: String(parseSize(k.ramBytes) + 256 * 1024 ** 2) } },
                securityContext: restrictedContainer(),
                volumeMounts,
              },
            ],
            volumes,
          },
        },
      },
    }),
  ];
  if (ctx.secrets === "generate" && !k.tokenSecret) {
    out.push(
      new Secret({
        metadata: meta(ctx, "kvd", names.kvdToken(ctx)),
        type: "Opaque",
        stringData: { token: ctx.random() },
      }),
    );
  }
  return out;
}
