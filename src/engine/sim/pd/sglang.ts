/**
 * SGLang bootstrap disaggregation, concurrent with identical bodies
 * (docs/engine-protocols.md#pd-sglang).
 * The router adds `bootstrap_host`, `bootstrap_port`, `bootstrap_room` at the top level of the
 * body and sends it to P and D at once. P serves the bootstrap server on
 * `--disaggregation-bootstrap-port` (read from the kv-transfer config's `bootstrap_port` /
 * `disaggregation_bootstrap_port`, env `SGLANG_DISAGGREGATION_BOOTSTRAP_PORT`, default 8998).
 *
 * The bootstrap server is SGLang's `CommonKVBootstrapServer` (sgl-project/sglang
 * python/sglang/srt/disaggregation/common/conn.py @ 0094505da74125a31ceb354f37ae7a1b6a97d3f5):
 * `PUT /route` registers a prefill rank (`attn_tp_size, attn_tp_rank, attn_cp_size,
 * attn_cp_rank, attn_dp_size, attn_dp_rank, pp_size, pp_rank, system_dp_size, system_dp_rank,
 * rank_ip, rank_port, page_size, kv_cache_dtype`, text "OK"); `GET /route?prefill_dp_rank=
 * &prefill_cp_rank=&target_tp_rank=&target_pp_rank=` answers the rank's `{rank_ip, rank_port}`
 * (404 text when unknown), all four -1 the `PrefillServerInfo`, 400 "Missing inputs for
 * bootstrap server." when one is missing, 503 until every rank registered; other methods 405;
 * `POST /register_dp_rank {bootstrap_room, dp_rank}` → "OK"; `POST /query_dp_ranks
 * {bootstrap_rooms}` → `{room: dp_rank}` for the known rooms; `GET /health` → "OK".
 * The sim's P registers its one rank there; its KV side channel is that rank's `rank_port`.
 * D finds the rank through `GET /route` (the room's DP rank is `room % dp_size` under
 * `follow_bootstrap_room`) and pulls the room's KV from it, waiting while P still computes.
 *
 * Batches (a list prompt, or `n` > 1) carry one room per item, normalized as SGLang's
 * `GenerateReqInput._normalize_bootstrap_params` does (python/sglang/srt/managers/io_struct.py):
 * a scalar room becomes `room + i` for i in range(batch × n), a list is repeated `n` times. D
 * waits for every item's room; an item whose room P never offers fails the request (504 at the
 * pull timeout) instead of succeeding. The core moves the KV of the first item; the other
 * items' rooms carry the same held prompt (for `n` > 1, the same prompt).
 */
import { BadRequestError, UpstreamError } from "../../../protocol/errors.ts";
import { SideChannelConnector } from "./base.ts";
import { JsonHttpServer, reply } from "./bootstrap-server.ts";
import { configNumber, paramNumber, paramString } from "./config.ts";
import { sideChannelUrl } from "./pull-client.ts";
import type { HeldKv, PdRequestInfo, PulledKv, SimConnectorDescription } from "./types.ts";

const ROUTE_PUT_KEYS = [
  "attn_tp_size",
  "attn_tp_rank",
  "attn_cp_size",
  "attn_cp_rank",
  "attn_dp_size",
  "attn_dp_rank",
  "pp_size",
  "pp_rank",
  "system_dp_size",
  "system_dp_rank",
  "rank_ip",
  "rank_port",
  "page_size",
  "kv_cache_dtype",
] as const;

interface RankInfo {
  rank_ip: string;
  rank_port: number;
}

/** SGLang's bootstrap tables (`prefill_port_table`, `room_to_dp_rank`). */
export class SglangBootstrapTable {
  private readonly prefillHttpPort: number;
  attnTpSize: number | null = null;
  attnCpSize: number | null = null;
  dpSize: number | null = null;
  ppSize: number | null = null;
  pageSize: number | null = null;
  kvCacheDtype: string | null = null;
  followBootstrapRoom: boolean | null = null;
  registered = 0;
  /** dp → cp → tp → pp → rank */
  readonly ports = new Map<number, Map<number, Map<number, Map<number, RankInfo>>>>();
  readonly roomToDpRank = new Map<string, number>();

