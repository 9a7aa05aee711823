/**
 * The infera server: a Deployment reading a config file (discovery, policy, router), a
 * Service, an HPA, and a PodDisruptionBudget. Probes: /health (process up) for liveness,
 * /ready (at least one worker in rotation) for readiness.
 */

import { createHash } from "node:crypto";
import { Deployment } from "kubernetes-models/apps/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { ConfigMap, Secret, Service } from "kubernetes-models/v1";
import type { IVolume } from "kubernetes-models/v1/Volume";
import { stringify } from "yaml";
import {
  clientTlsMounts,
  componentLabels,
  etcdClientAccess,
  etcdEndpoints,
  IMAGE_BIN,
  IMAGE_UID,
  MORIIO_PROXY_PORT,
  meta,
  names,
  natsClientTlsFiles,
  type RenderContext,
  restrictedContainer,
  restrictedPod,
  SERVER_PORT,
  usesMoriioProxy,
} from "./context.ts";
import { natsClientEnv } from "./infra.ts";
import { MORIIO_SINK_JS } from "./moriio-sink.ts";
import { SERVER_NATS_USER } from "./nats-auth.ts";

/** The server's `--config` file: keys of ServerConfig (src/server/config.ts). */
export function serverConfigFile(ctx: RenderContext): Record<string, unknown> {
  const s = ctx.spec.server;
  // etcd for every engine, vLLM + MoRIIO included: the launchers register those workers there
  // with their MoRIIO fields, and every replica sees them (moriio-sink.ts says why not the
  // MoRIIO socket).
  const discovery = {
    kind: "etcd",
    etcdEndpoints: etcdEndpoints(ctx),
    prefix: "/infera",
    ...(etcdClientAccess(ctx).tlsFiles ? { options: etcdClientAccess(ctx).tlsFiles } : {}),
  };
  return {
    host: "0.0.0.0",
    port: SERVER_PORT,
    policy: s.policy,
    router: s.router,
    discovery,
    ...(ctx.spec.planes.kind === "direct" ? { requestPlane: "http", eventPlane: "zmq" } : {}),
    // The URL and credentials come from INFERA_NATS_* (env); the client certificate from here.
    ...(natsClientTlsFiles(ctx) ? { nats: { tls: natsClientTlsFiles(ctx) } } : {}),
  };
}

