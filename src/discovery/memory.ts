/**
 * In-process discovery: a map of worker records that the embedding program (`infera up`,
 * tests) fills directly. Implements both sides (watcher and a registrar per worker).
 * Every record passes the same schema as etcd's (schema.ts); an invalid one is skipped with
 * a warning and the set keeps serving the others.
 */
import { createLogger, type Logger } from "../util/log.ts";
import { validateWorkerRecord } from "./schema.ts";
import type { DiscoveryEvent, DiscoveryRegistrar, DiscoveryWatcher, WorkerRecord } from "./types.ts";

export class MemoryDiscovery implements DiscoveryWatcher {
  private readonly records = new Map<string, WorkerRecord>();
  private readonly listeners = new Set<(ev: DiscoveryEvent) => void>();
  private snapshot: readonly WorkerRecord[] | null = [];
  private readonly log: Logger;

  constructor(initial: readonly WorkerRecord[] = [], logger?: Logger) {
    this.log = logger ?? createLogger("discovery-memory");
    for (const r of initial) {
      const v = this.check(r);
      if (v) this.records.set(v.id, v);
    }
    this.snapshot = null;
  }

  /** The record itself (the caller's object, kept as given), or null (logged) when it fails the schema. */
  private check(worker: WorkerRecord): WorkerRecord | null {
    const v = validateWorkerRecord(worker);
    if (v.ok) return worker;
    const key = typeof worker?.id === "string" ? worker.id : String(worker?.url ?? "?");
    this.log.warn({ key, error: v.error }, "ignoring invalid worker record");
    return null;
  }

  async start(): Promise<void> {}

  workers(): readonly WorkerRecord[] {
    this.snapshot ??= [...this.records.values()];
    return this.snapshot;
  }

  onChange(listener: (ev: DiscoveryEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Adds or replaces a worker (keyed by `id`); returns false (and logs) for an invalid record. */
  put(worker: WorkerRecord): boolean {
    const v = this.check(worker);
    if (!v) return false;
    worker = v;
    this.records.set(worker.id, worker);
    this.snapshot = null;
    this.emit({ type: "put", worker });
    return true;
  }

  /** Removes a worker; returns whether it was present. */
  remove(id: string): boolean {
    if (!this.records.delete(id)) return false;
    this.snapshot = null;
    this.emit({ type: "delete", id });
    return true;
  }

  /** A registrar bound to this store (what a launcher would use with etcd). */
  registrar(): DiscoveryRegistrar {
    let id: string | null = null;
    return {
      register: async (record) => {
        id = record.id;
        this.put(record);
      },
      deregister: async () => {
        if (id !== null) this.remove(id);
        id = null;
      },
      close: async () => {},
    };
  }

  async close(): Promise<void> {
    this.listeners.clear();
  }

  private emit(ev: DiscoveryEvent): void {
    for (const l of this.listeners) {
      try {
        l(ev);
      } catch {
        // A listener's failure must not stop the others from hearing about the change.
      }
    }
  }
}
