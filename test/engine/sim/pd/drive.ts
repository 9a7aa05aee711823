/**
 * Drives a PD request by hand against two sims, exactly as the router would: the same
 * protocol modules build the bodies, plain fetch sends them (serial: P then D; concurrent:
 * both at once), one X-Request-Id for both halves.
 */
import type { ConnectorInfo, WorkerRecord } from "../../../../src/discovery/types.ts";
import { pdProtocols } from "../../../../src/router/disagg/protocols/index.ts";
import type { SimProcess } from "../../../helpers/sim.ts";

export function simRecord(
  sim: SimProcess,
  role: "prefill" | "decode",
  connector: ConnectorInfo,
): WorkerRecord {
  return {
    id: `${role}-${sim.port}`,
    model: sim.model,
    servedModelNames: [sim.model],
    engine: "sim",
    role,
    url: sim.url,
    connector,
    blockSize: 16,
    dpSize: 1,
    tpSize: 1,
    dpRank: 0,
    maxModelLen: 8192,
    startedAt: new Date().toISOString(),
  };
}

export interface PdRun {
  prefillStatus: number;
  prefillJson: Record<string, unknown> | null;
  decodeStatus: number;
  decodeText: string;
  prefillBody: Record<string, unknown>;
  decodeBody: Record<string, unknown>;
}

async function post(url: string, body: unknown, requestId: string): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-request-id": requestId },
    body: JSON.stringify(body),
  });
}

/** Adds `extra` to a body's kv_transfer_params (fields a protocol module may not send yet). */
function withParams(b: Record<string, unknown>, extra: Record<string, unknown>): Record<string, unknown> {
  if (Object.keys(extra).length === 0) return b;
  const kvp = (b.kv_transfer_params ?? {}) as Record<string, unknown>;
  return { ...b, kv_transfer_params: { ...kvp, ...extra } };
}

export async function drivePd(
  p: WorkerRecord,
  d: WorkerRecord,
  body: Record<string, unknown>,
  requestId: string,
  extraParams: Record<string, unknown> = {},
): Promise<PdRun> {
  const proto = pdProtocols[p.connector.kind as Exclude<ConnectorInfo["kind"], "none">];
  const peerUrl = proto.peerInfo?.(p).url;
  const peer = peerUrl ? ((await (await fetch(peerUrl)).json()) as Record<string, unknown>) : undefined;
  const rid = proto.requestId?.(requestId, p, d) ?? requestId;
  const input = { body, requestId: rid, prefill: p, decode: d, peer };
  if (proto.mode === "serial") {
    const prefillBody = withParams(proto.prefillBody(input), extraParams);
    const pr = await post(p.url, prefillBody, rid);
    const prefillJson = (await pr.json()) as Record<string, unknown>;
    const params = (prefillJson.kv_transfer_params ?? {}) as Record<string, unknown>;
    const decodeBody = withParams(proto.decodeBody(input, params), extraParams);
    const dr = await post(d.url, decodeBody, rid);
    return {
      prefillStatus: pr.status,
      prefillJson,
      decodeStatus: dr.status,
      decodeText: await dr.text(),
      prefillBody,
      decodeBody,
    };
  }
  const bodies = proto.bodies(input);
  const prefill = withParams(bodies.prefill, extraParams);
  const decode = withParams(bodies.decode, extraParams);
  const [pr, dr] = await Promise.all([post(p.url, prefill, rid), post(d.url, decode, rid)]);
  const [pText, dText] = await Promise.all([pr.text(), dr.text()]);
  let prefillJson: Record<string, unknown> | null = null;
  try {
    prefillJson = JSON.parse(pText) as Record<string, unknown>;
  } catch {
    // a streamed P answer (SGLang's identical body): only its status matters
  }
  return {
    prefillStatus: pr.status,
    prefillJson,
    decodeStatus: dr.status,
    decodeText: dText,
    prefillBody: prefill,
    decodeBody: decode,
  };
}

/** The usage object of a JSON answer or of an SSE stream's usage chunk. */
export function usageOf(text: string): Record<string, unknown> | null {
  if (text.trimStart().startsWith("{"))
    return (JSON.parse(text) as { usage?: Record<string, unknown> }).usage ?? null;
  let usage: Record<string, unknown> | null = null;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { usage?: Record<string, unknown> | null };
    if (chunk.usage) usage = chunk.usage;
  }
  return usage;
}

/** Concatenated content of a JSON answer or an SSE stream. */
export function contentOf(text: string): string {
  if (text.trimStart().startsWith("{")) {
    const j = JSON.parse(text) as { choices: Array<{ message?: { content?: string } }> };
    return j.choices[0]?.message?.content ?? "";
  }
  let out = "";
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { choices: Array<{ delta?: { content?: string } }> };
    out += chunk.choices[0]?.delta?.content ?? "";
  }
  return out;
}
