import { BadRequestError } from "../../protocol/errors.ts";
import type { BenchRequest } from "../types.ts";
import { type DocQaSpec, docQaWorkload } from "./doc-qa.ts";
import { type MultiTurnSpec, multiTurnWorkload } from "./multi-turn.ts";
import { type SyntheticSpec, syntheticWorkload } from "./synthetic.ts";
import { type TraceSpec, traceWorkload } from "./trace.ts";

export type { DocQaSpec, MultiTurnSpec, SyntheticSpec, TraceSpec };
export type WorkloadSpec = SyntheticSpec | MultiTurnSpec | DocQaSpec | TraceSpec;

/** Builds the request list of a workload. Pure: the same spec, n and seed give identical output. */
export function buildWorkload(
  spec: WorkloadSpec,
  n: number,
  seed: number,
  maxTokens?: number,
): BenchRequest[] {
  if (!Number.isInteger(n) || n < 0)
    throw new BadRequestError(`requests must be a non-negative integer, got ${n}`);
  switch (spec.kind) {
    case "synthetic":
      return syntheticWorkload(spec, n, seed, maxTokens);
    case "multi-turn":
      return multiTurnWorkload(spec, n, seed, maxTokens);
    case "doc-qa":
      return docQaWorkload(spec, n, seed, maxTokens);
    case "trace":
      return traceWorkload(spec, n, maxTokens);
  }
}

/** The CLI's --workload value: a built-in name or a path to a .jsonl trace. */
export function parseWorkloadName(name: string): WorkloadSpec {
  if (name === "synthetic" || name === "multi-turn" || name === "doc-qa") return { kind: name };
  if (name.endsWith(".jsonl") || name.endsWith(".json") || name.includes("/"))
    return { kind: "trace", path: name };
  throw new BadRequestError(`unknown workload "${name}": use synthetic, multi-turn, doc-qa or a .jsonl file`);
}
