/**
 * kv-aware: the `kv-aware` preset of the scheduling pipeline (src/router/pipeline/presets.ts):
 * hot-spread → load-ceiling → kv-prefix (pending bridge) + prefill-backlog + active-decode +
 * engine-queue + cache-pressure → argmin (softmax when temperature > 0). The former policy
 * (imbalance guard, no bridge) is the `kv-aware-classic` preset. See src/router/pipeline/README.md.
 */
import type { Scheduler } from "../pipeline/scheduler.ts";
import type { PolicyFactory } from "../types.ts";
import { presetPolicy } from "./preset-policy.ts";

/** The kv-aware Scheduler: `stats` and `explain` as the former policy had them. */
export type KvAwarePolicy = Scheduler;

export const createKvAware: PolicyFactory = (ctx) => presetPolicy("kv-aware", ctx);
