/**
 * load: a candidate has headroom while its load is under every configured threshold. The
 * defaults follow GIE's saturation detector (gateway-api-inference-extension,
 * pkg/epp/saturationdetector: queue depth 5, KV-cache utilization 0.8): the engine's waiting
 * queue and KV usage from its scraped `/metrics`, plus what this replica alone knows at once —
 * its in-flight requests and prefill backlog on the worker. Between two scrapes the engine's
 * queue reads stale, so the growth of this replica's in-flight count on the worker since the
 * reading (net of completions) counts as waiting: a burst cannot all pass on one old reading,
 * while a steady stream whose completions keep pace is not held back. Behind a load balancer
 * the other replicas dispatch to the same engines between the same two scrapes, and their
 * dispatches show in neither this replica's count nor the reading: so the growth counts once
 * per replica routing there (`HeadroomScope.replicas`: the peer plane's live set, else
 * `flow.replicas`), as if each sent what this one did (bench/fleet-routing/RESULTS.md Run L:
 * 4 replicas each releasing up to `maxWaiting` onto a worker that had just freed).
 *
 * Per-band headroom (`bands`): a band may have tighter thresholds than the rest, e.g. the low
 * band admitted only while the worker runs fewer than 8 of this replica's requests (of every
 * band) — the slots above that are kept for the higher bands, so a high-band request meets a
 * small running batch and an empty engine queue, while the high band alone is bounded as
 * before (a flat `maxInFlight` slows it even on an idle fleet: bench/flow/RESULTS.md Run 6).
 * With `higherActiveMs` the tighter thresholds hold only while a higher band's request arrived
 * or waited within that many ms, so the low band has the whole fleet when nobody outranks it.
 */
import { z } from "zod";
import type { WorkerState } from "../types.ts";
import { defineHeadroom, type HeadroomObservation } from "./headroom.ts";

const limits = {
  /** Engine waiting requests (plus this replica's dispatches since the scrape) at most this. */
  maxWaiting: z.number().int().min(0),
  /** Engine KV-cache usage (0..1) below this; 1 turns it off. */
  maxKvUsage: z.number().min(0).max(1),
  /** This replica's in-flight requests (every band's) per worker at most this (0: no limit). */
  maxInFlight: z.number().int().min(0),
  /** This replica's not-yet-prefilled prompt tokens per worker at most this (0: no limit). */
  maxPendingPrefillTokens: z.number().int().min(0),
};
type Limits = { readonly [K in keyof typeof limits]: number };

const params = z
  .object({
    maxWaiting: limits.maxWaiting.default(5),
    maxKvUsage: limits.maxKvUsage.default(0.8),
    maxInFlight: limits.maxInFlight.default(0),
    maxPendingPrefillTokens: limits.maxPendingPrefillTokens.default(0),
    /** Engine readings older than this are ignored (ms); the in-flight limits still apply. */
    staleMs: z.number().int().min(1).default(5000),
    /**
     * Count this replica's dispatches since the reading once per server replica routing to the
     * engines (false: once, as if it were alone).
     */
    perReplicaGrowth: z.boolean().default(true),
    /** Per band name (flow.bands): thresholds that replace the ones above for that band's requests. */
    bands: z.record(z.string(), z.object(limits).partial().strict()).default({}),
    /**
     * A band's thresholds apply only while a request of a higher band arrived or waited within
     * this many ms (0: always); otherwise the band has the common ones.
     */
    higherActiveMs: z.number().int().min(0).default(0),
  })
  .strict();

export default defineHeadroom("load", {
  doc: "headroom while a worker's engine queue, KV usage, in-flight and prefill backlog are under thresholds (GIE saturation detector), tighter per band if set",
  params,
  needs: ["engineLoad"],
  create: (scope, p) => {
    /** Per worker: the reading last seen and this replica's in-flight count when it was seen. */
    const seen = new Map<string, { scrapedAt: number; inFlight: number }>();
    /** Per band index: when a request of that band was last checked (arrival, wake-up while queued). */
    const lastSeen: number[] = [];
    /** EWMA of observed end-to-end ms, for the wait estimate. */
    let e2eMs = 0;
    const common: Limits = p;
    const byBand = new Map(Object.entries(p.bands).map(([b, l]) => [b, { ...common, ...l }]));
    const limitsFor = (band: number, bandName: string, now: number): Limits => {
      const own = byBand.get(bandName);
      if (!own || p.higherActiveMs === 0) return own ?? common;
      for (let i = 0; i < band; i++)
        if (now - (lastSeen[i] ?? Number.NEGATIVE_INFINITY) <= p.higherActiveMs) return own;
      return common;
    };
    const blocked = (w: WorkerState, l: Limits, now: number, replicas: number): string | null => {
      if (l.maxInFlight > 0 && w.inFlight >= l.maxInFlight) return "in-flight";
      if (l.maxPendingPrefillTokens > 0 && w.pendingPrefillTokens >= l.maxPendingPrefillTokens)
        return "prefill-backlog";
      const e = w.engineLoad;
      if (!e || now - e.scrapedAt > p.staleMs) return null;
      let s = seen.get(w.record.id);
      if (!s || s.scrapedAt !== e.scrapedAt) {
        s = { scrapedAt: e.scrapedAt, inFlight: w.inFlight };
        seen.set(w.record.id, s);
      }
      if (e.waiting + replicas * Math.max(0, w.inFlight - s.inFlight) > l.maxWaiting) return "engine-queue";
      if (l.maxKvUsage < 1 && e.kvUsage >= l.maxKvUsage) return "kv-usage";
      return null;
    };
    return {
      name: "load",
      needs: ["engineLoad"],
      check(req, candidates) {
        const now = Date.now();
        lastSeen[req.band] = now;
        const l = limitsFor(req.band, req.bandName, now);
        const replicas = p.perReplicaGrowth ? Math.max(1, scope.replicas?.() ?? 1) : 1;
        const ok: number[] = [];
        let reason: string | undefined;
        let inFlight = 0;
        for (let i = 0; i < candidates.length; i++) {
          const why = blocked(candidates[i], l, now, replicas);
          if (why === null) ok.push(i);
          else reason ??= why;
          inFlight += candidates[i].inFlight;
        }
        if (ok.length > 0) return { fits: ok };
        // One of `inFlight` requests ends every e2e / inFlight ms on average.
        const waitMs = e2eMs > 0 ? Math.ceil(e2eMs / Math.max(1, inFlight)) : 1000;
        return { fits: ok, waitMs, reason };
      },
      observe(o: HeadroomObservation) {
        e2eMs = e2eMs === 0 ? o.e2eMs : e2eMs * 0.9 + o.e2eMs * 0.1;
      },
      onWorkerRemoved(id) {
        seen.delete(id);
      },
    };
  },
});
