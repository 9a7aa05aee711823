/**
 * AutoRouter: one ModelRouter per served model name. A model whose live workers include
 * both prefill and decode roles gets the DisaggRouter (when a factory is plugged in), every
 * other model the MixedRouter. The choice is re-made whenever the model's membership changes;
 * the policy instance of a model lives as long as the AutoRouter (its state survives). In
 * auto mode a model with PD workers and mixed workers routes disaggregated only while an
 * available PD pair exists, else on its mixed workers (./pd-or-mixed.ts).
 */

import type { PrefixIndex } from "../kv/prefix-index.ts";
import { InferaError, ModelNotFoundError, NoWorkerError } from "../protocol/errors.ts";
import type { Logger } from "../util/log.ts";
import { MixedRouter, type RouterObserver } from "./mixed.ts";
import { mixedCandidates, PdOrMixedRouter } from "./pd-or-mixed.ts";
import type { PeerRouting } from "./peers/types.ts";
import type { Scheduling } from "./pipeline/build.ts";
import type { DecisionLog } from "./pipeline/decisions.ts";
import type { TtftPredictor } from "./predict/ttft.ts";
import type { DisaggRouterFactory, DisaggSettings, ModelRouter, RoutingPolicy } from "./types.ts";
import type { LiveWorker, WorkerSet } from "./worker-set.ts";

export type RouterMode = "auto" | "mixed" | "disagg";

export interface AutoRouterOptions {
  workers: WorkerSet;
  /**
   * The scheduling built from the config's policy, policyOptions and profiles by
   * `buildScheduling` (./pipeline/build.ts; the server builds it first, to start what its
   * needs say): each model's Scheduler comes from it.
   */
  scheduling: Scheduling;
  mode?: RouterMode;
  disaggFactory?: DisaggRouterFactory;
  /** The server config's `disagg` section, handed to the DisaggRouter factory. */
  disagg?: DisaggSettings;
  maxRetries?: number;
  logger: Logger;
  /** Where each decision is explained (the server's /debug/decisions ring). */
  decisions?: DecisionLog;
  /** The server's TTFT predictor (src/router/predict), shared by every model's scheduler. */
  ttft?: TtftPredictor;
  /** The KV prefix index of a model, when the server ingests KV events (needs `kvIndex`). */
  kvIndexFor?: (model: string) => PrefixIndex | undefined;
  /** Peer replicas' routed prefixes for a model (src/router/peers), when shared. */
  peersFor?: (model: string) => PeerRouting | undefined;
  observer?: RouterObserver;
  /**
   * A model whose last worker left less than this long ago is answered 503 no_worker_available
   * with Retry-After (clients retry; its workers are likely restarting) instead of 404
   * model_not_found (SDKs never retry it). 0 or absent: off.
   */
  modelGoneRetryMs?: number;
}

/** Retry-After for a model whose workers are gone for now. */
const GONE_RETRY_AFTER_S = 2;
/** Bound on remembered vanished model names (discovery records name them, not clients). */
const MAX_GONE = 10_000;

interface Entry {
  generation: number;
  router: ModelRouter;
}

export class AutoRouter {
  private readonly o: AutoRouterOptions;
  private readonly entries = new Map<string, Entry>();
  private readonly modelPolicies = new Map<string, RoutingPolicy>();
  private readonly mode: RouterMode;
  private readonly unsubscribe: () => void;
  readonly scheduling: Scheduling;
  /** Model names whose last worker left, and when. */
  private readonly gone = new Map<string, number>();

  constructor(o: AutoRouterOptions) {
    this.o = o;
    this.scheduling = o.scheduling;
    this.mode = o.mode ?? "auto";
    if (this.mode === "disagg" && !o.disaggFactory) {
      throw new Error("--router disagg needs a DisaggRouter, and none is built into this server");
    }
    this.unsubscribe = o.workers.onChange((ev) => {
      if (ev.type !== "removed") return;
      for (const p of this.modelPolicies.values()) p.onWorkerRemoved?.(ev.worker.id);
      if (!o.modelGoneRetryMs) return;
      for (const name of ev.worker.record.servedModelNames)
        if (!o.workers.group(name)) this.rememberGone(name);
    });
  }

