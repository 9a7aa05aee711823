/**
 * vLLM MooncakeConnector, concurrent, D pulls via P's bootstrap
 * (docs/engine-protocols.md#pd-mooncake).
 * Everything below follows vllm-project/vllm
 * vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py
 * @ 00f4240ee6458263d76cf51ca7901ce1350bb4d1 and mooncake_utils.py @ e7ad92e5308e67c9657fc06f351ff4326848f130:
 *
 * - P (kv_producer) serves the bootstrap server (`VLLM_MOONCAKE_BOOTSTRAP_PORT`, default 8998;
 *   the sim also reads `kv_connector_extra_config.bootstrap_port`, 0 = free port): FastAPI
 *   `POST /register` (`{engine_id, dp_rank, tp_rank, pp_rank, addr}`) and `GET /query`
 *   answering `dict[dp_rank, {engine_id, worker_addr: {tp_rank: {pp_rank: addr}}}]`. With
 *   `bootstrap_server_address` in the extra config a worker registers with that server instead
 *   of starting its own (`should_launch_bootstrap_server`).
 * - Each DP rank is its own engine: with `--data-parallel-size` > 1 the engine id carries
 *   `_dp<rank>` (vLLM's DP engine core suffixes `kv_transfer_config.engine_id`).
 * - P answers no `kv_transfer_params` (`request_finished` returns `(delay, None)`). A P request
 *   without `transfer_id` is not an error: P logs "Missing transfer_id in kv_transfer_params
 *   from router!" and frees the blocks at once (`update_state_after_alloc`, `request_finished`).
 * - D needs `remote_engine_id`, `remote_bootstrap_addr` and `transfer_id`; without them vLLM
 *   logs "Got invalid KVTransferParams" and never loads the KV, so the request waits: the sim
 *   gives up after its pull timeout (504). D looks `remote_engine_id` up among `/query`'s
 *   entries (`_connect_to_prefiller_bootstrap`); an engine not listed fails the load
 *   ("remote engine_id … not found from bootstrap server …"), and a transfer the named engine
 *   never prefilled fails when P's wait for it runs out.
 */
