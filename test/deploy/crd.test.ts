/**
 * The CRD's schema is generated from the zod cluster spec: a structural schema (every node
 * typed, int-or-string marked), it accepts the example specs and refuses what zod refuses at
 * the type level, and `infera deploy crd` / `deploy k8s` behave as CLI commands.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { parse } from "yaml";
import { z } from "zod";
import { buildCrd, crdYaml } from "../../src/deploy/crd.ts";
import { type OpenApiSchema, UnsupportedZodTypeError, zodToOpenApi } from "../../src/deploy/openapi.ts";

const run = promisify(execFile);

function walk(s: OpenApiSchema, path: string, visit: (s: OpenApiSchema, path: string) => void): void {
  visit(s, path);
  for (const [k, v] of Object.entries(s.properties ?? {})) walk(v, `${path}.${k}`, visit);
  if (s.items) walk(s.items, `${path}[]`, visit);
  if (typeof s.additionalProperties === "object") walk(s.additionalProperties, `${path}{}`, visit);
}

/** A minimal structural-schema validator: types, required, enum, bounds, patterns, unknown fields. */
function check(s: OpenApiSchema, v: unknown, path = "spec"): string[] {
  if (s["x-kubernetes-int-or-string"])
    return Number.isInteger(v) || typeof v === "string" ? [] : [`${path}: int-or-string`];
  const t = Array.isArray(v)
    ? "array"
    : v === null
      ? "null"
      : typeof v === "number"
        ? Number.isInteger(v)
          ? "integer"
          : "number"
        : typeof v;
  if (s.type && s.type !== t && !(s.type === "number" && t === "integer"))
    return [`${path}: ${t} is not ${s.type}`];
  const errs: string[] = [];
  if (s.enum && !s.enum.includes(v as string)) errs.push(`${path}: not in enum`);
  if (
    typeof v === "number" &&
    ((s.minimum !== undefined && v < s.minimum) || (s.maximum !== undefined && v > s.maximum))
  )
    errs.push(`${path}: out of range`);
  if (typeof v === "string" && s.pattern && !new RegExp(s.pattern).test(v)) errs.push(`${path}: pattern`);
  if (Array.isArray(v)) for (const [i, x] of v.entries()) errs.push(...check(s.items!, x, `${path}[${i}]`));
  if (t === "object") {
    const o = v as Record<string, unknown>;
    for (const r of s.required ?? []) if (!(r in o)) errs.push(`${path}.${r}: required`);
    for (const [k, x] of Object.entries(o)) {
      const sub =
        s.properties?.[k] ??
        (typeof s.additionalProperties === "object" ? s.additionalProperties : undefined);
      if (!sub) errs.push(`${path}.${k}: unknown field`);
      else errs.push(...check(sub, x, `${path}.${k}`));
    }
  }
  return errs;
}

const specSchema = () =>
  (buildCrd().spec.versions[0]!.schema!.openAPIV3Schema!.properties as Record<string, OpenApiSchema>).spec!;

test("the CRD is a structural schema: every node has a type or is int-or-string", () => {
  buildCrd().validate();
  let nodes = 0;
  walk(specSchema(), "spec", (s, path) => {
    nodes++;
    assert.ok(s.type !== undefined || s["x-kubernetes-int-or-string"], `${path} has no type`);
    assert.ok(!("$ref" in s), path);
  });
  assert.ok(nodes > 60);
  assert.equal(
    (specSchema().properties!.rdma!.properties!.gidIndex as OpenApiSchema)["x-kubernetes-int-or-string"],
    true,
  );
  assert.deepEqual(specSchema().properties!.models!.items!.properties!.engine!.properties!.kind!.enum, [
    "vllm",
    "sglang",
    "atom",
  ]);
});

test("the CRD schema accepts every example spec and rejects type errors zod rejects", () => {
  for (const f of readdirSync("deploy/examples").filter((x) => x.endsWith(".yaml"))) {
    const doc = parse(readFileSync(join("deploy/examples", f), "utf8")) as { spec: unknown };
    assert.deepEqual(check(specSchema(), doc.spec), [], f);
  }
  const doc = parse(readFileSync("deploy/examples/1p1d.yaml", "utf8")) as { spec: Record<string, unknown> };
  const bad = structuredClone(doc.spec) as {
    models: { pools: { replicas: unknown }[]; engine: { kind: string } }[];
    extra?: 1;
  };
  bad.models[0]!.pools[0]!.replicas = "two";
  bad.models[0]!.engine.kind = "tgi";
  bad.extra = 1;
  assert.deepEqual(check(specSchema(), bad).sort(), [
    "spec.extra: unknown field",
    "spec.models[0].engine.kind: not in enum",
    "spec.models[0].pools[0].replicas: string is not integer",
  ]);
});

test("the converter refuses zod types it does not know instead of dropping them", () => {
  assert.throws(() => zodToOpenApi(z.object({ a: z.date() })), UnsupportedZodTypeError);
  assert.throws(() => zodToOpenApi(z.object({ a: z.union([z.string(), z.boolean()]) })), /\$\.a: union/);
  assert.deepEqual(
    zodToOpenApi(z.object({ n: z.number().int().min(1).default(2), s: z.string().optional() })),
    {
      type: "object",
      properties: { n: { type: "integer", minimum: 1, default: 2 }, s: { type: "string" } },
    },
  );
});

