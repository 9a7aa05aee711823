/**
 * The plugin registry: ONE line per plugin. Each plugin lives in its own file beside this one
 * and registers itself under its name when imported (plugin.ts `defineFilter/Scorer/Picker`);
 * profiles (presets and the config file's `profiles`) name plugins by those names.
 */
import { registered } from "./plugin.ts";

import "./filters/imbalance-guard.ts";
import "./filters/load-ceiling.ts";
import "./filters/hot-spread.ts";
import "./filters/health.ts";
import "./filters/model.ts";
import "./filters/role.ts";
import "./filters/connector.ts";
import "./filters/ttft-saturation.ts";

import "./scorers/kv-prefix.ts";
import "./scorers/approx-prefix.ts";
import "./scorers/prefill-backlog.ts";
import "./scorers/active-decode.ts";
import "./scorers/engine-queue.ts";
import "./scorers/cache-pressure.ts";
import "./scorers/lora-affinity.ts";
import "./scorers/round-robin.ts";
import "./scorers/predicted-ttft.ts";
import "./scorers/session-affinity.ts";

import "./pickers/argmin.ts";
import "./pickers/prefix-threshold.ts";
import "./pickers/least-load.ts";
import "./pickers/round-robin.ts";

export const filters = registered.filter;
export const scorers = registered.scorer;
export const pickers = registered.picker;
