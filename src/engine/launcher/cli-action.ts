/** The action behind `infera engine ...`: flags → spec → command → (dry run | lifecycle). */
import { type EtcdFlagValues, etcdOptionsFromFlags } from "../../discovery/etcd-client.ts";
import type { DiscoveryRegistrar } from "../../discovery/types.ts";
import { InferaError } from "../../protocol/errors.ts";
import type { NatsCliValues } from "../../transport/nats/cli-options.ts";
import { createLogger } from "../../util/log.ts";
import { shellLine } from "./common.ts";
import { blocksOverride } from "./facts.ts";
import { engineAdapters } from "./index.ts";
import { healthBaseUrl, runLifecycle } from "./lifecycle.ts";
import { buildLaunchSpec, type LaunchFlags, parseEngineKind } from "./options.ts";
import { buildWorkerRecord } from "./record.ts";

/**
 * The parsed flags of `infera engine` (commander camel-cases them; numbers stay strings and are
 * checked here). Owned by the launcher, which reads them: src/cli/engine.ts declares the same
 * flags and hands them over as this type.
 */
export interface EngineCliFlags extends LaunchFlags, EtcdFlagValues, NatsCliValues {
  dryRun?: boolean;
  discovery: string;
  leaseTtl: string;
  healthTimeout: string;
  healthInterval: string;
  stopTimeout: string;
  drainTimeout: string;
}

function seconds(flag: string, v: string, min: number): number {
  const n = Number(v);
  if (!Number.isFinite(n) || n < min)
    throw new InferaError(400, `--${flag} must be a number >= ${min} (got '${v}')`);
  return n;
}

export async function runEngineCommand(
  engineName: string,
  extraArgs: string[],
  flags: EngineCliFlags,
): Promise<number> {
  const log = createLogger("engine", { engine: engineName });
  try {
    const engine = parseEngineKind(engineName);
    const adapter = engineAdapters[engine];
    const spec = await buildLaunchSpec(engine, flags, extraArgs);
    const command = adapter.build(spec);
    if (flags.dryRun) {
      const record = buildWorkerRecord(spec, adapter, {
        startedAt: new Date(),
        kvBlocks: blocksOverride(spec.extraArgs),
      });
      process.stdout.write(
        `${JSON.stringify({ argv: command.argv, env: command.env, shell: shellLine(command), record }, null, 2)}\n`,
      );
      return 0;
    }
    const leaseTtl = seconds("lease-ttl", flags.leaseTtl, 1);
    let registrar: DiscoveryRegistrar | null = null;
    if (flags.discovery === "etcd") {
      const { EtcdRegistrar } = await import("../../discovery/etcd-registrar.ts");
      registrar = new EtcdRegistrar({
        ...etcdOptionsFromFlags(flags),
        leaseTtlSeconds: leaseTtl,
        logger: log,
      });
    } else if (flags.discovery !== "none") {
      throw new InferaError(400, `--discovery must be etcd or none (got '${flags.discovery}')`);
    }
    // NATS planes (--nats-url, --request-plane nats, --event-plane nats): agent + relay beside the engine.
    const { resolveTransport } = await import("../../transport/nats/cli-options.ts");
    const transport = resolveTransport(flags, spec.workerId);
    if (transport.nats) {
      const { withNatsPlanes } = await import("../../transport/nats/worker-plug.ts");
      registrar = withNatsPlanes(registrar, {
        settings: transport,
        engineUrl: healthBaseUrl(spec),
        logger: log,
      });
    }
    return await runLifecycle({
      spec,
      adapter,
      command,
      registrar,
      log,
      healthTimeoutMs: seconds("health-timeout", flags.healthTimeout, 0) * 1000,
      healthIntervalMs: seconds("health-interval", flags.healthInterval, 0) * 1000,
      stopTimeoutMs: seconds("stop-timeout", flags.stopTimeout, 0) * 1000,
      drainTimeoutMs: seconds("drain-timeout", flags.drainTimeout, 0) * 1000,
    });
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    process.stderr.write(`infera engine: ${msg}\n`);
    log.debug({ err: msg }, "launcher failed");
    return 2;
  }
}