// long: the manifests as one literal, in the shape kubectl shows them; pieces would hide the object.
export function serverObjects(ctx: RenderContext) {
  const s = ctx.spec.server;
  const name = names.server(ctx);
  const labels = componentLabels(ctx, "server");
  const moriio = ctx.spec.models.some(usesMoriioProxy);
  const env: { name: string; value?: string; valueFrom?: object }[] = [
    ...natsClientEnv(ctx, SERVER_NATS_USER),
  ];
  if (ctx.spec.auth.apiKeys) {
    env.push({
      name: "INFERA_API_KEYS",
      valueFrom: { secretKeyRef: { name: ctx.spec.auth.apiKeys.name, key: ctx.spec.auth.apiKeys.key } },
    });
  }
  const ports = [{ name: "http", containerPort: SERVER_PORT }];
  const volumeMounts = [{ name: "config", mountPath: "/etc/infera", readOnly: true }];
  const volumes: IVolume[] = [{ name: "config", configMap: { name: names.serverConfig(ctx) } }];
  for (const t of clientTlsMounts(ctx)) {
    volumeMounts.push(t.mount);
    volumes.push(t.volume);
  }
  // etcd credentials reach the server as INFERA_ETCD_USER / INFERA_ETCD_PASSWORD (its env layer
  // maps them to discovery.options, src/config/env-table.ts), never as argv: argv is readable by
  // every process on the node (/proc/<pid>/cmdline).
  env.push(...etcdClientAccess(ctx).env);
  const configText = stringify(serverConfigFile(ctx));
  const out = [];
  out.push(
    new ConfigMap({
      metadata: meta(ctx, "server", names.serverConfig(ctx)),
      data: { "server.yaml": configText },
    }),
  );
  if (ctx.secrets === "generate" && ctx.spec.auth.apiKeys) {
    out.push(
      new Secret({
        metadata: meta(ctx, "server", ctx.spec.auth.apiKeys.name),
        type: "Opaque",
        stringData: { [ctx.spec.auth.apiKeys.key]: `sk-infera-${ctx.random()}` },
      }),
    );
  }
  out.push(
    new Deployment({
      metadata: meta(ctx, "server", name),
      spec: {
        replicas: s.autoscaling ? undefined : s.replicas,
        selector: { matchLabels: labels },
        strategy: { type: "RollingUpdate", rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } },
        template: {
          // The server reads its config at start: a changed config must roll the pods.
          metadata: {
            labels,
            annotations: {
              "infera.dev/config-hash": createHash("sha256").update(configText).digest("hex").slice(0, 16),
            },
          },
          spec: {
            securityContext: restrictedPod(IMAGE_UID),
            terminationGracePeriodSeconds: 60,
            containers: [
              {
                name: "server",
                image: ctx.spec.image,
                command: [IMAGE_BIN, "server", "--config", "/etc/infera/server.yaml"],
                env,
                ports,
                readinessProbe: { httpGet: { path: "/ready", port: "http" }, periodSeconds: 5 },
                livenessProbe: {
                  httpGet: { path: "/health", port: "http" },
                  periodSeconds: 10,
                  failureThreshold: 3,
                },
                startupProbe: {
                  httpGet: { path: "/health", port: "http" },
                  periodSeconds: 2,
                  failureThreshold: 30,
                },
                resources: {
                  requests: { cpu: s.resources?.cpu ?? "2", memory: s.resources?.memory ?? "2Gi" },
                  limits: { memory: s.resources?.memory ?? "2Gi" },
                },
                securityContext: restrictedContainer(),
                volumeMounts,
              },
              ...(moriio ? [moriioSinkContainer(ctx)] : []),
            ],
            volumes,
          },
        },
      },
    }),
    new Service({
      metadata: meta(ctx, "server", name),
      spec: {
        type: s.serviceType,
        selector: labels,
        ports: [{ name: "http", port: SERVER_PORT, targetPort: "http" }],
      },
    }),
  );
  if (moriio) {
    // vLLM's MoRIIO workers send their heartbeats here; any server pod's sink takes them.
    out.push(
      new Service({
        metadata: meta(ctx, "server", `${name}-moriio`),
        spec: {
          selector: labels,
          ports: [{ name: "moriio-proxy", port: MORIIO_PROXY_PORT, targetPort: "moriio-proxy" }],
        },
      }),
    );
  }
  if (s.autoscaling) {
    out.push(
      new HorizontalPodAutoscaler({
        metadata: meta(ctx, "server", name),
        spec: {
          scaleTargetRef: { apiVersion: "apps/v1", kind: "Deployment", name },
          minReplicas: s.autoscaling.minReplicas,
          maxReplicas: s.autoscaling.maxReplicas,
          metrics: [
            {
              type: "Resource",
              resource: {
                name: "cpu",
                target: { type: "Utilization", averageUtilization: s.autoscaling.targetCPUUtilization },
              },
            },
          ],
        },
      }),
    );
  }
  const minReplicas = s.autoscaling?.minReplicas ?? s.replicas;
  if (minReplicas > 1) {
    out.push(
      new PodDisruptionBudget({
        metadata: meta(ctx, "server", name),
        spec: { minAvailable: Math.max(1, minReplicas - 1), selector: { matchLabels: labels } },
      }),
    );
  }
  return out;
}

/** The sidecar that accepts vLLM's MoRIIO heartbeats (moriio-sink.ts). */
function moriioSinkContainer(ctx: RenderContext) {
  return {
    name: "moriio-heartbeats",
    image: ctx.spec.image,
    // /app: the image's program directory, whose node_modules has zeromq and msgpackr.
    workingDir: "/app",
    command: ["node", "-e", MORIIO_SINK_JS, String(MORIIO_PROXY_PORT)],
    ports: [{ name: "moriio-proxy", containerPort: MORIIO_PROXY_PORT }],
    resources: { requests: { cpu: "10m", memory: "64Mi" }, limits: { memory: "128Mi" } },
    securityContext: restrictedContainer(),
  };
}
