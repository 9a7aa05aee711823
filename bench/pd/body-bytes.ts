/**
 * Event-loop time the server spends turning one PD request's body into the bytes of its two
 * halves (the protocol's body shaping plus what the HTTP executor sends: the registered bytes,
 * else JSON.stringify), for a long chat prompt. Run against any checkout to compare:
 *
 *   node bench/pd/body-bytes.ts [--tree <checkout>] [--kib 512] [--iterations 300]
 *     [--warmup 300] [--connectors nixl,sglang]
 *
 * The client body is registered as the client's bytes (setRawBody), as the server's body
 * intake does for a body it forwards unchanged.
 */
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { pairedArgs } from "../usage.ts";

const args = pairedArgs(process.argv.slice(2));
const TREE = resolve(args.get("tree") ?? ".");
const KIB = Number(args.get("kib") ?? 512);
const ITER = Number(args.get("iterations") ?? 300);

const mod = async (p: string) => import(pathToFileURL(resolve(TREE, p)).href);
const { pdProtocols } = await mod("src/router/disagg/protocols/index.ts");
const http = await mod("src/transport/http.ts");
const types = await mod("src/transport/types.ts");
const rawBodyOf: (b: object) => Buffer | undefined = types.rawBodyOf ?? (() => undefined);
// setRawBody lives in src/transport/types.ts now; older trees had it in http.ts.
const setRawBody: (b: object, raw: Buffer) => void = types.setRawBody ?? http.setRawBody;
const sent = (b: object) => rawBodyOf(b) ?? JSON.stringify(b);

// A chat prompt of about KIB KiB in a few messages, with escapes JSON.stringify has to write.
const para = 'Disaggregated serving moves the prompt\'s KV from P to D. "Quoted" \\ text\n';
const content = para.repeat(Math.ceil((KIB * 1024) / 4 / para.length));
const client = {
  model: "m",
  messages: [1, 2, 3, 4].map((i) => ({ role: i % 2 ? "user" : "assistant", content })),
  stream: true,
  stream_options: { include_usage: true },
  max_tokens: 256,
  temperature: 0,
};
const text = JSON.stringify(client);
const rec = (id: string, role: string, kind: string) => ({
  id,
  model: "m",
  servedModelNames: ["m"],
  engine: "sim",
  role,
  url: `http://10.0.0.${role === "prefill" ? 1 : 2}:8000`,
  connector: { kind, bootstrapHost: "10.0.0.1", bootstrapPort: 8998, handshakePort: 1, notifyPort: 2 },
  blockSize: 16,
  dpSize: 1,
  tpSize: 1,
  maxModelLen: 131072,
  startedAt: "2026-01-01T00:00:00.000Z",
});

function once(kind: string): number {
  const body = JSON.parse(text) as Record<string, unknown>;
  setRawBody(body, Buffer.from(text));
  const proto = pdProtocols[kind];
  const input = {
    body,
    requestId: "r",
    prefill: rec("p", "prefill", kind),
    decode: rec("d", "decode", kind),
  };
  const t0 = performance.now();
  let bytes = 0;
  if (proto.mode === "serial") {
    bytes += sent(proto.prefillBody(input)).length;
    bytes += sent(proto.decodeBody(input, { do_remote_prefill: true, remote_block_ids: [1, 2, 3] })).length;
  } else {
    const h = proto.bodies(input);
    bytes += sent(h.prefill).length + sent(h.decode).length;
  }
  const dt = performance.now() - t0;
  if (bytes < text.length) throw new Error("short body");
  return dt;
}

const KINDS = (args.get("connectors") ?? "nixl,sglang").split(",");
// Warm-up of every path first (JIT), so no connector's figures include the compiler's work.
for (let i = 0; i < Number(args.get("warmup") ?? 300); i++) for (const kind of KINDS) once(kind);
const out: string[] = [];
for (const kind of KINDS) {
  const ts: number[] = [];
  for (let i = 0; i < ITER; i++) ts.push(once(kind));
  ts.sort((a, b) => a - b);
  const q = (p: number) => ts[Math.min(ts.length - 1, Math.floor((p / 100) * ts.length))]!.toFixed(3);
  const mean = ts.reduce((a, b) => a + b, 0) / ts.length;
  out.push(`${kind}: mean ${mean.toFixed(3)} ms, p50 ${q(50)} ms, p90 ${q(90)} ms, p99 ${q(99)} ms`);
}
console.log(`${TREE}: body ${(text.length / 1024).toFixed(0)} KiB, ${ITER} PD requests per connector`);
for (const l of out) console.log(`  ${l}`);
