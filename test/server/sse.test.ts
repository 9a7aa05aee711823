import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SseUsageFilter } from "../../src/server/sse.ts";
import { Mulberry32 } from "../../src/util/mulberry32.ts";

const ev = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;

describe("SseUsageFilter", () => {
  const stream =
    ev({ choices: [{ delta: { content: "a" } }] }) +
    ev({ choices: [{ delta: { content: "b" } }] }) +
    ev({ choices: [], usage: { prompt_tokens: 7, completion_tokens: 2 } }) +
    "data: [DONE]\n\n";

  function run(strip: boolean, cuts: number[]): { out: string; usage: unknown } {
    const f = new SseUsageFilter(strip);
    const buf = Buffer.from(stream);
    let out = "";
    let prev = 0;
    for (const c of [...cuts, buf.length]) {
      out += f.push(buf.subarray(prev, c)).toString();
      prev = c;
    }
    out += f.flush().toString();
    return { out, usage: f.usage };
  }

  it("passes everything through and reads usage when the client asked", () => {
    for (const cuts of [[], [5], [30, 31, 90, 100, 150], Array.from({ length: 40 }, (_, i) => i * 5)]) {
      const r = run(false, cuts);
      assert.equal(r.out, stream);
      assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 2 });
    }
  });

  it("strips only the usage-only chunk when the server added include_usage", () => {
    for (const cuts of [[], [17], Array.from({ length: 60 }, (_, i) => i * 3)]) {
      const r = run(true, cuts);
      assert.equal(
        r.out,
        stream.replace(ev({ choices: [], usage: { prompt_tokens: 7, completion_tokens: 2 } }), ""),
      );
      assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 2 });
    }
  });
});

/**
 * The filter's specification as plain string code (latin1: one character per byte): events
 * are split at every "\n\n" from the start; every line must be a `data:` line holding a JSON
 * object or [DONE], a comment, an SSE field, or blank; events mentioning "usage" give their
 * token counts (the last that has any wins) and, when stripping, a usage event with
 * `"choices":[]` is dropped. The filter searches bytes natively and skips the events without
 * usage; it must answer exactly what this answers, however the stream is cut.
 */
class ReferenceFilter {
  usage: unknown = null;
  invalid = false;
  private pending = "";
  private readonly strip: boolean;
  constructor(strip: boolean) {
    this.strip = strip;
  }

  push(chunk: string): string {
    const buf = this.pending + chunk;
    this.pending = "";
    const last = buf.lastIndexOf("\n\n");
    if (last < 0) {
      this.pending = buf;
      return "";
    }
    this.pending = buf.slice(last + 2);
    const complete = buf.slice(0, last + 2);
    if (!complete.split("\n").every(validLine)) {
      this.invalid = true;
      this.pending = "";
      return "";
    }
    const events: string[] = [];
    for (let at = 0; at < complete.length; ) {
      const stop = complete.indexOf("\n\n", at);
      const end = stop < 0 ? complete.length : stop + 2;
      events.push(complete.slice(at, end));
      at = end;
    }
    return events.filter((e) => this.keep(e)).join("");
  }

  flush(): string {
    const p = this.pending;
    this.pending = "";
    if (p.trim() !== "" && !p.split("\n").every(validLine)) {
      this.invalid = true;
      return "";
    }
    return p;
  }

  private keep(ev: string): boolean {
    const at = ev.indexOf('"usage"');
    if (at < 0) return true;
    const tail = ev.slice(at);
    const p = /"prompt_tokens"\s*:\s*(\d+)/.exec(tail);
    const c = /"completion_tokens"\s*:\s*(\d+)/.exec(tail);
    if (p || c) {
      this.usage = {
        prompt_tokens: p ? Number(p[1]) : undefined,
        completion_tokens: c ? Number(c[1]) : undefined,
      };
    }
    return !(this.strip && ev.includes('"choices":[]'));
  }
}

function validLine(raw: string): boolean {
  const line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
  if (line === "" || line.startsWith(":")) return true;
  if (line.startsWith("data:")) {
    const v = line.slice(line[5] === " " ? 6 : 5).replace(/[ \t]+$/, "");
    return v === "[DONE]" || (v.length >= 2 && v.startsWith("{") && v.endsWith("}"));
  }
  return ["event:", "id:", "retry:"].some((f) => line.startsWith(f));
}

describe("SseUsageFilter against its specification", () => {
  const data = (o: unknown) => `data: ${JSON.stringify(o)}`;
  // Events an engine sends, and some it should not (the last three are invalid).
  const parts = [
    () => `${data({ id: "c", choices: [{ delta: { content: "usage of a page" } }] })}\n\n`,
    () => `${data({ choices: [{ delta: { content: 'say "usage" twice' } }] })}\n\n`,
    (n: number) => `${data({ choices: [], usage: { prompt_tokens: n, completion_tokens: n + 1 } })}\n\n`,
    (n: number) =>
      `${data({ choices: [{ delta: {} }], usage: { prompt_tokens: n, completion_tokens: 2 } })}\n\n`,
    (n: number) => `data:${JSON.stringify({ choices: [], usage: { completion_tokens: n } })}\r\n\r\n`,
    () => `${data({ usage: null, choices: [{ delta: { content: "[]" } }] })}\n\n`,
    () => ": keep-alive\n\n",
    () => "event: message\nid: 7\n\n",
    () => "\n\n\n",
    () => "\n",
    () => "data: [DONE]\n\n",
    () => "garbage line\n\n",
    () => "data: [1,2]\n\n",
    () => 'data: "usage"\n\n',
  ];

  it("forwards, strips and reads usage as the specification does, cut anywhere", () => {
    const rnd = new Mulberry32(32);
    const pick = (n: number) => Math.floor(rnd.next() * n);
    for (let round = 0; round < 3000; round++) {
      const valid = round % 4 !== 0;
      let stream = "";
      for (let i = 0, n = 1 + pick(8); i < n; i++)
        stream += parts[pick(valid ? parts.length - 3 : parts.length)]!(i);
      const bytes = Buffer.from(stream, "latin1");
      const cuts = Array.from({ length: pick(6) }, () => pick(bytes.length)).sort((a, b) => a - b);
      for (const strip of [true, false]) {
        const f = new SseUsageFilter(strip);
        const ref = new ReferenceFilter(strip);
        let out = "";
        let want = "";
        let prev = 0;
        for (const c of [...cuts, bytes.length]) {
          out += f.push(bytes.subarray(prev, c)).toString("latin1");
          want += ref.push(stream.slice(prev, c));
          prev = c;
        }
        out += f.flush().toString("latin1");
        want += ref.flush();
        const what = `stream ${JSON.stringify(stream)} cut at ${cuts}, strip ${strip}`;
        assert.equal(out, want, what);
        assert.deepEqual(f.usage, ref.usage, what);
        assert.equal(f.invalid, ref.invalid, what);
      }
    }
  });
});
