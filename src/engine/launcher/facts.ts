/**
 * What a launcher reads back from a healthy engine for its record when no flag said it:
 * the context length (`/v1/models` max_model_len) and the KV pool size in blocks.
 *
 * KV blocks: vLLM exposes its pool as the labels of the `vllm:cache_config_info` gauge
 * (`num_gpu_blocks`, one sample per engine core under DP); SGLang reports
 * `max_total_num_tokens` (tokens, i.e. pages × page size) from its server-info route.
 * ATOM reports neither, so its record leaves kvBlocks out.
 */
import type { LaunchSpec } from "./types.ts";

const TIMEOUT_MS = 2000;

async function getJson(url: string): Promise<unknown> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(TIMEOUT_MS) });
    return res.ok ? await res.json() : undefined;
  } catch {
    return undefined;
  }
}

export async function reportedMaxModelLen(base: string): Promise<number | undefined> {
  const body = (await getJson(`${base}/v1/models`)) as
    | { data?: Array<{ max_model_len?: unknown }> }
    | undefined;
  const v = body?.data?.[0]?.max_model_len;
  return typeof v === "number" && v > 0 ? v : undefined;
}

/** `--num-gpu-blocks-override N` (or `=N`) among the extra engine args (vLLM's own flag). */
export function blocksOverride(extraArgs: readonly string[]): number | undefined {
  for (let i = 0; i < extraArgs.length; i++) {
    const a = extraArgs[i] as string;
    let v: string | undefined;
    if (a === "--num-gpu-blocks-override") v = extraArgs[i + 1];
    else if (a.startsWith("--num-gpu-blocks-override=")) v = a.slice(a.indexOf("=") + 1);
    if (v !== undefined) {
      const n = Number(v);
      if (Number.isInteger(n) && n > 0) return n;
    }
  }
  return undefined;
}

/** The smallest `num_gpu_blocks` among `vllm:cache_config_info` samples (one pool per DP rank). */
export function parseVllmCacheBlocks(metricsText: string): number | undefined {
  let min: number | undefined;
  for (const line of metricsText.split("\n")) {
    if (!line.startsWith("vllm:cache_config_info{")) continue;
    const m = /[{,]num_gpu_blocks="(\d+)"/.exec(line);
    const n = m ? Number(m[1]) : 0;
    if (n > 0) min = min === undefined ? n : Math.min(min, n);
  }
  return min;
}

async function vllmBlocks(base: string): Promise<number | undefined> {
  try {
    const res = await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(TIMEOUT_MS) });
    return res.ok ? parseVllmCacheBlocks(await res.text()) : undefined;
  } catch {
    return undefined;
  }
}

async function sglangBlocks(base: string, pageSize: number): Promise<number | undefined> {
  for (const route of ["/server_info", "/get_server_info"]) {
    const body = (await getJson(`${base}${route}`)) as { max_total_num_tokens?: unknown } | undefined;
    const tokens = body?.max_total_num_tokens;
    if (typeof tokens === "number" && tokens > 0) return Math.floor(tokens / pageSize);
  }
  return undefined;
}

/** KV blocks per DP rank: the flag when given, else what the running engine reports. */
export async function reportedKvBlocks(
  spec: LaunchSpec,
  base: string,
  blockSize: number,
): Promise<number | undefined> {
  const flagged = blocksOverride(spec.extraArgs);
  if (flagged !== undefined) return flagged;
  if (spec.engine === "vllm" || spec.engine === "sim") return vllmBlocks(base);
  if (spec.engine === "sglang") return sglangBlocks(base, blockSize);
  return undefined;
}
