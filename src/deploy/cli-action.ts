/** File in, YAML out, for `infera deploy k8s`. */
import { mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parse } from "yaml";
import { type ClusterPolicy, policyIssues } from "./policy.ts";
import { tlsEnabled } from "./render/context.ts";
import { type KubeObject, type RenderOptions, renderCluster, toYaml } from "./render/index.ts";
import { type ClusterSpec, ClusterSpecError, parseClusterDocument } from "./spec.ts";

/**
 * Renders a spec file. With `policy` (the CLI's --allowed-host-path / --allowed-image), the
 * operator's allowlists are checked too: a cluster admin may opt in to the same refusals.
 */
export function renderFile(path: string, opts: RenderOptions = {}, policy?: ClusterPolicy): KubeObject[] {
  const doc = parseClusterDocument(parse(readFileSync(path, "utf8")));
  if (policy) {
    const issues = policyIssues(doc.spec, policy);
    if (issues.length > 0) throw new ClusterSpecError(issues);
  }
  const warning = plaintextWarning(doc.spec);
  if (warning) process.stderr.write(`warning: ${warning}\n`);
  return renderCluster(doc, opts);
}

/**
 * TLS is on by default; a spec that turns it off for an in-cluster etcd or NATS gets this
 * warning: credentials and prompts then cross the pod network in the clear.
 */
export function plaintextWarning(spec: ClusterSpec): string | undefined {
  if (tlsEnabled(spec)) return undefined;
  const planes = [...(spec.etcd.external ? [] : ["etcd"]), ...(spec.planes.kind === "nats" ? ["NATS"] : [])];
  if (planes.length === 0) return undefined;
  return (
    `tls.enabled is false: the in-cluster ${planes.join(" and ")} will carry credentials, ` +
    "prompts and answers in plaintext on the pod network (remove it to get TLS, the default)"
  );
}

const isDir = (p: string): boolean => {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
};

/** stdout, one file, or (for a directory) one numbered file per object in apply order. */
export function writeOutput(objects: readonly KubeObject[], output: string | undefined): void {
  if (output === undefined || output === "-") {
    process.stdout.write(toYaml(objects));
    return;
  }
  if (output.endsWith("/") || isDir(output)) {
    mkdirSync(output, { recursive: true });
    objects.forEach((o, i) => {
      const file = `${String(i).padStart(2, "0")}-${o.kind.toLowerCase()}-${o.metadata?.name ?? "object"}.yaml`;
      writeFileSync(join(output, file), toYaml([o]));
    });
    return;
  }
  writeFileSync(output, toYaml(objects));
}