test("the committed deploy/crd.yaml is what `infera deploy crd` prints", async () => {
  if (process.env.INFERA_UPDATE_GOLDENS === "1") writeFileSync("deploy/crd.yaml", crdYaml());
  const { stdout } = await run(process.execPath, ["bin/infera.js", "deploy", "crd"], {
    maxBuffer: 16 << 20,
    env: { ...process.env, INFERA_DIST: "0" },
  });
  assert.equal(stdout, readFileSync("deploy/crd.yaml", "utf8"));
});

test("deploy k8s -f writes one file per object to a directory; a bad spec exits 2 naming the key", async () => {
  const dir = mkdtempSync(join(tmpdir(), "infera-deploy-"));
  const env = { ...process.env, INFERA_DIST: "0" };
  await run(
    process.execPath,
    ["bin/infera.js", "deploy", "k8s", "-f", "deploy/examples/1p1d.yaml", "-o", `${dir}/`],
    { env },
  );
  const files = readdirSync(dir);
  assert.ok(files.includes("00-namespace-infera.yaml"), files.join(" "));
  assert.ok(files.some((f) => f.endsWith("-statefulset-pd-dsr1-prefill.yaml")));
  const badFile = join(dir, "bad.yaml");
  writeFileSync(
    badFile,
    readFileSync("deploy/examples/1p1d.yaml", "utf8").replace("replicas: 1", "replicas: -1"),
  );
  await assert.rejects(
    run(process.execPath, ["bin/infera.js", "deploy", "k8s", "-f", badFile], { env }),
    (e: { code: number; stderr: string }) =>
      e.code === 2 && /spec\.models\[0\]\.pools\[0\]\.replicas/.test(e.stderr),
  );
});

for (const [file, roleKind] of [
  ["deploy/operator.yaml", "ClusterRole"],
  ["deploy/operator-namespaced.yaml", "Role"],
] as const)
  test(`${file} validates, its ${roleKind} covers every kind the operator owns, Secrets create-only`, async () => {
    const { parseAllDocuments } = await import("yaml");
    const { OWNED_KINDS } = await import("../../src/operator/kinds.ts");
    const models = {
      Namespace: (await import("kubernetes-models/v1")).Namespace,
      ServiceAccount: (await import("kubernetes-models/v1")).ServiceAccount,
      ClusterRole: (await import("kubernetes-models/rbac.authorization.k8s.io/v1")).ClusterRole,
      ClusterRoleBinding: (await import("kubernetes-models/rbac.authorization.k8s.io/v1")).ClusterRoleBinding,
      Role: (await import("kubernetes-models/rbac.authorization.k8s.io/v1")).Role,
      RoleBinding: (await import("kubernetes-models/rbac.authorization.k8s.io/v1")).RoleBinding,
      Deployment: (await import("kubernetes-models/apps/v1")).Deployment,
    };
    const docs = parseAllDocuments(readFileSync(file, "utf8")).map(
      (d) =>
        d.toJS() as {
          kind: keyof typeof models;
          rules?: { apiGroups: string[]; resources: string[]; verbs: string[] }[];
        },
    );
    for (const d of docs) new models[d.kind](d as never).validate();
    assert.equal(
      docs.some((d) => d.kind === (roleKind === "Role" ? "ClusterRole" : "Role")),
      false,
      "one kind of role",
    );
    const rules = docs.find((d) => d.kind === roleKind)!.rules!;
    for (const k of OWNED_KINDS) {
      const group = k.apiVersion.includes("/") ? k.apiVersion.split("/")[0]! : "";
      const rs = rules.filter((x) => x.apiGroups.includes(group) && x.resources.includes(k.plural));
      assert.ok(rs.length > 0, `${k.kind}: no rule`);
      const verbs = rs.flatMap((r) => r.verbs);
      // Secrets: create only: no get/list/watch can read a credential (issue #30 item 2).
      if (k.createOnly) assert.deepEqual(verbs, ["create"], `${k.kind}`);
      else for (const v of ["list", "patch", "delete"]) assert.ok(verbs.includes(v), `${k.kind}: ${v}`);
    }
    assert.ok(!rules.some((x) => x.resources.includes("*") || x.verbs.includes("*")), "no wildcards");
    // The operator's own pod passes Pod Security "restricted".
    const { violations } = await import("./psa.ts");
    const dep = docs.find((d) => d.kind === "Deployment") as unknown as {
      spec: { template: { spec: object } };
    };
    assert.deepEqual(violations(dep.spec.template.spec, "restricted"), []);
    assert.ok(rules.some((x) => x.resources.includes("inferaclusters/status") && x.verbs.includes("patch")));
  });

test("the example specs quoted in docs/deploy-kubernetes.md are the files the tests render", () => {
  const md = readFileSync("docs/deploy-kubernetes.md", "utf8");
  const blocks = [...md.matchAll(/<!-- example: (\S+) -->\n```yaml\n([\s\S]*?)\n```/g)];
  assert.ok(blocks.length >= 2);
  for (const [, file, body] of blocks) assert.equal(`${body}\n`, readFileSync(file!, "utf8"), file);
});
