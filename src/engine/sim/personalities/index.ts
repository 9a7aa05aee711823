/** The personalities by name: the one place an engine name selects behaviour. */
import type { EngineKind } from "../engine-flags.ts";
import { atom } from "./atom.ts";
import { sglang } from "./sglang.ts";
import type { Personality } from "./types.ts";
import { vllm } from "./vllm.ts";

export type { Personality };

const PERSONALITIES: Readonly<Record<EngineKind, Personality>> = { vllm, sglang, atom };

export function personalityOf(kind: EngineKind): Personality {
  return PERSONALITIES[kind];
}
