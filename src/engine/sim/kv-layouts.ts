/**
 * KV-event wire layouts per personality (msgpack values before packing). Each mirrors the
 * engine's msgspec structs: `array_like` structs are positional arrays, others maps with the
 * `type` tag first; `omit_defaults` drops fields equal to their default (trailing ones, for arrays).
 *
 * - vllm-map: vllm-project/vllm vllm/distributed/kv_events.py @ 0181ea3173e53eea8cf04a86891488e3dc89bb34
 *   (KVCacheEvent tag=True, omit_defaults, not array_like; EventBatch a map) and
 *   vllm/v1/core/block_pool.py (BlockStored: medium GPU, extra_keys one entry per block,
 *   group_idx = kv_cache_group_id; kv_cache_spec_kind "full_attention").
 * - vllm-array: vLLM's older array_like layout (kept for consumers pinned to it).
 * - sglang: sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py @ 612d579090db24ec7c47cc5ca6b83e0c649b8c28
 *   (array_like; BlockStored [hashes, parent, tokens, block_size, lora_id, medium];
 *   BlockStoredWithMetadata adds `{cache_salt}` after medium; EventBatch [ts, events, attn_dp_rank])
 *   and mem_cache radix cache: one BlockStored per page.
 * - atom: ROCm/ATOM atom/distributed/kv_events.py @ ffdf3bb5ddf8a15a64d521a2eeb3bc7438f9ac21
 *   (array_like + omit_defaults: medium "GPU" and the None fields are defaults, so a GPU
 *   BlockStored is [tag, hashes, parent, tokens, block_size], BlockRemoved [tag, hashes]);
 *   atom/model_engine/block_manager.py emits coalesced runs with medium GPU.
 */
import type { KvEvent, SimBlockHash } from "./kv-events.ts";

export type KvLayout = "vllm-map" | "vllm-array" | "sglang" | "atom";

/** vLLM's KVCacheSpecKind.FULL_ATTENTION value (vllm/v1/kv_cache_interface.py). */
const FULL_ATTENTION = "full_attention";

function vllmMap(e: KvEvent): unknown[] | Record<string, unknown> {
  switch (e.type) {
    case "BlockStored":
      return {
        type: "BlockStored",
        block_hashes: e.blockHashes,
        parent_block_hash: e.parentBlockHash,
        token_ids: e.tokenIds,
        block_size: e.blockSize,
        lora_id: null,
        medium: e.medium ?? "GPU",
        lora_name: null,
        // One entry per block: the first block of a salted request holds (lora, mm..., salt).
        extra_keys: e.extraKeys ?? e.blockHashes.map(() => null),
        group_idx: 0,
        kv_cache_spec_kind: FULL_ATTENTION,
      };
    case "BlockRemoved":
      return { type: "BlockRemoved", block_hashes: e.blockHashes, medium: e.medium ?? "GPU", group_idx: 0 };
    case "AllBlocksCleared":
      return { type: "AllBlocksCleared" };
  }
}

function vllmArray(e: KvEvent): unknown[] {
  switch (e.type) {
    case "BlockStored":
      return [
        "BlockStored",
        e.blockHashes,
        e.parentBlockHash,
        e.tokenIds,
        e.blockSize,
        null,
        e.medium ?? "GPU",
        null,
        e.extraKeys,
        0,
      ];
    case "BlockRemoved":
      return ["BlockRemoved", e.blockHashes, e.medium ?? "GPU", 0];
    case "AllBlocksCleared":
      return ["AllBlocksCleared"];
  }
}

/** SGLang: one BlockStored per page, each linked to the previous page. */
function sglang(e: KvEvent, out: unknown[]): void {
  switch (e.type) {
    case "BlockStored": {
      let parent: SimBlockHash | null = e.parentBlockHash;
      e.blockHashes.forEach((h, i) => {
        const page = e.tokenIds.slice(i * e.blockSize, (i + 1) * e.blockSize);
        const ev: unknown[] = ["BlockStored", [h], parent, page, page.length, null, "GPU"];
        if (e.salt) ev.push({ cache_salt: e.salt });
        out.push(ev);
        parent = h;
      });
      return;
    }
    case "BlockRemoved":
      out.push(["BlockRemoved", e.blockHashes, "GPU"]);
      return;
    case "AllBlocksCleared":
      out.push(["AllBlocksCleared"]);
  }
}

function atom(e: KvEvent): unknown[] {
  switch (e.type) {
    case "BlockStored":
      return ["BlockStored", e.blockHashes, e.parentBlockHash, e.tokenIds, e.blockSize];
    case "BlockRemoved":
      return ["BlockRemoved", e.blockHashes];
    case "AllBlocksCleared":
      return ["AllBlocksCleared"];
  }
}

/** vLLM's offloading connector's reports (another medium) exist in vLLM's layouts only. */
function onGpu(e: KvEvent): boolean {
  return e.type === "AllBlocksCleared" || (e.medium ?? "GPU") === "GPU";
}

/** Each layout's EventBatch encoder, by name (the personalities pick the name). */
const ENCODERS: Readonly<
  Record<KvLayout, (ts: number, events: readonly KvEvent[], dpRank: number) => unknown>
> = {
  "vllm-map": (ts, events, dpRank) => ({ ts, events: events.map(vllmMap), data_parallel_rank: dpRank }),
  "vllm-array": (ts, events, dpRank) => [ts, events.map(vllmArray), dpRank],
  sglang: (ts, events, dpRank) => {
    const out: unknown[] = [];
    for (const e of events) if (onGpu(e)) sglang(e, out);
    return [ts, out, dpRank];
  },
  atom: (ts, events, dpRank) => [ts, events.filter(onGpu).map(atom), dpRank],
};

/** One step's events as the personality's EventBatch. */
export function encodeBatch(
  layout: KvLayout,
  ts: number,
  events: readonly KvEvent[],
  dpRank: number,
): unknown {
  return ENCODERS[layout](ts, events, dpRank);
}
