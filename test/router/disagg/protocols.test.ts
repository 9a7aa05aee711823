/** Each PD protocol's body transforms, table-driven (docs/engine-protocols.md#pd). No I/O. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { pdProtocols } from "../../../src/router/disagg/protocols/index.ts";
import { engineIdFromQuery } from "../../../src/router/disagg/protocols/mooncake.ts";
import { moriioZmqAddress } from "../../../src/router/disagg/protocols/moriio.ts";
import type { PdInput } from "../../../src/router/disagg/protocols/types.ts";
import { prefillOnlyBody } from "../../../src/router/disagg/protocols/types.ts";
import { record } from "./fixtures.ts";

const client = {
  model: "m",
  messages: [{ role: "user", content: "hi" }],
  stream: true,
  stream_options: { include_usage: true },
  max_tokens: 50,
  max_completion_tokens: 50,
  min_tokens: 3,
  temperature: 0,
  kv_transfer_params: { infera_retention: "short" },
};

describe("prefill-only body", () => {
  const cases: Array<{ name: string; body: Record<string, unknown>; expect: Record<string, unknown> }> = [
    {
      name: "all limits set",
      body: client,
      expect: {
        stream: false,
        max_tokens: 1,
        max_completion_tokens: 1,
        stream_options: undefined,
        min_tokens: undefined,
        temperature: 0,
      },
    },
    {
      name: "no max_completion_tokens stays absent",
      body: { model: "m", prompt: "x", max_tokens: 9 },
      expect: { stream: false, max_tokens: 1, max_completion_tokens: undefined },
    },
    {
      name: "no max_tokens gets one",
      body: { model: "m", prompt: "x", stream: true },
      expect: { stream: false, max_tokens: 1 },
    },
  ];
  for (const c of cases) {
    test(c.name, () => {
      const out = prefillOnlyBody(c.body, { do_remote_decode: true });
      for (const [k, v] of Object.entries(c.expect)) assert.deepEqual(out[k], v, k);
      if (!("max_completion_tokens" in c.body)) assert.ok(!("max_completion_tokens" in out));
      assert.equal((out.kv_transfer_params as Record<string, unknown>).do_remote_decode, true);
    });
  }
  test("the client body is not mutated and client kv params survive", () => {
    const before = structuredClone(client);
    const out = prefillOnlyBody(client, { do_remote_decode: true });
    assert.deepEqual(client, before);
    assert.equal((out.kv_transfer_params as Record<string, unknown>).infera_retention, "short");
  });
});

const P = record(
  "p1",
  "prefill",
  {
    kind: "x" as never,
    bootstrapHost: "10.1.1.1",
    bootstrapPort: 9001,
    handshakePort: 6301,
    notifyPort: 61005,
  },
  { dpRank: 2, dpSize: 4, tpSize: 8 },
);
const D = record("d1", "decode", {
  kind: "x" as never,
  bootstrapHost: "10.2.2.2",
  handshakePort: 6302,
  notifyPort: 61006,
});
const input = (peer?: Record<string, unknown>): PdInput => ({
  body: client,
  requestId: "rid",
  prefill: P,
  decode: D,
  peer,
});

const nixlAnswer = {
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_block_ids: [1, 2],
  remote_engine_id: "eng-p",
  remote_request_id: "rid",
  remote_host: "10.1.1.1",
  remote_port: 5600,
  tp_size: 8,
};

describe("serial protocols", () => {
  const table = [
    {
      kind: "nixl" as const,
      prefillParams: {
        do_remote_decode: true,
        do_remote_prefill: false,
        remote_engine_id: null,
        remote_block_ids: null,
        remote_host: null,
        remote_port: null,
      },
      answer: nixlAnswer,
      decodeParams: { ...nixlAnswer },
    },
    {
      kind: "moriio" as const,
      prefillParams: { do_remote_decode: true, do_remote_prefill: false },
      answer: { ...nixlAnswer, remote_handshake_port: 7301, remote_notify_port: 7005 },
      decodeParams: {
        do_remote_prefill: true,
        do_remote_decode: false,
        remote_engine_id: "eng-p",
        remote_block_ids: [1, 2],
        remote_host: "10.1.1.1",
        remote_handshake_port: 7301,
        remote_notify_port: 7005,
        remote_dp_size: 4,
        remote_tp_size: 8,
        remote_dp_rank: 2,
      },
    },
    {
      kind: "atom" as const,
      prefillParams: { do_remote_decode: true, do_remote_prefill: false },
      answer: {
        do_remote_prefill: true,
        remote_block_ids: [3],
        remote_engine_id: "a",
        remote_host: "h",
        remote_port: 1,
        remote_handshake_port: 6301,
        tp_size: 8,
        dp_rank: 1,
        transfer_id: "t",
        first_token_id: 7,
      },
      peer: { tp_size: 8, dp_size: 4 },
      decodeParams: {
        do_remote_prefill: true,
        transfer_id: "t",
        first_token_id: 7,
        remote_handshake_port: 6301,
        remote_dp_size: 4,
        remote_tp_size: 8,
        remote_dp_rank: 1,
      },
    },
  ];
  for (const row of table) {
    test(`${row.kind}: P's half and D's half`, () => {
      const proto = pdProtocols[row.kind];
      assert.equal(proto.mode, "serial");
      if (proto.mode !== "serial") return;
      const pb = proto.prefillBody(input(row.peer));
      assert.equal(pb.stream, false);
      assert.equal(pb.max_tokens, 1);
      assert.ok(!("stream_options" in pb) && !("min_tokens" in pb));
      const kvp = pb.kv_transfer_params as Record<string, unknown>;
      for (const [k, v] of Object.entries(row.prefillParams)) assert.deepEqual(kvp[k], v, `P ${k}`);
      const db = proto.decodeBody(input(row.peer), row.answer);
      assert.equal(db.stream, true, "D keeps the client's stream flag");
      assert.deepEqual(db.stream_options, { include_usage: true });
      assert.equal(db.max_tokens, 50);
      assert.equal(db.min_tokens, 3);
      const dkv = db.kv_transfer_params as Record<string, unknown>;
      for (const [k, v] of Object.entries(row.decodeParams)) assert.deepEqual(dkv[k], v, `D ${k}`);
    });
  }

  test("moriio request id carries both peers' zmq addresses", () => {
    const proto = pdProtocols.moriio;
    const id = proto.requestId!("chatcmpl-0123456789abcdef0123456789abcdef", P, D);
    assert.equal(
      id,
      "___prefill_addr_host:10.1.1.1,handshake:6301,notify:61005___decode_addr_host:10.2.2.2,handshake:6302,notify:61006_0123456789abcdef0123456789abcdef",
    );
    assert.equal(moriioZmqAddress({ ...D, connector: { kind: "moriio" } }), null);
    assert.equal(proto.requestId!("plain", P, { ...D, connector: { kind: "moriio" } }), "plain");
  });
});

describe("concurrent protocols", () => {
  test("mooncake: same transfer_id both sides; D gets bootstrap addr, engine id from /query, dp rank", () => {
    const proto = pdProtocols.mooncake;
    assert.equal(proto.mode, "concurrent");
    if (proto.mode !== "concurrent") return;
    assert.equal(proto.peerInfo!(P).url, "http://10.1.1.1:9001/query");
    const { prefill, decode } = proto.bodies(input({ engine_id: "mc-eng" }));
    const pk = prefill.kv_transfer_params as Record<string, unknown>;
    const dk = decode.kv_transfer_params as Record<string, unknown>;
    assert.match(String(pk.transfer_id), /^xfer-[0-9a-f-]{36}$/);
    assert.equal(pk.transfer_id, dk.transfer_id);
    assert.equal(pk.do_remote_decode, true);
    assert.equal(prefill.max_tokens, 1);
    assert.equal(prefill.stream, false);
    assert.deepEqual(
      { ...dk, transfer_id: 0 },
      {
        infera_retention: "short",
        do_remote_decode: false,
        do_remote_prefill: true,
        remote_bootstrap_addr: "http://10.1.1.1:9001",
        remote_engine_id: "mc-eng",
        remote_dp_rank: 2,
        transfer_id: 0,
      },
    );
    assert.equal(decode.stream, true);
    assert.notEqual(proto.bodies(input()).prefill.kv_transfer_params, pk, "fresh id per request");
  });

  test("mooncake /query shapes", () => {
    assert.equal(engineIdFromQuery({ engine_id: "a" }, 0), "a");
    assert.equal(engineIdFromQuery({ dp_ranks: { "1": { engine_id: "b" } } }, 1), "b");
    assert.equal(engineIdFromQuery({ "0": { engine_id: "c" } }, 0), "c");
    assert.equal(engineIdFromQuery({}, 0), null);
  });

  test("sglang: identical bodies with bootstrap host/port/room", () => {
    const proto = pdProtocols.sglang;
    if (proto.mode !== "concurrent") throw new Error("sglang must be concurrent");
    const { prefill, decode } = proto.bodies(input());
    assert.deepEqual(prefill, decode);
    assert.equal(prefill.bootstrap_host, "10.1.1.1");
    assert.equal(prefill.bootstrap_port, 9001);
    const room = prefill.bootstrap_room as number;
    assert.ok(Number.isSafeInteger(room) && room >= 0);
    assert.equal(prefill.stream, true);
    assert.equal(prefill.max_tokens, 50);
    const { prefill: p2 } = proto.bodies({ ...input(), prefill: { ...P, connector: { kind: "sglang" } } });
    assert.equal(p2.bootstrap_port, 8998, "default bootstrap port");
    assert.equal(p2.bootstrap_host, "10.0.0.2", "host from the URL when the record names none");
  });
});
