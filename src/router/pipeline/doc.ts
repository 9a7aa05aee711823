/**
 * The plugin reference, docs/plugins.md, rendered from the registry: every registered plugin of
 * every kind, with its `doc` line, its `needs` and its params (type, default, bounds) read from
 * its zod schema. The file is wholly generated (scripts/gen-plugin-doc.ts writes it;
 * test/router/pipeline/doc.test.ts fails while it is stale), so a plugin added with its one
 * registry line shows up with no edit here — and so does a new kind added to `registered`.
 */
import type { z } from "zod";
import { replaceBetweenMarkers } from "../../util/markers.ts";
import { headroomSignals } from "../flow/registry.ts";
import { type AnyPluginDef, registered } from "./plugin.ts";
import "./registry.ts";
import type { Need } from "./types.ts";

/** What a section reads of a plugin: pipeline plugins and flow control's headroom signals alike. */
interface Documented {
  readonly doc: string;
  readonly needs: readonly Need[];
  readonly params: z.ZodTypeAny;
}

/** What one zod def looks like from here: only the fields this file reads (zod 3's `_def`). */
interface Def {
  readonly typeName?: string;
  readonly innerType?: z.ZodTypeAny;
  readonly schema?: z.ZodTypeAny;
  readonly type?: z.ZodTypeAny;
  readonly defaultValue?: () => unknown;
  readonly checks?: readonly { kind: string; value?: unknown; inclusive?: boolean }[];
  readonly values?: readonly unknown[] | Record<string, unknown>;
  readonly value?: unknown;
  readonly options?: readonly z.ZodTypeAny[];
  readonly shape?: () => Record<string, z.ZodTypeAny>;
}

function def(s: z.ZodTypeAny): Def {
  return s._def as Def;
}

interface Field {
  readonly type: string;
  readonly optional: boolean;
  readonly default?: unknown;
  readonly description?: string;
}

function checksText(d: Def): string {
  const out: string[] = [];
  for (const c of d.checks ?? []) {
    if (c.kind === "int") out.push("integer");
    else if (c.kind === "min") out.push(`${c.inclusive === false ? ">" : "≥"} ${String(c.value)}`);
    else if (c.kind === "max") out.push(`${c.inclusive === false ? "<" : "≤"} ${String(c.value)}`);
    else if (c.kind === "multipleOf") out.push(`multiple of ${String(c.value)}`);
  }
  return out.length > 0 ? ` (${out.join(", ")})` : "";
}

/** A short human type for one schema, unwrapping defaults, optionals and refinements. */
function describe(s: z.ZodTypeAny): Field {
  const d = def(s);
  const description = s.description;
  switch (d.typeName) {
    case "ZodDefault": {
      const inner = describe(d.innerType as z.ZodTypeAny);
      return { ...inner, default: d.defaultValue?.(), description: description ?? inner.description };
    }
    case "ZodOptional":
    case "ZodNullable": {
      const inner = describe(d.innerType as z.ZodTypeAny);
      return { ...inner, optional: true, description: description ?? inner.description };
    }
    case "ZodEffects":
      return { ...describe(d.schema as z.ZodTypeAny), description };
    default:
      return { type: typeText(s), optional: false, description };
  }
}

function typeText(s: z.ZodTypeAny): string {
  const d = def(s);
  switch (d.typeName) {
    case "ZodNumber":
      return `number${checksText(d)}`;
    case "ZodString":
      return `string${checksText(d)}`;
    case "ZodBoolean":
      return "boolean";
    case "ZodEnum":
      return (d.values as readonly unknown[]).map((v) => JSON.stringify(v)).join(" | ");
    case "ZodLiteral":
      return JSON.stringify(d.value);
    case "ZodArray":
      return `array of ${describe(d.type as z.ZodTypeAny).type}`;
    case "ZodUnion":
      return (d.options ?? []).map((o) => describe(o).type).join(" | ");
    case "ZodObject":
      return "object";
    default:
      return (d.typeName ?? "value").replace(/^Zod/, "").toLowerCase();
  }
}

/** The params of a plugin as rows `name → Field`; a plugin whose params are not an object has none. */
function paramRows(params: z.ZodTypeAny): [string, Field][] {
  let s = params;
  while (def(s).typeName === "ZodEffects" || def(s).typeName === "ZodDefault") {
    s = (def(s).schema ?? def(s).innerType) as z.ZodTypeAny;
  }
  const shape = def(s).shape?.();
  return shape ? Object.entries(shape).map(([k, v]) => [k, describe(v)]) : [];
}

function cell(text: string): string {
  return text.replaceAll("|", "\\|").replaceAll("\n", " ");
}

function anchor(kind: string, name: string): string {
  return `${kind}-${name}`.toLowerCase().replace(/[^a-z0-9-]/g, "-");
}