  constructor(prefillHttpPort: number) {
    this.prefillHttpPort = prefillHttpPort;
  }

  ready(): boolean {
    if (this.attnTpSize === null || this.attnCpSize === null || this.ppSize === null || this.dpSize === null)
      return false;
    return this.registered >= this.dpSize * this.attnCpSize * this.attnTpSize * this.ppSize;
  }

  /** `_handle_route_put`; a missing key is Python's KeyError → aiohttp's 500. */
  put(data: Record<string, unknown>): string | null {
    for (const k of ROUTE_PUT_KEYS) if (!(k in data)) return k;
    const n = (k: string) => Number(data[k]);
    this.attnTpSize ??= n("attn_tp_size");
    this.attnCpSize ??= n("attn_cp_size");
    this.dpSize ??= n("system_dp_size") === 1 ? n("attn_dp_size") : n("system_dp_size");
    this.ppSize ??= n("pp_size");
    this.pageSize ??= n("page_size");
    this.kvCacheDtype ??= String(data.kv_cache_dtype);
    this.followBootstrapRoom ??=
      (data.load_balance_method ?? "follow_bootstrap_room") === "follow_bootstrap_room";
    const dp = n("system_dp_size") === 1 ? n("attn_dp_rank") : n("system_dp_rank");
    const level = <K, V>(m: Map<K, V>, k: K, make: () => V): V => {
      let v = m.get(k);
      if (v === undefined) {
        v = make();
        m.set(k, v);
      }
      return v;
    };
    const cp = level(this.ports, dp, () => new Map());
    const tp = level(cp, n("attn_cp_rank"), () => new Map());
    const pp = level(tp, n("attn_tp_rank"), () => new Map());
    pp.set(n("pp_rank"), { rank_ip: String(data.rank_ip), rank_port: n("rank_port") });
    this.registered++;
    return null;
  }

  serverInfo(): Record<string, unknown> {
    return {
      attn_tp_size: this.attnTpSize,
      attn_cp_size: this.attnCpSize,
      dp_size: this.dpSize,
      pp_size: this.ppSize,
      page_size: this.pageSize,
      kv_cache_dtype: this.kvCacheDtype,
      follow_bootstrap_room: this.followBootstrapRoom ?? true,
      enable_dsa_cache_layer_split: false,
      prefill_http_port: this.prefillHttpPort,
      target_tp_rank: null,
      target_tp_ranks: null,
      target_cp_ranks: null,
      target_pp_ranks: null,
      required_dst_info_num: null,
      required_prefill_response_num: null,
    };
  }

  rank(dp: number, cp: number, tp: number, pp: number): RankInfo | undefined {
    return this.ports.get(dp)?.get(cp)?.get(tp)?.get(pp);
  }
}

/** Items in an OpenAI body: prompts (a list prompt counts each entry) × n. */
export function batchItems(body: Record<string, unknown>): number {
  const p = body.prompt;
  const prompts =
    Array.isArray(p) && p.length > 0 && (typeof p[0] === "string" || Array.isArray(p[0])) ? p.length : 1;
  const n = typeof body.n === "number" && body.n > 1 ? body.n : 1;
  return prompts * n;
}

/** `_normalize_bootstrap_params` for rooms: scalar → room + i; list → list × n. */
export function normalizeRooms(body: Record<string, unknown>): string[] {
  const num = batchItems(body);
  const room = body.bootstrap_room;
  if (room === undefined || room === null) return [];
  if (Array.isArray(room)) {
    const n = typeof body.n === "number" && body.n > 1 ? body.n : 1;
    const out: string[] = [];
    for (let k = 0; k < n; k++) for (const r of room) out.push(String(asRoom(r)));
    return out;
  }
  const base = asRoom(room);
  return Array.from({ length: num }, (_, i) => String(base + BigInt(i)));
}

