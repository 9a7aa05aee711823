import type { Command } from "commander";

interface OperatorFlags {
  kubeconfig?: string;
  namespace?: string;
  resync: string;
  allowedHostPath: string[];
  allowedImage: string[];
  ownImage?: string;
}

const collect = (v: string, prev: string[]): string[] => [...prev, v];

/** `infera operator`: reconciles InferaCluster resources (install the CRD with `infera deploy crd`). */
export function registerOperator(program: Command): void {
  program
    .command("operator")
    .description("watch InferaCluster resources and reconcile their Kubernetes objects")
    .option("--kubeconfig <file>", "kubeconfig (default: in-cluster service account, then ~/.kube/config)")
    .option("--namespace <ns>", "watch only this namespace (default: all)")
    .option("--resync <seconds>", "re-reconcile every cluster this often (status of children)", "30")
    .option(
      "--allowed-host-path <dir>",
      "host directory an InferaCluster may mount (modelCacheHostPath, kvd.disk.hostPath), it or below it; repeatable (default: none)",
      collect,
      [],
    )
    .option(
      "--allowed-image <prefix|ref@sha256:…|sha256:…>",
      "image an InferaCluster may run: a prefix ending in / or :, an exact digest reference, or a digest; repeatable (default: only the operator's own default images)",
      collect,
      [],
    )
    .option("--own-image <ref>", "the operator's own infera image, always allowed (default: this release's)")
    .action(async (f: OperatorFlags) => {
      const [{ KubeConfig }, { KubeClusterApi }, { Controller }, { createLogger }, { OPERATOR_IMAGE }] =
        await Promise.all([
          import("@kubernetes/client-node"),
          import("../operator/kube-api.ts"),
          import("../operator/controller.ts"),
          import("../util/log.ts"),
          import("../deploy/policy.ts"),
        ]);
      const log = createLogger("operator");
      const kc = new KubeConfig();
      if (f.kubeconfig) kc.loadFromFile(f.kubeconfig);
      else kc.loadFromDefault();
      const resync = Number(f.resync);
      if (!(resync > 0)) throw new Error(`--resync must be a positive number (got '${f.resync}')`);
      const c = new Controller({
        api: new KubeClusterApi(kc),
        logger: log,
        namespace: f.namespace,
        resyncMs: resync * 1000,
        policy: {
          allowedHostPaths: f.allowedHostPath,
          allowedImages: f.allowedImage,
          ownImage: f.ownImage ?? OPERATOR_IMAGE,
        },
      });
      await c.start();
      log.info(
        {
          namespace: f.namespace ?? "(all)",
          allowedHostPaths: f.allowedHostPath,
          allowedImages: f.allowedImage.length > 0 ? f.allowedImage : "(defaults only)",
        },
        "operator started",
      );
      const stop = () => {
        c.stop().then(
          () => process.exit(0),
          () => process.exit(1),
        );
      };
      process.on("SIGINT", stop);
      process.on("SIGTERM", stop);
    });
}
