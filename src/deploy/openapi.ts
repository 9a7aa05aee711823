/**
 * zod → OpenAPI v3 "structural schema" (what a CRD's `openAPIV3Schema` must be): every node has
 * a `type`, no `$ref`, `int | "auto"` becomes `x-kubernetes-int-or-string`. Covers the zod types
 * the cluster spec uses and throws on any other, so a new kind of field cannot slip out
 * unconverted. Refinements (`.refine`, `.superRefine`) stay in zod: the operator re-validates.
 */
import { type ZodTypeAny, z } from "zod";

export interface OpenApiSchema {
  type?: "object" | "array" | "string" | "integer" | "number" | "boolean";
  description?: string;
  properties?: Record<string, OpenApiSchema>;
  required?: string[];
  additionalProperties?: OpenApiSchema | boolean;
  items?: OpenApiSchema;
  enum?: (string | number | boolean)[];
  default?: unknown;
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  pattern?: string;
  format?: string;
  "x-kubernetes-int-or-string"?: boolean;
  "x-kubernetes-preserve-unknown-fields"?: boolean;
}

export class UnsupportedZodTypeError extends Error {}

/** Strips optional/default/effects wrappers; reports whether the field may be absent. */
function unwrap(t: ZodTypeAny): { inner: ZodTypeAny; optional: boolean; dflt?: unknown } {
  let optional = false;
  let dflt: unknown;
  for (;;) {
    if (t instanceof z.ZodOptional || t instanceof z.ZodNullable) {
      optional = true;
      t = t.unwrap();
    } else if (t instanceof z.ZodDefault) {
      optional = true;
      dflt = t._def.defaultValue();
      t = t._def.innerType;
    } else if (t instanceof z.ZodEffects) {
      t = t.innerType();
    } else return { inner: t, optional, dflt };
  }
}

export function zodToOpenApi(schema: ZodTypeAny, path = "$"): OpenApiSchema {
  const { inner: t, dflt } = unwrap(schema);
  const out = convert(t, path);
  if (dflt !== undefined && typeof dflt !== "object") out.default = dflt;
  if (schema.description) out.description = schema.description;
  return out;
}

function convert(t: ZodTypeAny, path: string): OpenApiSchema {
  if (t instanceof z.ZodObject) {
    const shape = t.shape as Record<string, ZodTypeAny>;
    const properties: Record<string, OpenApiSchema> = {};
    const required: string[] = [];
    for (const [k, v] of Object.entries(shape)) {
      properties[k] = zodToOpenApi(v, `${path}.${k}`);
      if (!unwrap(v).optional) required.push(k);
    }
    return { type: "object", properties, ...(required.length > 0 ? { required } : {}) };
  }
  if (t instanceof z.ZodString) {
    const s: OpenApiSchema = { type: "string" };
    for (const c of t._def.checks) {
      if (c.kind === "min") s.minLength = c.value;
      else if (c.kind === "max") s.maxLength = c.value;
      else if (c.kind === "regex") s.pattern = c.regex.source;
      else if (c.kind === "url") s.format = "uri";
      else if (c.kind === "startsWith") s.pattern = `^${c.value.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}`;
    }
    return s;
  }
  if (t instanceof z.ZodNumber) {
    const s: OpenApiSchema = { type: t.isInt ? "integer" : "number" };
    for (const c of t._def.checks) {
      if (c.kind === "min") s.minimum = c.value;
      else if (c.kind === "max") s.maximum = c.value;
    }
    return s;
  }
  if (t instanceof z.ZodBoolean) return { type: "boolean" };
  if (t instanceof z.ZodEnum) return { type: "string", enum: [...(t.options as string[])] };
  if (t instanceof z.ZodLiteral) {
    const v = t.value as unknown;
    if (typeof v !== "string") throw new UnsupportedZodTypeError(`${path}: non-string literal`);
    return { type: "string", enum: [v] };
  }
  if (t instanceof z.ZodArray) {
    const s: OpenApiSchema = { type: "array", items: zodToOpenApi(t.element, `${path}[]`) };
    if (t._def.minLength) s.minItems = t._def.minLength.value;
    return s;
  }
  if (t instanceof z.ZodRecord) {
    return { type: "object", additionalProperties: zodToOpenApi(t.valueSchema, `${path}{}`) };
  }
  if (t instanceof z.ZodUnion) {
    // The one union the spec has: an integer or a keyword (`gidIndex: 3 | "auto"`).
    const kinds = (t.options as ZodTypeAny[]).map((o) => convert(unwrap(o).inner, path).type).sort();
    if (kinds.join() === "integer,string") return { "x-kubernetes-int-or-string": true };
    throw new UnsupportedZodTypeError(`${path}: union of ${kinds.join(", ")}`);
  }
  throw new UnsupportedZodTypeError(`${path}: unsupported zod type ${t.constructor.name}`);
}
