/**
 * `infera engine --otlp-endpoint URL` hands each engine its own tracing flags (issue #31 item 4).
 *
 * - vLLM: `--otlp-traces-endpoint URL`, exported over gRPC unless
 *   OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf, then to the URL as given
 *   (vllm-project/vllm vllm/tracing/otel.py `get_span_exporter` @
 *   40eeb0c5e942e511bf73359f99265d72470c2f59): the full /v1/traces URL and the variable.
 * - SGLang: `--enable-trace --otlp-traces-endpoint`, the same variable for an HTTP endpoint
 *   (sgl-project/sglang docs/references/production_request_trace.md @
 *   93d04878cfb9b08645fae7b11bd340ee33b34acf).
 * - ATOM: no tracing flag (none found in ROCm/ATOM's launcher): nothing added.
 *
 * Credentials: the URL lands on the engine's argv, so one with a password is refused. vLLM
 * builds `OTLPSpanExporter(endpoint=...)` with no headers (otel.py above), and that exporter
 * reads them from OTEL_EXPORTER_OTLP_TRACES_HEADERS, else OTEL_EXPORTER_OTLP_HEADERS
 * (open-telemetry/opentelemetry-python exporter/opentelemetry-exporter-otlp-proto-http/src/
 * opentelemetry/exporter/otlp/proto/http/trace_exporter/__init__.py `OTLPSpanExporter.__init__`
 * @ 015b3cd2cbbe821df8c0e4f4c31517a0a9d84522): the way the error names.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { parseSimArgs } from "../../../src/engine/sim/args.ts";
import { build, flagValue } from "./build.ts";

const FLAGS = { otlpEndpoint: "http://collector:4318" };
const URL_ = "http://collector:4318/v1/traces";

describe("engine tracing flags", () => {
  it("vLLM gets --otlp-traces-endpoint with the traces URL, and the HTTP protocol variable", async () => {
    const { cmd } = await build("vllm", FLAGS);
    assert.equal(flagValue(cmd.argv, "--otlp-traces-endpoint"), URL_);
    assert.equal(cmd.env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "http/protobuf");
  });

  it("SGLang gets --enable-trace and --otlp-traces-endpoint", async () => {
    const { cmd } = await build("sglang", FLAGS);
    assert.ok(cmd.argv.includes("--enable-trace"));
    assert.equal(flagValue(cmd.argv, "--otlp-traces-endpoint"), URL_);
    assert.equal(cmd.env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "http/protobuf");
  });

  it("ATOM and a launch without --otlp-endpoint get nothing", async () => {
    const atom = await build("atom", FLAGS);
    assert.ok(!atom.cmd.argv.some((a) => a.includes("otlp") || a.includes("trace")));
    const plain = await build("vllm");
    assert.equal(flagValue(plain.cmd.argv, "--otlp-traces-endpoint"), undefined);
    assert.equal(plain.cmd.env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, undefined);
  });

  it("a URL with a password is refused (it would be on the engine's argv), masked in the error", async () => {
    for (const engine of ["vllm", "sglang"] as const) {
      await assert.rejects(
        build(engine, { otlpEndpoint: "http://otel:s3cret@collector:4318" }),
        (e: Error) =>
          e.message.includes("OTEL_EXPORTER_OTLP_TRACES_HEADERS") &&
          e.message.includes("otel:***@collector") &&
          !e.message.includes("s3cret"),
      );
    }
    // A user without a password is no secret: kept.
    const { cmd } = await build("vllm", { otlpEndpoint: "http://otel@collector:4318" });
    assert.equal(flagValue(cmd.argv, "--otlp-traces-endpoint"), "http://otel@collector:4318/v1/traces");
  });

  it("the sim takes vLLM's flag (it traces) and SGLang's flags (accepted)", () => {
    const v = parseSimArgs(["serve", "m", "--otlp-traces-endpoint", URL_], {});
    assert.equal(v.config.otlpTracesEndpoint, URL_);
    const s = parseSimArgs(
      ["--engine", "sglang", "--model-path", "m", "--enable-trace", "--otlp-traces-endpoint", URL_],
      {},
    );
    assert.equal(s.config.engine, "sglang");
  });
});
