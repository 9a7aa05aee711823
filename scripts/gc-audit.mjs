// A preload for hunting load- and GC-dependent test flakes (not used by the test suite itself):
//
//   NODE_OPTIONS="--expose-gc --import ./scripts/gc-audit.mjs" GC_AUDIT_LOG=/tmp/gc.jsonl \
//     node scripts/run-tests.mjs test/server
//
// 1. In every test process (argv names a *.test.ts) it calls gc() every GC_AUDIT_MS (100 ms):
//    an object nothing references is collected within that, not "some time later".
// 2. In every process it logs, one JSON line each, the fetch() Response streams undici cancels
//    because their Response was garbage-collected (its FinalizationRegistry's reason names it):
//    the URL, the content type, the age and the stack of the fetch() call. A streamed answer a
//    test holds open without reading it (a worker kept busy, a request kept in flight) is
//    cancelled there, and the server sees the client leave early (CI's flow.test flake, fixed in
//    c4519a9). The cure is to read the body (or pipe it to a sink) while it must stay open.
//
// Slower processes also bring out time limits that only a loaded box reaches.
import { appendFileSync } from "node:fs";

const LOG = process.env.GC_AUDIT_LOG ?? "gc-audit.jsonl";
const info = new WeakMap();
const cancel = ReadableStream.prototype.cancel;
ReadableStream.prototype.cancel = function auditedCancel(reason) {
  if (typeof reason === "string" && reason.includes("garbage collected")) {
    const i = info.get(this) ?? {};
    const line = { pid: process.pid, argv: process.argv.slice(1).join(" ").slice(0, 200), ...i };
    appendFileSync(LOG, `${JSON.stringify({ ...line, ageMs: i.t0 ? Date.now() - i.t0 : null })}\n`);
  }
  return cancel.call(this, reason);
};
const realFetch = globalThis.fetch;
globalThis.fetch = async function auditedFetch(input, init) {
  const stack = (new Error().stack ?? "").split("\n").slice(2, 9).join("\n");
  const res = await realFetch(input, init);
  if (res.body) {
    const url = String(input?.url ?? input);
    info.set(res.body, { url, contentType: res.headers.get("content-type"), stack, t0: Date.now() });
  }
  return res;
};
if (typeof globalThis.gc === "function" && process.argv.some((a) => a.endsWith(".test.ts")))
  setInterval(() => globalThis.gc(), Number(process.env.GC_AUDIT_MS ?? 100)).unref();
