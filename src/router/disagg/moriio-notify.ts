/**
 * Best-effort release of a MoRIIO prefill's held blocks when D will never read them (D
 * failed or the client left between the halves): the router sends P the same notify D
 * sends after a read (msgpack `{req_id}` over ZMQ PUSH to P's notify port). P also frees
 * them on its own timeout, so a lost notify costs only memory for a while.
 */
import { pack } from "msgpackr";
import * as zmq from "zeromq";

export async function sendMoriioNotify(host: string, port: number, requestId: string): Promise<boolean> {
  const sock = new zmq.Push({ linger: 500, sendTimeout: 500 });
  try {
    sock.connect(`tcp://${host}:${port}`);
    await sock.send(pack({ req_id: requestId, source: "infera-router" }));
    return true;
  } catch {
    return false;
  } finally {
    sock.close();
  }
}
