/** Prometheus metrics for one daemon instance (own Registry, so tests can run several). */
import { Counter, Gauge, Registry } from "prom-client";
import type { AisStatus } from "./ais.ts";
import { type ConnGuard, REFUSAL_REASONS } from "./conn-guard.ts";
import type { TieredStore } from "./store.ts";
import type { TierName } from "./types.ts";

// long: one declaration per metric (name, help, collect), read as a list.
export function createKvdMetrics(
  store: TieredStore,
  clients: () => number,
  ais: AisStatus,
  guard?: ConnGuard,
): Registry {
  const registry = new Registry();
  const tiers = (): TierName[] => [
    "l2",
    ...(store.disk ? ["l3" as const] : []),
    ...(store.remote ? ["l4" as const] : []),
  ];
  new Gauge({
    name: "kvd_tier_bytes",
    help: "Bytes of chunk payload stored per tier",
    labelNames: ["tier"],
    registers: [registry],
    collect() {
      this.set({ tier: "l2" }, store.l2.bytes);
      if (store.disk) this.set({ tier: "l3" }, store.disk.used);
    },
  });
  new Gauge({
    name: "kvd_tier_capacity_bytes",
    help: "Configured capacity per tier",
    labelNames: ["tier"],
    registers: [registry],
    collect() {
      this.set({ tier: "l2" }, store.l2.arena.bytes);
      if (store.disk) this.set({ tier: "l3" }, store.disk.capacity);
    },
  });
  new Gauge({
    name: "kvd_tier_chunks",
    help: "Chunks stored per tier",
    labelNames: ["tier"],
    registers: [registry],
    collect() {
      this.set({ tier: "l2" }, store.l2.entries.size);
      if (store.disk) this.set({ tier: "l3" }, store.disk.index.size);
    },
  });
  new Counter({
    name: "kvd_hits_total",
    help: "GET hits, by the tier that answered",
    labelNames: ["tier"],
    registers: [registry],
    collect() {
      this.reset();
      for (const t of tiers()) this.inc({ tier: t }, store.hits[t]);
    },
  });
  new Counter({
    name: "kvd_misses_total",
    help: "GETs found in no tier",
    registers: [registry],
    collect() {
      this.reset();
      this.inc(store.misses);
    },
  });
  new Gauge({
    name: "kvd_hit_ratio",
    help: "Fraction of GETs answered by each tier since start",
    labelNames: ["tier"],
    registers: [registry],
    collect() {
      const total = store.hits.l2 + store.hits.l3 + store.hits.l4 + store.misses;
      for (const t of tiers()) this.set({ tier: t }, total === 0 ? 0 : store.hits[t] / total);
    },
  });
  new Counter({
    name: "kvd_evictions_total",
    help: "Chunks evicted, by tier and retention class",
    labelNames: ["tier", "class"],
    registers: [registry],
    collect() {
      this.reset();
      for (const cls of ["short", "long"] as const) {
        this.inc({ tier: "l2", class: cls }, store.l2.evictions[cls]);
        if (store.disk) this.inc({ tier: "l3", class: cls }, store.disk.evictions[cls]);
      }
    },
  });
  new Gauge({
    name: "kvd_clients",
    help: "Connected clients",
    registers: [registry],
    collect() {
      this.set(clients());
    },
  });
  new Gauge({
    name: "kvd_tcp_connections",
    help: "TCP connections open (capped by --max-tcp-connections; Unix-socket clients are not counted)",
    registers: [registry],
    collect() {
      this.set(guard?.tcp ?? 0);
    },
  });
  new Counter({
    name: "kvd_tcp_refused_total",
    help: "TCP connections refused or closed before authentication, by reason",
    labelNames: ["reason"],
    registers: [registry],
    collect() {
      this.reset();
      for (const r of REFUSAL_REASONS) this.inc({ reason: r }, guard?.refused[r] ?? 0);
    },
  });
  new Gauge({
    name: "kvd_ais_active",
    help: "1 when L3 I/O goes through hipFile (GPU-direct), else 0",
    labelNames: ["available"],
    registers: [registry],
    collect() {
      this.set({ available: String(ais.available) }, ais.active ? 1 : 0);
    },
  });
  return registry;
}
