/**
 * load: a candidate has headroom while its load is under every configured threshold. The
 * defaults follow GIE's saturation detector (gateway-api-inference-extension,
 * pkg/epp/saturationdetector: queue depth 5, KV-cache utilization 0.8): the engine's waiting
 * queue and KV usage from its scraped `/metrics`, plus what this replica alone knows at once —
 * its in-flight requests and prefill backlog on the worker. Between two scrapes the engine's
 * queue reads stale, so the growth of this replica's in-flight count on the worker since the
 * reading (net of completions) counts as waiting: a burst cannot all pass on one old reading,
 * while a steady stream whose completions keep pace is not held back.
 */
import { z } from "zod";
import type { WorkerState } from "../types.ts";
import { defineHeadroom, type HeadroomObservation } from "./headroom.ts";

const params = z
  .object({
    /** Engine waiting requests (plus this replica's dispatches since the scrape) at most this. */
    maxWaiting: z.number().int().min(0).default(5),
    /** Engine KV-cache usage (0..1) below this; 1 turns it off. */
    maxKvUsage: z.number().min(0).max(1).default(0.8),
    /** This replica's in-flight requests per worker at most this (0: no limit). */
    maxInFlight: z.number().int().min(0).default(0),
    /** This replica's not-yet-prefilled prompt tokens per worker at most this (0: no limit). */
    maxPendingPrefillTokens: z.number().int().min(0).default(0),
    /** Engine readings older than this are ignored (ms); the in-flight limits still apply. */
    staleMs: z.number().int().min(1).default(5000),
  })
  .strict();

export default defineHeadroom("load", {
  doc: "headroom while a worker's engine queue, KV usage, in-flight and prefill backlog are under thresholds (GIE saturation detector)",
  params,
  needs: ["engineLoad"],
  create: (_scope, p) => {
    /** Per worker: the reading last seen and this replica's in-flight count when it was seen. */
    const seen = new Map<string, { scrapedAt: number; inFlight: number }>();
    /** EWMA of observed end-to-end ms, for the wait estimate. */
    let e2eMs = 0;
    const blocked = (w: WorkerState, now: number): string | null => {
      if (p.maxInFlight > 0 && w.inFlight >= p.maxInFlight) return "in-flight";
      if (p.maxPendingPrefillTokens > 0 && w.pendingPrefillTokens >= p.maxPendingPrefillTokens)
        return "prefill-backlog";
      const e = w.engineLoad;
      if (!e || now - e.scrapedAt > p.staleMs) return null;
      let s = seen.get(w.record.id);
      if (!s || s.scrapedAt !== e.scrapedAt) {
        s = { scrapedAt: e.scrapedAt, inFlight: w.inFlight };
        seen.set(w.record.id, s);
      }
      if (e.waiting + Math.max(0, w.inFlight - s.inFlight) > p.maxWaiting) return "engine-queue";
      if (p.maxKvUsage < 1 && e.kvUsage >= p.maxKvUsage) return "kv-usage";
      return null;
    };
    return {
      name: "load",
      needs: ["engineLoad"],
      check(_req, candidates) {
        const now = Date.now();
        const ok: number[] = [];
        let reason: string | undefined;
        let inFlight = 0;
        for (let i = 0; i < candidates.length; i++) {
          const why = blocked(candidates[i], now);
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