  /** The router for a model; throws ModelNotFoundError when no live worker serves it. */
  routerFor(model: string): ModelRouter {
    const group = this.o.workers.group(model);
    if (!group) {
      const at = this.gone.get(model);
      if (at !== undefined && Date.now() - at <= (this.o.modelGoneRetryMs ?? 0))
        throw new NoWorkerError(model, GONE_RETRY_AFTER_S);
      throw new ModelNotFoundError(model);
    }
    const e = this.entries.get(model);
    if (e && e.generation === group.generation) return e.router;
    const router = this.build(model);
    this.entries.set(model, { generation: group.generation, router });
    return router;
  }

  private rememberGone(name: string): void {
    this.gone.delete(name);
    this.gone.set(name, Date.now());
    // Oldest first (Map order): drop what is past the window, and the oldest past the bound.
    const window = this.o.modelGoneRetryMs ?? 0;
    for (const [n, at] of this.gone) {
      if (this.gone.size <= MAX_GONE && Date.now() - at <= window) break;
      this.gone.delete(n);
    }
  }

  /** Whether a live worker serves the model name. */
  knows(model: string): boolean {
    return this.o.workers.group(model) !== undefined;
  }

  /** Which kind of router a model gets now (for /v1/workers and tests). */
  kindFor(model: string): "mixed" | "disagg" | null {
    try {
      return this.routerFor(model).kind;
    } catch {
      return null;
    }
  }

  close(): void {
    this.unsubscribe();
    for (const p of this.modelPolicies.values()) p.close?.();
    this.modelPolicies.clear();
    this.entries.clear();
  }

  /** Per model, its policy's pending-bridge counters (models whose policy has a bridge). */
  bridgeCounters(): [model: string, counters: Readonly<Record<string, number>>][] {
    const out: [string, Readonly<Record<string, number>>][] = [];
    for (const [model, p] of this.modelPolicies) {
      const c = p.bridgeCounters?.();
      if (c) out.push([model, c]);
    }
    return out;
  }

  policyFor(model: string): RoutingPolicy {
    let p = this.modelPolicies.get(model);
    if (!p) {
      p = this.scheduling.create({
        model,
        logger: this.o.logger.child({ model, policy: this.scheduling.policy }),
        kvIndex: this.o.kvIndexFor?.(model),
        peers: this.o.peersFor?.(model),
        decisions: this.o.decisions,
        ttft: this.o.ttft,
      });
      this.modelPolicies.set(model, p);
    }
    return p;
  }

  private build(model: string): ModelRouter {
    const ws = this.o.workers;
    const policy = this.policyFor(model);
    const all = ws.group(model)?.all ?? [];
    const hasPd = all.some((w) => w.record.role === "prefill") && all.some((w) => w.record.role === "decode");
    const factory = this.o.disaggFactory;
    if (factory && (this.mode === "disagg" || (this.mode === "auto" && hasPd))) {
      this.o.logger.info({ model }, "model routed disaggregated");
      const disagg = factory({
        model,
        prefillWorkers: () => ws.group(model)?.availableByRole.prefill ?? [],
        decodeWorkers: () => ws.group(model)?.availableByRole.decode ?? [],
        policy,
        logger: this.o.logger.child({ model, router: "disagg" }),
        options: this.scheduling.options,
        trackPrefill: this.scheduling.trackPrefill,
        disagg: this.o.disagg,
        reportFailure: (w, kind) => ws.reportFailure(w as LiveWorker, kind),
        reportSuccess: (w) => ws.reportSuccess(w as LiveWorker),
      });
      if (this.mode === "disagg") return disagg;
      // Auto: PD only while a healthy pair exists, the mixed workers otherwise (issue #17).
      return new PdOrMixedRouter(() => ws.group(model), disagg, this.mixed(model, policy));
    }
    if (this.mode === "disagg") throw new InferaError(500, "disaggregated routing is not available");
    return this.mixed(model, policy);
  }

  private mixed(model: string, policy: RoutingPolicy): MixedRouter {
    const ws = this.o.workers;
    return new MixedRouter({
      model,
      // Mixed workers first; a model with only P/D workers (and no DisaggRouter) still
      // gets answers from them, since such engines also serve plain requests.
      candidates: () => mixedCandidates(ws.group(model)),
      policy,
      workers: ws,
      maxRetries: this.o.maxRetries ?? 2,
      trackPrefill: this.scheduling.trackPrefill,
      logger: this.o.logger.child({ model, router: "mixed" }),
      observer: this.o.observer,
    });
  }
}
