/**
 * The sim's request spans, as vLLM's: started with `--otlp-traces-endpoint URL`, vLLM exports
 * one `llm_request` span (SERVER kind) per finished request, its parent taken from the
 * request's W3C `traceparent` / `tracestate` headers, with `gen_ai.*` attributes
 * (vllm-project/vllm vllm/v1/engine/output_processor.py `do_tracing` @
 * d07822605346f767b672503c9aae85aa23ef2d82; headers: vllm/tracing/utils.py TRACE_HEADERS and
 * vllm/tracing/otel.py `extract_trace_context` @ 40eeb0c5e942e511bf73359f99265d72470c2f59).
 * Without the flag vLLM ignores the headers, and so does the sim.
 *
 * vLLM exports over gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf
 * (vllm/tracing/otel.py `get_span_exporter`, the URL used as it is); the sim speaks OTLP/HTTP
 * only (JSON, the installed exporter's encoding), to the URL as given, whatever that variable
 * says. Minimal: one span per request, no engine-internal spans.
 */
import type { IncomingHttpHeaders } from "node:http";
import {
  defaultTextMapGetter,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  type Tracer,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";

const propagator = new W3CTraceContextPropagator();

export class SimTracer {
  private readonly provider: TracerProvider;
  private readonly tracer: Tracer;

  constructor(endpoint: string, serviceName: string) {
    this.provider = new TracerProvider({
      resource: resourceFromAttributes({ "service.name": serviceName }),
      spanProcessors: [
        new BatchSpanProcessor({
          exporter: new OTLPTraceExporter({ url: endpoint }),
          scheduledDelayMillis: 200,
        }),
      ],
    });
    this.tracer = this.provider.getTracer("vllm.llm_engine");
  }

  /** One finished (or failed) request: `llm_request` from its arrival, under its traceparent. */
  request(
    headers: IncomingHttpHeaders,
    requestId: string,
    arrivalMs: number,
    attrs: Record<string, number | string>,
    failed: boolean,
  ): void {
    if (headers.traceparent === undefined) return;
    const parent = propagator.extract(ROOT_CONTEXT, headers, defaultTextMapGetter);
    const span = this.tracer.startSpan(
      "llm_request",
      {
        kind: SpanKind.SERVER,
        startTime: arrivalMs,
        attributes: { "gen_ai.request.id": requestId, ...attrs },
      },
      parent,
    );
    if (failed) span.setStatus({ code: SpanStatusCode.ERROR });
    span.end();
  }

  shutdown(): Promise<void> {
    return this.provider.shutdown();
  }
}
