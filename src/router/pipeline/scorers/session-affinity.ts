/**
 * session-affinity: keeps a session on the worker that served it (issue #29 item 5), while that
 * worker has headroom. Value: `weight × (0 for the session's worker, 1 for the others)`; 0 for
 * every candidate when the request names no session, the session is new or expired, or its
 * worker is saturated (then it escapes: the other scorers choose, and the session moves to the
 * new worker, whose cache now holds its history).
 *
 * The session is the `x-session-id` header (`header`), or OpenAI's `user` body field when
 * `useUserField` is set and no header is given. Saturated: the worker's request load (max of
 * this server's in-flight and the engine's running + waiting) is above `ratio` × the
 * candidates' mean + `slack`, or its engine queue is above `maxWaiting` (0: off), or its
 * predicted TTFT (the server's predictor, src/router/predict) is above the request's TTFT target
 * when it has one (`x-infera-ttft-target-ms` or `targetMs` / `byModel` / `byPriority`).
 *
 * It composes with `kv-prefix`: the prefix scorer already prefers the worker holding a
 * conversation's history while the KV index shows it; the session adds a fixed pull that holds
 * before the engine's events arrive and after an eviction, and gives way under saturation.
 * The table is per model, bounded (`maxSessions`, the least recently used leave) and each entry
 * expires `ttlMs` after its last request.
 */
import { z } from "zod";
import { type TtftTargetConfig, ttftTargetOf, ttftTargetParams } from "../../predict/target.ts";
import { predictorOf } from "../../predict/ttft.ts";
import type { RoutingRequest } from "../../types.ts";
import { defineScorer } from "../plugin.ts";
import type { StepContext } from "../types.ts";

const params = z
  .object({
    header: z.string().min(1).default("x-session-id"),
    useUserField: z.boolean().default(false),
    ttlMs: z.number().positive().default(600_000),
    maxSessions: z.number().int().positive().default(100_000),
    ratio: z.number().min(1).default(1.5),
    slack: z.number().min(0).default(4),
    maxWaiting: z.number().int().min(0).default(0),
    ...ttftTargetParams,
  })
  .strict();

interface Entry {
  worker: string;
  expires: number;
}

/** The request's session key, or null. */
export function sessionOf(req: RoutingRequest, header: string, useUser: boolean): string | null {
  const h = req.header?.(header.toLowerCase());
  if (h !== undefined && h !== "") return h;
  if (useUser && typeof req.body.user === "string" && req.body.user !== "") return req.body.user;
  return null;
}

export default defineScorer("session-affinity", {
  doc: "0 for the worker that served the request's session (x-session-id, or `user`) while it has headroom, else 1",
  params,
  needs: [],
  create: (scope, p) => {
    const table = scope.shared(
      `session-affinity:${p.header}:${p.useUserField}`,
      () => new Map<string, Entry>(),
    );
    const target: TtftTargetConfig = p;
    const predictor = predictorOf(scope);

    function saturated(ctx: StepContext, at: readonly number[], pos: number): boolean {
      const loads = ctx.loads();
      let sum = 0;
      for (const i of at) sum += loads[i];
      if (loads[pos] > (sum / at.length) * p.ratio + p.slack) return true;
      const w = ctx.all[pos];
      if (p.maxWaiting > 0 && (w.engineLoad?.waiting ?? 0) > p.maxWaiting) return true;
      const t = ttftTargetOf(ctx.req, target);
      return t !== undefined && predictor.predictions(ctx)[pos] > t;
    }

    function lookup(key: string, now: number): Entry | null {
      const e = table.get(key);
      if (!e) return null;
      if (e.expires <= now) {
        table.delete(key);
        return null;
      }
      return e;
    }

    return {
      name: "session-affinity",
      needs: [],
      score(ctx, at, weight, out) {
        out.fill(0, 0, at.length);
        const key = sessionOf(ctx.req, p.header, p.useUserField);
        if (key === null) return;
        const e = lookup(key, Date.now());
        if (!e) return;
        let k = -1;
        for (let j = 0; j < at.length; j++) if (ctx.all[at[j]].record.id === e.worker) k = j;
        // Its worker filtered out, or saturated: the session escapes (no pull anywhere).
        if (k < 0 || saturated(ctx, at, at[k])) return;
        for (let j = 0; j < at.length; j++) out[j] = j === k ? 0 : weight;
      },
      onRouted(req, worker) {
        const key = sessionOf(req, p.header, p.useUserField);
        if (key === null) return;
        // Re-inserted: Map order is least recently used first.
        table.delete(key);
        table.set(key, { worker: worker.record.id, expires: Date.now() + p.ttlMs });
        if (table.size > p.maxSessions) table.delete(table.keys().next().value!);
      },
      onWorkerRemoved(id) {
        for (const [key, e] of table) if (e.worker === id) table.delete(key);
      },
    };
  },
});
