/**
 * Generators of bad requests for the fuzz test, from a seeded PRNG so a failing case can be
 * reproduced. Every case is wrong in at least one way the server must refuse with a 4xx.
 */

export type Rng = () => number;

/** mulberry32 */
export function rng(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const pick = <T>(r: Rng, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
const int = (r: Rng, n: number): number => Math.floor(r() * n);

export interface HttpCase {
  kind: string;
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Buffer | null;
}

export const CHAT = "/v1/chat/completions";
export const COMPLETIONS = "/v1/completions";
export const MODEL = "fuzz-model";

const validChat = (): Record<string, unknown> => ({
  model: MODEL,
  messages: [{ role: "user", content: "hello" }],
  max_tokens: 4,
});
const validCompletion = (): Record<string, unknown> => ({ model: MODEL, prompt: "hello", max_tokens: 4 });

const json = (v: unknown): Buffer => Buffer.from(JSON.stringify(v));
const post = (kind: string, path: string, body: Buffer): HttpCase => ({
  kind,
  method: "POST",
  path,
  headers: { "content-type": "application/json" },
  body,
});

/** Text that is not JSON, or not complete JSON. */
export function malformedJson(r: Rng): HttpCase {
  const good = JSON.stringify(r() < 0.5 ? validChat() : validCompletion());
  const variants = [
    () => good.slice(0, 1 + int(r, good.length - 2)),
    () => good.replace(/"/g, "'"),
    () => good.replace("}", ",}"),
    () => `${good}}`,
    () => good.replace(":", ""),
    () => good.replace(/4/, "NaN"),
    () => good.replace(/4/, "0x10"),
    () => Buffer.from(Array.from({ length: 1 + int(r, 200) }, () => 32 + int(r, 95))).toString("latin1"),
    () => "",
    () => "{".repeat(1 + int(r, 50)),
    () => `{"model": "${MODEL}", "messages": [`,
    () => good.replace("{", "{\u0000"),
    () => "undefined",
    () => `[${good}`,
  ];
  return post("malformed-json", r() < 0.7 ? CHAT : COMPLETIONS, Buffer.from(pick(r, variants)()));
}

const WRONG_VALUES: readonly unknown[] = [null, true, -1, 0, 1.5, "", "str", [], [1, 2], {}, { a: 1 }, -1e20];

/** Well-formed JSON with one field of the wrong type or out of range. */
export function wrongTypes(r: Rng): HttpCase {
  const chat = r() < 0.65;
  const body = chat ? validChat() : validCompletion();
  const roll = r();
  if (roll < 0.08) {
    // Not an object at all.
    return post("wrong-type", chat ? CHAT : COMPLETIONS, json(pick(r, [null, 1, "x", [], [body], true])));
  }
  if (roll < 0.18) delete body.model;
  else if (roll < 0.28) delete body[chat ? "messages" : "prompt"];
  // Only the fields the router validates: the rest (sampling parameters, limits, logprobs) pass
  // through to the engine, which judges them (see src/protocol/openai.ts).
  const fields = chat
    ? ["model", "messages", "stream", "stream_options", "cache_salt", "kv_transfer_params"]
    : ["model", "prompt", "stream", "stream_options", "cache_salt", "kv_transfer_params"];
  if (roll >= 0.28) {
    const field = pick(r, fields);
    let v = pick(r, WRONG_VALUES);
    // Values that would be valid for the field are swapped for surely-invalid ones.
    if (field === "stream" && (v === true || v === null)) v = "yes";
    if (field === "stream_options" && (v === null || (typeof v === "object" && !Array.isArray(v)))) v = "on";
    if (field === "cache_salt" && (typeof v === "string" || v === null)) v = 5;
    if (field === "kv_transfer_params" && (v === null || (typeof v === "object" && !Array.isArray(v))))
      v = "p";
    if (field === "messages" && Array.isArray(v) && v.length === 2) v = [{ role: 1 }];
    if (field === "prompt" && Array.isArray(v) && v.length === 2) v = [[-1]];
    if (field === "prompt" && typeof v === "string") v = 5;
    if (field === "model" && v === "str") v = "";
    body[field] = v;
  }
  if (chat && roll >= 0.9) {
    body.messages = [
      pick(r, [{ role: 5, content: "x" }, { content: "x" }, { role: "user", content: 5 }, "hi", null]),
    ];
  }
  return post("wrong-type", chat ? CHAT : COMPLETIONS, json(body));
}

/** Big (but under the body limit) wrong-typed fields, deep nesting, long unknown model names. */
export function hugeFields(r: Rng, limit: number): HttpCase {
  const room = limit - 512;
  const big = "x".repeat(Math.max(1, Math.floor(room * (0.3 + 0.6 * r()))));
  const variants: (() => Buffer)[] = [
    () => json({ ...validChat(), messages: big }),
    () => json({ ...validChat(), model: { name: big } }),
    () => json({ ...validChat(), stream: big }),
    () => json({ ...validCompletion(), prompt: Array.from({ length: Math.floor(room / 4) }, () => -1) }),
    () => json({ ...validChat(), model: `no-such-model-${big}` }),
    () => json({ ...validChat(), stream_options: Array.from({ length: Math.floor(room / 6) }, () => 1) }),
    () => {
      // Nested past the depth limit in a field the router does not read.
      const depth = 200 + int(r, Math.floor(room / 2) - 200);
      return Buffer.from(
        `{"model":"${MODEL}","messages":[{"role":"user","content":"x"}],"x":${"[".repeat(depth)}${"]".repeat(depth)}}`,
      );
    },
    () => {
      const depth = 100 + int(r, Math.floor(room / 2) - 100);
      return Buffer.from(`{"model":"${MODEL}","messages":${"[".repeat(depth)}${"]".repeat(depth)}}`);
    },
    () => Buffer.from(`{"model":"${MODEL}","messages":[{"role":"user","content":"${"\\u".repeat(8)}"}]}`),
  ];
  return post("huge-field", r() < 0.8 ? CHAT : COMPLETIONS, pick(r, variants)());
}

/** JSON whose strings carry bytes that are not UTF-8. */
export function invalidUtf8(r: Rng): HttpCase {
  const bad = pick(r, [
    [0xff],
    [0xc3, 0x28],
    [0xed, 0xa0, 0x80],
    [0xf8, 0x88, 0x80, 0x80, 0x80],
    [0xe2, 0x82],
    [0xc0, 0xaf],
    [0x80],
  ]);
  const text = JSON.stringify(r() < 0.5 ? validChat() : { ...validChat(), model: "m\u00e9" });
  const at = text.indexOf("hello") + int(r, 5);
  const body = Buffer.concat([Buffer.from(text.slice(0, at)), Buffer.from(bad), Buffer.from(text.slice(at))]);
  return post("invalid-utf8", CHAT, body);
}

/** Known paths with the wrong method, unknown paths, odd query strings and headers. */
export function oddRoutes(r: Rng): HttpCase {
  const body = json(validChat());
  return pick(r, [
    (): HttpCase => ({ kind: "bad-route", method: "GET", path: CHAT, headers: {}, body: null }),
    (): HttpCase => ({ kind: "bad-route", method: "PUT", path: COMPLETIONS, headers: {}, body }),
    (): HttpCase => ({ kind: "bad-route", method: "DELETE", path: "/v1/models", headers: {}, body: null }),
    (): HttpCase => ({ kind: "bad-route", method: "POST", path: "/v1/models", headers: {}, body }),
    (): HttpCase => ({ kind: "bad-route", method: "POST", path: `/v1/${int(r, 1e6)}`, headers: {}, body }),
    (): HttpCase => ({
      kind: "bad-route",
      method: "GET",
      path: "/v1/chat/completions/../../etc",
      headers: {},
      body: null,
    }),
    (): HttpCase => ({ kind: "bad-route", method: "PATCH", path: "/health", headers: {}, body: null }),
    (): HttpCase => ({
      kind: "bad-header",
      method: "POST",
      path: `${CHAT}?stream=true&${"a=b&".repeat(int(r, 50))}`,
      headers: { "content-type": "text/plain", "x-request-id": "\t".repeat(3) },
      body: Buffer.from("not json"),
    }),
    (): HttpCase => ({
      kind: "bad-header",
      method: "POST",
      path: CHAT,
      headers: { "content-type": "application/json; charset=latin1", authorization: "Bearer" },
      body: Buffer.from('{"model":5}'),
    }),
  ])();
}

/** Raw HTTP/1.1 byte sequences with broken framing or headers (sent on their own socket). */
export function badFraming(r: Rng, limit: number): { kind: string; bytes: Buffer } {
  const good = JSON.stringify(validChat());
  const head = (h: string) => `POST ${CHAT} HTTP/1.1\r\nhost: x\r\n${h}\r\n`;
  return pick(r, [
    () => ({ kind: "bad-header", bytes: Buffer.from(`${head("content-length: abc\r\n")}${good}`) }),
    () => ({ kind: "bad-header", bytes: Buffer.from(`${head("content-length: -5\r\n")}${good}`) }),
    () => ({
      kind: "bad-header",
      bytes: Buffer.from(`${head(`content-length: 3\r\ncontent-length: ${good.length}\r\n`)}${good}`),
    }),
    () => ({
      kind: "bad-header",
      bytes: Buffer.from(
        `${head(`content-length: ${good.length}\r\ntransfer-encoding: chunked\r\n`)}${good}`,
      ),
    }),
    () => ({ kind: "bad-header", bytes: Buffer.from(`${head("bad header: x\r\ncontent-length: 0\r\n")}`) }),
    () => ({ kind: "bad-header", bytes: Buffer.from(`${head("no-colon-here\r\ncontent-length: 0\r\n")}`) }),
    () => ({
      kind: "bad-header",
      bytes: Buffer.from(`${head("x-a: \u0000\u0001\r\ncontent-length: 0\r\n")}`),
    }),
    () => ({ kind: "bad-header", bytes: Buffer.from(`${head(`x-big: ${"a".repeat(20_000)}\r\n`)}`) }),
    () => ({ kind: "bad-header", bytes: Buffer.from(`P@ST ${CHAT} HTTP/1.1\r\nhost: x\r\n\r\n`) }),
    () => ({ kind: "bad-header", bytes: Buffer.from(`POST ${CHAT} HTTP/9.9\r\nhost: x\r\n\r\n`) }),
    () => ({
      kind: "bad-header",
      bytes: Buffer.from(`${head("transfer-encoding: chunked\r\n")}zz\r\n${good}\r\n0\r\n\r\n`),
    }),
    () => ({
      kind: "oversized",
      bytes: Buffer.from(`${head(`content-length: ${limit + 1 + int(r, limit)}\r\n`)}${"x".repeat(1024)}`),
    }),
    () => {
      // Chunked, no declared length: refused once the received bytes pass the limit.
      const chunk = "y".repeat(16 * 1024);
      const n = Math.ceil(limit / chunk.length) + 1 + int(r, 3);
      const chunks = Array.from({ length: n }, () => `${chunk.length.toString(16)}\r\n${chunk}\r\n`).join("");
      return {
        kind: "oversized",
        bytes: Buffer.from(`${head("transfer-encoding: chunked\r\n")}${chunks}0\r\n\r\n`),
      };
    },
  ])();
}
