/**
 * A PD half goes out as the client's own bytes with the protocol's fields appended (no
 * JSON.stringify of the prompt on the event loop), when the server registered those bytes.
 * The engines parse request bodies with Python's json.loads through FastAPI/Starlette, which
 * keeps the LAST of duplicate keys (src/transport/types.ts cites the sources), so the bytes
 * must mean, parsed last-wins, what the half's object means: checked here with JSON.parse,
 * which keeps the last duplicate too. The fields a prefill half removes are appended as the
 * engine's defaults instead: `stream_options: null` and `min_tokens: 0` (vllm-project/vllm
 * vllm/entrypoints/openai/chat_completion/protocol.py @ d5dba2d7b0ab9b98096560c69db7126b54b14d79:
 * `stream_options: StreamOptions | None = None`, `min_tokens: int = 0`).
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import type { ConnectorInfo } from "../../../src/discovery/types.ts";
import { pdProtocols } from "../../../src/router/disagg/protocols/index.ts";
import type { PdInput } from "../../../src/router/disagg/protocols/types.ts";
import { HttpExecutor } from "../../../src/transport/http.ts";
import { appendFields, rawBodyOf, setRawBody } from "../../../src/transport/types.ts";
import { firstPairRouter, record, routingRequest, state } from "./fixtures.ts";

/** A client body as a client might write it: spaces, its own key order, a duplicate key. */
const CLIENT_TEXT =
  '{ "model": "m", "stream": false, "messages": [ {"role": "user", "content": "hi \\u00e9"} ],\n' +
  '  "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 50,\n' +
  '  "max_completion_tokens": 50, "min_tokens": 3, "temperature": 0,\n' +
  '  "kv_transfer_params": {"infera_retention": "short"} }\n';

function clientBody(): Record<string, unknown> {
  const body = JSON.parse(CLIENT_TEXT) as Record<string, unknown>;
  setRawBody(body, Buffer.from(CLIENT_TEXT));
  return body;
}

/** What `bytes` mean to a last-wins parser, with a prefill half's removed fields as defaults. */
function meaning(bytes: Buffer, removedAsDefaults: boolean): Record<string, unknown> {
  const v = JSON.parse(bytes.toString()) as Record<string, unknown>;
  if (removedAsDefaults) {
    assert.equal(v.stream_options, null);
    assert.equal(v.min_tokens, 0);
    delete v.stream_options;
    delete v.min_tokens;
  }
  return v;
}

/** The client's bytes are kept as they came, up to their closing brace. */
function assertKeepsClientBytes(bytes: Buffer): void {
  const head = CLIENT_TEXT.slice(0, CLIENT_TEXT.lastIndexOf("}"));
  assert.equal(bytes.subarray(0, Buffer.byteLength(head)).toString(), head);
}

describe("appendFields", () => {
  test("members go before the closing brace, after trailing space; undefined ones are skipped", () => {
    const out = appendFields(Buffer.from(' {"a": 1} \n'), { b: [1], c: undefined, a: 2 });
    assert.equal(out?.toString(), ' {"a": 1,"b":[1],"a":2} \n');
    assert.deepEqual(JSON.parse(out!.toString()), { a: 2, b: [1] });
  });
  test("an empty object takes no leading comma; a non-object is refused", () => {
    assert.equal(appendFields(Buffer.from("{ }"), { a: 1 })?.toString(), '{ "a":1}');
    assert.equal(appendFields(Buffer.from("[1]"), { a: 1 }), null);
    assert.equal(appendFields(Buffer.from(""), { a: 1 }), null);
  });
});

const conn = (kind: ConnectorInfo["kind"]): ConnectorInfo => ({
  kind,
  bootstrapHost: "10.0.0.1",
  bootstrapPort: 8998,
  handshakePort: 6301,
  notifyPort: 61005,
});

