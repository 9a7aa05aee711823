/**
 * Discovery backend factory. Each backend is one line of `discoveryBackends`; the server
 * calls `createDiscoveryWatcher(config)` and knows nothing else about the backend.
 */
import type { Logger } from "../util/log.ts";
import { MemoryDiscovery } from "./memory.ts";
import { type PartialWorkerRecord, StaticDiscovery } from "./static.ts";
import type { DiscoveryWatcher } from "./types.ts";

export interface DiscoveryConfig {
  kind: string;
  /** static: worker base URLs (`--worker`). */
  workers?: readonly string[];
  /** static: JSON/YAML list of partial worker records (`--workers-file`). */
  workersFile?: string;
  /** static/memory: records given programmatically. */
  records?: readonly PartialWorkerRecord[];
  /** etcd: endpoints (`--etcd`, `INFERA_ETCD`), e.g. `http://127.0.0.1:2379`. */
  etcdEndpoints?: readonly string[];
  /** Key prefix in the registry (default `/infera`). */
  prefix?: string;
  /** Backend-specific extras from the config file. */
  options?: Readonly<Record<string, unknown>>;
}

export type DiscoveryBackendFactory = (
  config: DiscoveryConfig,
  logger: Logger,
) => DiscoveryWatcher | Promise<DiscoveryWatcher>;

/** One line per backend. */
export const discoveryBackends: Record<string, DiscoveryBackendFactory> = {
  memory: () => new MemoryDiscovery(),
  static: (c, logger) =>
    new StaticDiscovery({ urls: c.workers, workersFile: c.workersFile, records: c.records, logger }),
  etcd: async (c, logger) => (await import("./etcd-watcher.ts")).createEtcdWatcherFromConfig(c, logger),
  moriio: async (c, logger) =>
    (await import("./moriio-proxy.ts")).createMoriioProxyDiscoveryFromConfig(c, logger),
};

/** Builds (does not start) the watcher for `config.kind`. */
export async function createDiscoveryWatcher(
  config: DiscoveryConfig,
  logger: Logger,
): Promise<DiscoveryWatcher> {
  const factory = discoveryBackends[config.kind];
  if (!factory) {
    throw new Error(
      `unknown discovery backend '${config.kind}' (known: ${Object.keys(discoveryBackends).join(", ")})`,
    );
  }
  return factory(config, logger);
}

export { MemoryDiscovery } from "./memory.ts";
export { StaticDiscovery } from "./static.ts";
