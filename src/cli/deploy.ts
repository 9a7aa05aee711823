import type { Command } from "commander";

interface DeployK8sFlags {
  file: string;
  output?: string;
  generateSecrets?: boolean;
  allowedHostPath?: string[];
  allowedImage?: string[];
}

const collect = (v: string, prev: string[] = []): string[] => [...prev, v];

/**
 * `infera deploy k8s -f cluster.yaml [-o out.yaml|dir/]`: renders a cluster spec to manifests
 * for `kubectl apply -f`; `infera deploy crd`: prints the InferaCluster CRD for the operator.
 */
export function registerDeploy(program: Command): void {
  const deploy = program.command("deploy").description("render Kubernetes manifests for an Infera cluster");
  deploy
    .command("k8s")
    .description("render a cluster spec (InferaCluster YAML) to multi-document YAML for kubectl apply")
    .requiredOption("-f, --file <cluster.yaml>", "cluster spec (an InferaCluster document)")
    .option(
      "-o, --output <path>",
      "write here instead of stdout; a path ending in / (or a dir) gets one file per object",
    )
    .option(
      "--generate-secrets",
      "also emit Secrets (NATS credentials, API keys, kvd's token) with random values",
    )
    .option(
      "--allowed-host-path <dir>",
      "check host paths against this allowlist as the operator does (repeatable; default: no check)",
      collect,
    )
    .option(
      "--allowed-image <entry>",
      "check images against this allowlist as the operator does (repeatable; default: no check)",
      collect,
    )
    .action(async (f: DeployK8sFlags, cmd: Command) => {
      const [{ renderFile, writeOutput }, { OPERATOR_IMAGE }] = await Promise.all([
        import("../deploy/cli-action.ts"),
        import("../deploy/policy.ts"),
      ]);
      const policy =
        f.allowedHostPath || f.allowedImage
          ? {
              allowedHostPaths: f.allowedHostPath ?? [],
              allowedImages: f.allowedImage ?? [],
              ownImage: OPERATOR_IMAGE,
            }
          : undefined;
      try {
        const objects = renderFile(f.file, { secrets: f.generateSecrets ? "generate" : "reference" }, policy);
        writeOutput(objects, f.output);
      } catch (err) {
        cmd.error(`infera deploy k8s: ${err instanceof Error ? err.message : String(err)}`, { exitCode: 2 });
      }
    });
  deploy
    .command("crd")
    .description("print the InferaCluster CustomResourceDefinition (schema generated from the spec)")
    .action(async () => {
      const { crdYaml } = await import("../deploy/crd.ts");
      process.stdout.write(crdYaml());
    });
}
