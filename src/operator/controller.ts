/**
 * The operator loop: list + watch InferaClusters, and reconcile each one (serially per cluster)
 * on every change and every resync period, since the children's readiness (status) changes
 * without the custom resource changing. A failed pass is retried with backoff; a closed or
 * expired watch is re-listed and re-opened.
 */
import type { ClusterPolicy } from "../deploy/policy.ts";
import type { Logger } from "../util/log.ts";
import type { ClusterApi } from "./kube-api.ts";
import {
  type Action,
  type ClusterStatus,
  type InferaClusterResource,
  type ObjectLike,
  reconcile,
} from "./reconcile.ts";

export interface ControllerOptions {
  api: ClusterApi;
  logger: Logger;
  /** Watch one namespace; all when absent. */
  namespace?: string;
  /** The installer's allowlists, checked on every pass. */
  policy?: ClusterPolicy;
  resyncMs?: number;
  retryMs?: number;
}

const keyOf = (c: InferaClusterResource) => `${c.metadata.namespace ?? "default"}/${c.metadata.name}`;

export class Controller {
  private readonly o: ControllerOptions;
  private readonly clusters = new Map<string, InferaClusterResource>();
  private readonly queued = new Set<string>();
  private readonly running = new Map<string, Promise<void>>();
  /**
   * The status this operator last wrote per cluster. Only the operator writes status, so this is
   * newer than any cached copy: a watch event still in flight must not make a pass write it again.
   */
  private readonly written = new Map<string, ClusterStatus>();
  /** Create-only objects (Secrets) this process saw exist, per `ns/apiVersion/kind/name`. */
  private readonly seen = new Set<string>();
  private watch?: { abort(): void };
  private resync?: NodeJS.Timeout;
  private stopped = false;
  /** Passes completed (for tests and logs). */
  passes = 0;

  constructor(o: ControllerOptions) {
    this.o = o;
  }

  async start(): Promise<void> {
    await this.listAndWatch();
    this.resync = setInterval(() => {
      for (const k of this.clusters.keys()) this.enqueue(k);
    }, this.o.resyncMs ?? 30_000);
    this.resync.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.resync);
    this.watch?.abort();
    await Promise.allSettled([...this.running.values()]);
  }

  private async listAndWatch(): Promise<void> {
    const { items, resourceVersion } = await this.o.api.listClusters(this.o.namespace);
    this.clusters.clear();
    for (const c of items) {
      this.clusters.set(keyOf(c), c);
      this.enqueue(keyOf(c));
    }
    this.watch = await this.o.api.watchClusters(
      this.o.namespace,
      resourceVersion,
      (phase, obj) => {
        if (phase === "BOOKMARK" || phase === "ERROR") return;
        const key = keyOf(obj);
        if (phase === "DELETED") {
          this.clusters.delete(key);
          this.written.delete(key);
        } else {
          this.clusters.set(key, obj);
          this.enqueue(key);
        }
      },
      (err) => {
        if (this.stopped) return;
        if (err) this.o.logger.warn({ err: String(err) }, "watch ended; re-listing");
        setTimeout(() => {
          if (!this.stopped)
            this.listAndWatch().catch((e) => this.o.logger.error({ err: String(e) }, "re-list failed"));
        }, this.o.retryMs ?? 1000).unref();
      },
    );
  }

  /** Serial per cluster: a key changed during a pass runs once more after it. */
  private enqueue(key: string): void {
    if (this.stopped) return;
    if (this.running.has(key)) {
      this.queued.add(key);
      return;
    }
    const p = this.pass(key).finally(() => {
      this.running.delete(key);
      if (this.queued.delete(key)) this.enqueue(key);
    });
    this.running.set(key, p);
  }

  private async pass(key: string): Promise<void> {
    const cached = this.clusters.get(key);
    if (!cached) return;
    const last = this.written.get(key);
    const cr = last ? { ...cached, status: last } : cached;
    const ns = cr.metadata.namespace ?? "default";
    try {
      const observed = await this.o.api.listOwned(ns, cr.metadata.name);
      const actions = reconcile(cr, observed, {
        now: new Date(),
        unserved: this.o.api.skipped,
        policy: this.o.policy,
      });
      await this.execute(ns, key, cr, actions);
      this.passes++;
      for (const a of actions) {
        const refused = a.type === "status" && a.status.conditions.find((c) => c.reason === "PolicyRefused");
        if (refused) this.o.logger.warn({ cluster: key, refused: refused.message }, "spec refused by policy");
      }
      if (actions.length > 0) this.o.logger.info({ cluster: key, actions: actions.length }, "reconciled");
    } catch (err) {
      this.o.logger.warn({ cluster: key, err: String(err) }, "reconcile failed; retrying");
      setTimeout(() => this.enqueue(key), this.o.retryMs ?? 1000).unref();
    }
  }

  /**
   * A generated Secret is POSTed on every pass (the operator may not read one): 201 after this
   * process saw it exist means someone deleted it and it was made again, with new values.
   */
  private createOnly(ns: string, cluster: string, o: ObjectLike, r: "created" | "exists"): void {
    const id = `${ns}/${o.apiVersion}/${o.kind}/${o.metadata.name}`;
    if (r === "created" && this.seen.has(id))
      this.o.logger.warn(
        { cluster, secret: o.metadata.name },
        "generated Secret was deleted; created again with new values (pods started before keep the old ones until they restart)",
      );
    this.seen.add(id);
  }

  private async execute(
    ns: string,
    key: string,
    cr: InferaClusterResource,
    actions: Action[],
  ): Promise<void> {
    for (const a of actions) {
      if (a.type === "apply") {
        const r = await this.o.api.apply(a.object);
        if (r === "created" || r === "exists") this.createOnly(ns, key, a.object, r);
      } else if (a.type === "delete") await this.o.api.delete(a);
      else {
        await this.o.api.patchStatus(ns, cr.metadata.name, a.status);
        this.written.set(key, a.status);
      }
    }
  }
}
