/**
 * docs/plugins.md is generated from the registry (src/router/pipeline/doc.ts): it must be
 * current, list every registered plugin with its params, and pick up a plugin — or a whole new
 * kind of plugin — that registers itself, with no edit to the generator.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { renderPluginDoc, renderPluginList } from "../../../src/router/pipeline/doc.ts";
import { type AnyPluginDef, registered } from "../../../src/router/pipeline/plugin.ts";
import "../../../src/router/pipeline/registry.ts";

const DOC = fileURLToPath(new URL("../../../docs/plugins.md", import.meta.url));
const ARCH = fileURLToPath(new URL("../../../docs/architecture.md", import.meta.url));

describe("docs/plugins.md", () => {
  it("is current (node scripts/gen-plugin-doc.ts)", () => {
    assert.equal(readFileSync(DOC, "utf8"), renderPluginDoc());
  });

  it("docs/architecture.md's plugin list is current and names every registered filter", () => {
    const arch = readFileSync(ARCH, "utf8");
    assert.equal(arch, renderPluginList(arch));
    // The filters the list once missed (issue #33): load-ceiling and hot-spread among them.
    assert.match(
      arch,
      new RegExp(`- filters \\(${registered.filter.size}\\): .*\`hot-spread\`.*\`load-ceiling\``),
    );
  });

  it("names every registered plugin under its kind, with each param's default", () => {
    const doc = renderPluginDoc();
    for (const [kind, map] of Object.entries(registered)) {
      const section = doc.split(`## ${kind[0].toUpperCase()}${kind.slice(1)}s (${map.size})`)[1];
      assert.ok(section, `a section for ${kind}s`);
      for (const name of map.keys()) assert.match(section, new RegExp(`### \`${name}\``), `${kind} ${name}`);
    }
    // load-ceiling's params as its schema says (src/router/pipeline/filters/load-ceiling.ts).
    assert.match(doc, /\| `ratio` \| number \(≥ 1\) \| `1\.5` \|/);
    assert.match(doc, /\| `slack` \| number \(≥ 0\) \| `1` \|/);
  });

  it("picks up a new kind of plugin and its described params with no edit", () => {
    const kinds = registered as unknown as Record<string, Map<string, AnyPluginDef<unknown>>>;
    kinds.admitter = new Map([
      [
        "token-bucket",
        {
          kind: "filter",
          doc: "admits a request while the bucket has tokens",
          params: z
            .object({ rate: z.number().positive().default(10).describe("tokens per second") })
            .strict(),
          needs: [],
          build: () => ({}),
        },
      ],
    ]);
    try {
      const doc = renderPluginDoc();
      assert.match(doc, /## Admitters \(1\)/);
      assert.match(doc, /### `token-bucket`\n\nAdmits a request while the bucket has tokens\./);
      assert.match(doc, /\| `rate` \| number \(> 0\) \| `10` \| tokens per second \|/);
      const list = renderPluginList(readFileSync(ARCH, "utf8"));
      assert.match(list, /- admitters \(1\): \[`token-bucket`\]\(plugins\.md#admitter-token-bucket\)/);
    } finally {
      delete kinds.admitter;
    }
  });
});
