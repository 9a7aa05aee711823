/**
 * SGLang bootstrap (docs/engine-protocols.md#pd-sglang): concurrent, identical bodies carrying P's
 * `bootstrap_host`, `bootstrap_port` and a random `bootstrap_room`.
 *
 * A batched request carries one of each per item, as SGLang's gateway prepares PD requests
 * (sgl-project/sglang sgl-model-gateway/src/routers/http/pd_router.rs @ ca7a220,
 * `get_chat_batch_size` / `get_completion_batch_size` / `inject_bootstrap_into_value`): a
 * chat request with `n` > 1 has `n` items, a completion whose `prompt` is a list has one per
 * prompt; each item gets its own independent random room. The room is drawn below 2^53 (a
 * subset of SGLang's [0, 2^63-1], pd_types.rs `generate_room_id`) so it survives JSON
 * parsing as a double exactly.
 */
import { randomInt } from "node:crypto";
import { rawBodyOf, setRawBody } from "../../../transport/types.ts";
import { type ConcurrentProtocol, connectorHost, withAppended } from "./types.ts";

export const SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998;

export function randomBootstrapRoom(): number {
  return randomInt(0, 2 ** 47) * 64 + randomInt(0, 64);
}

/**
 * How many items a request is, for SGLang's per-item bootstrap lists; null = a single one
 * (scalars). A list `prompt` is a batch of prompts unless it is one prompt's token ids.
 */
export function sglangBatchSize(body: Readonly<Record<string, unknown>>): number | null {
  const prompt = body.prompt;
  if (Array.isArray(prompt)) {
    if (prompt.length === 0 || typeof prompt[0] === "number") return null;
    return prompt.length;
  }
  if (prompt === undefined && typeof body.n === "number" && body.n > 1) return body.n;
  return null;
}

export const sglangProtocol: ConcurrentProtocol = {
  kind: "sglang",
  mode: "concurrent",
  bodies({ body, prefill }) {
    const host = connectorHost(prefill);
    const port = prefill.connector.bootstrapPort ?? SGLANG_DEFAULT_BOOTSTRAP_PORT;
    const n = sglangBatchSize(body);
    const fields =
      n === null
        ? { bootstrap_host: host, bootstrap_port: port, bootstrap_room: randomBootstrapRoom() }
        : {
            bootstrap_host: Array.from({ length: n }, () => host),
            bootstrap_port: Array.from({ length: n }, () => port),
            bootstrap_room: Array.from({ length: n }, randomBootstrapRoom),
          };
    // Both halves go out as the client's bytes with the three fields appended, when the server
    // has them (SGLang parses with Python's json.loads, last duplicate key wins: transport/types.ts).
    const pBody = withAppended(body, { ...body, ...fields }, fields);
    const dBody = { ...body, ...fields };
    const raw = rawBodyOf(pBody);
    if (raw) setRawBody(dBody, raw);
    return { prefill: pBody, decode: dBody };
  },
};
