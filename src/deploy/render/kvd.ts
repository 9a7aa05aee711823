/**
 * The tiered KV-cache daemon, one per GPU node (DaemonSet). Engines on the node reach it through
 * the Unix socket in the hostPath /run/infera (INFERA_KVD_SOCKET), which passes the RAM arena's
 * fd; the TCP port is the copy path for clients that cannot use the socket.
 */

import { DaemonSet } from "kubernetes-models/apps/v1";
import type { IVolume } from "kubernetes-models/v1/Volume";
import { parseSize } from "../../kvd/size.ts";
import {
  componentLabels,
  IMAGE_BIN,
  KVD_METRICS_PORT,
  KVD_SOCKET_DIR,
  meta,
  names,
  type RenderContext,
} from "./context.ts";

export function kvdObjects(ctx: RenderContext): DaemonSet[] {
  const k = ctx.spec.kvd;
  if (!k.enabled) return [];
  const labels = componentLabels(ctx, "kvd");
  const command = [
    IMAGE_BIN,
    "kvd",
    "--socket",
    `${KVD_SOCKET_DIR}/kvd.sock`,
    "--tcp",
    `0.0.0.0:${k.port}`,
    "--ram-bytes",
    k.ramBytes,
    "--metrics-port",
    String(KVD_METRICS_PORT),
    "--metrics-host",
    "0.0.0.0",
  ];
  const volumeMounts = [{ name: "sock", mountPath: KVD_SOCKET_DIR }];
  const volumes: IVolume[] = [
    { name: "sock", hostPath: { path: KVD_SOCKET_DIR, type: "DirectoryOrCreate" } },
  ];
  if (k.disk) {
    command.push("--disk-dir", "/var/lib/infera-kvd", "--disk-bytes", k.disk.bytes);
    volumeMounts.push({ name: "disk", mountPath: "/var/lib/infera-kvd" });
    volumes.push({ name: "disk", hostPath: { path: k.disk.hostPath, type: "DirectoryOrCreate" } });
  }
  if (k.remote) command.push("--remote", k.remote);
  // The GPU nodes: where some pool asks for GPUs.
  return [
    new DaemonSet({
      metadata: meta(ctx, "kvd", names.kvd(ctx)),
      spec: {
        selector: { matchLabels: labels },
        updateStrategy: { type: "RollingUpdate", rollingUpdate: { maxUnavailable: 1 } },
        template: {
          metadata: { labels },
          spec: {
            nodeSelector: { "infera.dev/kvd": "true" },
            containers: [
              {
                name: "kvd",
                image: ctx.spec.image,
                command,
                ports: [
                  { name: "kvd", containerPort: k.port },
                  { name: "metrics", containerPort: KVD_METRICS_PORT },
                ],
                readinessProbe: { tcpSocket: { port: "kvd" }, periodSeconds: 5 },
                livenessProbe: { httpGet: { path: "/metrics", port: "metrics" }, periodSeconds: 15 },
                // The arena is allocated up front: request it (plus headroom for the process).
                resources: { requests: { memory: String(parseSize(k.ramBytes) + 256 * 1024 ** 2) } },
                volumeMounts,
              },
            ],
            volumes,
          },
        },
      },
    }),
  ];
}
