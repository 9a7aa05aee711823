/**
 * How `infera engine` runs the NATS planes beside its engine: a DiscoveryRegistrar wrapper that,
 * before the worker's record is first registered, connects to NATS, starts the request agent
 * (and puts its subject in the record's `natsSubject`) and/or the KV-event relay, and stops
 * them when the launcher closes. Registration waits for NATS: a worker whose request plane
 * cannot be reached is not advertised (the launcher's register loop retries).
 */
import type { NatsConnection } from "@nats-io/transport-node";
import type { DiscoveryRegistrar, WorkerRecord } from "../../discovery/types.ts";
import type { Logger } from "../../util/log.ts";
import { type NatsRequestAgent, startRequestAgent } from "./agent.ts";
import type { TransportSettings } from "./cli-options.ts";
import { connectNats } from "./connection.ts";
import { type NatsKvRelay, startKvRelay } from "./kv-relay.ts";

export interface NatsWorkerOptions {
  settings: TransportSettings;
  /** Where the agent reaches its engine (local address, e.g. http://127.0.0.1:8000). */
  engineUrl: string;
  logger: Logger;
}

export class NatsWorkerRegistrar implements DiscoveryRegistrar {
  private readonly inner: DiscoveryRegistrar | null;
  private readonly o: NatsWorkerOptions;
  private nc?: NatsConnection;
  agent?: NatsRequestAgent;
  relay?: NatsKvRelay;
  private starting?: Promise<void>;
  /** The record last registered, so an epoch change can announce itself. */
  private last?: WorkerRecord;

  constructor(inner: DiscoveryRegistrar | null, o: NatsWorkerOptions) {
    this.inner = inner;
    this.o = o;
  }

  private async startPlanes(rec: WorkerRecord): Promise<void> {
    const { settings, logger } = this.o;
    if (!settings.nats) return;
    this.nc ??= await connectNats({ ...settings.nats, name: settings.nats.name ?? rec.id, logger });
    if (settings.requestPlane === "nats" && !this.agent) {
      this.agent = await startRequestAgent({
        nc: this.nc,
        engineUrl: this.o.engineUrl,
        model: rec.model,
        workerId: rec.id,
        logger: logger.child({ plane: "nats-req" }),
      });
      logger.info({ subject: this.agent.subject }, "nats request agent ready");
    }
    if (settings.eventPlane === "nats" && rec.kvEvents && !this.relay) {
      this.relay = await startKvRelay({
        nc: this.nc,
        model: rec.model,
        workerId: rec.id,
        events: rec.kvEvents,
        logger: logger.child({ plane: "nats-kv" }),
        // The engine restarted under this agent: announce the new epoch, which is what makes
        // servers drop the worker's old blocks (a bare seq 0 on the subject is refused).
        onEpochChange: () => {
          if (this.last)
            this.register(this.last).catch((err: Error) =>
              logger.warn({ err: err.message }, "re-registering with a new kv epoch failed"),
            );
        },
      });
      logger.info({ subject: this.relay.subject }, "nats kv relay ready");
    }
  }

  async register(record: WorkerRecord): Promise<void> {
    // Idempotent per piece: a re-registration (after an unhealthy spell or a failed start) only
    // starts what is not running yet.
    this.starting ??= this.startPlanes(record).finally(() => {
      this.starting = undefined;
    });
    await this.starting;
    this.last = record;
    const rec: WorkerRecord = { ...record };
    if (this.agent) rec.natsSubject = this.agent.subject;
    if (this.relay) rec.natsKvEpoch = this.relay.epoch;
    await this.inner?.register(rec);
  }

  async deregister(): Promise<void> {
    await this.inner?.deregister();
  }

  async close(): Promise<void> {
    await this.inner?.close().catch(() => {});
    await this.agent?.close().catch(() => {});
    await this.relay?.close().catch(() => {});
    await this.nc?.close().catch(() => {});
  }
}

/** The launcher's registrar, wrapped when a NATS plane is on; unchanged (possibly null) otherwise. */
export function withNatsPlanes(
  inner: DiscoveryRegistrar | null,
  o: NatsWorkerOptions,
): DiscoveryRegistrar | null {
  if (!o.settings.nats || (o.settings.requestPlane !== "nats" && o.settings.eventPlane !== "nats"))
    return inner;
  return new NatsWorkerRegistrar(inner, o);
}
