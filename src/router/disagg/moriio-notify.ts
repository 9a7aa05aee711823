/**
 * Best-effort release of a MoRIIO prefill's held blocks when D will never read them (D
 * failed or the client left between the halves): the router sends P the release D sends
 * after a READ. P frees them on its own timeout too, so a lost notify costs only memory.
 *
 * Wire form, from vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/moriio/
 * moriio_engine.py @ 028a39c286ca87e0d302e66eda00bdb1a00b8c03:
 * - P's notify listener (`async_wait_reqid`) is a ZMQ ROUTER reading `identity, msg`; peers
 *   send with a DEALER (`send_notify`). A PUSH cannot talk to a ROUTER (ZMQ refuses the
 *   socket-type pair in the handshake), so the message would never arrive.
 * - A release is the msgpack map `{type: "release", transfer_id}` (`_handle_release_message`)
 *   keyed by the transfer id, not the request id. A map with `req_id` and no `type` is read
 *   as a WRITE `remote_blocks` announcement and, without a block list, raises inside P's
 *   listener thread, which then stops serving notifies.
 */
import { pack } from "msgpackr";
import * as zmq from "zeromq";

export async function sendMoriioNotify(host: string, port: number, transferId: string): Promise<boolean> {
  const sock = new zmq.Dealer({ linger: 500, sendTimeout: 500 });
  try {
    sock.connect(`tcp://${host}:${port}`);
    await sock.send(pack({ type: "release", transfer_id: transferId }));
    return true;
  } catch {
    return false;
  } finally {
    sock.close();
  }
}
