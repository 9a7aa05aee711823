/**
 * The server config's `flow` section (issue #29: admission queue, priority bands, tenant
 * fairness and limits). Absent or `enabled: false`: no queue, every request goes straight to
 * the scheduler as before. Headroom signals are checked against ./registry.ts.
 */
import { z } from "zod";
import { DEFAULT_LOCALITY, type LocalityConfig } from "./locality.ts";
import { headroomSignals } from "./registry.ts";

const signalRef = z
  .object({ name: z.string().min(1), params: z.record(z.string(), z.unknown()).optional() })
  .strict()
  .superRefine((ref, ctx) => {
    const def = headroomSignals.get(ref.name);
    if (!def) {
      ctx.addIssue({
        code: z.ZodIssueCode.custom,
        path: ["name"],
        message: `unknown headroom signal '${ref.name}' (known: ${[...headroomSignals.keys()].join(", ")})`,
      });
      return;
    }
    const r = def.params.safeParse(ref.params ?? {});
    if (!r.success) for (const i of r.error.issues) ctx.addIssue({ ...i, path: ["params", ...i.path] });
  });

const bandSchema = z
  .object({
    /** The `x-infera-priority` header value that selects the band. */
    name: z.string().regex(/^[a-z0-9_-]{1,32}$/, "expected 1–32 of a-z 0-9 _ - (band name)"),
    /** Past this wait a queued request is answered 429 (default: flow.maxWaitMs). */
    maxWaitMs: z.number().int().min(1).optional(),
    /** Past this wait a queued request goes ahead of higher bands (default: maxWaitMs / 2). */
    agingMs: z.number().int().min(0).optional(),
    /**
     * Requests without the header whose vLLM `priority` body field is at most this join the
     * band (bands are tried in order; lower priority values are more urgent in vLLM).
     */
    bodyPriorityMax: z.number().int().optional(),
  })
  .strict();

/** Locality (./locality.ts): wait a little for the worker holding a queued request's prefix. */
const localitySchema = z
  .object({
    /** Longest extra wait for that worker, ms, counted from the first time it was passed over (0: off; default 500). */
    waitMs: z.number().int().min(0),
    /** Cached prompt tokens that worker must hold beyond the best one with headroom (default 512). */
    minGainTokens: z.number().int().min(1),
    /** Queued entries one dispatch looks at (default 32). */
    lookahead: z.number().int().min(1),
    /** Of those that need not wait: `cheapest` (fewest uncached prompt tokens; default) or `first` in order. */
    pick: z.enum(["first", "cheapest"]),
  })
  .partial()
  .strict();

const tenantSchema = z
  .object({
    /** Share of the band's tokens against other backlogged flows (VTC). */
    weight: z.number().positive().default(1),
    /** Requests per minute (0: none). */
    rpm: z.number().int().min(0).default(0),
    /** Prompt + expected output tokens per minute (0: none). */
    tpm: z.number().int().min(0).default(0),
  })
  .strict();

/**
 * One config layer's `flow`: every key optional and no defaults, so a later layer (flags)
 * overrides only what it sets; `resolveFlowConfig` applies the defaults to the merged result.
 */
export const flowConfigSchema = z
  .object({
    enabled: z.boolean(),
    /** Headroom signals; a worker has headroom when every one says so (default: [load]). */
    headroom: z.array(signalRef),
    /** Queued requests at most, this replica (default 1000). */
    maxQueue: z.number().int().min(0),
    /** Default maximum wait of a band, ms (default 30000). */
    maxWaitMs: z.number().int().min(1),
    /** Highest first (default high, normal, low). */
    bands: z.array(bandSchema).min(1),
    /** The band of a request with neither header nor a matching body priority (default normal). */
    defaultBand: z.string(),
    /** Take the flow key from `x-infera-tenant` (else the API key's digest); default false. */
    tenantHeader: z.boolean(),
    /** Output tokens expected of a request without max_tokens (fairness and TPM); default 256. */
    expectedOutputTokens: z.number().int().min(1),
    /**
     * Server replicas behind the balancer (default 1): limits are split evenly among them, and
     * without a peer plane the `load` signal counts its dispatches since a reading this many times.
     */
    replicas: z.number().int().min(1),
    /** Per flow key (tenant name, or `key-<12 hex of sha256(key)>`): weight and limits. */
    tenants: z.record(z.string(), tenantSchema),
    /** Weight and limits of a flow not listed in `tenants`. */
    defaultTenant: tenantSchema,
    /** Locality of release: wait a little for the worker holding the prompt's prefix. */
    locality: localitySchema,
  })
  .partial()
  .strict();

