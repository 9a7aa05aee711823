/** vLLM NixlConnector: serial, D pulls from P's side channel (docs/engine-protocols.md#pd-nixl). */
import { prefillOnlyBody, type SerialProtocol, withKvParams } from "./types.ts";

export const nixlProtocol: SerialProtocol = {
  kind: "nixl",
  mode: "serial",
  prefillBody: ({ body }) =>
    prefillOnlyBody(body, {
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    }),
  // P's object goes to D as it came: it already says do_remote_prefill and where to pull.
  decodeBody: ({ body }, p) => withKvParams(body, { ...p }),
};
