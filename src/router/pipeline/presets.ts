/**
 * Presets: policy names as step profiles. `round-robin`, `kv-aware-classic` and `approx-prefix`
 * reproduce the former policies' choices exactly (test/router/pipeline/presets-exact.test.ts
 * drives them against frozen copies of the old code). `kv-aware`, the default, is the profile
 * the fleet-routing runs chose (src/router/pipeline/README.md, "The kv-aware preset"): no
 * imbalance guard, the pending bridge on, hot-prefix spreading and a saturation valve. The
 * policy options (`--policy-option`, `--kv-*` flags, `policyOptions` in the config) map to
 * plugin params here; an option no preset and no other part of the server knows is refused.
 *
 * Decode (the D of a PD pair) in every preset: least-load, as before.
 */
import type { PluginRef, ProfileSet, ProfileSpec } from "./types.ts";
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
  "bridgeGraceMs",
  "bridgeTtlMs",
  "hotRatio",
  "hotWindow",
  "ceilingRatio",
  "ceilingSlack",
  "saturationGain",
] as const;

/**
 * Options read elsewhere from the same `policyOptions` bag: the DisaggRouter
 * (src/router/disagg/router.ts) and the KV ingest (src/kv/feeds/, src/kv/server-ingest.ts).
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

/** The former kv-aware policy, choice for choice (`kv-aware-classic`). */
function kvAwareClassic(o: Options): ProfileSpec {
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

/** The saturation valve's defaults (README, "The kv-aware preset": the runs that chose them). */
const DEFAULT_CEILING_RATIO = 3;
const DEFAULT_CEILING_SLACK = 16;
/** kv-prefix's weight grows by this × the fleet's saturation (scorers/kv-prefix.ts; README runs). */
const DEFAULT_SATURATION_GAIN = 1;

/**
 * The default `kv-aware`: kv-aware-classic's scorers without SGLang's imbalance guard (which
 * under a burst sends requests to the least-loaded worker whatever its cache: fleet-routing
 * Run C), with
 * - the pending bridge (`kv-prefix` `bridgePending`): a routed prompt counts as cached on its
 *   worker from routing until the engine's KV events confirm it, or the request fails or is
 *   cancelled (../pending-prefixes.ts); the prefix weighted 2 so that a follower charged its
 *   tenant's queued prompt (prefill-backlog) does not tie with a cold prefill elsewhere, and
 *   more once every candidate has a prefill queue (`saturationGain`: moving a request off its
 *   cache then adds work that delays the queued requests, not just a copy);
 * - `hot-spread`: a prefix carrying more than 1/N of recent decisions is replicated onto more
 *   workers before anything queues (`hotRatio`, 0 = off); a request is judged by the longest
 *   head of its prompt routed before, so a preamble all traffic shares makes nobody hot;
 * - a saturation valve, `load-ceiling`: a worker loaded above `ceilingRatio` × the mean +
 *   `ceilingSlack` requests leaves the choice, so its prefix stops attracting requests that would
 *   wait longer there than a cold prefill takes elsewhere (`ceilingRatio` 0 = off).
 * Weights and thresholds: the runs in the pipeline README.
 */
function kvAware(o: Options): ProfileSpec {
  const filters: PluginRef[] = [];
  const hotRatio = numOption(o, "hotRatio", 1.25);
  if (hotRatio > 0)
    filters.push({
      name: "hot-spread",
      params: { ratio: hotRatio, window: numOption(o, "hotWindow", 256) },
    });
  const ceilingRatio = numOption(o, "ceilingRatio", DEFAULT_CEILING_RATIO);
  if (ceilingRatio > 0)
    filters.push({
      name: "load-ceiling",
      params: { ratio: ceilingRatio, slack: numOption(o, "ceilingSlack", DEFAULT_CEILING_SLACK) },
    });
  return {
    filters,
    scorers: [
      {
        name: "kv-prefix",
        weight: numOption(o, "overlapWeight", 2),
        params: {
          chunkChars: numOption(o, "chunkChars", 64),
          maxNodesPerWorker: numOption(o, "maxNodesPerWorker", 100_000),
          recentRoutingMs: numOption(o, "recentRoutingMs", 0),
          bridgePending: true,
          bridgeGraceMs: numOption(o, "bridgeGraceMs", 1000),
          bridgeTtlMs: numOption(o, "bridgeTtlMs", 120_000),
          saturationGain: numOption(o, "saturationGain", DEFAULT_SATURATION_GAIN),
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
  "kv-aware-classic": (o) => ({ mixed: kvAwareClassic(o), prefill: kvAwareClassic(o), decode: LEAST_LOAD }),
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
