import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Unpackr } from "msgpackr";
import { Subscriber } from "zeromq";
import { type SimHandle, startSimEngine } from "../../../src/engine/sim/server.ts";

process.env.INFERA_LOG_LEVEL ??= "warn";

describe("startSimEngine (in-process) with ZMQ-chosen event ports", () => {
  let sim: SimHandle;

  before(async () => {
    sim = await startSimEngine({
      model: "inproc",
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      kvEvents: { endpoint: "tcp://127.0.0.1:*", replay_endpoint: "tcp://127.0.0.1:*", topic: "" },
    });
  });
  after(async () => {
    await sim?.close();
  });

  it("reports the bound endpoints and publishes on them", async () => {
    assert.match(sim.kvEndpoint ?? "", /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.match(sim.replayEndpoint ?? "", /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.notEqual(sim.kvEndpoint, sim.replayEndpoint);
    const sub = new Subscriber();
    sub.connect(sim.kvEndpoint!);
    sub.subscribe();
    await new Promise((r) => setTimeout(r, 200));
    try {
      const r = await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "inproc",
          prompt: Array.from({ length: 40 }, (_, i) => i + 1),
          max_tokens: 1,
        }),
      });
      assert.equal(r.status, 200);
      const [topic, seq, payload] = await sub.receive();
      assert.equal(topic.length, 0);
      assert.equal(seq.readBigUInt64BE(0), 0n);
      const batch = new Unpackr({ int64AsType: "bigint" }).unpack(payload) as unknown[];
      const ev = (batch[1] as unknown[][])[0];
      assert.equal(ev[0], "BlockStored");
      assert.deepEqual(
        ev[3],
        Array.from({ length: 32 }, (_, i) => i + 1),
      );
    } finally {
      sub.close();
    }
  });
});

describe("ATOM event framing (--kv-events-framing atom)", () => {
  let sim: SimHandle;
  before(async () => {
    sim = await startSimEngine({
      model: "atom-like",
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      kvEventsFraming: "atom",
      kvEvents: { endpoint: "tcp://127.0.0.1:*", replay_endpoint: "tcp://127.0.0.1:*", topic: "" },
    });
  });
  after(async () => {
    await sim?.close();
  });

  it("sends one frame [payload] without a sequence frame, and no replay socket", async () => {
    assert.equal(sim.replayEndpoint, null);
    const sub = new Subscriber();
    sub.connect(sim.kvEndpoint!);
    sub.subscribe();
    await new Promise((r) => setTimeout(r, 200));
    try {
      await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "atom-like",
          prompt: Array.from({ length: 20 }, (_, i) => i + 7),
          max_tokens: 1,
        }),
      }).then((r) => r.json());
      const frames = await sub.receive();
      assert.equal(frames.length, 1);
      const batch = new Unpackr({ int64AsType: "bigint" }).unpack(frames[0]) as unknown[];
      assert.equal((batch[1] as unknown[][])[0][0], "BlockStored");
    } finally {
      sub.close();
    }
  });
});

describe("--api-key", () => {
  let sim: SimHandle;
  before(async () => {
    sim = await startSimEngine({
      model: "keyed",
      host: "127.0.0.1",
      port: 0,
      speed: 100,
      kvEvents: null,
      apiKey: "k1",
    });
  });
  after(async () => {
    await sim?.close();
  });

  it("requires the bearer token on /v1 routes only", async () => {
    const no = await fetch(`${sim.url}/v1/models`);
    assert.equal(no.status, 401);
    assert.equal(((await no.json()) as { error: { type: string } }).error.type, "authentication_error");
    const yes = await fetch(`${sim.url}/v1/models`, { headers: { authorization: "Bearer k1" } });
    assert.equal(yes.status, 200);
    assert.equal((await fetch(`${sim.url}/health`)).status, 200);
  });
});