/** A room is an integer (SGLang's `Optional[Union[List[int], int]]`); anything else is a 400. */
function asRoom(v: unknown): bigint {
  if (typeof v === "number" && Number.isInteger(v)) return BigInt(v);
  if (typeof v === "string" && /^-?\d+$/.test(v.trim())) return BigInt(v.trim());
  throw new BadRequestError(
    `bootstrap_room must be an integer or a list of integers, got ${JSON.stringify(v)}`,
    "bootstrap_room",
  );
}

/** The first entry of a scalar-or-list bootstrap field. */
function first(v: unknown): unknown {
  return Array.isArray(v) ? v[0] : v;
}

export class SglangSimConnector extends SideChannelConnector {
  readonly kind = "sglang" as const;
  private bootstrap: JsonHttpServer | null = null;

  async start(): Promise<void> {
    if (this.opts.role !== "prefill") return;
    const port = configNumber(
      this.opts,
      ["bootstrap_port", "disaggregation_bootstrap_port"],
      ["SGLANG_DISAGGREGATION_BOOTSTRAP_PORT"],
      8998,
    );
    await this.channel.listen(0, this.bindHost);
    const table = new SglangBootstrapTable(this.host.httpPort);
    const text = (status: number, body: string) => reply(status, body, "text");
    this.bootstrap = new JsonHttpServer({
      "PUT /route": (body) => {
        if (!body || typeof body !== "object") return text(500, "500 Internal Server Error");
        const missing = table.put(body as Record<string, unknown>);
        return missing
          ? text(500, "500 Internal Server Error\n\nServer got itself in trouble")
          : text(200, "OK");
      },
      "GET /route": (_b, q) => {
        const keys = ["prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"];
        const v = keys.map((k) => q.get(k));
        if (v.some((x) => !x)) return text(400, "Missing inputs for bootstrap server.");
        const [dp, cp, tp, pp] = v.map((x) => Number(x));
        if (!table.ready()) {
          return text(
            503,
            `Prefill server not fully registered yet (${table.registered} workers registered).`,
          );
        }
        if (dp === -1 && cp === -1 && tp === -1 && pp === -1) return table.serverInfo();
        const info = table.rank(dp, cp, tp, pp);
        if (!info) {
          return text(
            404,
            `Bootstrap info not found for dp_rank=${dp} cp_rank=${cp} tp_rank=${tp} pp_rank=${pp}`,
          );
        }
        return info;
      },
      "* /route": () => text(405, "Method not allowed"),
      "POST /register_dp_rank": (body) => {
        const b = (body ?? {}) as Record<string, unknown>;
        table.roomToDpRank.set(String(b.bootstrap_room), Number(b.dp_rank));
        return text(200, "OK");
      },
      "POST /query_dp_ranks": (body) => {
        const rooms = ((body ?? {}) as { bootstrap_rooms?: unknown[] }).bootstrap_rooms ?? [];
        const out: Record<string, number> = {};
        for (const r of rooms) {
          const dp = table.roomToDpRank.get(String(r));
          if (dp !== undefined) out[String(r)] = dp;
        }
        return out;
      },
      "GET /health": () => text(200, "OK"),
    });
    await this.bootstrap.listen(port, this.bindHost);
    // Each sim process is a whole prefill server of one rank: a DP-rank sim has its own bootstrap
    // port, so D (room % dp_size) must land on this process whatever its --data-parallel-rank.
    table.put({
      attn_tp_size: 1,
      attn_tp_rank: 0,
      attn_cp_size: 1,
      attn_cp_rank: 0,
      attn_dp_size: 1,
      attn_dp_rank: 0,
      pp_size: 1,
      pp_rank: 0,
      system_dp_size: 1,
      system_dp_rank: 0,
      rank_ip: this.advertisedHost,
      rank_port: this.channel.port,
      page_size: this.host.blockSize,
      kv_cache_dtype: "auto",
    });
    this.started = true;
  }

  override async close(): Promise<void> {
    await this.bootstrap?.close();
    await super.close();
  }

  describe(): SimConnectorDescription {
    return {
      kind: this.kind,
      bootstrapHost: this.advertisedHost,
      bootstrapPort: this.bootstrap?.port || undefined,
    };
  }

