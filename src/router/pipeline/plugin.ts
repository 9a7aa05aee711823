/**
 * How a plugin file describes itself to the registry: its kind, a zod schema of its params
 * (unknown params are refused) and what it needs from the server, plus a factory. The factory
 * runs once per model and step; per-model state shared across steps goes through
 * `ModelScope.shared`.
 */
import type { z } from "zod";
import type { Filter, ModelScope, Need, Picker, Scorer } from "./types.ts";

interface Def<K extends string, S extends z.ZodTypeAny, T> {
  readonly kind: K;
  /** One line for the README and error messages. */
  readonly doc: string;
  readonly params: S;
  readonly needs: readonly Need[];
  create(scope: ModelScope, params: z.output<S>): T;
}

export type FilterDef<S extends z.ZodTypeAny = z.ZodTypeAny> = Def<"filter", S, Filter>;
export type ScorerDef<S extends z.ZodTypeAny = z.ZodTypeAny> = Def<"scorer", S, Scorer>;
export type PickerDef<S extends z.ZodTypeAny = z.ZodTypeAny> = Def<"picker", S, Picker>;

/** A plugin with its params type erased, as the registry holds it. */
export interface AnyPluginDef<T> {
  readonly kind: "filter" | "scorer" | "picker";
  readonly doc: string;
  readonly params: z.ZodTypeAny;
  readonly needs: readonly Need[];
  /** Validates `params` (throws a ZodError) and builds the plugin. */
  build(scope: ModelScope, params: unknown): T;
}

function erase<K extends "filter" | "scorer" | "picker", S extends z.ZodTypeAny, T>(
  d: Def<K, S, T>,
): AnyPluginDef<T> {
  return {
    kind: d.kind,
    doc: d.doc,
    params: d.params,
    needs: d.needs,
    build: (scope, params) => d.create(scope, d.params.parse(params ?? {}) as z.output<S>),
  };
}

/** Registered plugins by kind and name (filled by the plugin files that registry.ts imports). */
export const registered = {
  filter: new Map<string, AnyPluginDef<Filter>>(),
  scorer: new Map<string, AnyPluginDef<Scorer>>(),
  picker: new Map<string, AnyPluginDef<Picker>>(),
};

function add<T>(map: Map<string, AnyPluginDef<T>>, name: string, def: AnyPluginDef<T>): AnyPluginDef<T> {
  if (map.has(name)) throw new Error(`${def.kind} '${name}' is registered twice`);
  map.set(name, def);
  return def;
}

/** Defines and registers a filter under `name`. */
export function defineFilter<S extends z.ZodTypeAny>(
  name: string,
  d: Omit<FilterDef<S>, "kind">,
): AnyPluginDef<Filter> {
  return add(registered.filter, name, erase({ ...d, kind: "filter" as const }));
}

/** Defines and registers a scorer under `name`. */
export function defineScorer<S extends z.ZodTypeAny>(
  name: string,
  d: Omit<ScorerDef<S>, "kind">,
): AnyPluginDef<Scorer> {
  return add(registered.scorer, name, erase({ ...d, kind: "scorer" as const }));
}

/** Defines and registers a picker under `name`. */
export function definePicker<S extends z.ZodTypeAny>(
  name: string,
  d: Omit<PickerDef<S>, "kind">,
): AnyPluginDef<Picker> {
  return add(registered.picker, name, erase({ ...d, kind: "picker" as const }));
}
