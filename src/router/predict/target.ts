/**
 * A request's TTFT target (issue #29 item 4): the `x-infera-ttft-target-ms` header, else the
 * configured target for its model and priority, else the model's, else the default; none → no
 * target (nothing is judged saturated by predicted TTFT).
 *
 * Priority is the request's `x-infera-priority` header (a flow-control band name, or a number)
 * or vLLM's `priority` body field (an integer, lower is served earlier under
 * `--scheduling-policy priority`: vllm-project/vllm vllm/entrypoints/openai/protocol.py
 * ChatCompletionRequest.priority), matched as that string against `byPriority`.
 */
import { z } from "zod";
import type { RoutingRequest } from "../types.ts";

export const TTFT_TARGET_HEADER = "x-infera-ttft-target-ms";

/** Zod shape of the target settings a plugin takes as params. */
export const ttftTargetParams = {
  /** Default target (ms); absent: only requests with a header or a configured model have one. */
  targetMs: z.number().positive().optional(),
  /** Per served model name: ms, or per priority value within the model. */
  byModel: z
    .record(
      z.string(),
      z.union([
        z.number().positive(),
        z
          .object({
            targetMs: z.number().positive().optional(),
            byPriority: z.record(z.string(), z.number().positive()).default({}),
          })
          .strict(),
      ]),
    )
    .default({}),
  /** Per priority value (any model): ms. */
  byPriority: z.record(z.string(), z.number().positive()).default({}),
};

export interface TtftTargetConfig {
  targetMs?: number;
  byModel: Record<string, number | { targetMs?: number; byPriority: Record<string, number> }>;
  byPriority: Record<string, number>;
}

/** The request's priority as a string key ("" when none). */
export function priorityKey(req: RoutingRequest): string {
  // The header names a band ("high") or a vLLM priority value ("-1"); either is a key.
  const h = req.header?.("x-infera-priority")?.trim().toLowerCase();
  if (h) return /^-?\d+$/.test(h) ? String(Number(h)) : h;
  const p = req.body.priority;
  return typeof p === "number" && Number.isInteger(p) ? String(p) : "";
}

/** The request's TTFT target in ms, or undefined when none applies. */
export function ttftTargetOf(req: RoutingRequest, cfg: TtftTargetConfig): number | undefined {
  const h = req.header?.(TTFT_TARGET_HEADER);
  if (h !== undefined) {
    const v = Number(h);
    if (Number.isFinite(v) && v > 0) return v;
  }
  const prio = priorityKey(req);
  const m = cfg.byModel[req.model];
  if (typeof m === "number") return m;
  if (m) {
    if (prio !== "" && m.byPriority[prio] !== undefined) return m.byPriority[prio];
    if (m.targetMs !== undefined) return m.targetMs;
  }
  if (prio !== "" && cfg.byPriority[prio] !== undefined) return cfg.byPriority[prio];
  return cfg.targetMs;
}
