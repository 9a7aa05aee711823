/**
 * Large request bodies parsed off the event loop (issue #17 item 1): the worker-thread pool
 * parses exactly like `JSON.parse` on the loop (same values, same errors, the depth limit),
 * is bounded (503 past its queue), and a dead worker fails only its own body (500) while the
 * server keeps serving. Through a real server: the engine receives the client's bytes.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { request } from "undici";
import { MemoryDiscovery } from "../../src/discovery/memory.ts";
import { completeRecord } from "../../src/discovery/static.ts";
import { InvalidJsonError } from "../../src/protocol/errors.ts";
import { MAX_BODY_DEPTH } from "../../src/protocol/openai.ts";
import type { RoutedEndpoint } from "../../src/router/types.ts";
import {
  BodyParserBusyError,
  BodyParserFailedError,
  BodyParserPool,
  longStringHead,
  OFF_LOOP_BODY_BYTES,
  parseBodySync,
} from "../../src/server/body-parser-pool.ts";
import { type InferaServer, startServer } from "../../src/server/index.ts";
import { ROUTING_TEXT_CAP } from "../../src/server/prompt-tokens.ts";
import { ServerRoutingRequest } from "../../src/server/routing-request.ts";
import { getDefaultTokenizer } from "../../src/tokenizer/tokenizer.ts";

/** A deterministic PRNG so a failing body can be reproduced. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const KEYS = ["model", "__proto__", "constructor", "toString", "1", "01", "", "é", "a b", "\u0000", "😀"];
const NUMBERS = [0, -0, 1, -1, 1e308, -1e-308, 2 ** 53 + 2, 0.1, 123456789.123, 5e-324];

function randomString(r: () => number, maxLen: number): string {
  const n = Math.floor(r() * maxLen);
  let s = "";
  for (let i = 0; i < n; i++) {
    const k = r();
    if (k < 0.5) s += String.fromCharCode(0x20 + Math.floor(r() * 95));
    else if (k < 0.7) s += String.fromCharCode(0x4e00 + Math.floor(r() * 20_000));
    else if (k < 0.8) s += String.fromCodePoint(0x1f600 + Math.floor(r() * 80));
    else if (k < 0.9)
      s += String.fromCharCode(Math.floor(r() * 0x20)); // control chars: escaped
    else s += '"\\/';
  }
  return s;
}

function randomValue(r: () => number, depth: number): unknown {
  const k = r();
  if (depth <= 0 || k < 0.3) {
    const p = r();
    if (p < 0.4) return randomString(r, 40);
    if (p < 0.7) return NUMBERS[Math.floor(r() * NUMBERS.length)]! * (r() < 0.5 ? 1 : r() * 1000);
    if (p < 0.85) return r() < 0.5;
    return null;
  }
  if (k < 0.6) return Array.from({ length: Math.floor(r() * 6) }, () => randomValue(r, depth - 1));
  const o: Record<string, unknown> = {};
  const n = Math.floor(r() * 6);
  for (let i = 0; i < n; i++) {
    const key = r() < 0.5 ? KEYS[Math.floor(r() * KEYS.length)]! : randomString(r, 8);
    Object.defineProperty(o, key, {
      value: randomValue(r, depth - 1),
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return o;
}

/** `value` and `expected` are the same JSON value: structure, key order, own "__proto__" keys, -0. */
function assertSameJson(value: unknown, expected: unknown, path = "$"): void {
  if (expected === null || typeof expected !== "object") {
    assert.ok(Object.is(value, expected), `${path}: ${String(value)} vs ${String(expected)}`);
    return;
  }
  assert.equal(Object.getPrototypeOf(value), Object.getPrototypeOf(expected), `${path}: prototype`);
  const keys = Reflect.ownKeys(expected as object);
  assert.deepEqual(Reflect.ownKeys(value as object), keys, `${path}: keys`);
  for (const key of keys) {
    if (key === "length" && Array.isArray(expected)) continue;
    const d = Object.getOwnPropertyDescriptor(expected, key)!;
    const v = Object.getOwnPropertyDescriptor(value, key)!;
    assertSameJson(v.value, d.value, `${path}.${String(key)}`);
  }
}

const nested = (depth: number): string => `${"[".repeat(depth)}${"]".repeat(depth)}`;

async function rejection(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (err) {
    return err as Error;
  }
  assert.fail("expected a rejection");
}

