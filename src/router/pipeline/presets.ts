/**
 * Presets: today's policy names as step profiles. `round-robin`, `kv-aware` and `approx-prefix`
 * reproduce the former policies' choices exactly (test/router/pipeline/presets-exact.test.ts
 * drives them against frozen copies of the old code). The policy options (`--policy-option`,
 * `--kv-*` flags, `policyOptions` in the config) map to plugin params here; an option no preset
 * and no other part of the server knows is refused.
 *
 * Decode (the D of a PD pair) in every preset: least-load, as before.
 */
import type { ProfileSet, ProfileSpec } from "./types.ts";
import { numOption } from "./util.ts";

type Options = Readonly<Record<string, unknown>>;

/** Options of the preset profiles (each maps to one plugin param or weight). */
export const PRESET_OPTIONS = [
  "overlapWeight",
  "prefillWeight",
  "decodeWeight",
  "waitingWeight",
  "pressureWeight",
  "temperature",
  "balanceAbsThreshold",
  "balanceRelThreshold",
  "chunkChars",
  "maxNodesPerWorker",
  "recentRoutingMs",
  "cacheThreshold",
] as const;

/**
 * Options read elsewhere from the same `policyOptions` bag: the DisaggRouter
 * (src/router/disagg/router.ts) and the KV ingest (src/kv/ingest.ts, server-ingest.ts).
 * (`trackPrefill` is retired: the config drops it with a warning, src/server/config.ts.)
 */
export const SERVER_OPTIONS = [
  "prefillTimeoutMs",
  "decodeTimeoutMs",
  "pdFallbackMixed",
  "maxPrefillAttempts",
  "kvReplayTimeoutMs",
  "kvMaxBlocksPerWorker",
] as const;

const LEAST_LOAD: ProfileSpec = { scorers: [], picker: { name: "least-load" } };

function guard(o: Options, prefer: "overlap" | "none") {
  return {
    name: "imbalance-guard",
    params: {
      balanceAbsThreshold: numOption(o, "balanceAbsThreshold", 16),
      balanceRelThreshold: numOption(o, "balanceRelThreshold", 1.5),
      prefer,
    },
  };
}

function kvAware(o: Options): ProfileSpec {
  return {
    filters: [guard(o, "overlap")],
    // Order matters: totals add up left to right, as the former cost formula did.
    scorers: [
      {
        name: "kv-prefix",
        weight: numOption(o, "overlapWeight", 1),
        params: {
          chunkChars: numOption(o, "chunkChars", 64),
          maxNodesPerWorker: numOption(o, "maxNodesPerWorker", 100_000),
          recentRoutingMs: numOption(o, "recentRoutingMs", 0),
        },
      },
      { name: "prefill-backlog", weight: numOption(o, "prefillWeight", 1) },
      { name: "active-decode", weight: numOption(o, "decodeWeight", 0.5) },
      { name: "engine-queue", weight: numOption(o, "waitingWeight", 4) },
      { name: "cache-pressure", weight: numOption(o, "pressureWeight", 0.1) },
    ],
    picker: { name: "argmin", params: { temperature: numOption(o, "temperature", 0) } },
  };
}

function approxPrefix(o: Options): ProfileSpec {
  return {
    filters: [guard(o, "none")],
    scorers: [
      {
        name: "approx-prefix",
        weight: 1,
        params: {
          chunkChars: numOption(o, "chunkChars", 64),
          maxNodesPerWorker: numOption(o, "maxNodesPerWorker", 100_000),
        },
      },
    ],
    picker: { name: "prefix-threshold", params: { cacheThreshold: numOption(o, "cacheThreshold", 0.5) } },
  };
}

const ROUND_ROBIN: ProfileSpec = { scorers: [], picker: { name: "round-robin" } };

/** The presets: one policy name → its mixed, prefill and decode profiles. */
export const presets: Readonly<Record<string, (o: Options) => ProfileSet>> = {
  "round-robin": () => ({ mixed: ROUND_ROBIN, prefill: ROUND_ROBIN, decode: LEAST_LOAD }),
  "kv-aware": (o) => ({ mixed: kvAware(o), prefill: kvAware(o), decode: LEAST_LOAD }),
  "approx-prefix": (o) => ({ mixed: approxPrefix(o), prefill: approxPrefix(o), decode: LEAST_LOAD }),
};

export function presetNames(): string[] {
  return Object.keys(presets);
}

/** Refuses option names nothing reads (a typo would otherwise be silently ignored). */
export function checkOptionNames(o: Options): void {
  const known = new Set<string>([...PRESET_OPTIONS, ...SERVER_OPTIONS]);
  const unknown = Object.keys(o).filter((k) => !known.has(k));
  if (unknown.length > 0)
    throw new Error(
      `unknown policy option${unknown.length > 1 ? "s" : ""} ${unknown.map((k) => `'${k}'`).join(", ")} ` +
        `(known: ${[...known].join(", ")}; compose plugins under 'profiles' in the config file instead)`,
    );
}
