/**
 * A small JSON-Schema-driven value generator: what the sim "decodes" under a structured-output
 * constraint (response_format json_schema / json_object, vLLM's structured_outputs / guided_json,
 * SGLang's json_schema) and for tool-call arguments. It covers objects (every listed property,
 * required or not), arrays (minItems..maxItems), enum, const, string / number / integer /
 * boolean / null, nullable type lists, anyOf / oneOf / allOf (first branch), and local $ref
 * (#/$defs/..., #/definitions/...). Values are drawn from the sequence's seeded Mulberry32, so the
 * same seed gives the same JSON.
 *
 * The text is laid out as Python's json.dumps does it (", " and ": " separators,
 * ensure_ascii=False): vLLM re-serialises tool arguments with json.dumps, so the streamed raw
 * text and the final arguments agree.
 */
import type { Mulberry32 } from "../../util/mulberry32.ts";

type Schema = Record<string, unknown>;

const WORDS = [
  "alpha",
  "bridge",
  "river",
  "market",
  "cloud",
  "engine",
  "garden",
  "harbor",
  "signal",
  "window",
  "forest",
  "lantern",
];
const MAX_DEPTH = 8;

function pick<T>(rng: Mulberry32, xs: readonly T[]): T {
  return xs[Math.floor(rng.next() * xs.length)];
}

function resolveRef(root: Schema, ref: string): Schema {
  const m = /^#\/(\$defs|definitions)\/(.+)$/.exec(ref);
  if (!m) return {};
  const defs = root[m[1]] as Record<string, Schema> | undefined;
  return defs?.[m[2].replaceAll("~1", "/").replaceAll("~0", "~")] ?? {};
}

function genString(s: Schema, rng: Mulberry32): string {
  switch (s.format) {
    case "date-time":
      return "2026-01-02T03:04:05Z";
    case "date":
      return "2026-01-02";
    case "time":
      return "03:04:05";
    case "email":
      return "sim@example.com";
    case "uuid":
      return "00000000-0000-4000-8000-000000000000";
    case "uri":
      return "https://example.com/sim";
  }
  const min = typeof s.minLength === "number" ? s.minLength : 0;
  const max = typeof s.maxLength === "number" ? s.maxLength : Number.POSITIVE_INFINITY;
  let out = pick(rng, WORDS);
  if (rng.next() < 0.5) out += ` ${pick(rng, WORDS)}`;
  while (out.length < min) out += ` ${pick(rng, WORDS)}`;
  return out.length > max ? out.slice(0, max) : out;
}

function genNumber(s: Schema, rng: Mulberry32, integer: boolean): number {
  const lo =
    typeof s.minimum === "number"
      ? s.minimum
      : typeof s.exclusiveMinimum === "number"
        ? s.exclusiveMinimum + 1
        : 0;
  const hi =
    typeof s.maximum === "number"
      ? s.maximum
      : typeof s.exclusiveMaximum === "number"
        ? s.exclusiveMaximum - 1
        : lo + 100;
  const x = lo + rng.next() * Math.max(0, hi - lo);
  if (integer) return Math.min(Math.floor(hi), Math.max(Math.ceil(lo), Math.round(x)));
  return Math.round(x * 100) / 100;
}

function gen(root: Schema, raw: unknown, rng: Mulberry32, depth: number): unknown {
  let s = (raw !== null && typeof raw === "object" ? raw : {}) as Schema;
  for (let hops = 0; typeof s.$ref === "string" && hops < 16; hops++) s = resolveRef(root, s.$ref);
  if ("const" in s) return s.const;
  if (Array.isArray(s.enum) && s.enum.length > 0) return pick(rng, s.enum);
  for (const k of ["anyOf", "oneOf", "allOf"] as const) {
    const branches = s[k];
    if (Array.isArray(branches) && branches.length > 0) {
      // Past the depth limit, prefer a branch that ends the recursion (null) when there is one.
      const leaf = branches.find((b) => (b as Schema)?.type === "null");
      return gen(root, depth >= MAX_DEPTH && leaf ? leaf : branches[0], rng, depth + 1);
    }
  }
  let type = s.type;
  if (Array.isArray(type)) {
    const concrete = type.filter((t) => t !== "null");
    type = depth >= MAX_DEPTH && type.includes("null") ? "null" : (concrete[0] ?? "null");
  }
  if (type === undefined) type = s.properties ? "object" : s.items ? "array" : "string";
  switch (type) {
    case "object": {
      const out: Record<string, unknown> = {};
      const props = (s.properties ?? {}) as Record<string, unknown>;
      const required = Array.isArray(s.required) ? (s.required as string[]) : [];
      for (const [k, v] of Object.entries(props)) {
        if (depth >= MAX_DEPTH && !required.includes(k)) continue;
        out[k] = gen(root, v, rng, depth + 1);
      }
      // A bare json_object (no properties): one small field, as a model would write.
      if (Object.keys(props).length === 0 && required.length === 0 && depth === 0)
        out.answer = genString({}, rng);
      for (const k of required) if (!(k in out)) out[k] = genString({}, rng);
      return out;
    }
    case "array": {
      const min = typeof s.minItems === "number" ? s.minItems : depth >= MAX_DEPTH ? 0 : 1;
      const max = typeof s.maxItems === "number" ? s.maxItems : Math.max(min, 3);
      const n = depth >= MAX_DEPTH ? min : min + Math.floor(rng.next() * (max - min + 1));
      if (Array.isArray(s.prefixItems))
        return (s.prefixItems as unknown[]).map((p) => gen(root, p, rng, depth + 1));
      return Array.from({ length: n }, () => gen(root, s.items, rng, depth + 1));
    }
    case "string":
      return genString(s, rng);
    case "integer":
      return genNumber(s, rng, true);
    case "number":
      return genNumber(s, rng, false);
    case "boolean":
      return rng.next() < 0.5;
    default:
      return null;
  }
}

/** A value valid for `schema` (within the subset above), drawn from `rng`. */
export function generateFromSchema(schema: unknown, rng: Mulberry32): unknown {
  const root = (schema !== null && typeof schema === "object" ? schema : {}) as Schema;
  return gen(root, root, rng, 0);
}

/** JSON text as Python's `json.dumps(v, ensure_ascii=False)` writes it. */
export function pyJson(v: unknown): string {
  if (v === null || v === undefined) return "null";
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (typeof v === "object")
    return `{${Object.entries(v as Record<string, unknown>)
      .map(([k, x]) => `${JSON.stringify(k)}: ${pyJson(x)}`)
      .join(", ")}}`;
  if (typeof v === "number" && Number.isInteger(v) && !Object.is(v, -0)) return String(v);
  return JSON.stringify(v);
}

/**
 * Splits text into token-sized pieces (a word with its leading space, a run of digits, or one
 * punctuation mark) whose concatenation is the text: how the scripted answer is "sampled".
 */
export function pieces(text: string): string[] {
  return text.match(/ ?[A-Za-z_]+| ?\d+|\s+|[^\sA-Za-z_\d]/g) ?? [];
}