describe("each protocol's halves carry the client's bytes plus their fields", () => {
  for (const kind of ["nixl", "mooncake", "moriio", "sglang", "atom"] as const) {
    test(kind, () => {
      const body = clientBody();
      const input: PdInput = {
        body,
        requestId: "req-1",
        prefill: record("p1", "prefill", conn(kind), { url: "http://10.0.0.1:8100" }),
        decode: record("d1", "decode", conn(kind), { url: "http://10.0.0.2:8200" }),
        transferId: "xfer-1",
        peer: { engine_id: "e-1", dp_size: 1, tp_size: 1 },
      };
      const proto = pdProtocols[kind];
      const halves =
        proto.mode === "serial"
          ? { prefill: proto.prefillBody(input), decode: proto.decodeBody(input, { remote_block_ids: [1] }) }
          : proto.bodies(input);
      for (const [half, obj] of Object.entries(halves)) {
        const bytes = rawBodyOf(obj);
        assert.ok(bytes, `${half}: bytes registered`);
        assertKeepsClientBytes(bytes);
        const removed = half === "prefill" && kind !== "sglang";
        assert.deepEqual(meaning(bytes, removed), JSON.parse(JSON.stringify(obj)), half);
      }
    });
  }

  test("a body without registered bytes gets none (it is serialised when sent)", () => {
    const body = JSON.parse(CLIENT_TEXT) as Record<string, unknown>;
    const proto = pdProtocols.nixl;
    assert.equal(proto.mode, "serial");
    if (proto.mode !== "serial") return;
    const input: PdInput = {
      body,
      requestId: "r",
      prefill: record("p1", "prefill", conn("nixl")),
      decode: record("d1", "decode", conn("nixl")),
    };
    assert.equal(rawBodyOf(proto.prefillBody(input)), undefined);
  });
});

describe("through the HttpExecutor: what P and D receive (nixl)", () => {
  const got: Record<string, Buffer[]> = { p: [], d: [] };
  let server: http.Server;
  let base = "";
  before(async () => {
    server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks);
        const parsed = JSON.parse(body.toString()) as Record<string, unknown>;
        // P and D share this server; P's half is the one asking to be decoded remotely.
        const isPrefill = (parsed.kv_transfer_params as Record<string, unknown>)?.do_remote_decode === true;
        got[isPrefill ? "p" : "d"].push(body);
        res.setHeader("content-type", "application/json");
        res.end(
          JSON.stringify(
            isPrefill
              ? { id: "x", kv_transfer_params: { do_remote_prefill: true, remote_block_ids: [7] } }
              : { id: "y" },
          ),
        );
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => new Promise<void>((r) => server.close(() => r())));

  test("P gets the client's bytes + the prefill fields, D the client's bytes + P's params", async () => {
    const exec = new HttpExecutor();
    const c: ConnectorInfo = { kind: "nixl", bootstrapHost: "127.0.0.1", bootstrapPort: 9 };
    const p = state(record("p1", "prefill", c, { url: base }));
    const d = state(record("d1", "decode", c, { url: base }));
    const r = firstPairRouter([p], [d]);
    const up = await r.handle(routingRequest(clientBody()), exec, new AbortController().signal);
    for await (const _ of up.body);
    await exec.close();
    const [pb] = got.p;
    const [db] = got.d;
    assert.ok(pb && db, "both halves sent");
    assertKeepsClientBytes(pb);
    assertKeepsClientBytes(db);
    const pm = meaning(pb, true);
    assert.equal(pm.stream, false);
    assert.equal(pm.max_tokens, 1);
    assert.equal(pm.max_completion_tokens, 1);
    assert.deepEqual(pm.kv_transfer_params, {
      infera_retention: "short",
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    });
    const dm = meaning(db, false);
    assert.equal(dm.stream, true);
    assert.equal(dm.max_tokens, 50);
    assert.deepEqual(dm.stream_options, { include_usage: true });
    assert.deepEqual(dm.kv_transfer_params, {
      infera_retention: "short",
      do_remote_prefill: true,
      remote_block_ids: [7],
    });
  });
});
