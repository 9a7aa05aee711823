/**
 * vLLM's MoRIIO workers send a registration heartbeat to `proxy_ip:proxy_ping_port`: one ZMQ
 * DEALER socket, connected once, re-sending the same msgpack map every interval
 * (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/moriio/moriio_heartbeat.py
 * @ 1c3d6462281cdb320c80a4e11fa29acdec6deca0). Through a Service that one connection reaches one
 * server replica only, so the replicas cannot discover through it; they discover the workers in
 * etcd (the launcher registers them there with the MoRIIO fields the router needs), and this
 * sidecar of each server pod only accepts the heartbeats — without any listener vLLM's queue
 * fills to the high-water mark and it logs a failed send every interval. It logs each worker's
 * first heartbeat (its HTTP address and role), for whoever debugs a worker that never shows up.
 *
 * Runs as `node -e MORIIO_SINK_JS <port>` in the infera image, from /app, whose node_modules
 * has zeromq and msgpackr.
 */
export const MORIIO_SINK_JS = [
  'const zmq = require("zeromq"), { unpack } = require("msgpackr");',
  "const port = Number(process.argv[1]), seen = new Set();",
  "const log = (o) => process.stdout.write(JSON.stringify({ time: Date.now(), ...o }) + '\\n');",
  "(async () => {",
  "  const sock = new zmq.Router();",
  '  await sock.bind("tcp://*:" + port);',
  '  log({ msg: "moriio heartbeat sink listening", port });',
  "  for await (const [id, ...rest] of sock) {",
  "    const peer = id.toString('hex');",
  "    if (seen.has(peer)) continue;",
  "    if (seen.size >= 10000) seen.clear();",
  "    seen.add(peer);",
  "    let reg = {};",
  "    try { reg = unpack(rest[rest.length - 1]) ?? {}; } catch {}",
  '    log({ msg: "moriio worker heartbeat", peer, type: reg.type, http_address: reg.http_address ?? reg.request_address });',
  "  }",
  "})().catch((e) => { process.stderr.write(String(e?.stack ?? e) + '\\n'); process.exit(1); });",
].join("\n");
