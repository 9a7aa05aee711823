/**
 * An OTLP/HTTP trace receiver for tests: POST /v1/traces (or any path), JSON-encoded
 * ExportTraceServiceRequest as @opentelemetry/exporter-trace-otlp-http sends it
 * (opentelemetry-proto's JSON mapping: `resourceSpans[].scopeSpans[].spans[]`, ids as hex).
 * Protobuf bodies are refused with 415, so a test notices an exporter that changed encoding.
 */
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  service: string;
  attributes: Record<string, unknown>;
}

interface OtlpValue {
  stringValue?: string;
  intValue?: string | number;
  doubleValue?: number;
  boolValue?: boolean;
  arrayValue?: { values?: OtlpValue[] };
}

function otlpValue(v: OtlpValue | undefined): unknown {
  if (!v) return undefined;
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  if (v.boolValue !== undefined) return v.boolValue;
  if (v.arrayValue) return (v.arrayValue.values ?? []).map(otlpValue);
  return undefined;
}

type Attr = { key: string; value?: OtlpValue };
const attrs = (list: Attr[] | undefined): Record<string, unknown> =>
  Object.fromEntries((list ?? []).map((a) => [a.key, otlpValue(a.value)]));

export interface OtlpReceiver {
  /** Base URL (`http://127.0.0.1:PORT`); the exporter appends nothing to `tracesUrl`. */
  url: string;
  tracesUrl: string;
  spans: ReceivedSpan[];
  /** Every export request's path and headers (an exporter's credentials arrive as headers). */
  requests: { path: string; headers: IncomingHttpHeaders }[];
  /** Resolves once `pred` holds over the spans received (polls; rejects after `ms`). */
  waitFor(pred: (spans: ReceivedSpan[]) => boolean, ms?: number): Promise<void>;
  close(): Promise<void>;
}

export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const requests: OtlpReceiver["requests"] = [];
  const server: Server = createServer((req, res) => {
    requests.push({ path: req.url ?? "", headers: req.headers });
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (!(req.headers["content-type"] ?? "").includes("json")) {
        res.statusCode = 415;
        res.end();
        return;
      }
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as {
        resourceSpans?: {
          resource?: { attributes?: Attr[] };
          scopeSpans?: {
            spans?: {
              traceId: string;
              spanId: string;
              parentSpanId?: string;
              name: string;
              kind: number;
              attributes?: Attr[];
            }[];
          }[];
        }[];
      };
      for (const rs of body.resourceSpans ?? []) {
        const service = String(attrs(rs.resource?.attributes)["service.name"] ?? "");
        for (const ss of rs.scopeSpans ?? [])
          for (const s of ss.spans ?? [])
            spans.push({
              traceId: s.traceId,
              spanId: s.spanId,
              parentSpanId: s.parentSpanId ?? "",
              name: s.name,
              kind: s.kind,
              service,
              attributes: attrs(s.attributes),
            });
      }
      res.setHeader("content-type", "application/json");
      res.end("{}");
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    tracesUrl: `${url}/v1/traces`,
    spans,
    requests,
    async waitFor(pred, ms = 10_000) {
      const until = Date.now() + ms;
      while (!pred(spans)) {
        if (Date.now() > until)
          throw new Error(`spans not received in ${ms} ms: ${JSON.stringify(spans.map((s) => s.name))}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    close: () =>
      new Promise<void>((r) => {
        server.close(() => r());
        server.closeAllConnections();
      }),
  };
}
