/**
 * OpenTelemetry request traces (issue #31 item 4), received by a real OTLP/HTTP endpoint in the
 * test: one connected tree per request — the client's `traceparent` as the root's parent, the
 * server's intake / route / upstream / stream spans under the root, and the engine's own span
 * under the upstream span whose context the server sent it — for a mixed request and for both
 * halves of a PD request.
 *
 * The engines' side is vLLM's: started with `--otlp-traces-endpoint`, vLLM parents its
 * `llm_request` span (SERVER kind) on the request's W3C `traceparent` header
 * (vllm-project/vllm vllm/v1/engine/output_processor.py `do_tracing` @
 * d07822605346f767b672503c9aae85aa23ef2d82; vllm/tracing/otel.py `extract_trace_context` @
 * 40eeb0c5e942e511bf73359f99265d72470c2f59). The W3C header format is the Trace Context
 * recommendation's: `00-<32 hex trace id>-<16 hex parent id>-<flags>`.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { otlpTracesUrl } from "../../src/server/tracing.ts";
import { type OtlpReceiver, type ReceivedSpan, startOtlpReceiver } from "../helpers/otlp-receiver.ts";
import { MODEL, type PdCluster, startPdCluster } from "../router/disagg/pd-cluster.ts";
import { type Cluster, startCluster } from "./cluster.ts";

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN = "00f067aa0ba902b7";

function byId(spans: ReceivedSpan[]): Map<string, ReceivedSpan> {
  return new Map(spans.map((s) => [s.spanId, s]));
}

/** Every span of `trace` reaches `root` through its parents: one connected tree. */
function assertConnected(spans: ReceivedSpan[], root: ReceivedSpan): void {
  const ids = byId(spans);
  for (const s of spans) {
    let at: ReceivedSpan | undefined = s;
    for (let hops = 0; at && at !== root && hops < 10; hops++) at = ids.get(at.parentSpanId);
    assert.equal(at, root, `span ${s.name} (${s.service}) is not under the request's root`);
  }
}

describe("tracing: mixed request (in-process server, two sims)", () => {
  let recv: OtlpReceiver;
  let c: Cluster;
  before(async () => {
    recv = await startOtlpReceiver();
    c = await startCluster(2, {
      simArgs: ["--speed", "100", "--seed", "1", "--otlp-traces-endpoint", recv.tracesUrl],
      config: { otlpEndpoint: recv.url },
    });
  });
  after(async () => {
    await c?.close();
    await recv?.close();
  });

  it("the client's traceparent parents the root; the engine's span hangs under the upstream span", async () => {
    const r = await c.client.chat.completions.create(
      { model: c.sims[0].model, messages: [{ role: "user", content: "trace me" }], max_tokens: 3 },
      { headers: { traceparent: `00-${TRACE}-${CLIENT_SPAN}-01` } },
    );
    assert.ok(r.choices[0]);
    const names = ["infera.request", "intake", "route", "upstream", "stream", "llm_request"];
    await recv.waitFor((s) => names.every((n) => s.some((x) => x.traceId === TRACE && x.name === n)));
    const spans = recv.spans.filter((s) => s.traceId === TRACE);
    const root = spans.find((s) => s.name === "infera.request")!;
    assert.equal(root.parentSpanId, CLIENT_SPAN, "root's parent is the client's span");
    assert.equal(root.kind, 2, "SERVER");
    for (const n of ["intake", "route", "upstream", "stream"]) {
      assert.equal(spans.find((s) => s.name === n)!.parentSpanId, root.spanId, `${n} under the root`);
    }
    const route = spans.find((s) => s.name === "route")!;
    assert.deepEqual([...(route.attributes["infera.route.candidates"] as string[])].sort(), [
      "sim-0",
      "sim-1",
    ]);
    assert.ok(["sim-0", "sim-1"].includes(route.attributes["infera.route.winner"] as string));
    assert.equal(typeof route.attributes["infera.route.reason"], "string");
    const up = spans.find((s) => s.name === "upstream")!;
    assert.equal(up.kind, 3, "CLIENT");
    assert.equal(up.attributes["infera.role"], "mixed");
    assert.equal(up.attributes["infera.worker"], route.attributes["infera.route.winner"]);
    const engine = spans.find((s) => s.name === "llm_request")!;
    assert.equal(engine.parentSpanId, up.spanId, "the engine's span is a child of the upstream span");
    assert.equal(engine.service, "vllm-sim");
    assertConnected(spans, root);
  });

  it("without a traceparent the root starts a new trace, still one tree with the engine's span", async () => {
    const before = new Set(recv.spans.map((s) => s.traceId));
    const stream = await c.client.chat.completions.create({
      model: c.sims[0].model,
      messages: [{ role: "user", content: "new trace" }],
      max_tokens: 3,
      stream: true,
    });
    for await (const _ of stream) {
      // drain
    }
    await recv.waitFor((s) =>
      s.some((x) => x.name === "llm_request" && !before.has(x.traceId) && x.traceId !== TRACE),
    );
    const engine = recv.spans.find((x) => x.name === "llm_request" && !before.has(x.traceId))!;
    await recv.waitFor((s) => s.some((x) => x.traceId === engine.traceId && x.name === "infera.request"));
    const spans = recv.spans.filter((s) => s.traceId === engine.traceId);
    const root = spans.find((s) => s.name === "infera.request")!;
    assert.equal(root.parentSpanId, "");
    assertConnected(spans, root);
  });
});

