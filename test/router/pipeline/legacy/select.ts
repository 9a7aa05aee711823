// FROZEN copy of the pre-pipeline implementation (commit a5c2372), kept to prove the presets exact. Do not edit.
/**
 * Pair selection for the DisaggRouter. P: the server's policy (kv-aware where KV events
 * exist) over the prefill workers that have a decode partner speaking the same connector
 * (and, for MoRIIO, in the same transfer mode).
 * D: least load among the decode workers of P's connector: fewest in-flight requests here,
 * then the engine's own running + waiting, then KV usage.
 */
import type { ConnectorKind } from "../../../../src/discovery/types.ts";
import { pairingKey, protocolFor } from "../../../../src/router/disagg/protocols/index.ts";
import type { RoutingPolicy, RoutingRequest, Selection, WorkerState } from "../../../../src/router/types.ts";

export function decodeLoadKey(w: WorkerState): [number, number, number] {
  const l = w.engineLoad;
  return [w.inFlight, l ? l.running + l.waiting : 0, l ? l.kvUsage : 0];
}

export function leastLoaded(ws: readonly WorkerState[]): WorkerState | null {
  let best: WorkerState | null = null;
  let bestKey: [number, number, number] | null = null;
  for (const w of ws) {
    const k = decodeLoadKey(w);
    if (
      !bestKey ||
      k[0] < bestKey[0] ||
      (k[0] === bestKey[0] && (k[1] < bestKey[1] || (k[1] === bestKey[1] && k[2] < bestKey[2])))
    ) {
      best = w;
      bestKey = k;
    }
  }
  return best;
}

export interface PairChoice {
  prefill: Selection;
  decode: WorkerState;
  kind: Exclude<ConnectorKind, "none">;
}

/** Chooses a P and a D speaking the same connector, skipping `exclude`d prefill workers. */
export function choosePair(
  req: RoutingRequest,
  prefills: readonly WorkerState[],
  decodes: readonly WorkerState[],
  policy: RoutingPolicy,
  exclude: ReadonlySet<WorkerState>,
): PairChoice | null {
  const decodeKeys = new Set<string>();
  for (const d of decodes) if (protocolFor(d.record.connector.kind)) decodeKeys.add(pairingKey(d.record));
  const pCands = prefills.filter((p) => !exclude.has(p) && decodeKeys.has(pairingKey(p.record)));
  if (pCands.length === 0) return null;
  const prefill = policy.select(req, pCands);
  const kind = prefill.worker.record.connector.kind as Exclude<ConnectorKind, "none">;
  const key = pairingKey(prefill.worker.record);
  const decode = leastLoaded(decodes.filter((d) => pairingKey(d.record) === key));
  if (!decode) return null;
  return { prefill, decode, kind };
}
