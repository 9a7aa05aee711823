/**
 * Static discovery: a fixed list of workers from `--worker URL` flags and/or a workers file
 * (JSON or YAML list of partial worker records). A worker given by URL only is asked for
 * its `/v1/models` to learn its model and served names; one that does not answer yet is
 * retried in the background and joins the live set once it does.
 */
import { readFile } from "node:fs/promises";
import { request } from "undici";
import { parse as parseYaml } from "yaml";
import { createLogger, type Logger } from "../util/log.ts";
import { MemoryDiscovery } from "./memory.ts";
import type { DiscoveryEvent, DiscoveryWatcher, EngineKind, WorkerRecord, WorkerRole } from "./types.ts";

export type PartialWorkerRecord = Partial<WorkerRecord> & { url: string };

export interface StaticDiscoveryOptions {
  /** Base URLs (role mixed; model learned from `/v1/models`). */
  urls?: readonly string[];
  /** Path of a JSON/YAML file holding a list of partial worker records. */
  workersFile?: string;
  /** Partial records given directly (programmatic use). */
  records?: readonly PartialWorkerRecord[];
  /** Delay between attempts to reach a worker that has not answered `/v1/models` yet. */
  retryMs?: number;
  logger?: Logger;
}

const ENGINES = new Set<EngineKind>(["vllm", "sglang", "atom", "sim"]);
const ROLES = new Set<WorkerRole>(["mixed", "prefill", "decode"]);

function isHttpUrl(url: string): boolean {
  try {
    const u = new URL(url);
    return u.protocol === "http:" || u.protocol === "https:";
  } catch {
    return false;
  }
}

function normaliseUrl(url: string): string {
  const u = new URL(url);
  return `${u.protocol}//${u.host}${u.pathname.replace(/\/+$/, "").replace(/\/v1$/, "")}`;
}

/** Fills every field a partial record leaves out with a neutral default. */
export function completeRecord(p: PartialWorkerRecord, learned: Partial<WorkerRecord> = {}): WorkerRecord {
  const url = normaliseUrl(p.url);
  const model = p.model ?? learned.model ?? p.servedModelNames?.[0] ?? "unknown";
  const served = p.servedModelNames ?? learned.servedModelNames ?? [model];
  const engine = p.engine && ENGINES.has(p.engine) ? p.engine : (learned.engine ?? "vllm");
  const role = p.role && ROLES.has(p.role) ? p.role : "mixed";
  return {
    ...p,
    id: p.id ?? `${role}@${new URL(url).host}`,
    model,
    servedModelNames: served,
    engine,
    role,
    url,
    connector: p.connector ?? { kind: "none" },
    blockSize: p.blockSize ?? 16,
    dpSize: p.dpSize ?? 1,
    tpSize: p.tpSize ?? 1,
    maxModelLen: p.maxModelLen ?? learned.maxModelLen ?? 0,
    startedAt: p.startedAt ?? new Date().toISOString(),
  };
}

interface ModelsResponse {
  data?: Array<{ id?: unknown; root?: unknown; max_model_len?: unknown; owned_by?: unknown }>;
}

