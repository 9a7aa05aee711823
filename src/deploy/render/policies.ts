/**
 * NetworkPolicies. A default-deny ingress policy selects every pod of the instance; explicit
 * allows then admit: anyone to the server's API port (it authenticates with API keys); the server
 * and peer workers (KV transfer) to workers; workers to kvd; the server and workers to etcd and
 * NATS, and their own peers; Prometheus' namespace to the metrics ports.
 *
 * Host-network pods (rdma.mode hostNetwork): their traffic carries the node's IP, which no
 * podSelector matches, so wherever workers are admitted the nodes' ranges (rdma.nodeCidrs) are
 * admitted too. Traffic *to* a host-network pod is the node's traffic: NetworkPolicy does not
 * isolate it (docs/deploy-kubernetes.md "Security").
 */
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import {
  type Component,
  componentLabels,
  KVD_METRICS_PORT,
  MORIIO_PROXY_PORT,
  meta,
  type RenderContext,
  usesMoriioProxy,
} from "./context.ts";

type Peer = Record<string, unknown>;

export function policyObjects(ctx: RenderContext): NetworkPolicy[] {
  if (!ctx.spec.networkPolicies) return [];
  const from = (c: Component): Peer => ({ podSelector: { matchLabels: componentLabels(ctx, c) } });
  const rdma = ctx.spec.rdma;
  const hostNetWorkers =
    rdma?.mode === "hostNetwork" && ctx.spec.models.some((m) => m.pools.some((p) => p.role !== "mixed"));
  const nodes: Peer[] = hostNetWorkers ? (rdma?.nodeCidrs ?? []).map((cidr) => ({ ipBlock: { cidr } })) : [];
  const workers: Peer[] = [from("worker"), ...nodes];
  const prometheus = {
    namespaceSelector: {
      matchLabels: { "kubernetes.io/metadata.name": ctx.spec.monitoring.prometheusNamespace },
    },
  };
  const instance = {
    "app.kubernetes.io/name": "infera",
    "app.kubernetes.io/instance": ctx.name,
  };
  const policy = (target: Component, suffix: string, ingress: object[]) =>
    new NetworkPolicy({
      metadata: meta(ctx, target, `${ctx.name}-${suffix}`),
      spec: {
        podSelector: { matchLabels: componentLabels(ctx, target) },
        policyTypes: ["Ingress"],
        ingress,
      },
    });
  const out = [
    // Every pod of this instance: no ingress unless a policy below allows it.
    new NetworkPolicy({
      metadata: {
        name: `${ctx.name}-default-deny`,
        namespace: ctx.namespace,
        labels: { ...instance, "app.kubernetes.io/managed-by": "infera" },
      },
      spec: { podSelector: { matchLabels: instance }, policyTypes: ["Ingress"] },
    }),
    policy("server", "server-api", [
      // The API is for every client (ingress controllers, other namespaces, load balancers).
      { ports: [{ port: "http", protocol: "TCP" }] },
      ...(ctx.spec.models.some(usesMoriioProxy)
        ? [{ from: workers, ports: [{ port: MORIIO_PROXY_PORT, protocol: "TCP" }] }]
        : []),
    ]),
    policy("worker", "workers-from-server", [
      { from: [from("server"), ...workers] },
      { from: [prometheus], ports: [{ port: "http", protocol: "TCP" }] },
    ]),
  ];
  if (ctx.spec.kvd.enabled) {
    out.push(
      policy("kvd", "kvd-from-workers", [
        { from: workers, ports: [{ port: ctx.spec.kvd.port, protocol: "TCP" }] },
        { from: [prometheus], ports: [{ port: KVD_METRICS_PORT, protocol: "TCP" }] },
      ]),
    );
  }
  if (!ctx.spec.etcd.external) {
    out.push(policy("etcd", "etcd-clients", [{ from: [from("server"), ...workers, from("etcd")] }]));
  }
  if (ctx.spec.planes.kind === "nats") {
    out.push(
      // No rule for the monitor port: it listens on the pod's loopback only (infra.ts).
      policy("nats", "nats-clients", [{ from: [from("server"), ...workers, from("nats")] }]),
    );
  }
  return out;
}
