/**
 * The flow-control registry: ONE line per headroom signal (./headroom.ts `defineHeadroom`).
 * Profiles (config `flow.headroom`) name signals by these names.
 */
import { headroomSignals } from "./headroom.ts";

import "./load.ts";
import "./predicted-ttft.ts";

export { headroomSignals };
