import assert from "node:assert/strict";
import { test } from "node:test";
import { Command } from "commander";
import { addNatsOptions, resolveTransport } from "../../../src/transport/nats/cli-options.ts";
import { buildConnectionOptions } from "../../../src/transport/nats/connection.ts";
import { decodeControl, encodeControl } from "../../../src/transport/nats/frames.ts";
import { KvRing } from "../../../src/transport/nats/kv-ring.ts";
import {
  decodeReplayEnd,
  decodeReplayRequest,
  encodeKvMessage,
  encodeReplayEnd,
  encodeReplayRequest,
  kvPayload,
  readKvSeq,
  seqFrame,
} from "../../../src/transport/nats/kv-wire.ts";
import { kvSubject, requestSubject, subjectToken } from "../../../src/transport/nats/subjects.ts";

test("subject tokens are NATS-safe", () => {
  assert.equal(subjectToken("meta-llama/Llama-3.1-8B"), "meta-llama/Llama-3_1-8B");
  assert.equal(subjectToken("a*b>c d\te.f"), "a_b_c_d_e_f");
  assert.equal(subjectToken(""), "_");
  assert.equal(requestSubject("m.1", "host:8000"), "infera.req.m_1.host:8000");
  assert.equal(kvSubject("m", "w.2"), "infera.kv.m.w_2");
  // Exactly four tokens whatever the names contain.
  assert.equal(requestSubject("a.b.c", "*.>").split(".").length, 4);
});

test("control frames round-trip; short frames are rejected", () => {
  assert.deepEqual(decodeControl(encodeControl(0x43, 123456)), [0x43, 123456]);
  assert.equal(decodeControl(new Uint8Array(3)), undefined);
});

test("kv wire: seq and payload survive byte for byte", () => {
  const payload = Buffer.from([1, 2, 3, 255]);
  const m = encodeKvMessage(seqFrame(7), payload);
  assert.equal(readKvSeq(m), 7);
  assert.deepEqual(Buffer.from(kvPayload(m)), payload);
  assert.deepEqual(decodeReplayRequest(encodeReplayRequest(42, 10)), { start: 42, max: 10 });
  assert.deepEqual(decodeReplayEnd(encodeReplayEnd(3, 99)), { oldest: 3, next: 99 });
  assert.equal(decodeReplayEnd(m), undefined);
  assert.equal(readKvSeq(new Uint8Array(2)), undefined);
});

test("kv ring keeps the newest batches in order and clears on a seq reset", () => {
  const r = new KvRing(3);
  for (let s = 0; s < 5; s++) r.push(s, Buffer.from([s]));
  assert.equal(r.oldest, 2);
  assert.equal(r.newest, 4);
  const seen: number[] = [];
  r.forEachFrom(3, 0, (s) => seen.push(s));
  assert.deepEqual(seen, [3, 4]);
  const two: number[] = [];
  r.forEachFrom(0, 2, (s) => two.push(s));
  assert.deepEqual(two, [2, 3]);
  r.push(0, Buffer.from([9]));
  assert.equal(r.size, 1);
  assert.equal(r.oldest, 0);
});

test("connection options pass auth and TLS through", () => {
  const o = buildConnectionOptions({
    url: "tls://a:1, nats://b:2",
    user: "u",
    password: "p",
    tls: { caFile: "/ca.pem" },
  });
  assert.deepEqual(o.servers, ["tls://a:1", "nats://b:2"]);
  assert.equal(o.user, "u");
  assert.equal(o.pass, "p");
  assert.equal(o.tls?.caFile, "/ca.pem");
  assert.equal(o.maxReconnectAttempts, -1);
  assert.equal(buildConnectionOptions({ url: "nats://x:1", token: "t" }).token, "t");
  assert.equal(buildConnectionOptions({ url: "nats://x:1" }).tls, undefined);
  assert.throws(() => buildConnectionOptions({ url: " , " }));
});

test("planes default to http + zmq without a NATS URL, nats with one", () => {
  const parse = (argv: string[]) => {
    const cmd = addNatsOptions(new Command("x").exitOverride());
    cmd.parse(argv, { from: "user" });
    return resolveTransport(cmd.opts());
  };
  assert.deepEqual(parse([]), { requestPlane: "http", eventPlane: "zmq" });
  const n = parse(["--nats-url", "nats://h:4222", "--nats-token", "s3"]);
  assert.equal(n.requestPlane, "nats");
  assert.equal(n.eventPlane, "nats");
  assert.equal(n.nats?.token, "s3");
  const mixed = parse(["--nats-url", "nats://h:4222", "--event-plane", "zmq"]);
  assert.equal(mixed.eventPlane, "zmq");
  assert.throws(() => parse(["--request-plane", "nats"]), /nats-url/);
});
