/**
 * The router's best-effort MoRIIO release to P (D will never read the blocks), on the wire as
 * vLLM's P reads it: vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/moriio/
 * moriio_engine.py @ 028a39c286ca87e0d302e66eda00bdb1a00b8c03 — P's notify listener is a
 * ZMQ ROUTER (`async_wait_reqid`, `identity, msg = sock.recv_multipart()`), peers send from a
 * DEALER (`send_notify`), and a release is the msgpack map `{type: "release", transfer_id}`
 * (`_handle_release_message`) on `notify_port + dp rank` (`get_port_offset`).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { unpack } from "msgpackr";
import * as zmq from "zeromq";
import { moriioProtocol } from "../../../src/router/disagg/protocols/moriio.ts";
import { mixedRecord } from "../../helpers/records.ts";

test("MoRIIO release: a DEALER frame {type: release, transfer_id} on P's ROUTER, at notify_port + rank", async () => {
  const router = new zmq.Router({ linger: 0, receiveTimeout: 5000 });
  await router.bind("tcp://127.0.0.1:*");
  const ep = router.lastEndpoint ?? "";
  const rankPort = Number(ep.slice(ep.lastIndexOf(":") + 1));
  try {
    const prefill = mixedRecord({
      id: "p",
      model: "m",
      url: "http://127.0.0.1:1",
      role: "prefill",
      dpSize: 2,
      connector: { kind: "moriio", bootstrapHost: "127.0.0.1", handshakePort: 1, notifyPort: rankPort - 1 },
    });
    const decode = mixedRecord({ id: "d", model: "m", url: "http://127.0.0.1:2", role: "decode" });
    const input = {
      body: {},
      requestId: "req-1",
      prefill,
      decode,
      transferId: "tx-0f0e",
      prefillDpRank: 1,
    };
    // P's answer names its base notify port; the router adds the pinned rank.
    await moriioProtocol.releasePrefill?.(input, {
      remote_host: "127.0.0.1",
      remote_notify_port: rankPort - 1,
      transfer_id: "tx-0f0e",
    });
    const frames = await router.receive();
    assert.equal(frames.length, 2, "a ROUTER sees [identity, message]: the sender is a DEALER");
    assert.deepEqual(unpack(frames[1]), { type: "release", transfer_id: "tx-0f0e" });
  } finally {
    router.close();
  }
});