function pluginSection(kind: string, name: string, p: Documented): string {
  const doc = `${p.doc[0].toUpperCase()}${p.doc.slice(1)}`;
  const lines = [
    `<a id="${anchor(kind, name)}"></a>`,
    "",
    `### \`${name}\``,
    "",
    `${doc}.`.replace(/\.\.$/, "."),
    "",
  ];
  lines.push(`Needs: ${p.needs.length > 0 ? p.needs.map((n) => `\`${n}\``).join(", ") : "nothing"}.`, "");
  const rows = paramRows(p.params);
  if (rows.length === 0) {
    lines.push("No params.", "");
    return lines.join("\n");
  }
  // The "about" column only when some param carries a zod `.describe()`.
  const about = rows.some(([, f]) => f.description);
  lines.push(about ? "| param | type | default | about |" : "| param | type | default |");
  lines.push(about ? "|---|---|---|---|" : "|---|---|---|");
  for (const [k, f] of rows) {
    const dflt =
      f.default !== undefined ? `\`${JSON.stringify(f.default)}\`` : f.optional ? "(unset)" : "required";
    const tail = about ? ` ${cell(f.description ?? "")} |` : "";
    lines.push(`| \`${k}\` | ${cell(f.type)} | ${dflt} |${tail}`);
  }
  lines.push("");
  return lines.join("\n");
}

const HEADER = `<!-- Generated by scripts/gen-plugin-doc.ts from src/router/pipeline/registry.ts; do not edit.
     test/router/pipeline/doc.test.ts fails while this file is stale. -->
# Pipeline plugins

Every plugin a scheduling profile can name (\`profiles.<step>.filters\`, \`.scorers\`, \`.picker\`
in the config file, or the presets in \`src/router/pipeline/presets.ts\`), with its params as the
config schema validates them (unknown params are refused). How a decision runs and how to add a
plugin: [src/router/pipeline/README.md](../src/router/pipeline/README.md).

**Needs** say what the server starts for a profile that uses the plugin: \`kvIndex\` → KV event
ingestion, \`engineLoad\` → the engines' \`/metrics\` scraper, \`promptTokens\` → prompts tokenized
ahead, \`approxTree\` → prompts templated ahead for the approximate prefix tree.
`;

export const LIST_BEGIN = "<!-- BEGIN plugin-list (generated by scripts/gen-plugin-doc.ts; do not edit) -->";
export const LIST_END = "<!-- END plugin-list -->";

/**
 * `doc` (docs/architecture.md) with the short plugin list between its markers redone from the
 * registry: one line per kind, names linking into plugins.md. The list is indented like the
 * marker line, so it stays inside the numbered item that holds it.
 */
export function renderPluginList(doc: string): string {
  const list = (indent: string) =>
    Object.entries(registered)
      .map(([kind, map]) => {
        const names = [...map.keys()].sort().map((n) => `[\`${n}\`](plugins.md#${anchor(kind, n)})`);
        return `${indent}- ${kind}s (${names.length}): ${names.join(", ")}`;
      })
      .join("\n");
  return replaceBetweenMarkers(doc, LIST_BEGIN, LIST_END, list, "plugin-list");
}

/** docs/plugins.md as the registry describes it now. */
export function renderPluginDoc(): string {
  const parts = [HEADER];
  for (const [kind, map] of Object.entries(registered) as [string, Map<string, AnyPluginDef<unknown>>][]) {
    const names = [...map.keys()].sort();
    parts.push(`## ${kind[0].toUpperCase()}${kind.slice(1)}s (${names.length})`, "");
    parts.push(names.map((n) => `[\`${n}\`](#${anchor(kind, n)})`).join(" · "), "");
    for (const n of names) parts.push(pluginSection(kind, n, map.get(n) as AnyPluginDef<unknown>));
  }
  // Flow control's headroom signals (src/router/flow/registry.ts): named by `flow.headroom`, not
  // by a profile step, so they have their own registry and their own section.
  const signals = [...headroomSignals.keys()].sort();
  parts.push(`## Headroom signals (${signals.length})`, "");
  parts.push(
    "Flow control's admission queue (config `flow.headroom`, src/router/flow/README.md) asks these whether a worker has room; a worker has headroom when every listed signal says so.",
    "",
    "Among the workers with headroom, `flow.locality` (src/router/flow/locality.ts; not a plugin: one rule of the queue, read from the profile's prefix scorer) keeps a queued request for a busy worker holding notably more of its prompt for up to `waitMs`, and of a look-ahead window releases the request with the fewest uncached prompt tokens first (`pick: cheapest`). Params: `waitMs` (500; 0 = off), `minGainTokens` (512), `lookahead` (32), `pick` (`cheapest` | `first`).",
    "",
  );
  parts.push(signals.map((n) => `[\`${n}\`](#${anchor("headroom", n)})`).join(" · "), "");
  for (const n of signals) parts.push(pluginSection("headroom", n, headroomSignals.get(n) as Documented));
  return `${parts.join("\n").trimEnd()}\n`;
}
