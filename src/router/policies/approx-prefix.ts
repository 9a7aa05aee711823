/**
 * approx-prefix: the `approx-prefix` preset of the scheduling pipeline
 * (src/router/pipeline/presets.ts): imbalance guard → approx-prefix scorer → prefix-threshold.
 */
import type { PolicyFactory } from "../types.ts";
import { presetPolicy } from "./preset-policy.ts";

export const createApproxPrefix: PolicyFactory = (ctx) => presetPolicy("approx-prefix", ctx);