export type FlowConfigLayer = z.infer<typeof flowConfigSchema>;
export type TenantConfig = z.output<typeof tenantSchema>;

export interface FlowConfig {
  readonly enabled: boolean;
  readonly headroom: readonly { name: string; params?: Record<string, unknown> }[];
  readonly maxQueue: number;
  readonly maxWaitMs: number;
  readonly bands: readonly { name: string; maxWaitMs: number; agingMs: number; bodyPriorityMax?: number }[];
  readonly defaultBand: number;
  readonly tenantHeader: boolean;
  readonly expectedOutputTokens: number;
  readonly replicas: number;
  readonly tenants: Readonly<Record<string, TenantConfig>>;
  readonly defaultTenant: TenantConfig;
  readonly locality: LocalityConfig;
}

/** The merged `flow` layers with defaults; throws when `defaultBand` names no band. */
export function resolveFlowConfig(l: FlowConfigLayer = {}): FlowConfig {
  const maxWaitMs = l.maxWaitMs ?? 30_000;
  const bands = (l.bands ?? [{ name: "high" }, { name: "normal" }, { name: "low" }]).map((b) => {
    const wait = b.maxWaitMs ?? maxWaitMs;
    return {
      name: b.name,
      maxWaitMs: wait,
      agingMs: b.agingMs ?? Math.floor(wait / 2),
      bodyPriorityMax: b.bodyPriorityMax,
    };
  });
  const names = bands.map((b) => b.name);
  if (new Set(names).size !== names.length)
    throw new Error(`flow.bands: band names repeat (${names.join(", ")})`);
  const defaultBand = names.indexOf(l.defaultBand ?? (names.includes("normal") ? "normal" : names[0]));
  if (defaultBand < 0)
    throw new Error(`flow.defaultBand: '${l.defaultBand}' is not one of ${names.join(", ")}`);
  const headroom = l.headroom ?? [{ name: "load" }];
  // A signal's per-band params (load's `bands`) are keyed by band name: a typo would silently
  // leave that band at the common thresholds.
  for (const ref of headroom) {
    const per = ref.params?.bands;
    if (per === null || typeof per !== "object") continue;
    const unknown = Object.keys(per).filter((k) => !names.includes(k));
    if (unknown.length > 0)
      throw new Error(
        `flow.headroom '${ref.name}' params.bands: '${unknown.join("', '")}' is not one of ${names.join(", ")}`,
      );
  }
  return {
    enabled: l.enabled ?? false,
    headroom,
    maxQueue: l.maxQueue ?? 1000,
    maxWaitMs,
    bands,
    defaultBand,
    tenantHeader: l.tenantHeader ?? false,
    expectedOutputTokens: l.expectedOutputTokens ?? 256,
    replicas: l.replicas ?? 1,
    // Layers keep what they were given; the tenants' defaults (weight 1, no limits) apply here.
    tenants: Object.fromEntries(Object.entries(l.tenants ?? {}).map(([k, t]) => [k, tenantSchema.parse(t)])),
    defaultTenant: tenantSchema.parse(l.defaultTenant ?? {}),
    locality: { ...DEFAULT_LOCALITY, ...l.locality },
  };
}
