/** Helpers shared by the engine modules: command words, ZMQ endpoints, KV roles, RDMA env. */
import type { KvEventsRank, WorkerRole } from "../../discovery/types.ts";
import { BadRequestError } from "../../protocol/errors.ts";
import type { EngineCommand, LaunchSpec } from "./types.ts";

/** Splits a command string into words; single/double quotes group, backslash escapes. */
export function splitCommand(cmd: string): string[] {
  const words: string[] = [];
  let cur = "";
  let inWord = false;
  let quote: '"' | "'" | null = null;
  for (let i = 0; i < cmd.length; i++) {
    const c = cmd[i] as string;
    if (quote) {
      if (c === quote) quote = null;
      else if (c === "\\" && quote === '"' && i + 1 < cmd.length) cur += cmd[++i];
      else cur += c;
    } else if (c === '"' || c === "'") {
      quote = c;
      inWord = true;
    } else if (c === "\\" && i + 1 < cmd.length) {
      cur += cmd[++i];
      inWord = true;
    } else if (/\s/.test(c)) {
      if (inWord) words.push(cur);
      cur = "";
      inWord = false;
    } else {
      cur += c;
      inWord = true;
    }
  }
  if (quote) throw new BadRequestError(`unterminated quote in command: ${cmd}`);
  if (inWord) words.push(cur);
  return words;
}

/** POSIX-shell quoting, for printing a command a person can paste. */
export function shellQuote(word: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", `'\\''`)}'`;
}

export function shellLine(cmd: EngineCommand): string {
  const env = Object.entries(cmd.env).map(([k, v]) => `${k}=${shellQuote(v)}`);
  return [...env, ...cmd.argv.map(shellQuote)].join(" ");
}

/** The address an engine that always bind()s (ATOM) binds its ZMQ socket to: `*` for all interfaces. */
export function bindEndpoint(host: string, port: number): string {
  const h = host === "0.0.0.0" || host === "::" || host === "" ? "*" : host;
  return `tcp://${h}:${port}`;
}

/**
 * The KV-event endpoint vLLM and SGLang are given. Both bind() their PUB socket only when
 * the endpoint contains `*` or `::` and connect() otherwise (a specific address, even
 * 0.0.0.0), so the engine always gets the wildcard and the record carries the reachable
 * host (vllm/distributed/kv_events.py, sglang/srt/disaggregation/kv_events.py
 * `_socket_setup`).
 */
export function wildcardEndpoint(port: number): string {
  return `tcp://*:${port}`;
}

export function advertisedEndpoint(spec: LaunchSpec, port: number): string {
  const h = spec.advertiseHost.includes(":") ? `[${spec.advertiseHost}]` : spec.advertiseHost;
  return `tcp://${h}:${port}`;
}

/** Data-parallel ranks (≥ 1). */
export function dpSize(spec: LaunchSpec): number {
  return spec.dp ?? 1;
}

/**
 * Every rank's KV-event sockets for an engine that binds rank r's PUB on port + r and its
 * replay ROUTER on replayPort + r (vLLM `ZmqEventPublisher.offset_endpoint_port`).
 */
export function kvEventRanks(spec: LaunchSpec, withReplay: boolean): KvEventsRank[] {
  const ranks: KvEventsRank[] = [];
  for (let r = 0; r < dpSize(spec); r++) {
    const rank: KvEventsRank = { dpRank: r, endpoint: advertisedEndpoint(spec, spec.kvEvents.port + r) };
    if (withReplay) rank.replayEndpoint = advertisedEndpoint(spec, spec.kvEvents.replayPort + r);
    ranks.push(rank);
  }
  return ranks;
}

/** vLLM / ATOM `kv_role` for a worker role (Nixl uses kv_both for either side). */
export function kvRole(role: WorkerRole): "kv_producer" | "kv_consumer" | "kv_both" {
  if (role === "prefill") return "kv_producer";
  if (role === "decode") return "kv_consumer";
  return "kv_both";
}

/**
 * One RoCEv2 GID index for every RDMA stack an engine may load: MC_GID_INDEX (Mooncake),
 * NCCL_IB_GID_INDEX (RCCL/NCCL), MORI_IB_GID_INDEX (MoRI-IO, read by mori's RDMA backend)
 * and UCX_IB_GID_INDEX (UCX under Nixl). Whichever the connector uses picks its own.
 */
export function rdmaEnv(spec: LaunchSpec): Record<string, string> {
  if (spec.gidIndex === undefined) return {};
  const v = String(spec.gidIndex);
  return { MC_GID_INDEX: v, NCCL_IB_GID_INDEX: v, MORI_IB_GID_INDEX: v, UCX_IB_GID_INDEX: v };
}

/** Appends `flag value` when the value is defined. */
export function opt(argv: string[], flag: string, value: string | number | undefined): void {
  if (value !== undefined) argv.push(flag, String(value));
}

export function requireBackend(spec: LaunchSpec, allowed: readonly string[]): void {
  if (spec.backend !== "none" && !allowed.includes(spec.backend)) {
    throw new BadRequestError(
      `${spec.engine}: connector '${spec.backend}' is not supported (use one of: ${allowed.join(", ")})`,
      "connector",
    );
  }
  if (spec.role !== "mixed" && spec.backend === "none") {
    throw new BadRequestError(`${spec.engine}: role '${spec.role}' needs a KV connector`, "connector");
  }
}

/**
 * Tracing: vLLM exports its request spans to `--otlp-traces-endpoint`, over gRPC unless
 * OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is `http/protobuf`, when the URL is used as it is
 * (vllm-project/vllm vllm/tracing/otel.py `get_span_exporter` @
 * 40eeb0c5e942e511bf73359f99265d72470c2f59); infera's collector is OTLP/HTTP, so both are set.
 */
export const OTLP_HTTP_ENV = { OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/protobuf" } as const;
