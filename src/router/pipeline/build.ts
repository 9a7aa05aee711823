/**
 * `buildScheduling`: from the server config's `policy`, `policyOptions` and `profiles`, the
 * resolved step profiles, what they need from the server (KV ingest, tokenization, scraping)
 * and a factory of per-model Schedulers. The server decides what to start from `needs` only;
 * no code compares policy names.
 */
import type { PrefixIndex } from "../../kv/prefix-index.ts";
import type { Logger } from "../../util/log.ts";
import type { PeerRouting } from "../peers/types.ts";
import type { TtftPredictor } from "../predict/ttft.ts";
import { issuePath, type ProfilesConfig, profilesConfigSchema } from "./config-schema.ts";
import type { DecisionLog } from "./decisions.ts";
import { checkOptionNames, presetNames, presets } from "./presets.ts";
import { filters, pickers, scorers } from "./registry.ts";
import { Scheduler } from "./scheduler.ts";
import type { Need, Needs, ProfileSet, Step } from "./types.ts";

export class SchedulingConfigError extends Error {
  override readonly name = "SchedulingConfigError";
}

export interface SchedulingInput {
  policy: string;
  policyOptions?: Readonly<Record<string, unknown>>;
  /** The config's `profiles` (validated here), each replacing that step of the preset. */
  profiles?: unknown;
  /** Router mode: `mixed` uses only the mixed step, `disagg` only prefill and decode. */
  router?: "auto" | "mixed" | "disagg";
}

export interface Scheduling {
  readonly policy: string;
  /** The policy options it was built from (the DisaggRouter reads its own from them). */
  readonly options: Readonly<Record<string, unknown>>;
  readonly profiles: ProfileSet;
  /** Union of the needs of the steps the router mode uses. */
  readonly needs: Needs;
  /** Count prompt tokens into the prefill backlog (the prompt is read anyway). */
  readonly trackPrefill: boolean;
  create(o: {
    model: string;
    logger: Logger;
    kvIndex?: PrefixIndex;
    peers?: PeerRouting;
    decisions?: DecisionLog;
    ttft?: TtftPredictor;
  }): Scheduler;
}

const STEPS: readonly Step[] = ["mixed", "prefill", "decode"];

export function parseProfiles(raw: unknown): ProfilesConfig {
  if (raw === undefined || raw === null) return {};
  const r = profilesConfigSchema.safeParse(raw);
  if (r.success) return r.data;
  const msgs = r.error.issues.map((i) => `${issuePath("profiles", i.path)}: ${i.message}`);
  throw new SchedulingConfigError(`invalid scheduling profiles: ${msgs.join("; ")}`);
}

export function buildScheduling(input: SchedulingInput): Scheduling {
  const preset = presets[input.policy];
  if (!preset)
    throw new SchedulingConfigError(
      `unknown routing policy '${input.policy}' (known: ${presetNames().join(", ")})`,
    );
  const options = input.policyOptions ?? {};
  checkOptionNames(options);
  const custom = parseProfiles(input.profiles);
  const base = preset(options);
  const profiles: ProfileSet = {
    mixed: custom.mixed ?? base.mixed,
    prefill: custom.prefill ?? base.prefill,
    decode: custom.decode ?? base.decode,
  };
  const used = STEPS.filter((s) =>
    input.router === "mixed" ? s === "mixed" : input.router === "disagg" ? s !== "mixed" : true,
  );
  const needs = new Set<Need>();
  for (const s of used) {
    const p = profiles[s];
    for (const f of p.filters ?? []) for (const n of filters.get(f.name)?.needs ?? []) needs.add(n);
    for (const sc of p.scorers) for (const n of scorers.get(sc.name)?.needs ?? []) needs.add(n);
    for (const n of pickers.get(p.picker.name)?.needs ?? []) needs.add(n);
  }
  const policy = input.policy;
  return {
    policy,
    options,
    profiles,
    needs,
    trackPrefill: needs.has("promptTokens") || needs.has("approxTree"),
    create: (o) => new Scheduler({ name: policy, profiles, ...o }),
  };
}