/** Asks a worker's `/v1/models` which model it serves and under which names. */
export async function probeModels(url: string, timeoutMs = 2000): Promise<Partial<WorkerRecord>> {
  const res = await request(`${normaliseUrl(url)}/v1/models`, {
    method: "GET",
    headersTimeout: timeoutMs,
    bodyTimeout: timeoutMs,
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (res.statusCode !== 200) {
    await res.body.dump();
    throw new Error(`GET /v1/models answered ${res.statusCode}`);
  }
  const body = (await res.body.json()) as ModelsResponse;
  const names: string[] = [];
  let model: string | undefined;
  let maxModelLen: number | undefined;
  let engine: EngineKind | undefined;
  for (const m of body.data ?? []) {
    if (typeof m.id === "string") names.push(m.id);
    if (model === undefined && typeof m.root === "string") model = m.root;
    if (maxModelLen === undefined && typeof m.max_model_len === "number") maxModelLen = m.max_model_len;
    if (engine === undefined && typeof m.owned_by === "string" && ENGINES.has(m.owned_by as EngineKind)) {
      engine = m.owned_by as EngineKind;
    }
  }
  if (names.length === 0) throw new Error("GET /v1/models listed no model");
  return { model: model ?? names[0], servedModelNames: names, maxModelLen, engine };
}

/**
 * Reads a workers file: a JSON or YAML list (or `{workers: [...]}`) of partial records. A file
 * that is not such a list throws; an entry without a string `url` is skipped with a warning
 * naming it (`<path>[i]`), like any other invalid record, and the rest are served.
 */
export async function readWorkersFile(path: string, log?: Logger): Promise<PartialWorkerRecord[]> {
  const text = await readFile(path, "utf8");
  const doc: unknown = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  const list = Array.isArray(doc) ? doc : (doc as { workers?: unknown } | null)?.workers;
  if (!Array.isArray(list)) throw new Error(`${path}: expected a list of workers`);
  const out: PartialWorkerRecord[] = [];
  list.forEach((item, i) => {
    if (!item || typeof item !== "object" || typeof (item as { url?: unknown }).url !== "string") {
      log?.warn({ key: `${path}[${i}]`, error: "url: must be a string" }, "ignoring invalid worker record");
      return;
    }
    out.push(item as PartialWorkerRecord);
  });
  return out;
}

export class StaticDiscovery implements DiscoveryWatcher {
  private readonly opts: StaticDiscoveryOptions;
  private readonly store: MemoryDiscovery;
  private readonly log: Logger;
  private readonly timers = new Set<NodeJS.Timeout>();
  private closed = false;

  constructor(opts: StaticDiscoveryOptions) {
    this.opts = opts;
    this.log = opts.logger ?? createLogger("discovery-static");
    this.store = new MemoryDiscovery([], this.log);
  }

  /**
   * Completes and stores a record; the schema check is MemoryDiscovery's (schema.ts). A
   * record that cannot even be completed (url not a URL) is skipped with one warning too.
   */
  private put(p: PartialWorkerRecord, learned?: Partial<WorkerRecord>): void {
    let rec: WorkerRecord;
    try {
      rec = completeRecord(p, learned);
    } catch (err) {
      this.log.warn({ key: p.id ?? p.url, error: (err as Error).message }, "ignoring invalid worker record");
      return;
    }
    this.store.put(rec);
  }

  async start(): Promise<void> {
    const partials: PartialWorkerRecord[] = [...(this.opts.records ?? [])];
    for (const url of this.opts.urls ?? []) partials.push({ url });
    if (this.opts.workersFile) partials.push(...(await readWorkersFile(this.opts.workersFile, this.log)));
    // A record that already names its model needs no probe; the others are probed once
    // here (so the first list is as complete as the fleet allows) and retried after.
    await Promise.all(partials.map((p) => this.admit(p)));
  }

  private async admit(p: PartialWorkerRecord): Promise<void> {
    if (this.closed) return;
    if (p.model && p.servedModelNames) {
      this.put(p);
      return;
    }
    let learned: Partial<WorkerRecord>;
    try {
      learned = await probeModels(p.url);
    } catch (err) {
      if (!isHttpUrl(p.url)) {
        // Retrying cannot make it reachable.
        this.put(p);
        return;
      }
      this.log.warn({ url: p.url, err: (err as Error).message }, "worker not reachable yet; retrying");
      const t = setTimeout(() => {
        this.timers.delete(t);
        void this.admit(p);
      }, this.opts.retryMs ?? 2000);
      t.unref();
      this.timers.add(t);
      return;
    }
    this.put(p, learned);
  }

  workers(): readonly WorkerRecord[] {
    return this.store.workers();
  }

  onChange(listener: (ev: DiscoveryEvent) => void): () => void {
    return this.store.onChange(listener);
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    await this.store.close();
  }
}