describe("tracing: PD request (server child process, 1P1D NIXL sims)", () => {
  let recv: OtlpReceiver;
  let pd: PdCluster;
  before(async () => {
    recv = await startOtlpReceiver();
    pd = await startPdCluster({
      kind: "nixl",
      simArgs: ["--speed", "20", "--otlp-traces-endpoint", recv.tracesUrl],
      serverArgs: ["--otlp-endpoint", recv.url],
    });
  });
  after(async () => {
    await pd?.close();
    await recv?.close();
  });

  it("both halves, the KV transfer and both engines' spans form one tree", async () => {
    const trace = "0af7651916cd43dd8448eb211c80319c";
    await pd.client.chat.completions.create(
      { model: MODEL, messages: [{ role: "user", content: "disaggregated trace" }], max_tokens: 4 },
      { headers: { traceparent: `00-${trace}-b7ad6b7169203331-01` } },
    );
    await recv.waitFor(
      (s) =>
        s.filter((x) => x.traceId === trace && x.name === "llm_request").length === 2 &&
        s.some((x) => x.traceId === trace && x.name === "infera.request") &&
        s.some((x) => x.traceId === trace && x.name === "kv_transfer"),
    );
    const spans = recv.spans.filter((s) => s.traceId === trace);
    const root = spans.find((s) => s.name === "infera.request")!;
    assert.equal(root.parentSpanId, "b7ad6b7169203331");
    const ups = spans.filter((s) => s.name === "upstream");
    const p = ups.find((s) => s.attributes["infera.role"] === "prefill");
    const d = ups.find((s) => s.attributes["infera.role"] === "decode");
    assert.ok(p && d, `prefill and decode upstream spans: ${JSON.stringify(ups.map((u) => u.attributes))}`);
    const engines = spans.filter((s) => s.name === "llm_request");
    assert.deepEqual(
      engines.map((e) => e.parentSpanId).sort(),
      [p.spanId, d.spanId].sort(),
      "each engine's span under its own half",
    );
    assert.deepEqual(engines.map((e) => e.attributes["infera.sim.pd_phase"]).sort(), ["decode", "prefill"]);
    const kv = spans.find((s) => s.name === "kv_transfer")!;
    assert.equal(kv.parentSpanId, root.spanId);
    const route = spans.find((s) => s.name === "route")!;
    assert.equal(route.attributes["infera.route.step"], "pd");
    assert.equal(route.attributes["infera.route.winner"], p.attributes["infera.worker"]);
    assert.equal(route.attributes["infera.route.decode"], d.attributes["infera.worker"]);
    assertConnected(spans, root);
  });
});

describe("otlpTracesUrl", () => {
  it("appends /v1/traces to a bare collector URL and keeps a full one", () => {
    assert.equal(otlpTracesUrl("http://c:4318"), "http://c:4318/v1/traces");
    assert.equal(otlpTracesUrl("http://c:4318/custom/traces"), "http://c:4318/custom/traces");
  });
});