import { TimeoutError, UpstreamError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { JsonHttpServer, reply } from "./bootstrap-server.ts";
import { configNumber, configString, paramString } from "./config.ts";
import { abortableSleep, sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

/** One DP rank's entry in the bootstrap server's `/query` answer. */
export interface MooncakeEngineEntry {
  engine_id: string;
  /** `{tp_rank: {pp_rank: "tcp://host:port"}}` */
  worker_addr: Record<string, Record<string, string>>;
}

interface RegisterPayload {
  engine_id: string;
  dp_rank: number;
  tp_rank: number;
  pp_rank: number;
  addr: string;
}

function isRegisterPayload(v: unknown): v is RegisterPayload {
  if (!v || typeof v !== "object") return false;
  const o = v as Record<string, unknown>;
  return (
    typeof o.engine_id === "string" &&
    Number.isInteger(o.dp_rank) &&
    Number.isInteger(o.tp_rank) &&
    Number.isInteger(o.pp_rank) &&
    typeof o.addr === "string"
  );
}

/** vLLM's bootstrap table (`MooncakeBootstrapServer.workers`). */
export class MooncakeBootstrapTable {
  readonly workers = new Map<number, MooncakeEngineEntry>();

  /** `register_worker`: null on success, else the 400 detail vLLM answers. */
  register(p: RegisterPayload): string | null {
    let entry = this.workers.get(p.dp_rank);
    if (!entry) {
      entry = { engine_id: p.engine_id, worker_addr: {} };
      this.workers.set(p.dp_rank, entry);
    }
    if (entry.engine_id !== p.engine_id) {
      return `Engine ID mismatch for dp_rank=${p.dp_rank}: expected ${entry.engine_id}, got ${p.engine_id}`;
    }
    entry.worker_addr[String(p.tp_rank)] ??= {};
    const tp = entry.worker_addr[String(p.tp_rank)];
    const prev = tp[String(p.pp_rank)];
    if (prev !== undefined) {
      return `Worker with dp_rank=${p.dp_rank}, tp_rank=${p.tp_rank}, pp_rank=${p.pp_rank} is already registered at ${prev}, but still want to register at ${p.addr}`;
    }
    tp[String(p.pp_rank)] = p.addr;
    return null;
  }

  query(): Record<string, MooncakeEngineEntry> {
    return Object.fromEntries([...this.workers].map(([k, v]) => [String(k), v]));
  }
}

function parseTcpAddr(addr: string): { host: string; port: number } | null {
  const m = /^(?:tcp:\/\/)?\[?([^\]]+?)\]?:(\d+)$/.exec(addr);
  return m ? { host: m[1], port: Number(m[2]) } : null;
}

export class MooncakeSimConnector extends SideChannelConnector {
  readonly kind = "mooncake" as const;
  private bootstrap: JsonHttpServer | null = null;
  private readonly table = new MooncakeBootstrapTable();

  /** The engine id D must name in `remote_engine_id`. */
  get engineId(): string {
    return this.host.dpSize > 1 ? `${this.host.engineId}_dp${this.host.dpRank}` : this.host.engineId;
  }

  async start(): Promise<void> {
    if (this.opts.role !== "prefill") return;
    await this.channel.listen(configNumber(this.opts, ["side_channel_port"], [], 0), this.bindHost);
    const regs: RegisterPayload[] = [];
    for (let tp = 0; tp < this.host.tpSize; tp++) {
      regs.push({
        engine_id: this.engineId,
        dp_rank: this.host.dpRank,
        tp_rank: tp,
        pp_rank: 0,
        addr: `tcp://${this.advertisedHost}:${this.channel.port}`,
      });
    }
    const external = configString(this.opts, ["bootstrap_server_address"], []);
    if (external) {
      for (const r of regs) await this.registerWith(external, r);
    } else {
      for (const r of regs) this.table.register(r);
      this.bootstrap = new JsonHttpServer({
        "GET /query": () => this.table.query(),
        "POST /register": (body) => {
          if (!isRegisterPayload(body)) return reply(422, { detail: "invalid RegisterWorkerPayload" });
          const err = this.table.register(body);
          return err ? reply(400, { detail: err }) : { status: "ok" };
        },
      });
      await this.bootstrap.listen(
        configNumber(this.opts, ["bootstrap_port"], ["VLLM_MOONCAKE_BOOTSTRAP_PORT"], 8998),
        this.bindHost,
      );
    }
    this.started = true;
  }

  private async registerWith(address: string, payload: RegisterPayload): Promise<void> {
    const url = `${address.startsWith("http") ? address : `http://${address}`}/register`;
    const res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(payload),
    });
    if (!res.ok) {
      throw new Error(`Failed to register with the Mooncake bootstrap server at ${url}: ${await res.text()}`);
    }
  }

  override async close(): Promise<void> {
    await this.bootstrap?.close();
    await super.close();
  }

  describe(): SimConnectorDescription {
    return { kind: this.kind, bootstrapHost: this.advertisedHost, bootstrapPort: this.bootstrap?.port };
  }

  async onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<null> {
    const transferId = paramString(req.params, "transfer_id");
    if (!transferId) {
      // vLLM only warns; the blocks are freed at once and nobody can pull them.
      this.log.warn({ requestId: req.requestId }, "Missing transfer_id in kv_transfer_params from router!");
      this.host.releaseHeld(held.requestId);
      return null;
    }
    this.channel.offer(transferId, held);
    return null;
  }

  async pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv> {
    const p = req.params;
    const transferId = paramString(p, "transfer_id");
    const engineId = paramString(p, "remote_engine_id");
    const bootstrapAddr = paramString(p, "remote_bootstrap_addr");
    if (!transferId || !engineId || !bootstrapAddr) {
      this.log.warn({ params: p }, "Got invalid KVTransferParams. This request will not utilize KVTransfer");
      await abortableSleep(this.settings.pullTimeoutMs, signal);
      throw new TimeoutError(
        `KV for request ${req.requestId} never arrived: kv_transfer_params lacks remote_engine_id, remote_bootstrap_addr or transfer_id`,
      );
    }
    const bootstrap = bootstrapAddr.replace(/\/+$/, "");
    let answer: Record<string, MooncakeEngineEntry>;
    try {
      const res = await fetch(`${bootstrap}/query`, {
        // The bootstrap lookup has its own bound: a short pull timeout (tests use 400 ms) must
        // not turn a slow but live bootstrap server into a connect failure on a busy host.
        signal: AbortSignal.any([signal, AbortSignal.timeout(Math.max(this.settings.pullTimeoutMs, 10_000))]),
      });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      answer = (await res.json()) as Record<string, MooncakeEngineEntry>;
    } catch (err) {
      if (signal.aborted) throw signal.reason ?? err;
      const msg =
        err instanceof Error ? (err.cause instanceof Error ? err.cause.message : err.message) : String(err);
      throw new UpstreamError(
        `Failed to connect to bootstrap server ${bootstrap}: ${msg}`,
        502,
        "kv_transfer_failed",
      );
    }
    const entry = Object.values(answer ?? {}).find((e) => e?.engine_id === engineId);
    const addr = entry ? parseTcpAddr(entry.worker_addr?.["0"]?.["0"] ?? "") : null;
    if (!addr) {
      throw new UpstreamError(
        `remote engine_id ${engineId} not found from bootstrap server ${bootstrap}`,
        502,
        "kv_transfer_failed",
      );
    }
    return this.pull(sideChannelUrl(addr.host, addr.port, transferId), req, {
      signal,
      waitMs: this.settings.pullTimeoutMs,
    });
  }
}