describe("BodyParserPool", () => {
  const pool = new BodyParserPool({ workers: 2 });
  after(() => pool.close());

  it("parses random JSON bodies exactly like JSON.parse, and hands the bytes back", async () => {
    const r = rng(17);
    for (let i = 0; i < 60; i++) {
      const value = randomValue(r, 1 + Math.floor(r() * 8));
      const text = r() < 0.3 ? JSON.stringify(value, null, 2) : JSON.stringify(value);
      const raw = Buffer.from(text);
      const copy = Buffer.from(raw);
      const got = await pool.parse(raw);
      assertSameJson(got.value, JSON.parse(text), `body ${i}`);
      assert.ok(got.raw.equals(copy), `body ${i}: bytes handed back unchanged`);
    }
  });

  it("long strings decoded here in slices: the same values as JSON.parse", async () => {
    // Every string of at least 1 character goes back as a span (8 per body at most).
    const spans = new BodyParserPool({ workers: 1, longStringChars: 1 });
    try {
      const r = rng(99);
      for (let i = 0; i < 60; i++) {
        const value = randomValue(r, 1 + Math.floor(r() * 8));
        const text = JSON.stringify(value);
        assertSameJson((await spans.parse(Buffer.from(text))).value, JSON.parse(text), `body ${i}`);
      }
      const mixed = "é😀中a".repeat(70_000); // chunk cuts land inside UTF-8 sequences
      const cases: unknown[] = [
        {
          model: "m",
          messages: [
            { role: "user", content: mixed },
            { role: "user", content: mixed },
          ],
        },
        JSON.parse(`{"__proto__":${JSON.stringify(mixed)},"x":[${JSON.stringify(mixed)}]}`),
        mixed, // a top-level string
        { escaped: `${mixed}"\\\n`, lone: `${mixed}\ud800` }, // not found verbatim / not well-formed: cloned
      ];
      for (const [i, value] of cases.entries()) {
        const text = JSON.stringify(value);
        assertSameJson((await spans.parse(Buffer.from(text))).value, JSON.parse(text), `case ${i}`);
      }
      assert.ok(spans.slicedStrings > 40, `${spans.slicedStrings} strings decoded in slices`);
    } finally {
      await spans.close();
    }
  });

  it("routing reads a long string's kept head: the same prompt text as from JSON.parse", async () => {
    const tok = getDefaultTokenizer();
    // Past the routing cap (1 Mi characters), so a head is kept apart.
    const long = "word, 😀 中文 ".repeat(120_000);
    const bodies: [RoutedEndpoint, Record<string, unknown>][] = [
      [
        "chat",
        {
          model: "m",
          messages: [
            { role: "system", content: "be brief" },
            { role: "user", content: long },
          ],
        },
      ],
      ["completion", { model: "m", prompt: long }],
      ["completion", { model: "m", prompt: [long, "second"] }],
    ];
    for (const [endpoint, body] of bodies) {
      const text = JSON.stringify(body);
      const got = (await pool.parse(Buffer.from(text))).value as Record<string, unknown>;
      const want = JSON.parse(text) as Record<string, unknown>;
      const a = new ServerRoutingRequest("r", "m", endpoint, got, false, undefined, tok);
      const b = new ServerRoutingRequest("r", "m", endpoint, want, false, undefined, tok);
      assert.equal(a.promptText(), b.promptText(), endpoint);
      assert.ok(a.promptText().length <= ROUTING_TEXT_CAP);
      assertSameJson(got, want);
    }
    const chat = (await pool.parse(Buffer.from(JSON.stringify(bodies[0]![1])))).value as {
      messages: object[];
    };
    assert.ok(longStringHead(chat.messages[1]!, "content"), "the head was kept apart for routing");
  });

  it("a 1 MB body: the value and the bytes survive the round trip", async () => {
    const content = "a".repeat(1_000_000);
    const text = JSON.stringify({ model: "m", messages: [{ role: "user", content }], max_tokens: 1 });
    const raw = Buffer.from(text);
    const got = await pool.parse(raw);
    assert.equal(raw.length, 0, "the buffer moved to the worker (transferred, not copied)");
    assert.equal((got.value as { messages: { content: string }[] }).messages[0]!.content, content);
    assert.ok(pool.slicedStrings > 0, "the 1 MB string was decoded here in slices, not cloned");
    assert.equal(got.raw.toString(), text);
  });

  it("a body that is a slice of a larger buffer is copied, the larger buffer left intact", async () => {
    const big = Buffer.from(`xx{"model":"m"}yy`);
    const got = await pool.parse(big.subarray(2, big.length - 2));
    assert.deepEqual(got.value, { model: "m" });
    assert.equal(big.toString(), `xx{"model":"m"}yy`);
  });

  it("invalid JSON: the same InvalidJsonError as the synchronous path", async () => {
    for (const text of ['{"model": "m",', "{'a':1}", "", "[1,2,]", '{"a":1}x', "\u00a0{}"]) {
      const sync = (() => {
        try {
          parseBodySync(Buffer.from(text));
        } catch (err) {
          return err as Error;
        }
        assert.fail(`sync path accepted ${text}`);
      })();
      const off = await rejection(pool.parse(Buffer.from(text)));
      assert.ok(off instanceof InvalidJsonError, `${text}: ${off}`);
      assert.equal(off.message, sync.message);
      assert.equal(off.status, 400);
      assert.equal(off.code, "invalid_json");
    }
  });

  it("the depth limit: MAX_BODY_DEPTH passes, one more is a 400 as on the loop", async () => {
    const ok = await pool.parse(Buffer.from(`{"a":${nested(MAX_BODY_DEPTH - 1)}}`));
    assert.ok(ok.value);
    const text = `{"a":${nested(MAX_BODY_DEPTH)}}`;
    const off = (await rejection(pool.parse(Buffer.from(text)))) as InvalidJsonError;
    const sync = (() => {
      try {
        parseBodySync(Buffer.from(text));
      } catch (err) {
        return err as InvalidJsonError;
      }
      assert.fail("sync path accepted a too-deep body");
    })();
    assert.equal(off.status, 400);
    assert.equal(off.code, "invalid_value");
    assert.equal(off.message, sync.message);
    // Far deeper than the stack allows a recursive check: still a 400, not a crash.
    const deep = (await rejection(pool.parse(Buffer.from(nested(200_000))))) as InvalidJsonError;
    assert.equal(deep.status, 400);
  });

  it("is bounded: past maxPending a body is refused with 503, the others are parsed", async () => {
    const small = new BodyParserPool({ workers: 1, maxPending: 2 });
    try {
      const body = () => Buffer.from(JSON.stringify({ model: "m", prompt: "x".repeat(200_000) }));
      const a = small.parse(body());
      const b = small.parse(body());
      const c = await rejection(small.parse(body()));
      assert.ok(c instanceof BodyParserBusyError);
      assert.equal((c as BodyParserBusyError).status, 503);
      assert.equal((c as BodyParserBusyError).headers["retry-after"], "1");
      assert.equal(small.size, 2);
      await Promise.all([a, b]);
      assert.equal(small.size, 0);
      await small.parse(body()); // room again
    } finally {
      await small.close();
    }
  });

  it("an idle pool does not keep the process alive; a body being parsed does", async () => {
    const mod = new URL("../../src/server/body-parser-pool.ts", import.meta.url).href;
    // The top-level await is only settled if the worker's answer arrives (a pool unref'd while
    // busy exits with 13); the process then exits on its own (a ref'd idle worker hangs it).
    const src = `import { BodyParserPool } from ${JSON.stringify(mod)};
      const r = await new BodyParserPool().parse(Buffer.from('{"a":1}'));
      console.log(JSON.stringify(r.value));`;
    const child = spawn(process.execPath, ["--input-type=module", "-e", src], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d;
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
    const [code, signal] = (await once(child, "exit")) as [number | null, string | null];
    clearTimeout(timer);
    assert.equal(signal, null, "the process did not exit by itself");
    assert.equal(code, 0);
    assert.equal(out.trim(), '{"a":1}');
  });

  it("a worker that dies fails only its own body; the next bodies get a fresh worker", async () => {
    const crashy = new BodyParserPool({ workers: 1, maxPending: 8, crashMarker: "CRASH-HERE" });
    try {
      const doomed = crashy.parse(Buffer.from('{"model":"CRASH-HERE"}'));
      const queued = crashy.parse(Buffer.from('{"model":"fine"}'));
      const err = await rejection(doomed);
      assert.ok(err instanceof BodyParserFailedError, String(err));
      assert.equal((err as BodyParserFailedError).status, 500);
      assert.deepEqual((await queued).value, { model: "fine" });
      assert.deepEqual((await crashy.parse(Buffer.from('{"n":1}'))).value, { n: 1 });
      assert.equal(crashy.crashes, 1);
    } finally {
      await crashy.close();
    }
  });
});

describe("the server with large bodies", () => {
  let engine: Server;
  let server: InferaServer;
  let pool: BodyParserPool;
  const received: Buffer[] = [];

  before(async () => {
    engine = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks);
        if (req.method === "POST") received.push(body);
        if (body.includes('"stream":true')) {
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.end('data: {"id":"x","object":"chat.completion.chunk","choices":[]}\n\ndata: [DONE]\n\n');
          return;
        }
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            id: "x",
            object: "chat.completion",
            model: "m",
            choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
          }),
        );
      });
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
    const memory = new MemoryDiscovery([
      completeRecord({ id: "w", url, model: "m", servedModelNames: ["m"], engine: "vllm", role: "mixed" }),
    ]);
    pool = new BodyParserPool({ workers: 1, crashMarker: "CRASH-HERE" });
    server = await startServer(
      { port: 0, host: "127.0.0.1", scrapeIntervalMs: 0, policy: "kv-aware", maxBodyBytes: 2 * 1024 * 1024 },
      { discovery: memory, bodyParser: pool },
    );
  });
  after(async () => {
    await server?.close();
    await pool?.close();
    await new Promise((r) => engine?.close(r));
  });

  const post = async (body: Buffer | string) => {
    const res = await request(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
    const text = await res.body.text();
    return {
      status: res.statusCode,
      text,
      json: () => JSON.parse(text) as { error: { code: string; message: string } },
    };
  };
  const big = (extra: Record<string, unknown> = {}, content = "é".repeat(OFF_LOOP_BODY_BYTES)) =>
    JSON.stringify({ model: "m", messages: [{ role: "user", content }], max_tokens: 1, ...extra });

  it("the engine receives the client's bytes (and the one spliced field of a stream)", async () => {
    const plain = `  ${big()}\n`;
    received.length = 0;
    assert.equal((await post(plain)).status, 200);
    assert.equal(received.length, 1);
    assert.equal(received[0]!.toString(), plain);

    const stream = big({ stream: true });
    received.length = 0;
    assert.equal((await post(stream)).status, 200);
    assert.equal(
      received[0]!.toString(),
      `${stream.slice(0, -1)},"stream_options":{"include_usage":true}}`,
      "stream_options spliced before the closing brace, the rest as sent",
    );
  });

  it("invalid JSON, invalid UTF-8, too deep, too large: the same 400/413 answers", async () => {
    const broken = big().slice(0, -1);
    const r1 = await post(broken);
    assert.equal(r1.status, 400);
    assert.equal(r1.json().error.code, "invalid_json");
    let expected = "";
    try {
      JSON.parse(broken);
    } catch (err) {
      expected = (err as Error).message;
    }
    assert.ok(r1.json().error.message.endsWith(expected), r1.json().error.message);

    const bad = Buffer.from(big());
    bad[100] = 0xff;
    const r2 = await post(bad);
    assert.equal(r2.status, 400);
    assert.equal(r2.json().error.code, "invalid_json");

    const r3 = await post(big({ deep: JSON.parse(nested(MAX_BODY_DEPTH + 5)) }));
    assert.equal(r3.status, 400);
    assert.equal(r3.json().error.code, "invalid_value");

    const r4 = await post(big({}, "x".repeat(3 * 1024 * 1024)));
    assert.equal(r4.status, 413);
  });

  it("a parser worker that dies: a 500 for that request only, the server keeps serving", async () => {
    const [doomed, fine] = await Promise.all([post(big({ user: "CRASH-HERE" })), post(big())]);
    assert.equal(doomed.status, 500);
    assert.equal(doomed.json().error.code, "body_parser_failed");
    assert.equal(fine.status, 200);
    assert.equal((await post(big())).status, 200);
    assert.equal((await post('{"model":"m","messages":[{"role":"user","content":"hi"}]}')).status, 200);
    const health = await request(`${server.url}/health`);
    assert.equal(health.statusCode, 200);
    await health.body.dump();
    assert.equal(pool.crashes, 1);
  });
});
