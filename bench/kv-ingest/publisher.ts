/**
 * The engine side of bench/kv-ingest: one process standing in for a vLLM rank's
 * `ZmqEventPublisher` (vllm-project/vllm vllm/distributed/kv_events.py @
 * 0181ea3173e53eea8cf04a86891488e3dc89bb34): a PUB socket with send HWM 100,000 that the server
 * connects to, and one 3-frame message per batch, `(topic, seq.to_bytes(8, "big"), payload)`,
 * seq counting from 0. The payload is what `msgspec.msgpack.Encoder().encode(KVEventBatch)`
 * writes: a map (msgspec structs encode as maps unless `array_like`), `{ts, events,
 * data_parallel_rank}`, each event a map tagged with `type` (`tag=True`), fields with a default
 * left out (`omit_defaults=True`); `lora_id`, `medium`, `lora_name` have none, so they are sent.
 *
 * It sends through libzmq's C API (koffi; the libzmq zeromq.js ships) so the publisher is not
 * the bottleneck: zeromq.js' `send()` costs ≈ 4 µs a message. Payloads are encoded before the
 * clock starts. Prints "ready" once bound, waits for "go" on stdin, sends, prints a JSON line.
 *
 *   node bench/kv-ingest/publisher.ts <endpoint> <n> <events-per-msg> <rate msg/s, 0 = flat out>
 */
import { readFileSync } from "node:fs";
import koffi from "koffi";
import { Packr } from "msgpackr";
import "zeromq";

const [endpoint, nArg, epmArg, rateArg] = process.argv.slice(2);
const N = Number(nArg);
const EPM = Number(epmArg);
const RATE = Number(rateArg);
const BS = 16;

const addon = readFileSync("/proc/self/maps", "utf8")
  .split("\n")
  .map((l) => l.split(/\s+/).pop() ?? "")
  .find((p) => /zeromq.*addon\.node$/.test(p));
if (!addon) throw new Error("zeromq addon not loaded");
const lib = koffi.load(addon);
const ctx = (lib.func("void *zmq_ctx_new()") as () => object)();
const socket = lib.func("void *zmq_socket(void *, int)") as (c: object, t: number) => object;
const setsockopt = lib.func("int zmq_setsockopt(void *, int, const void *, size_t)") as (
  s: object,
  o: number,
  v: Uint8Array,
  l: number,
) => number;
const bind = lib.func("int zmq_bind(void *, const char *)") as (s: object, e: string) => number;
const send = lib.func("int zmq_send(void *, const uint8_t *, size_t, int)") as (
  s: object,
  b: Uint8Array,
  l: number,
  f: number,
) => number;
const close = lib.func("int zmq_close(void *)") as (s: object) => number;
const ZMQ_PUB = 1;
const ZMQ_SNDHWM = 23;
const ZMQ_LINGER = 17;
const ZMQ_SNDMORE = 2;

const pub = socket(ctx, ZMQ_PUB);
const i32 = (v: number) => {
  const b = Buffer.alloc(4);
  b.writeInt32LE(v);
  return b;
};
setsockopt(pub, ZMQ_SNDHWM, i32(100_000), 4); // vLLM's `hwm` default
setsockopt(pub, ZMQ_LINGER, i32(5000), 4);
if (bind(pub, endpoint) !== 0) throw new Error(`bind ${endpoint} failed`);

// One BlockStored per event, each block chained on the previous one (a prompt being prefilled),
// a BlockRemoved every 8th event (the LRU evicting): the mix a busy engine step sends. Hashes
// are BigInts so msgpackr writes them as uint64 (0xcf), as msgspec does for vLLM's int hashes
// (a Number past 2^32 would go out as a float64, which no engine sends).
const packr = new Packr({ useRecords: false, variableMapSize: true });
const payloads: Buffer[] = [];
let h = 0x1_0000_0000;
for (let i = 0; i < N; i++) {
  const events: Record<string, unknown>[] = [];
  for (let e = 0; e < EPM; e++) {
    const k = i * EPM + e;
    if (k % 8 === 7) events.push({ type: "BlockRemoved", block_hashes: [BigInt(h - 6)], medium: "GPU" });
    else {
      h++;
      events.push({
        type: "BlockStored",
        block_hashes: [BigInt(h)],
        parent_block_hash: k % 64 === 0 ? null : BigInt(h - 1),
        token_ids: Array.from({ length: BS }, (_, t) => (k * BS + t) % 50_000),
        block_size: BS,
        lora_id: null,
        medium: "GPU",
        lora_name: null,
      });
    }
  }
  payloads.push(packr.pack({ ts: 1_700_000_000 + i / 1000, events, data_parallel_rank: 0 }));
}
const topic = Buffer.alloc(0);
const seqs = Buffer.alloc(8 * N);
for (let i = 0; i < N; i++) seqs.writeBigUInt64BE(BigInt(i), 8 * i);
const seqViews = Array.from({ length: N }, (_, i) => seqs.subarray(8 * i, 8 * i + 8));

process.stdout.write(`ready ${Math.round(payloads.reduce((a, p) => a + p.length, 0) / N)}\n`);
process.stdin.once("data", () => {
  const t0 = performance.now();
  let sent = 0;
  // Paced in 1 ms slices when a rate is given (busy-waiting between them: this process has
  // nothing else to do), flat out otherwise.
  const perMs = RATE > 0 ? RATE / 1000 : Number.POSITIVE_INFINITY;
  while (sent < N) {
    const due = Math.min(N, RATE > 0 ? Math.floor((performance.now() - t0 + 1) * perMs) : N);
    for (; sent < due; sent++) {
      send(pub, topic, 0, ZMQ_SNDMORE);
      send(pub, seqViews[sent], 8, ZMQ_SNDMORE);
      send(pub, payloads[sent], payloads[sent].length, 0);
    }
  }
  const ms = performance.now() - t0;
  process.stdout.write(`${JSON.stringify({ sent, ms, rate: Math.round((sent / ms) * 1000) })}\n`);
  setTimeout(() => {
    close(pub);
    process.exit(0);
  }, 1000);
});
