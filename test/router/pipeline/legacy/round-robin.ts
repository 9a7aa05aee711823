// FROZEN copy of the pre-pipeline implementation (commit a5c2372), kept to prove the presets exact. Do not edit.
/** Round-robin: each request goes to the next available worker in turn (an exact, even spread). */
import type { RoutingPolicy, Selection } from "../../../../src/router/types.ts";
import type { PolicyFactory } from "./types.ts";

export const createRoundRobin: PolicyFactory = () => {
  let next = 0;
  const policy: RoutingPolicy = {
    name: "round-robin",
    select(_req, candidates): Selection {
      const i = next % candidates.length;
      next = (next + 1) % 0x40000000;
      return { worker: candidates[i]!, reason: "round-robin" };
    },
  };
  return policy;
};
