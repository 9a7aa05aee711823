import { createHash } from "node:crypto";
/** The control planes: etcd (discovery registry) and NATS (request and event planes). */
import { StatefulSet } from "kubernetes-models/apps/v1";
import { ConfigMap, Secret, Service } from "kubernetes-models/v1";
import type { IVolume } from "kubernetes-models/v1/Volume";
import {
  componentLabels,
  ETCD_PORT,
  etcdTlsOn,
  meta,
  NATS_MONITOR_PORT,
  NATS_PORT,
  names,
  natsTlsOn,
  natsUrl,
  type RenderContext,
  restrictedContainer,
  restrictedPod,
} from "./context.ts";
import {
  natsAuthorizationBlock,
  natsClientIdentityEnv,
  natsCredentials,
  natsSecretName,
  natsServerEnv,
  ROUTE_AUTH_LINE,
} from "./nats-auth.ts";

/** etcd's own TLS files (spec.tls): the etcd Secret, mounted in the etcd pods. */
const ETCD_SERVER_TLS_DIR = "/etc/etcd/tls";
/** etcd serves /health and /metrics over plain HTTP here when clients need TLS, for the kubelet's probes. */
const ETCD_METRICS_PORT = 2381;
/**
 * NATS' TLS files. Not under /etc/nats: that is a ConfigMap volume, read-only, and the kubelet
 * cannot create a mount point inside it.
 */
const NATS_SERVER_TLS_DIR = "/etc/nats-tls";

const sha256 = (text: string): string => createHash("sha256").update(text).digest("hex");

/** A single- or multi-member etcd StatefulSet behind a headless Service (stable peer names). */
// long: the manifests as one literal, in the shape kubectl shows them; pieces would hide the object.
export function etcdObjects(ctx: RenderContext): (StatefulSet | Service)[] {
  const e = ctx.spec.etcd;
  if (e.external) return [];
  const name = names.etcd(ctx);
  const labels = componentLabels(ctx, "etcd");
  const tls = etcdTlsOn(ctx);
  const scheme = tls ? "https" : "http";
  const peers = Array.from(
    { length: e.replicas },
    (_, i) => `${name}-${i}=${scheme}://${name}-${i}.${name}.${ctx.namespace}.svc:2380`,
  ).join(",");
  // Client and peer TLS, each with client-certificate authentication (etcd's own flags; the
  // same certificate serves both, so it needs the serverAuth and clientAuth usages).
  const d = ETCD_SERVER_TLS_DIR;
  const tlsFlags = tls
    ? [
        `--cert-file=${d}/tls.crt`,
        `--key-file=${d}/tls.key`,
        `--trusted-ca-file=${d}/ca.crt`,
        "--client-cert-auth",
        `--peer-cert-file=${d}/tls.crt`,
        `--peer-key-file=${d}/tls.key`,
        `--peer-trusted-ca-file=${d}/ca.crt`,
        "--peer-client-cert-auth",
        `--listen-metrics-urls=http://0.0.0.0:${ETCD_METRICS_PORT}`,
      ]
    : [];
  const probePort = tls ? "metrics" : "client";
  const volumes: IVolume[] = tls ? [{ name: "tls", secret: { secretName: names.etcdTls(ctx) } }] : [];
  const svc = new Service({
    metadata: meta(ctx, "etcd", name),
    spec: {
      clusterIP: "None",
      // Peers must find each other before they are ready.
      publishNotReadyAddresses: true,
      selector: labels,
      ports: [
        { name: "client", port: ETCD_PORT, targetPort: "client" },
        { name: "peer", port: 2380, targetPort: "peer" },
      ],
    },
  });
  const sts = new StatefulSet({
    metadata: meta(ctx, "etcd", name),
    spec: {
      serviceName: name,
      replicas: e.replicas,
      podManagementPolicy: "Parallel",
      selector: { matchLabels: labels },
      template: {
        metadata: { labels },
        spec: {
          // Pod Security "restricted": etcd needs no privilege (data on its PVC, fsGroup-owned).
          securityContext: restrictedPod(1000),
          containers: [
            {
              name: "etcd",
              image: e.image,
              command: [
                "etcd",
                "--name=$(POD_NAME)",
                "--data-dir=/var/lib/etcd",
                `--listen-client-urls=${scheme}://0.0.0.0:${ETCD_PORT}`,
                `--advertise-client-urls=${scheme}://$(POD_NAME).${name}.${ctx.namespace}.svc:${ETCD_PORT}`,
                `--listen-peer-urls=${scheme}://0.0.0.0:2380`,
                `--initial-advertise-peer-urls=${scheme}://$(POD_NAME).${name}.${ctx.namespace}.svc:2380`,
                `--initial-cluster=${peers}`,
                "--initial-cluster-state=new",
                `--initial-cluster-token=${name}`,
                ...tlsFlags,
              ],
              env: [{ name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } }],
              ports: [
                { name: "client", containerPort: ETCD_PORT },
                { name: "peer", containerPort: 2380 },
                ...(tls ? [{ name: "metrics", containerPort: ETCD_METRICS_PORT }] : []),
              ],
              readinessProbe: { httpGet: { path: "/health", port: probePort }, periodSeconds: 5 },
              livenessProbe: {
                httpGet: { path: "/health", port: probePort },
                periodSeconds: 10,
                failureThreshold: 6,
              },
              securityContext: restrictedContainer(),
              volumeMounts: [
                { name: "data", mountPath: "/var/lib/etcd" },
                ...(tls ? [{ name: "tls", mountPath: ETCD_SERVER_TLS_DIR, readOnly: true }] : []),
              ],
            },
          ],
          ...(volumes.length > 0 ? { volumes } : {}),
        },
      },
      volumeClaimTemplates: [
        {
          metadata: { name: "data" },
          spec: { accessModes: ["ReadWriteOnce"], resources: { requests: { storage: e.storage } } },
        },
      ],
    },
  });
  return [svc, sts];
}

