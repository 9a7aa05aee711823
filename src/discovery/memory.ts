/**
 * In-process discovery: a map of worker records that the embedding program (`infera up`,
 * tests) fills directly. Implements both sides (watcher and a registrar per worker).
 */
import type { DiscoveryEvent, DiscoveryRegistrar, DiscoveryWatcher, WorkerRecord } from "./types.ts";

export class MemoryDiscovery implements DiscoveryWatcher {
  private readonly records = new Map<string, WorkerRecord>();
  private readonly listeners = new Set<(ev: DiscoveryEvent) => void>();
  private snapshot: readonly WorkerRecord[] | null = [];

  constructor(initial: readonly WorkerRecord[] = []) {
    for (const r of initial) this.records.set(r.id, r);
    this.snapshot = null;
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

  /** Adds or replaces a worker (keyed by `id`). */
  put(worker: WorkerRecord): void {
    this.records.set(worker.id, worker);
    this.snapshot = null;
    this.emit({ type: "put", worker });
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
