/**
 * NetworkPolicies: only the server (and peer workers, for KV transfer) reach workers; only
 * workers reach kvd; etcd and NATS take their clients only. Prometheus' namespace may scrape.
 * Pods on hostNetwork (RDMA mode hostNetwork) are outside NetworkPolicy enforcement.
 */
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import { type Component, componentLabels, KVD_METRICS_PORT, meta, type RenderContext } from "./context.ts";

export function policyObjects(ctx: RenderContext): NetworkPolicy[] {
  if (!ctx.spec.networkPolicies) return [];
  const from = (c: Component) => ({ podSelector: { matchLabels: componentLabels(ctx, c) } });
  const prometheus = {
    namespaceSelector: {
      matchLabels: { "kubernetes.io/metadata.name": ctx.spec.monitoring.prometheusNamespace },
    },
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
    policy("worker", "workers-from-server", [
      { from: [from("server"), from("worker")] },
      { from: [prometheus], ports: [{ port: "http", protocol: "TCP" }] },
    ]),
  ];
  if (ctx.spec.kvd.enabled) {
    out.push(
      policy("kvd", "kvd-from-workers", [
        { from: [from("worker")], ports: [{ port: ctx.spec.kvd.port, protocol: "TCP" }] },
        { from: [prometheus], ports: [{ port: KVD_METRICS_PORT, protocol: "TCP" }] },
      ]),
    );
  }
  if (!ctx.spec.etcd.external) {
    out.push(policy("etcd", "etcd-clients", [{ from: [from("server"), from("worker"), from("etcd")] }]));
  }
  if (ctx.spec.planes.kind === "nats") {
    out.push(policy("nats", "nats-clients", [{ from: [from("server"), from("worker"), from("nats")] }]));
  }
  return out;
}
