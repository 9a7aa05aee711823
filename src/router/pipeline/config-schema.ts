/**
 * The scheduling part of the server config: per-step profiles (`mixed`, `prefill`, `decode`),
 * each a list of filters, weighted scorers and a picker. A step given here replaces that step of
 * the preset named by `policy`. The server's config schema embeds this one, so a bad profile is
 * refused with its path (e.g. `profiles.prefill.scorers[1].weight`).
 *
 * Plugin names and params are checked against the registry: each plugin's own zod schema.
 */
import { z } from "zod";
import type { AnyPluginDef } from "./plugin.ts";
import { filters, pickers, scorers } from "./registry.ts";

const refShape = z
  .object({
    name: z.string().min(1),
    params: z.record(z.string(), z.unknown()).optional(),
  })
  .strict();

const scorerShape = refShape.extend({ weight: z.number().finite() }).strict();

/** Checks a plugin reference against the registry and the plugin's own params schema. */
function checkRef<T>(kind: string, defs: ReadonlyMap<string, AnyPluginDef<T>>) {
  return (ref: { name: string; params?: Record<string, unknown> }, ctx: z.RefinementCtx): void => {
    const def = defs.get(ref.name);
    if (!def) {
      ctx.addIssue({
        code: z.ZodIssueCode.custom,
        path: ["name"],
        message: `unknown ${kind} '${ref.name}' (known: ${[...defs.keys()].join(", ")})`,
      });
      return;
    }
    const r = def.params.safeParse(ref.params ?? {});
    if (!r.success)
      for (const issue of r.error.issues) ctx.addIssue({ ...issue, path: ["params", ...issue.path] });
  };
}

export const profileSpecSchema = z
  .object({
    filters: z.array(refShape.superRefine(checkRef("filter", filters))).optional(),
    scorers: z.array(scorerShape.superRefine(checkRef("scorer", scorers))).default([]),
    picker: refShape.superRefine(checkRef("picker", pickers)),
  })
  .strict();

export const profilesConfigSchema = z
  .object({
    mixed: profileSpecSchema.optional(),
    prefill: profileSpecSchema.optional(),
    decode: profileSpecSchema.optional(),
  })
  .strict();

export type ProfilesConfig = z.infer<typeof profilesConfigSchema>;

/** `profiles.prefill.scorers[1].weight`-style path of a zod issue. */
export function issuePath(root: string, path: readonly (string | number)[]): string {
  let s = root;
  for (const p of path) s += typeof p === "number" ? `[${p}]` : `.${p}`;
  return s;
}
