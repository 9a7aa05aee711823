import type {
  HeldKv,
  PdRequestInfo,
  SimConnectorOptions,
  SimKvHost,
} from "../../../../src/engine/sim/pd/types.ts";

/** A SimKvHost stand-in that records holds, releases and imports, for connector-level tests. */
export class FakeKvHost implements SimKvHost {
  readonly engineId: string;
  readonly kvBytesPerBlock;
  readonly blockSize = 16;
  readonly host = "127.0.0.1";
  readonly httpPort = 18000;
  readonly tpSize: number = 1;
  readonly dpSize: number = 1;
  readonly dpRank: number = 0;
  readonly held = new Map<string, HeldKv>();
  readonly released: string[] = [];

  constructor(
    engineId: string,
    kvBytesPerBlock = 64 * 1024,
    layout: { dpSize?: number; dpRank?: number; tpSize?: number } = {},
  ) {
    this.engineId = engineId;
    this.kvBytesPerBlock = kvBytesPerBlock;
    this.dpSize = layout.dpSize ?? 1;
    this.dpRank = layout.dpRank ?? 0;
    this.tpSize = layout.tpSize ?? 1;
  }

  /** Simulates a finished prefill of `tokens` for `requestId`. */
  hold(requestId: string, tokens: number[]): HeldKv {
    const blocks = Math.ceil(tokens.length / this.blockSize);
    const held: HeldKv = {
      requestId,
      blockIds: Array.from({ length: blocks }, (_, i) => 100 + i),
      tokenIds: tokens,
      firstTokenId: 42,
    };
    this.held.set(requestId, held);
    return held;
  }
  holdBlocks(requestId: string): HeldKv | null {
    return this.held.get(requestId) ?? null;
  }
  getHeld(requestId: string): HeldKv | null {
    return this.held.get(requestId) ?? null;
  }
  releaseHeld(requestId: string): void {
    if (this.held.delete(requestId)) this.released.push(requestId);
  }
  importBlocks(_requestId: string, tokenIds: readonly number[]): { importedTokens: number } {
    return { importedTokens: tokenIds.length };
  }
}

export function connectorOpts(
  kind: SimConnectorOptions["kind"],
  role: "prefill" | "decode",
  extra: Record<string, unknown> = {},
  top: Record<string, unknown> = {},
): SimConnectorOptions {
  return {
    kind,
    role,
    kvTransferConfig: { kv_connector: kind, kv_role: "kv_both", ...top, kv_connector_extra_config: extra },
    holdTimeoutMs: 10_000,
  };
}

export function pdReq(
  requestId: string,
  tokens: number[],
  params: Record<string, unknown>,
  body: Record<string, unknown> = {},
): PdRequestInfo {
  return { requestId, params, body: { ...body, kv_transfer_params: params }, promptTokenIds: tokens };
}

export const prompt = (n: number, seed = 1): number[] =>
  Array.from({ length: n }, (_, i) => (i * 7 + seed) % 5000);