  /** SGLang marks PD requests by the bootstrap fields alone; the worker's role says which half. */
  override pdPhase(body: Record<string, unknown>): "prefill" | "decode" | null {
    if (body.bootstrap_room === undefined || body.bootstrap_room === null) return super.pdPhase(body);
    if (this.opts.role === "prefill") return "prefill";
    if (this.opts.role === "decode") return "decode";
    return null;
  }

  private rooms(req: PdRequestInfo): string[] {
    const rooms = normalizeRooms(req.body);
    if (rooms.length === 0)
      throw new BadRequestError("bootstrap_room is required for disaggregated requests", "bootstrap_room");
    return rooms;
  }

  override validate(req: PdRequestInfo, phase: "prefill" | "decode"): void {
    this.rooms(req);
    if (
      phase === "decode" &&
      (!paramString({ h: first(req.body.bootstrap_host) }, "h") ||
        !paramNumber({ p: first(req.body.bootstrap_port) }, "p"))
    ) {
      throw new BadRequestError(
        "bootstrap_host and bootstrap_port are required on the decode side",
        "bootstrap_host",
      );
    }
  }

  async onPrefillFinished(req: PdRequestInfo, held: HeldKv): Promise<null> {
    const [room0, ...more] = this.rooms(req);
    this.channel.offer(room0, held);
    // Other items' rooms: the same prompt KV under each room; releasing them frees nothing more.
    for (const r of more) this.channel.offer(r, { ...held, requestId: `${held.requestId}#room-${r}` });
    return null;
  }

  /** D's way to the rank holding a room: `GET /route` for the server info, then for the rank. */
  private async rankFor(host: string, port: number, room: string, signal: AbortSignal): Promise<RankInfo> {
    const base = `http://${host.includes(":") ? `[${host}]` : host}:${port}`;
    const get = async (q: string) => {
      const res = await fetch(`${base}/route?${q}`, {
        signal: AbortSignal.any([signal, AbortSignal.timeout(this.settings.pullTimeoutMs)]),
      });
      if (!res.ok) throw new Error(`GET /route?${q}: ${res.status} ${await res.text()}`);
      return (await res.json()) as Record<string, unknown>;
    };
    try {
      const info = await get("prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1");
      const dpSize = Number(info.dp_size) || 1;
      const dp = info.follow_bootstrap_room === false ? 0 : Number(BigInt(room) % BigInt(dpSize));
      return (await get(
        `prefill_dp_rank=${dp}&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0`,
      )) as unknown as RankInfo;
    } catch (err) {
      if (signal.aborted) throw signal.reason ?? err;
      const msg = err instanceof Error ? (err.cause instanceof Error ? err.cause.message : err.message) : "";
      throw new UpstreamError(`SGLang bootstrap ${base} failed: ${msg}`, 502, "kv_transfer_failed");
    }
  }

  async pullForDecode(req: PdRequestInfo, signal: AbortSignal): Promise<PulledKv> {
    this.validate(req, "decode");
    const rooms = this.rooms(req);
    const hosts = Array.isArray(req.body.bootstrap_host) ? req.body.bootstrap_host : null;
    const ports = Array.isArray(req.body.bootstrap_port) ? req.body.bootstrap_port : null;
    // One failed item fails the request: stop the other items' waits with it.
    const stop = new AbortController();
    const all = AbortSignal.any([signal, stop.signal]);
    const pulls = rooms.map(async (room, i) => {
      const host = String(hosts ? hosts[i % hosts.length] : req.body.bootstrap_host);
      const port = Number(ports ? ports[i % ports.length] : req.body.bootstrap_port);
      const rank = await this.rankFor(host, port, room, all);
      return this.pull(sideChannelUrl(rank.rank_ip, rank.rank_port, room), req, {
        signal: all,
        waitMs: this.settings.pullTimeoutMs,
      });
    });
    for (const p of pulls) p.catch(() => stop.abort(new Error("another item of the batch failed")));
    // Every item must get its KV; the first item's is imported.
    let results: PulledKv[];
    try {
      results = await Promise.all(pulls);
    } catch (err) {
      stop.abort();
      throw err;
    }
    return { tokenIds: results[0].tokenIds, bytes: results.reduce((a, r) => a + r.bytes, 0) };
  }
}
