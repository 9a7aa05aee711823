/**
 * Pair selection for the DisaggRouter. P: the scheduler's `prefill` step over the prefill
 * workers that have a decode partner speaking the same connector (and, for MoRIIO, in the same
 * transfer mode). D: the scheduler's `decode` step over the decode workers of P's connector —
 * least-load in every preset (fewest in-flight requests here, then the engine's own
 * running + waiting, then KV usage), any profile through the config's `profiles.decode`.
 * A plain RoutingPolicy (not a Scheduler) chooses P, and D is least-load.
 */
import type { ConnectorKind } from "../../discovery/types.ts";
import { Scheduler } from "../pipeline/scheduler.ts";
import { decodeLoadKey, leastLoadedWorker } from "../pipeline/util.ts";
import type { RoutingPolicy, RoutingRequest, Selection, WorkerState } from "../types.ts";
import { pairingKey, protocolFor } from "./protocols/index.ts";

export { decodeLoadKey };

/** The least-loaded decode worker (the pdFallbackMixed target and the plain-policy D). */
export function leastLoaded(ws: readonly WorkerState[]): WorkerState | null {
  return leastLoadedWorker(ws);
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
  const sched = policy instanceof Scheduler ? policy : null;
  const prefill = sched ? sched.selectFor("prefill", req, pCands) : policy.select(req, pCands);
  const kind = prefill.worker.record.connector.kind as Exclude<ConnectorKind, "none">;
  const key = pairingKey(prefill.worker.record);
  const dCands = decodes.filter((d) => pairingKey(d.record) === key);
  if (dCands.length === 0) return null;
  let decode: WorkerState | null;
  if (sched) {
    const step = sched.step("decode");
    decode = step.select(req, dCands).worker;
    step.onRouted(req, decode);
  } else decode = leastLoaded(dCands);
  if (!decode) return null;
  return { prefill, decode, kind };
}
