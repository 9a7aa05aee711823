/** Round-robin: the `round-robin` preset of the scheduling pipeline (src/router/pipeline/presets.ts). */
import type { PolicyFactory } from "../types.ts";
import { presetPolicy } from "./preset-policy.ts";

export const createRoundRobin: PolicyFactory = (ctx) => presetPolicy("round-robin", ctx);
