/**
 * The one check every worker record passes at the discovery boundary (etcd, static, memory):
 * types, ranges and URL schemes. A record that fails it is skipped with a warning naming its
 * key, so one bad record cannot break requests for its model (`blockSize: 0` made every
 * request throw in kv/hash; a `ftp://` url made every request fail without opening the
 * breaker; numeric served names leaked into /v1/models).
 *
 * The interfaces in types.ts stay the documented contract; the compile-time checks at the end
 * of this file fail the build when the schema and the interfaces disagree.
 */
import { z } from "zod";
import type {
  ConnectorInfo,
  ConnectorKind,
  EngineKind,
  KvEventsInfo,
  KvEventsRank,
  WorkerRecord,
  WorkerRole,
} from "./types.ts";

const ENGINE_KINDS = ["vllm", "sglang", "atom", "sim"] as const satisfies readonly EngineKind[];
const ROLES = ["mixed", "prefill", "decode"] as const satisfies readonly WorkerRole[];
const CONNECTOR_KINDS = [
  "nixl",
  "mooncake",
  "moriio",
  "sglang",
  "atom",
  "none",
] as const satisfies readonly ConnectorKind[];

/** Bounded so a record cannot carry megabytes in a field the router copies per request. */
const text = z.string().min(1).max(1024);
const port = z.number().int().min(1).max(65535);
const count = z.number().int().min(1);
const index = z.number().int().min(0);

/** The engine's OpenAI server: only http(s) can be proxied to. */
const httpUrl = text.refine(
  (v) => {
    try {
      const u = new URL(v);
      return (u.protocol === "http:" || u.protocol === "https:") && u.hostname !== "";
    } catch {
      return false;
    }
  },
  { message: "must be an http:// or https:// URL" },
);

/**
 * A ZMQ endpoint a subscriber connects to: scheme://address, never the bind wildcard `*`
 * (vLLM's default `tcp://*:5557` is what the engine binds, vllm/config/kv_events.py; the
 * launcher registers the reachable host instead).
 */
const zmqEndpoint = text.refine((v) => /^(tcp|ipc|inproc):\/\/[^*]+$/.test(v), {
  message: "must be tcp://, ipc:// or inproc:// and not a bind wildcard",
});

export const connectorInfoSchema = z.object({
  kind: z.enum(CONNECTOR_KINDS),
  bootstrapHost: text.optional(),
  bootstrapPort: port.optional(),
  handshakePort: port.optional(),
  notifyPort: port.optional(),
  transferMode: z.enum(["READ", "WRITE"]).optional(),
});

export const kvEventsRankSchema = z.object({
  dpRank: index,
  endpoint: zmqEndpoint,
  replayEndpoint: zmqEndpoint.optional(),
});

export const kvEventsInfoSchema = z.object({
  endpoint: zmqEndpoint,
  replayEndpoint: zmqEndpoint.optional(),
  topic: z.string().max(1024),
  framing: z.enum(["seq", "atom"]),
  ranks: z.array(kvEventsRankSchema).min(1).max(1024).optional(),
});

export const workerRecordSchema = z
  .object({
    id: text,
    model: text,
    servedModelNames: z.array(text).min(1).max(256),
    engine: z.enum(ENGINE_KINDS),
    role: z.enum(ROLES),
    url: httpUrl,
    connector: connectorInfoSchema,
    blockSize: count,
    kvEvents: kvEventsInfoSchema.optional(),
    dpSize: count,
    tpSize: count,
    dpRank: index.optional(),
    /** 0 = unknown (neither the flag nor the engine said). */
    maxModelLen: index,
    kvBlocks: count.optional(),
    startedAt: text,
    natsSubject: text.optional(),
    natsKvEpoch: z
      .string()
      .regex(/^[0-9a-f]{8,64}$/)
      .optional(),
    labels: z.record(z.string().max(64 * 1024)).optional(),
    routes: z
      .array(z.string().regex(/^\/[A-Za-z0-9_/.-]{1,200}$/))
      .max(64)
      .optional(),
  })
  .superRefine((r, ctx) => {
    if (r.dpRank !== undefined && r.dpRank >= r.dpSize)
      ctx.addIssue({ code: "custom", path: ["dpRank"], message: `must be below dpSize (${r.dpSize})` });
  });

export type WorkerRecordParse = { ok: true; record: WorkerRecord } | { ok: false; error: string };

/** Validates a decoded record; the error names the first offending field. */
export function validateWorkerRecord(value: unknown): WorkerRecordParse {
  const r = workerRecordSchema.safeParse(value);
  if (r.success) return { ok: true, record: r.data };
  const issue = r.error.issues[0];
  const where = issue && issue.path.length > 0 ? issue.path.join(".") : "record";
  return { ok: false, error: `${where}: ${issue?.message ?? "invalid"}` };
}

/**
 * Parses a stored (etcd) record: JSON, then the schema. Fields older registrars left out are
 * filled as before (`servedModelNames` = [model], `connector` = none) before validation.
 */
export function parseWorkerRecordText(raw: string): WorkerRecordParse {
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch (err) {
    return { ok: false, error: `not JSON: ${(err as Error).message}` };
  }
  if (typeof v !== "object" || v === null || Array.isArray(v))
    return { ok: false, error: "not a JSON object" };
  const o = v as Record<string, unknown>;
  if (o.servedModelNames === undefined && typeof o.model === "string") o.servedModelNames = [o.model];
  if (o.connector === undefined) o.connector = { kind: "none" };
  return validateWorkerRecord(o);
}

// Compile-time agreement between the schema and the interfaces of types.ts: each direction
// must be assignable, so a field added to one and not the other fails `tsc`.
// Optional fields are mutually assignable when only one side has them, so the keys are
// compared too (zod strips keys its schema lacks: a field missing here is lost from etcd).
type Assignable<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
type Same<A, B> = Assignable<A, B> extends true ? Assignable<keyof A, keyof B> : false;
const agree = <T extends true>(_: T) => undefined;
agree<Same<z.infer<typeof workerRecordSchema>, WorkerRecord>>(true);
agree<Same<z.infer<typeof connectorInfoSchema>, ConnectorInfo>>(true);
agree<Same<z.infer<typeof kvEventsInfoSchema>, KvEventsInfo>>(true);
agree<Same<z.infer<typeof kvEventsRankSchema>, KvEventsRank>>(true);
