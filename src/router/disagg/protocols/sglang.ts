/**
 * SGLang bootstrap (engine-protocols.md §4d): concurrent, identical bodies carrying P's
 * `bootstrap_host`, `bootstrap_port` and a random `bootstrap_room`. The room is drawn below
 * 2^53 (a subset of SGLang's [0, 2^63-1]) so it survives JSON parsing as a double exactly.
 */
import { randomInt } from "node:crypto";
import { type ConcurrentProtocol, connectorHost } from "./types.ts";

export const SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998;

export function randomBootstrapRoom(): number {
  return randomInt(0, 2 ** 47) * 64 + randomInt(0, 64);
}

export const sglangProtocol: ConcurrentProtocol = {
  kind: "sglang",
  mode: "concurrent",
  bodies({ body, prefill }) {
    const shared = {
      ...body,
      bootstrap_host: connectorHost(prefill),
      bootstrap_port: prefill.connector.bootstrapPort ?? SGLANG_DEFAULT_BOOTSTRAP_PORT,
      bootstrap_room: randomBootstrapRoom(),
    };
    return { prefill: shared, decode: { ...shared } };
  },
};
