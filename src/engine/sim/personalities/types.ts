/**
 * What one engine's personality is: everything the sim does differently for vLLM, SGLang or
 * ATOM, as data and small functions on one object (vllm.ts, sglang.ts, atom.ts), looked up once
 * by name (index.ts). Outside personalities/ no sim file compares an engine's name
 * (test/engine/sim/no-name-checks.test.ts).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { InferaError } from "../../../protocol/errors.ts";
import type { RawArgs } from "../arg-types.ts";
import type { KvEventsEncoding, KvEventsFraming, SimConfig } from "../config.ts";
import type { EngineKind, FlagSpec } from "../engine-flags.ts";
import type { KvLayout } from "../kv-layouts.ts";
import type { MetricNames } from "../metric-names.ts";
import type { RequestRules } from "../request-plan.ts";

/** The label inputs of one rank's metrics. */
export interface RankLabelInput {
  modelName: string;
  dpRank: number;
  dpSize: number;
  role: "mixed" | "prefill" | "decode";
}

/** What a personality's own routes may read of the running sim. */
export interface PersonalityRouteDeps {
  cfg: SimConfig;
}

export type PostRoute = (
  deps: PersonalityRouteDeps,
  req: IncomingMessage,
  res: ServerResponse,
) => Promise<void>;

export interface Personality {
  readonly kind: EngineKind;
  // --- command line -------------------------------------------------------------------------
  /** The program name argparse prints in its usage/error lines. */
  readonly prog: string;
  /** The engine's flags as its argparse declares them (engine-flags.ts). */
  readonly flags: Readonly<Record<string, FlagSpec>>;
  /** argparse accepts `_` for `-` in long flags (vLLM's FlexibleArgumentParser, ATOM's). */
  readonly underscoreFlags: boolean;
  /** vLLM's `[serve] MODEL` positional; the others take no positionals. */
  readonly positionalModel: boolean;
  readonly defaultPort: number;
  readonly defaultHost: string;
  /** Tokens per KV block (vLLM/ATOM block size, SGLang page size). */
  readonly defaultBlockSize: number;
  /** The environment variable read for the API key, if the engine reads one. */
  readonly apiKeyEnv?: string;
  /** The default `--kv-events-encoding` (`explicit`: `--engine` was named). */
  defaultKvEncoding(explicit: boolean): KvEventsEncoding;
  readonly defaultKvFraming: KvEventsFraming;
  /** Maps the engine's own PD / KV-event flags onto the SimConfig fields the core reads. */
  applyArgs(cfg: SimConfig, raw: RawArgs, env: NodeJS.ProcessEnv): void;
  // --- metrics ------------------------------------------------------------------------------
  readonly metricNames: MetricNames;
  rankLabels(o: RankLabelInput): Record<string, string>;
  // --- KV events ----------------------------------------------------------------------------
  kvLayout(encoding: KvEventsEncoding): KvLayout;
  /** The port offset of DP rank `rank`'s KV endpoints. */
  kvRankPortOffset(rank: number): number;
  /** Whether the engine binds or connects its KV PUB socket for `endpoint`. */
  kvPubMode(endpoint: string): "bind" | "connect";
  // --- HTTP ---------------------------------------------------------------------------------
  /** The DP rank a request pins (raw, validated by the caller), or undefined. */
  pinnedRankRaw(header: string | undefined, body: Record<string, unknown>): unknown;
  /** Refuses (throws) a request model the engine refuses before the OpenAI layer, if it does. */
  checkModelName(cfg: SimConfig, body: unknown): void;
  /** The error answer before any byte is sent: status comes from `e`. */
  errorAnswer(e: InferaError): { body: unknown; headers: Record<string, string> };
  /** `GET /health`'s JSON body, or null for an empty 200. */
  readonly healthBody: unknown;
  /** GET routes of the engine's own (non-OpenAI) surface. */
  getRoutes(cfg: SimConfig): Readonly<Record<string, () => unknown>>;
  /** POST routes of the engine's own surface. */
  readonly postRoutes: Readonly<Record<string, PostRoute>>;
  // --- requests -----------------------------------------------------------------------------
  /** Tools, structured outputs, temperature and priority as the engine takes them. */
  readonly requests: RequestRules;
}