/** nats-server's /healthz on its loopback-only monitor port, run in the NATS container. */
export const NATS_HEALTH_CHECK = [
  "wget",
  "-q",
  "-O",
  "/dev/null",
  `http://127.0.0.1:${NATS_MONITOR_PORT}/healthz`,
];

/**
 * NATS with one user per role and subject permissions (nats-auth.ts). The config file names
 * environment variables (NATS config syntax `$VAR`), filled from the credentials Secret, so no
 * secret lands in a ConfigMap.
 */
// long: the manifests as one literal, in the shape kubectl shows them; pieces would hide the object.
export function natsObjects(ctx: RenderContext): (StatefulSet | Service | ConfigMap | Secret)[] {
  const p = ctx.spec.planes;
  if (p.kind !== "nats") return [];
  const name = names.nats(ctx);
  const labels = componentLabels(ctx, "nats");
  const routes = Array.from(
    { length: p.natsReplicas },
    (_, i) => `    nats://${name}-${i}.${name}-cluster.${ctx.namespace}.svc:6222`,
  ).join("\n");
  const tls = natsTlsOn(ctx);
  // nats-server's tls block: `verify: true` makes clients present a certificate signed by ca_file
  // (mutual TLS); in the cluster block the same certificate authenticates routes both ways.
  const tlsBlock = (indent: string, verify: boolean) => [
    `${indent}tls {`,
    `${indent}  cert_file: "${NATS_SERVER_TLS_DIR}/tls.crt"`,
    `${indent}  key_file: "${NATS_SERVER_TLS_DIR}/tls.key"`,
    `${indent}  ca_file: "${NATS_SERVER_TLS_DIR}/ca.crt"`,
    ...(verify ? [`${indent}  verify: true`] : []),
    `${indent}}`,
  ];
  const conf = [
    `port: ${NATS_PORT}`,
    // The monitoring endpoints (/varz, /connz, /subsz: clients, subjects, addresses) have no
    // authentication in nats-server: loopback only, for the probes below and `kubectl
    // port-forward` (nats-io/nats-server server/opts.go: `http` takes "host:port").
    `http: "127.0.0.1:${NATS_MONITOR_PORT}"`,
    ...natsAuthorizationBlock(ctx),
    ...(tls ? tlsBlock("", true) : []),
    ...(p.natsReplicas > 1
      ? [
          "cluster {",
          `  name: ${name}`,
          "  port: 6222",
          ROUTE_AUTH_LINE,
          ...(tls ? tlsBlock("  ", true) : []),
          "  routes: [",
          tls ? routes.replaceAll("nats://", "tls://") : routes,
          "  ]",
          "}",
        ]
      : []),
    "",
  ].join("\n");
  const secretName = natsSecretName(ctx);
  const out: (StatefulSet | Service | ConfigMap | Secret)[] = [
    new ConfigMap({ metadata: meta(ctx, "nats", names.natsConfig(ctx)), data: { "nats.conf": conf } }),
    new Service({
      metadata: meta(ctx, "nats", name),
      spec: { selector: labels, ports: [{ name: "client", port: NATS_PORT, targetPort: "client" }] },
    }),
    new Service({
      metadata: meta(ctx, "nats", `${name}-cluster`),
      spec: {
        clusterIP: "None",
        publishNotReadyAddresses: true,
        selector: labels,
        ports: [{ name: "cluster", port: 6222, targetPort: "cluster" }],
      },
    }),
    new StatefulSet({
      metadata: meta(ctx, "nats", name),
      spec: {
        serviceName: `${name}-cluster`,
        replicas: p.natsReplicas,
        podManagementPolicy: "Parallel",
        selector: { matchLabels: labels },
        template: {
          // The users' subject lists follow the pools' replicas; nats-server reads its config at
          // start, so a changed config rolls the NATS pods (clients reconnect, see
          // test/reliability/nats-restart.test.ts).
          metadata: { labels, annotations: { "infera.dev/nats-config-sha256": sha256(conf).slice(0, 16) } },
          spec: {
            securityContext: restrictedPod(1000),
            containers: [
              {
                name: "nats",
                image: p.natsImage,
                args: ["--config", "/etc/nats/nats.conf"],
                env: natsServerEnv(ctx),
                ports: [
                  { name: "client", containerPort: NATS_PORT },
                  { name: "cluster", containerPort: 6222 },
                ],
                // The kubelet's httpGet goes to the pod IP, where the monitor no longer listens:
                // the probe runs inside the pod (busybox wget of the nats:*-alpine images).
                readinessProbe: { exec: { command: NATS_HEALTH_CHECK }, periodSeconds: 5 },
                livenessProbe: { exec: { command: NATS_HEALTH_CHECK }, periodSeconds: 10 },
                securityContext: restrictedContainer(),
                volumeMounts: [
                  { name: "config", mountPath: "/etc/nats" },
                  ...(tls ? [{ name: "tls", mountPath: NATS_SERVER_TLS_DIR, readOnly: true }] : []),
                ],
              },
            ],
            volumes: [
              { name: "config", configMap: { name: names.natsConfig(ctx) } },
              ...(tls ? [{ name: "tls", secret: { secretName: names.natsTls(ctx) } }] : []),
            ],
          },
        },
      },
    }),
  ];
  if (ctx.secrets === "generate" && !ctx.spec.auth.natsCredentialsSecret) {
    out.push(
      new Secret({
        metadata: meta(ctx, "nats", secretName),
        type: "Opaque",
        // One key per NATS user (server, engine-<model>-<pool>, route), its password.
        stringData: natsCredentials(ctx),
      }),
    );
  }
  return out;
}

/**
 * The env entries a NATS client reads its URL and identity from: `user` is the server's or its
 * pool's NATS user (nats-auth.ts), and the pod gets that user's password only.
 */
export function natsClientEnv(
  ctx: RenderContext,
  user: string,
): { name: string; value?: string; valueFrom?: object }[] {
  if (ctx.spec.planes.kind !== "nats") return [];
  return [{ name: "INFERA_NATS_URL", value: natsUrl(ctx) }, ...natsClientIdentityEnv(ctx, user)];
}
